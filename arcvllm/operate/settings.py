"""The settings file (docker/arcvllm.env): one file, read twice by compose.

Compose reads it for the `${...}` in docker/compose.yaml (`--env-file`) and hands every
line to the container as its environment (`env_file`). A typo there fails silently in
both places (a misspelt VLLM_API_KEY serves without a key), and compose v2 and
docker-compose 1.29 disagree on quotes and inline comments. `arcvllm settings check FILE`
(run by `make up`) refuses such a file in one line before anything starts, and so a
RENDER_GID that is not the group of this host's render nodes: the container would start
without access to the GPU and vLLM would fail later with an unclear platform error.
"""

from __future__ import annotations

import difflib
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

import yaml

from arcvllm.errors import ArcvllmError, UsageError
from arcvllm.presets import EXTRA_ARGS, extra_args, presets_dir

# Read by compose for the ${...} in docker/compose.yaml and docker/compose.scale.yaml.
HOST_KEYS = (
    *("RENDER_GID", "BIND_ADDRESS", "PORT", "MODELS_DIR", "SHM_SIZE", "IPC_MODE", "IMAGE"),
    *("CPU_IMAGE", "CPU_PRESET", "CPU_MODELS_DIR", "CPUSET_0", "CPUSET_1", "SCALE_OUT_ARGS"),
    "PROMETHEUS_IMAGE",
    *("ROUTER_IMAGE", "ROUTER_POLICY", "ROUTER_WORKER_URLS", "ROUTER_CACHE_THRESHOLD"),
    *("ROUTER_BALANCE_ABS_THRESHOLD", "ROUTER_BALANCE_REL_THRESHOLD"),
    *("ROUTER_HEALTH_CHECK_INTERVAL_SECS", "ROUTER_HEALTH_FAILURE_THRESHOLD"),
    *("ALERT_WEBHOOK_URL", "ALERTMANAGER_IMAGE", "CANARY_CA_CERT", "CANARY_INTERVAL"),
    *("VLLM_API_KEY_FILE", "GATEWAY_IMAGE", "GATEWAY_UPSTREAM", "GATEWAY_CONN_PER_CLIENT"),
    *("GATEWAY_RATE", "GATEWAY_BURST", "GATEWAY_MAX_BODY", "GATEWAY_READ_TIMEOUT"),
    *("GATEWAY_SERVER_NAME", "GATEWAY_DIAGNOSTIC_ROUTES", "GATEWAY_TLS_CERT", "GATEWAY_TLS_KEY"),
    "GATEWAY_TLS_VOLUME",
)
# Read inside the container: the entrypoint and `arcvllm serve`, vLLM, Level Zero, oneCCL,
# the Hugging Face hub. Every preset's `env:` key is known too (the operator may override
# it on purpose).
CONTAINER_KEYS = (
    "ARCVLLM_PRESET",
    "ZE_AFFINITY_MASK",
    "VLLM_API_KEY",
    "HF_HUB_OFFLINE",
    "HF_TOKEN",
    "VLLM_LOGGING_LEVEL",
    "CCL_TOPO_P2P_ACCESS",
    "CCL_ZE_IPC_EXCHANGE",
    "ARCVLLM_EMULATE_HIGH_ADDRESSES",  # diagnostics only (arcvllm/serving/emulation.py)
    EXTRA_ARGS,  # `arcvllm serve` adds them to the preset's (presets.extra_args)
)

_KEY = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


@dataclass(frozen=True)
class Setting:
    key: str
    value: str
    line: int


def _preset_files(preset_dir: Path | None = None) -> dict[str, Path]:
    directory = preset_dir or presets_dir()
    return {p.stem: p for p in sorted(directory.glob("*.yaml"))}


def known_keys(preset_dir: Path | None = None) -> frozenset[str]:
    """The settings file's own keys and every preset's `env:` keys (read as plain YAML:
    `arcvllm presets --check` judges the presets, not this)."""
    keys = {*HOST_KEYS, *CONTAINER_KEYS}
    for path in _preset_files(preset_dir).values():
        try:
            data = yaml.safe_load(path.read_text()) or {}
        except (OSError, yaml.YAMLError):
            continue
        env = data.get("env") if isinstance(data, dict) else None
        if isinstance(env, dict):
            keys.update(str(k) for k in env)
    return frozenset(keys)


