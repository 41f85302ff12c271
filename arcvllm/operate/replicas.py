"""The XPU replicas of a scale-out: K Arc Pro B70s each (one by default), and nothing of
the others.

Which GPUs: the B70s (8086:e223) in sysfs, as `arcvllm doctor` counts them; an iGPU or
another Intel GPU never counts, so the K of a replica are always the same kind. Replica i
gets the i-th K of them in PCI order, never a GPU of another replica; K must divide the
host's B70s (none left over) and equal the preset's tensor-parallel-size (its TP group is
the replica's GPUs). Each replica's container gets only its own render nodes, their own
/dev/dri/by-path entries (compute-runtime finds devices through by-path) and the nodes'
GID, so it cannot open another GPU whatever ZE_AFFINITY_MASK says; the mask is 0..K-1,
every GPU it sees.

`compose_services` turns the cards into the compose file of replicas vllm-0 .. vllm-(N-1), made
from docker/compose.scale.yaml's `x-xpu-replica` (its one definition), with the router
told the N workers, Prometheus its N targets and the canary its N metrics URLs.
`arcvllm scale up` writes it under the deployment's state folder; `arcvllm scale render`
prints it for compose by hand.
"""

from __future__ import annotations

import copy
from pathlib import Path

import yaml

from arcvllm.errors import Unavailable, UsageError
from arcvllm.operate.host import Host, RenderNode, b70s
from arcvllm.presets import Preset, load_all

TEMPLATE_KEY = "x-xpu-replica"
# The variable vLLM's XPU platform reads to pick its GPUs (vllm/platforms/xpu.py,
# XPUPlatform.device_control_env_var, in each XPU stack's release: tests/operate/test_replicas.py).
AFFINITY_ENV = "ZE_AFFINITY_MASK"
TARGETS_IN_CONTAINER = "/etc/arcvllm/prometheus/targets/replicas.yml"
CANARY_KEY = "x-canary-command"
METRICS_URL = "--metrics-url="


Replica = tuple[RenderNode, ...]  # the B70s of one replica, its TP group in mask order


def divisors(count: int) -> list[int]:
    """The replica sizes that use all COUNT GPUs with none left over."""
    return [k for k in range(1, count + 1) if count % k == 0]


def pick(host: Host, replicas: int, per_replica: int = 1) -> list[Replica]:
    """REPLICAS groups of PER_REPLICA B70s (the first ones, in PCI order; no GPU in two), or
    one line: too few GPUs (the host), a size that leaves GPUs over (wrong use)."""
    if replicas < 1:
        raise UsageError(f"--replicas must be 1 or more, not {replicas}")
    if per_replica < 1:
        raise UsageError(f"--gpus-per-replica must be 1 or more, not {per_replica}")
    cards = b70s(host)
    need = replicas * per_replica
    if need > len(cards):
        seen = ", ".join(f"{c.slot} {c.path}" for c in cards) or "none"
        each = "" if per_replica == 1 else f" of {per_replica}"
        what = "1 replica" + each + " needs" if replicas == 1 else f"{replicas} replicas{each} need"
        raise Unavailable(
            f"{what} {need} Arc Pro B70s; this host has {len(cards)} "
            f"with a render node ({seen}; `arcvllm doctor` says more)"
        )
    if cards and len(cards) % per_replica:
        sizes = ", ".join(map(str, divisors(len(cards))))
        raise UsageError(
            f"--gpus-per-replica {per_replica} does not divide this host's {len(cards)} "
            f"Arc Pro B70s (it can be {sizes})"
        )
    return [tuple(cards[i * per_replica : (i + 1) * per_replica]) for i in range(replicas)]


def tensor_parallel(preset: Preset) -> int:
    """The GPUs one server of PRESET spans: its tensor-parallel-size (1 unless set)."""
    return int(preset.vllm_args.get("tensor-parallel-size", 1))


def check_preset(preset: Preset, per_replica: int) -> None:
    """A replica of PER_REPLICA GPUs serves a preset whose TP group is exactly those GPUs:
    a smaller one leaves GPUs idle, a larger one cannot start. One line naming the presets
    that fit."""
    tp = tensor_parallel(preset)
    if tp == per_replica:
        return
    fits = [
        p.name
        for p in load_all().values()
        if p.flavor == "xpu" and tensor_parallel(p) == per_replica
    ]
    raise UsageError(
        f"preset {preset.name} has tensor-parallel-size {tp}, but --gpus-per-replica is "
        f"{per_replica}: set ARCVLLM_PRESET to one of TP={per_replica} "
        f"({', '.join(fits) or 'none here'})"
    )


def problems(host: Host, preset: Preset) -> list[str]:
    """What keeps this host from serving PRESET as replicas of its TP group, one line each
    (none: at least one replica of K B70s fits, and K uses every B70): the checks `scale
    up` makes, as values a host check (doctor) can list."""
    k = tensor_parallel(preset)
    found = []
    for check in (lambda: pick(host, 1, k), lambda: check_preset(preset, k)):
        try:
            check()
        except (UsageError, Unavailable) as exc:
            found.append(str(exc))
    return found


def template(scale_file: Path) -> dict:
    """compose.scale.yaml's `x-xpu-replica`, its anchors resolved, and under CANARY_KEY the
    command of its `canary`."""
    doc = yaml.safe_load(scale_file.read_text())
    if not isinstance(doc, dict) or not isinstance(doc.get(TEMPLATE_KEY), dict):
        raise Unavailable(f"{scale_file}: no {TEMPLATE_KEY} mapping")
    command = ((doc.get("services") or {}).get("canary") or {}).get("command")
    if not isinstance(command, list):
        raise Unavailable(f"{scale_file}: no services.canary.command list")
    return {**doc[TEMPLATE_KEY], CANARY_KEY: command}


