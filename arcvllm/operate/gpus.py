"""`arcvllm gpus`: this host's Intel GPUs as Level Zero and the server see them.

Each Intel GPU with a render node, its Level Zero index here (doctor's order: by PCI
address) and the index it has in the single server's container, which is given the Arc Pro
B70s only (an iGPU or another card never: on a host with an enabled iGPU, Level Zero's
device 0 would be the iGPU and the presets' ZE_AFFINITY_MASK=0 would serve on it).
`--compose FILE` writes docker/compose.yaml's `vllm` its GPUs: every B70's render node and
a by-path folder of their links only (beside FILE); `make up` uses it after compose.yaml.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from arcvllm import options
from arcvllm.errors import Unavailable
from arcvllm.operate import replicas
from arcvllm.operate.compose import gpus_file
from arcvllm.operate.doctor import DEFAULT_PRESET, default_preset
from arcvllm.operate.host import Card, Host, b70s, level_zero_devices
from arcvllm.operate.settings import load as load_settings
from arcvllm.presets import get_preset


def table(host: Host) -> list[dict]:
    """One row per Intel GPU Level Zero enumerates here; `server` is its index in the
    single server's container (B70s only), None for a GPU the server is not given."""
    cards = {c.slot: (i, c) for i, c in enumerate(b70s(host))}
    rows = []
    for index, (gpu, node) in enumerate(level_zero_devices(host)):
        server, card = cards.get(gpu.slot, (None, None))
        rows.append(
            {
                "level_zero": index,
                "slot": gpu.slot,
                "device": f"8086:{gpu.device:04x}",
                "name": gpu.name,
                "render": f"/dev/dri/{node}",
                "gid": card.gid if card else host.stat(host.path(f"/dev/dri/{node}")).st_gid,
                "by_path": list(card.by_path) if card else [],
                "server": server,
            }
        )
    return rows


def compose(host: Host, gpus: int, out: Path) -> list[Card]:
    """Write OUT for the host's B70s (at least GPUS of them); the cards it names."""
    cards = b70s(host)
    if len(cards) < max(gpus, 1):
        raise Unavailable(
            f"the preset needs {gpus} Arc Pro B70(s); this host has {len(cards)} with a render "
            "node (`arcvllm doctor` says more)"
        )
    replicas.write_server(cards, out)
    return cards


def write_for(host: Host, out: Path, preset: str | None = None) -> list[Card]:
    """OUT for the server of PRESET (default: the settings' ARCVLLM_PRESET, else the host's
    default preset): `make up` and the smoke test write it before compose starts `vllm`."""
    name = preset or host.settings.get("ARCVLLM_PRESET") or default_preset(host.environ)
    return compose(host, get_preset(name).gpus, out)


def _cmd(args: argparse.Namespace) -> int:
    if args.probe:  # in the image: its torch (arcvllm/serving/probe.py)
        from arcvllm.serving.probe import probe, show

        return show(probe(), args.json)
    settings = load_settings(args.env_file) if args.env_file else {}
    host = Host(root=args.root, settings=settings)
    rows = table(host)
    out = None
    if args.compose:
        out = args.compose.resolve()
        write_for(host, out, args.preset)
    if args.json:
        print(json.dumps({"gpus": rows, "compose": str(out) if out else None}, indent=2))
        return 0
    from arcvllm.text import columns

    head = ("LEVEL ZERO", "SLOT", "GPU", "RENDER", "GID", "SERVER")
    lines = [head]
    for r in rows:
        server = "-" if r["server"] is None else str(r["server"])
        lines.append(
            (str(r["level_zero"]), r["slot"], r["name"], r["render"], str(r["gid"]), server)
        )
    print(columns(lines) if rows else "no Intel GPU with a render node here")
    if out:
        print(f"wrote {out}", file=sys.stderr)
    return 0


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "gpus",
        help="this host's Intel GPUs: Level Zero index, render node, which the server gets",
        description=__doc__.split("\n\n")[1],
    )
    parser.add_argument(
        "--compose",
        type=Path,
        nargs="?",
        const=gpus_file(),
        metavar="FILE",
        help="write compose.yaml's `vllm` its GPUs: every B70, nothing else (exit 3 when "
        f"fewer than the preset needs); FILE: {gpus_file()} unless given",
    )
    parser.add_argument(
        "--preset", help=f"default: the settings' or $ARCVLLM_PRESET, else {DEFAULT_PRESET}"
    )
    parser.add_argument(
        "--env-file", type=options.existing_file, help="the settings file (its ARCVLLM_PRESET)"
    )
    parser.add_argument(
        "--root",
        default="/",
        type=options.existing_dir,
        help="read /sys and /dev under this root (as doctor --root)",
    )
    parser.add_argument(
        "--probe",
        action="store_true",
        help="in the XPU image: each device as PyTorch sees it (name, PCI ID, memory, driver) "
        "and a computation on it (exit 3 without torch or a device, 1 when one computes wrong)",
    )
    options.add_json(parser, help="the table (and the file written) as JSON")
    parser.set_defaults(func=_cmd)