def parse(text: str, source: str = "<settings>") -> list[Setting]:
    """KEY=VALUE lines, comments on their own lines: the subset both compose versions read
    the same way. Anything else is an ArcvllmError naming the file and line."""
    settings: list[Setting] = []
    seen: dict[str, int] = {}
    for number, raw in enumerate(text.splitlines(), start=1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        where = f"{source}:{number}"
        key, eq, value = line.partition("=")
        key = key.strip()
        if not eq or not _KEY.fullmatch(key):
            raise ArcvllmError(f"{where}: not a KEY=VALUE line: {line[:60]!r}")
        if key in seen:
            raise ArcvllmError(f"{where}: {key} is set twice (first on line {seen[key]})")
        if re.search(r"\s#", value):
            raise ArcvllmError(
                f"{where}: inline comment in {key}: put comments on their own line "
                "(docker-compose 1.29 keeps them in the value)"
            )
        if len(value) >= 2 and value[0] == value[-1] and value[0] in "'\"":
            raise ArcvllmError(
                f"{where}: quoted value of {key}: write it without quotes "
                "(docker-compose 1.29 keeps them in the value)"
            )
        seen[key] = number
        settings.append(Setting(key, value, number))
    return settings


def check(settings: Iterable[Setting], known: frozenset[str], source: str) -> None:
    """Unknown keys and unknown presets, as one line for the first problem."""
    presets = None
    for s in settings:
        if s.key not in known:
            close = difflib.get_close_matches(s.key, sorted(known), n=1)
            hint = f" (did you mean {close[0]}?)" if close else ""
            raise ArcvllmError(
                f"{source}:{s.line}: unknown setting {s.key}{hint}; "
                "known: docker/arcvllm.env and the presets' env keys"
            )
        if s.key == EXTRA_ARGS:
            try:
                extra_args(s.value)
            except ArcvllmError as exc:
                raise ArcvllmError(f"{source}:{s.line}: {exc}") from None
        if s.key == "ARCVLLM_PRESET" and s.value:
            presets = presets if presets is not None else _preset_files()
            if s.value not in presets:
                raise ArcvllmError(
                    f"{source}:{s.line}: unknown preset {s.value!r}; presets: {', '.join(presets)}"
                )


def read(path: Path) -> list[Setting]:
    """The checked settings of PATH, in the file's order."""
    try:
        text = path.read_text()
    except OSError as exc:
        raise UsageError(f"cannot read settings file {path}: {exc.strerror}") from exc
    settings = parse(text, str(path))
    check(settings, known_keys(), str(path))
    return settings


def load(path: Path) -> dict[str, str]:
    """The checked settings of PATH as a mapping (what the container's environment gets)."""
    return {s.key: s.value for s in read(path)}


def render_gid_mismatch(value: str, nodes: Mapping[str, int]) -> tuple[str, int] | None:
    """The first render node whose GID is not RENDER_GID=VALUE, with that GID; None when
    VALUE is empty (unset: `make up` passes the nodes' GID) or there is no node to open."""
    if not value:
        return None
    return next(((node, gid) for node, gid in nodes.items() if str(gid) != value), None)


def check_render_gid(settings: Iterable[Setting], nodes: Mapping[str, int], source: str) -> None:
    """RENDER_GID (when set) against the render nodes' GID, as one line naming both."""
    for s in settings:
        if s.key != "RENDER_GID":
            continue
        mismatch = render_gid_mismatch(s.value, nodes)
        if mismatch is not None:
            node, gid = mismatch
            raise ArcvllmError(
                f"{source}:{s.line}: RENDER_GID={s.value} but {node} belongs to GID {gid}: "
                f"the container could not open the GPU; set RENDER_GID={gid} "
                f"(stat -c %g {node})"
            )


def check_file(path: Path, dri_dir: Path | None = None, key_file: Path | None = None) -> list[str]:
    """`arcvllm settings check PATH`: its lines, its RENDER_GID against the render nodes of
    DRI_DIR (default /dev/dri) and KEY_FILE (the API key file compose hands out, if given)
    by the one key rule; the keys it sets, sorted (never the values: they may be secrets)."""
    from arcvllm.operate.host import DRI_DIR, check_api_key_file, render_node_gids

    lines = read(path)
    check_render_gid(lines, render_node_gids(dri_dir or DRI_DIR), str(path))
    if key_file is not None:  # the one key rule, before compose hands the file out
        check_api_key_file(key_file)
    return sorted({s.key for s in lines})
