"""The XPU replicas of a scale-out: one Arc Pro B70 each, and nothing of the others.

Which GPUs: the B70s (8086:e223) in sysfs, as `arcvllm doctor` counts them; an iGPU or
another Intel GPU never counts. Each replica's container gets only its own render node,
its own /dev/dri/by-path entry (compute-runtime finds devices through by-path) and the
node's own GID, so it cannot open another GPU whatever ZE_AFFINITY_MASK says.

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

TEMPLATE_KEY = "x-xpu-replica"
# The variable vLLM's XPU platform reads to pick its GPUs (vllm/platforms/xpu.py,
# XPUPlatform.device_control_env_var, in each XPU stack's release: tests/operate/test_replicas.py).
AFFINITY_ENV = "ZE_AFFINITY_MASK"
TARGETS_IN_CONTAINER = "/etc/arcvllm/prometheus/targets/replicas.yml"
CANARY_KEY = "x-canary-command"
METRICS_URL = "--metrics-url="


def pick(host: Host, replicas: int) -> list[RenderNode]:
    """The first REPLICAS B70s, or one line saying how many this host has."""
    if replicas < 1:
        raise UsageError(f"--replicas must be 1 or more, not {replicas}")
    cards = b70s(host)
    if replicas > len(cards):
        seen = ", ".join(f"{c.slot} {c.path}" for c in cards) or "none"
        raise Unavailable(
            f"{replicas} replicas need {replicas} Arc Pro B70s; this host has {len(cards)} "
            f"with a render node ({seen}; `arcvllm doctor` says more)"
        )
    return cards[:replicas]


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


def compose_services(cards: list[RenderNode], base: dict, state: Path) -> dict:
    """The compose file of the replicas (absolute paths only: compose reads relative ones
    from the first file's folder). Writes each replica's by-path folder under STATE."""
    services: dict[str, dict] = {}
    base = dict(base)
    canary = base.pop(CANARY_KEY)
    for i, card in enumerate(cards):
        by_path = by_path_folder([card], state / "by-path" / name(i))
        service = copy.deepcopy(base)
        service["devices"] = [f"{card.path}:{card.path}"]
        service["group_add"] = [str(card.gid)]
        service["volumes"] = [*service.get("volumes", []), f"{by_path}:/dev/dri/by-path:ro"]
        # The one GPU the container sees is device 0 (over the settings file's value).
        service["environment"] = {**service.get("environment", {}), AFFINITY_ENV: "0"}
        service["labels"] = {
            "org.arcvllm.gpu.slot": card.slot,
            "org.arcvllm.gpu.render": card.path,
        }
        services[name(i)] = service
    workers = " ".join(f"http://{name(i)}:8000" for i in range(len(cards)))
    # All N by default; `scale up` names only the healthy ones (ROUTER_WORKER_URLS).
    services["router"] = {"command": f"--worker-urls ${{ROUTER_WORKER_URLS:-{workers}}}"}
    targets_file = state / "targets.yml"
    targets_file.write_text(yaml.safe_dump(targets(len(cards)), sort_keys=False))
    services["prometheus"] = {"volumes": [f"{targets_file}:{TARGETS_IN_CONTAINER}:ro"]}
    services["canary"] = {"command": canary_command(canary, len(cards))}
    return {"services": services}


def canary_command(command: list[str], count: int) -> list[str]:
    """COMMAND with one --metrics-url for each of the COUNT replicas, where its own were."""
    at = next((i for i, arg in enumerate(command) if arg.startswith(METRICS_URL)), len(command))
    rest = [arg for arg in command if not arg.startswith(METRICS_URL)]
    urls = [f"{METRICS_URL}http://{name(i)}:8000" for i in range(count)]
    return rest[:at] + urls + rest[at:]


def write(cards: list[RenderNode], scale_file: Path, state: Path) -> Path:
    """STATE/replicas.yaml for CARDS; its path."""
    state.mkdir(parents=True, exist_ok=True)
    doc = compose_services(cards, template(scale_file), state)
    out = state / "replicas.yaml"
    head = (
        "# The XPU replicas of this scale-out, one Arc Pro B70 each: written by `arcvllm scale`\n"
        f"# from {scale_file.name}'s {TEMPLATE_KEY}; after compose.yaml and {scale_file.name}.\n"
    )
    out.write_text(head + yaml.safe_dump(doc, sort_keys=False))
    return out
