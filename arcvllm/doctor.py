"""`arcvllm doctor`: can this host (or this container) serve a preset? One table, one answer.

Everything is read from files (/dev, /sys, /proc, /etc, the dpkg database) under a root
that defaults to `/`, so the same code checks the host, the inside of a container, or a
fake tree built by the tests. Each row is ok / warn / fail and says the fix in words; any
fail makes the exit code non-zero.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import stat
import subprocess
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

from arcvllm.presets import Preset, get_preset

INTEL = 0x8086
B70 = 0xE223  # Arc Pro B70 (BMG-G31)
GIB = 1024**3
DEFAULT_PRESET = "qwen3.6-35b-a3b-w4a16-1xb70"

OK, WARN, FAIL = "ok", "warn", "fail"

# dpkg package names of the GPU user-space stack, as the release debs name them.
COMPUTE_RUNTIME_PKGS = ("libze-intel-gpu1", "intel-level-zero-gpu", "intel-opencl-icd")
LEVEL_ZERO_PKGS = ("libze1", "level-zero")


@dataclass(frozen=True)
class Row:
    check: str
    status: str
    seen: str
    fix: str = ""


def _run(argv: Sequence[str], env: Mapping[str, str]) -> tuple[int, str]:
    try:
        done = subprocess.run(list(argv), capture_output=True, text=True, timeout=30, env=dict(env))
    except (OSError, subprocess.TimeoutExpired) as exc:
        return 127, str(exc)
    return done.returncode, (done.stdout + done.stderr).strip()


def _groups() -> frozenset[int]:
    return frozenset({os.getgid(), *os.getgroups()})


@dataclass
class Host:
    """Where doctor looks; every edge is injectable so tests can build a fake machine."""

    root: Path = Path("/")
    environ: Mapping[str, str] = field(default_factory=lambda: dict(os.environ))
    uid: int = field(default_factory=os.getuid)
    gids: frozenset[int] = field(default_factory=_groups)
    stat: Callable[[Path], os.stat_result] = os.stat
    disk_usage: Callable[[Path], tuple[int, int, int]] = shutil.disk_usage
    run: Callable[[Sequence[str], Mapping[str, str]], tuple[int, str]] = _run

    def path(self, absolute: str) -> Path:
        return self.root / absolute.lstrip("/")

    def read(self, absolute: str) -> str | None:
        try:
            return self.path(absolute).read_text()
        except OSError:
            return None

    def in_container(self) -> bool:
        return self.path("/.dockerenv").exists() or self.path("/run/.containerenv").exists()

    def which(self, tool: str) -> str | None:
        return shutil.which(tool, path=self.environ.get("PATH", os.defpath))


@dataclass(frozen=True)
class Gpu:
    slot: str
    device: int
    driver: str | None

    @property
    def is_b70(self) -> bool:
        return self.device == B70


# ---- what the files say (pure reads) ----


def render_nodes(host: Host) -> list[Path]:
    return sorted(host.path("/dev/dri").glob("renderD*"))


def intel_gpus(host: Host) -> list[Gpu]:
    """Intel display-class PCI devices from sysfs, with the kernel driver bound to each."""
    gpus = []
    for dev in sorted(host.path("/sys/bus/pci/devices").glob("*")):
        try:
            vendor = int((dev / "vendor").read_text().strip(), 16)
            device = int((dev / "device").read_text().strip(), 16)
            klass = int((dev / "class").read_text().strip(), 16)
        except (OSError, ValueError):
            continue
        if vendor != INTEL or klass >> 16 != 0x03:
            continue
        driver = dev / "driver"
        name = Path(os.readlink(driver)).name if driver.is_symlink() else None
        gpus.append(Gpu(dev.name, device, name))
    return gpus


def group_names(host: Host) -> dict[int, str]:
    names = {}
    for line in (host.read("/etc/group") or "").splitlines():
        parts = line.split(":")
        if len(parts) >= 3 and parts[2].isdigit():
            names[int(parts[2])] = parts[0]
    return names


def can_open(st: os.stat_result, uid: int, gids: frozenset[int]) -> bool:
    """Read-write access by mode bits, the way the kernel decides for a non-root user."""
    if st.st_uid == uid:
        return st.st_mode & (stat.S_IRUSR | stat.S_IWUSR) == stat.S_IRUSR | stat.S_IWUSR
    if st.st_gid in gids:
        return st.st_mode & (stat.S_IRGRP | stat.S_IWGRP) == stat.S_IRGRP | stat.S_IWGRP
    return st.st_mode & (stat.S_IROTH | stat.S_IWOTH) == stat.S_IROTH | stat.S_IWOTH


def meminfo(host: Host) -> dict[str, int]:
    """/proc/meminfo in bytes."""
    values = {}
    for line in (host.read("/proc/meminfo") or "").splitlines():
        key, _, rest = line.partition(":")
        parts = rest.split()
        if parts and parts[0].isdigit():
            values[key] = int(parts[0]) * (1024 if parts[1:2] == ["kB"] else 1)
    return values


def dpkg_versions(host: Host) -> dict[str, str]:
    """Installed package -> version from the dpkg database (the image is Debian/Ubuntu)."""
    versions: dict[str, str] = {}
    for stanza in (host.read("/var/lib/dpkg/status") or "").split("\n\n"):
        fields = dict(
            line.split(": ", 1) for line in stanza.splitlines() if ": " in line and line[0] != " "
        )
        if "installed" in fields.get("Status", "") and "Package" in fields:
            versions[fields["Package"]] = fields.get("Version", "?")
    return versions


def gib(n: float) -> str:
    return f"{n / GIB:.1f} GiB"


# ---- the rows ----


def check_render_nodes(host: Host, preset: Preset) -> Row:
    nodes = render_nodes(host)
    if nodes:
        return Row("render node", OK, " ".join(f"/dev/dri/{n.name}" for n in nodes))
    if preset.device == "cpu":
        return Row("render node", WARN, "no /dev/dri/renderD* (not needed: CPU preset)")
    fix = (
        "pass the GPU into the container (--device /dev/dri, compose `devices`)"
        if host.in_container()
        else "no Intel GPU node: install the GPU and a kernel with the xe driver"
    )
    return Row("render node", FAIL, "no /dev/dri/renderD*: no XPU visible", fix)


def check_render_access(host: Host, preset: Preset) -> Row:
    nodes = render_nodes(host)
    if not nodes:
        return Row("render group", WARN, "no render node to open")
    names = group_names(host)
    seen, blocked = [], []
    for node in nodes:
        st = host.stat(node)
        seen.append(f"{node.name} gid {st.st_gid} ({names.get(st.st_gid, '?')})")
        if not can_open(st, host.uid, host.gids):
            blocked.append(st.st_gid)
    text = ", ".join(seen)
    if blocked and host.uid != 0:
        gid = blocked[0]
        return Row(
            "render group",
            FAIL,
            f"{text}; uid {host.uid} cannot open it",
            f"add the serving user to GID {gid}: `--group-add {gid}` (docker), "
            f'`group_add: ["{gid}"]` (compose), `usermod -aG {names.get(gid, gid)} USER` '
            "(host)",
        )
    if host.uid == 0:
        gid = host.stat(nodes[0]).st_gid
        return Row(
            "render group",
            WARN,
            f"{text}; running as root",
            f"the image serves as a non-root user: give it GID {gid} with --group-add {gid}",
        )
    return Row("render group", OK, f"{text}; uid {host.uid} can open it")


def check_gpu_identity(host: Host, preset: Preset) -> Row:
    gpus = intel_gpus(host)
    b70 = [g for g in gpus if g.is_b70]
    need = max(preset.gpus, 1)
    seen = ", ".join(f"{g.slot} 8086:{g.device:04x}" for g in gpus) or "no Intel GPU in sysfs"
    if preset.device == "cpu":
        return Row("GPU (sysfs)", OK if b70 else WARN, f"{seen} (not needed: CPU preset)")
    if len(b70) >= need:
        return Row("GPU (sysfs)", OK, f"{len(b70)}x Arc Pro B70: {seen}")
    if len(b70) + len(gpus) == 0:
        return Row(
            "GPU (sysfs)", FAIL, f"{seen}: no XPU", "this host has no Intel GPU; use a CPU preset"
        )
    if gpus and len(gpus) >= need:
        return Row(
            "GPU (sysfs)",
            WARN,
            f"{seen}: not an Arc Pro B70 (8086:e223)",
            "the presets are tuned and tested on the B70; other Intel GPUs may need other "
            "memory settings",
        )
    return Row(
        "GPU (sysfs)",
        FAIL,
        f"{seen}: preset {preset.name} needs {need} GPU(s)",
        "pick a preset for fewer GPUs or add GPUs",
    )


def check_driver(host: Host, preset: Preset) -> Row:
    gpus = intel_gpus(host)
    if not gpus:
        return Row("kernel driver", WARN, "no Intel GPU to check")
    seen = ", ".join(f"{g.slot}: {g.driver or 'none'}" for g in gpus)
    if any(g.driver is None for g in gpus):
        return Row(
            "kernel driver",
            FAIL,
            seen,
            "no driver bound: load xe (`modprobe xe`) on a kernel with Battlemage support "
            "(6.12 or newer)",
        )
    if any(g.is_b70 and g.driver != "xe" for g in gpus):
        return Row(
            "kernel driver",
            FAIL,
            seen,
            "Battlemage is driven by xe only: blacklist i915 for it or boot with "
            "`i915.force_probe=!e223 xe.force_probe=e223`",
        )
    if all(g.driver == "xe" for g in gpus):
        return Row("kernel driver", OK, seen)
    return Row("kernel driver", WARN, seen, "vLLM on Intel GPUs is tested with the xe driver")


def check_runtime(host: Host, preset: Preset) -> Row:
    pkgs = dpkg_versions(host)
    cr = next((f"{p} {pkgs[p]}" for p in COMPUTE_RUNTIME_PKGS if p in pkgs), None)
    l0 = next((f"{p} {pkgs[p]}" for p in LEVEL_ZERO_PKGS if p in pkgs), None)
    seen = f"compute-runtime: {cr or 'absent'}; level-zero: {l0 or 'absent'}"
    if cr and l0:
        return Row("GPU user-space", OK, seen)
    if preset.device == "cpu":
        return Row("GPU user-space", OK, f"{seen} (not needed: CPU preset)")
    if host.in_container():
        return Row(
            "GPU user-space",
            FAIL,
            seen,
            "this image has no GPU user-space driver: use the XPU image",
        )
    return Row(
        "GPU user-space",
        WARN,
        f"{seen} on the host",
        "the XPU image carries them; run `arcvllm doctor` inside the container to check",
    )


def check_sycl_ls(host: Host, preset: Preset) -> Row:
    tool = host.which("sycl-ls")
    if tool is None:
        where = "in this image" if host.in_container() else "on the host"
        return Row("sycl-ls", WARN, f"not installed {where}", "run doctor inside the XPU image")
    rc, out = host.run([tool], host.environ)
    gpus = [line.strip() for line in out.splitlines() if "level_zero:gpu" in line]
    if rc == 0 and gpus:
        return Row("sycl-ls", OK, "; ".join(gpus))
    if preset.device == "cpu":
        return Row("sycl-ls", WARN, f"no Level Zero GPU (rc {rc}; not needed: CPU preset)")
    return Row(
        "sycl-ls",
        FAIL,
        f"no Level Zero GPU listed (rc {rc}): {out.splitlines()[-1] if out else 'no output'}",
        "the runtime cannot see the GPU: check the render node, the render group and the driver",
    )


def check_xpu_smi(host: Host, preset: Preset) -> Row:
    tool = host.which("xpu-smi")
    if tool is None:
        where = "in this image" if host.in_container() else "on the host"
        return Row("xpu-smi", WARN, f"not installed {where}", "optional: GPU telemetry")
    rc, out = host.run([tool, "discovery"], host.environ)
    names = [ln.strip(" |") for ln in out.splitlines() if "Device Name" in ln]
    if rc == 0:
        return Row("xpu-smi", OK, "; ".join(names) or "ran, no device named")
    status = WARN if preset.device == "cpu" else FAIL
    last = out.splitlines()[-1] if out else "no output"
    return Row("xpu-smi", status, f"rc {rc}: {last}", "xpu-smi cannot reach the GPU driver")


def check_shm(host: Host, preset: Preset) -> Row:
    path = host.path("/dev/shm")
    if not path.is_dir():
        return Row("/dev/shm", FAIL, "missing", "mount a tmpfs at /dev/shm (--shm-size 16g)")
    total = host.disk_usage(path)[0]
    want = 16 * GIB if preset.gpus > 1 else 1 * GIB
    fix = f"give it {gib(want)} or more: --shm-size {want // GIB}g (docker), `shm_size` (compose)"
    if total >= want:
        return Row("/dev/shm", OK, gib(total))
    # vLLM's processes talk through a shared-memory broadcast of ~160 MiB: Docker's default
    # 64 MiB stops the engine ("Insufficient space in /dev/shm"); tensor-parallel workers
    # also exchange activations there.
    floor = GIB if preset.gpus > 1 else 256 * 1024**2
    if total < floor:
        return Row("/dev/shm", FAIL, f"{gib(total)}: too small for vLLM's shared memory", fix)
    return Row("/dev/shm", WARN, f"{gib(total)} < {gib(want)}", fix)


def check_ram(host: Host, preset: Preset) -> Row:
    info = meminfo(host)
    total, free = info.get("MemTotal", 0), info.get("MemAvailable", 0)
    need = preset.host_ram_gib * GIB
    seen = f"{gib(free)} available of {gib(total)}; {preset.name} needs {gib(need)}"
    if not info:
        return Row("host RAM", WARN, "cannot read /proc/meminfo")
    if total < need:
        return Row("host RAM", FAIL, seen, "loading streams the weights through host RAM: add RAM")
    if free < need:
        return Row("host RAM", WARN, seen, "free memory first: other processes hold it")
    return Row("host RAM", OK, seen)


def hf_cache_dir(environ: Mapping[str, str]) -> str:
    if "HF_HUB_CACHE" in environ:
        return environ["HF_HUB_CACHE"]
    home = environ.get("HF_HOME") or os.path.join(
        environ.get("XDG_CACHE_HOME") or os.path.join(environ.get("HOME", "/root"), ".cache"),
        "huggingface",
    )
    return os.path.join(home, "hub")


def check_disk(host: Host, preset: Preset) -> Row:
    cache = hf_cache_dir(host.environ)
    probe = host.path(cache)
    while not probe.exists() and probe != probe.parent:
        probe = probe.parent
    free = host.disk_usage(probe)[2]
    local = preset.model.startswith("/") and host.path(preset.model).exists()
    # A local model needs room only for compile caches; a hub model downloads its weights.
    need = 2 * GIB if local else preset.disk_gib * GIB
    seen = f"{gib(free)} free at {cache}; needs {gib(need)}" + (" (model local)" if local else "")
    if free < need:
        return Row("HF cache disk", FAIL, seen, "free disk or point HF_HOME at a larger volume")
    if free < 1.5 * need:
        return Row("HF cache disk", WARN, seen, "little headroom: compile caches grow")
    return Row("HF cache disk", OK, seen)


CHECKS = (
    check_render_nodes,
    check_render_access,
    check_gpu_identity,
    check_driver,
    check_runtime,
    check_sycl_ls,
    check_xpu_smi,
    check_shm,
    check_ram,
    check_disk,
)


def diagnose(host: Host, preset: Preset) -> list[Row]:
    return [check(host, preset) for check in CHECKS]


def render_table(rows: Sequence[Row]) -> str:
    from arcvllm.text import columns

    return columns(
        [("CHECK", "STATUS", "SEEN", "FIX"), *((r.check, r.status, r.seen, r.fix) for r in rows)]
    )


def _cmd_doctor(args: argparse.Namespace) -> int:
    preset = get_preset(args.preset)
    rows = diagnose(Host(root=Path(args.root)), preset)
    if args.json:
        print(json.dumps([asdict(r) for r in rows], indent=2))
    else:
        where = "container" if Host(root=Path(args.root)).in_container() else "host"
        print(f"arcvllm doctor: {where}, preset {preset.name}")
        print(render_table(rows))
    failed = [r.check for r in rows if r.status == FAIL]
    if failed:
        print(f"arcvllm: cannot serve {preset.name}: {', '.join(failed)}", file=sys.stderr)
        return 1
    return 0


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "doctor",
        help="host preflight: can this host serve a preset?",
        description="Check GPU nodes, driver, runtime, shared memory, RAM and disk for a preset.",
    )
    parser.add_argument("--preset", default=DEFAULT_PRESET, help=f"default {DEFAULT_PRESET}")
    parser.add_argument("--root", default="/", help="read /dev, /sys, /proc under this root")
    parser.add_argument("--json", action="store_true", help="rows as JSON")
    parser.set_defaults(func=_cmd_doctor)