def name(index: int) -> str:
    return f"vllm-{index}"


def targets(count: int) -> list[dict]:
    """Prometheus's file_sd targets: one per replica, labelled with its name."""
    return [{"targets": [f"{name(i)}:8000"], "labels": {"replica": name(i)}} for i in range(count)]


def by_path_folder(cards: list[RenderNode], folder: Path) -> Path:
    """FOLDER holding the by-path links of CARDS only (made again each time)."""
    folder.mkdir(parents=True, exist_ok=True)
    for link in folder.iterdir():
        link.unlink()
    for card in cards:
        for entry in card.by_path:
            (folder / entry).symlink_to(f"../{Path(card.path).name}")
    return folder


# The single server's file (docker/compose.yaml's `vllm`): compose appends a later file's
# `devices` to the earlier one's, so the list is replaced (`!override`, compose 2.24+) over
# compose.yaml's placeholder, which no host has: without this file the service does not
# start, naming the command that writes it.
SERVER = "vllm"
PLACEHOLDER = "/dev/dri/run-arcvllm-gpus-compose"


def server(cards: list[RenderNode], state: Path) -> str:
    """The compose file that gives compose.yaml's XPU server every B70 of CARDS and nothing
    else (no iGPU: Level Zero's device 0 is then the first B70), as YAML text."""
    folder = by_path_folder(cards, state / "by-path" / SERVER)
    service = {
        "devices": [f"{c.path}:{c.path}" for c in cards],
        "volumes": [f"{folder}:/dev/dri/by-path:ro"],
        "labels": {
            "org.arcvllm.gpu.slots": " ".join(c.slot for c in cards),
            "org.arcvllm.gpu.render": " ".join(c.path for c in cards),
        },
    }
    text = yaml.safe_dump({"services": {SERVER: service}}, sort_keys=False)
    return text.replace("    devices:\n", "    devices: !override\n", 1)


def write_server(cards: list[RenderNode], out: Path) -> Path:
    """OUT for CARDS, the by-path folder beside it; OUT."""
    out.parent.mkdir(parents=True, exist_ok=True)
    head = (
        "# The Arc Pro B70s of this host for docker/compose.yaml's `vllm` (written by\n"
        "# `arcvllm gpus compose`): after compose.yaml. Index i of ZE_AFFINITY_MASK is the\n"
        "# i-th B70 below.\n"
    )
    out.write_text(head + server(cards, out.parent))
    return out


def mask(group: Replica) -> str:
    """ZE_AFFINITY_MASK inside a replica's container: every GPU it sees (0, or 0,1,...)."""
    return ",".join(str(i) for i in range(len(group)))


def compose_services(groups: list[Replica], base: dict, state: Path) -> dict:
    """The compose file of the replicas, one per group of GROUPS (absolute paths only:
    compose reads relative ones from the first file's folder). Writes each replica's
    by-path folder under STATE."""
    services: dict[str, dict] = {}
    base = dict(base)
    canary = base.pop(CANARY_KEY)
    for i, group in enumerate(groups):
        by_path = by_path_folder(list(group), state / "by-path" / name(i))
        service = copy.deepcopy(base)
        service["devices"] = [f"{c.path}:{c.path}" for c in group]
        service["group_add"] = sorted({str(c.gid) for c in group})
        service["volumes"] = [*service.get("volumes", []), f"{by_path}:/dev/dri/by-path:ro"]
        # The GPUs the container sees are devices 0..K-1 (over the settings file's value).
        service["environment"] = {**service.get("environment", {}), AFFINITY_ENV: mask(group)}
        service["labels"] = {
            "org.arcvllm.gpu.slots": " ".join(c.slot for c in group),
            "org.arcvllm.gpu.render": " ".join(c.path for c in group),
        }
        services[name(i)] = service
    workers = " ".join(f"http://{name(i)}:8000" for i in range(len(groups)))
    # All N by default; `scale up` names only the healthy ones (ROUTER_WORKER_URLS).
    services["router"] = {"command": f"--worker-urls ${{ROUTER_WORKER_URLS:-{workers}}}"}
    targets_file = state / "targets.yml"
    targets_file.write_text(yaml.safe_dump(targets(len(groups)), sort_keys=False))
    services["prometheus"] = {"volumes": [f"{targets_file}:{TARGETS_IN_CONTAINER}:ro"]}
    services["canary"] = {"command": canary_command(canary, len(groups))}
    return {"services": services}


def canary_command(command: list[str], count: int) -> list[str]:
    """COMMAND with one --metrics-url for each of the COUNT replicas, where its own were."""
    at = next((i for i, arg in enumerate(command) if arg.startswith(METRICS_URL)), len(command))
    rest = [arg for arg in command if not arg.startswith(METRICS_URL)]
    urls = [f"{METRICS_URL}http://{name(i)}:8000" for i in range(count)]
    return rest[:at] + urls + rest[at:]


def write(groups: list[Replica], scale_file: Path, state: Path) -> Path:
    """STATE/replicas.yaml for GROUPS (one replica each); its path."""
    state.mkdir(parents=True, exist_ok=True)
    doc = compose_services(groups, template(scale_file), state)
    out = state / "replicas.yaml"
    each = "one Arc Pro B70" if all(len(g) == 1 for g in groups) else "their own Arc Pro B70s"
    head = (
        f"# The XPU replicas of this scale-out, {each} each: written by `arcvllm scale`\n"
        f"# from {scale_file.name}'s {TEMPLATE_KEY}; after compose.yaml and {scale_file.name}.\n"
    )
    out.write_text(head + yaml.safe_dump(doc, sort_keys=False))
    return out
