"""`arcvllm gpus`: this host's Intel GPUs as Level Zero and the server see them.

Each Intel GPU with a render node, its Level Zero index here (doctor's order: by PCI
address) and the index it has in the single server's container, which is given the Arc Pro
B70s only (an iGPU or another card never: on a host with an enabled iGPU, Level Zero's
device 0 would be the iGPU and the presets' ZE_AFFINITY_MASK=0 would serve on it).
`--compose FILE` writes docker/compose.yaml's `vllm` its GPUs: every B70's render node and
a by-path folder of their links only (beside FILE); `make up` uses it after compose.yaml.
"""

from __future__ import annotations

from pathlib import Path

from arcvllm.errors import Unavailable
from arcvllm.operate import replicas
from arcvllm.operate.host import Host, RenderNode, b70s, level_zero_devices
from arcvllm.presets import default_preset, get_preset
from arcvllm.text import Shown, columns


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


def compose(host: Host, gpus: int, out: Path) -> list[RenderNode]:
    """Write OUT for the host's B70s (at least GPUS of them); the cards it names."""
    cards = b70s(host)
    if len(cards) < max(gpus, 1):
        raise Unavailable(
            f"the preset needs {gpus} Arc Pro B70(s); this host has {len(cards)} with a render "
            "node (`arcvllm doctor` says more)"
        )
    replicas.write_server(cards, out)
    return cards


def write_for(host: Host, out: Path, preset: str | None = None) -> list[RenderNode]:
    """OUT for the server of PRESET (default: the settings' ARCVLLM_PRESET, else the host's
    default preset): `make up` and the smoke test write it before compose starts `vllm`."""
    name = preset or host.settings.get("ARCVLLM_PRESET") or default_preset(host.environ)
    return compose(host, get_preset(name).gpus, out)


def survey(
    root: Path = Path("/"),
    env_file: Path | None = None,
    out: Path | None = None,
    preset: str | None = None,
) -> Shown:
    """`arcvllm gpus`: the table of this host's GPUs (under ROOT, with ENV_FILE's settings)
    and, given OUT, compose's GPU file written there for PRESET's server (the document's
    `compose`)."""
    from arcvllm.operate.settings import load

    host = Host(root=root, settings=load(env_file) if env_file else {})
    rows = table(host)
    if out:
        out = out.resolve()
        write_for(host, out, preset)
    lines = [("LEVEL ZERO", "SLOT", "GPU", "RENDER", "GID", "SERVER")]
    for r in rows:
        server = "-" if r["server"] is None else str(r["server"])
        lines.append(
            (str(r["level_zero"]), r["slot"], r["name"], r["render"], str(r["gid"]), server)
        )
    text = columns(lines) if rows else "no Intel GPU with a render node here"
    return Shown({"gpus": rows, "compose": str(out) if out else None}, text)
