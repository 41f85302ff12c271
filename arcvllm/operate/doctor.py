"""`arcvllm doctor`: can this host (or this container) serve a preset? One table, one answer.

Everything is read from files (/dev, /sys, /proc, /etc, /lib, the dpkg database) under a
root that defaults to `/`, and the tools it runs (sycl-ls, xpu-smi) are looked up in
$PATH under that root too, so the same code checks the host, the inside of a container, a
container's filesystem mounted elsewhere, or a fake tree built by the tests, and never
mixes them. Each row is ok / warn / fail and says the fix in words; any fail makes the exit
code non-zero.
"""

from __future__ import annotations

import json
import os
import stat
from collections.abc import Sequence
from dataclasses import asdict, dataclass

from arcvllm.errors import CheckFailed
from arcvllm.operate import replicas, weights
from arcvllm.operate.host import (
    B70,
    BMG_G31,
    Host,
    b70s,
    intel_gpus,
    level_zero_devices,
    render_nodes,
)
from arcvllm.operate.settings import render_gid_mismatch
from arcvllm.presets import DEFAULT_XPU_PRESET, Preset, get_preset

GIB = 1024**3
DEFAULT_PRESET = DEFAULT_XPU_PRESET

# What the stack needs from the host and the image (docs/host.md, its one home).
# The first mainline Linux whose xe driver lists the Arc Pro B70 (8086:e223, with the other
# BMG-G31 IDs e220-e222): 6.17, by "drm/xe/xe2_hpg: Add PCI IDs for xe2_hpg" (9b779ff0e1d1,
# beside "Define additional Xe2_HPG GMD_ID" and "Add set of workarounds") in the drm pull
# for 6.17-rc1 (drm-next-2025-07-30, include/drm/intel/pciids.h). A distribution can carry
# the IDs to an older kernel, so a kernel's own modules.alias decides where it is readable
# (Debian 13's 6.12.117 lists no e22x: read from its xe.ko).
MIN_KERNEL_B70 = (6, 17)
# Battlemage (BMG-G21) IDs came in 6.11 behind xe.force_probe; 6.12 is taken as the first
# without the gate (not confirmed from a primary source: docs/host.md#kernel).
MIN_KERNEL = (6, 12)


def dotted(version: tuple[int, ...]) -> str:
    return ".".join(map(str, version))


# compute-runtime knows the G31 device IDs from 25.27.34303.5 (intel/compute-runtime
# ff380058, "feature: add support for release 20.2 (BMG G31)", 2025-06-13).
MIN_COMPUTE_RUNTIME_G31 = (25, 27, 34303, 5)
# The firmware xe loads on Battlemage (drivers/gpu/drm/xe/xe_uc_fw.c): GuC and HuC blobs
# under /lib/firmware/xe/, possibly compressed.
FIRMWARE = {"GuC": "xe/bmg_guc_70.bin", "HuC": "xe/bmg_huc.bin"}
FIRMWARE_DIRS = ("/lib/firmware", "/usr/lib/firmware")
# A full-size (resizable) BAR maps the whole VRAM; 256 MiB is the legacy window.
FULL_BAR = 16 * GIB

OK, WARN, FAIL = "ok", "warn", "fail"


@dataclass(frozen=True)
class Distribution:
    """The fix lines of one distribution for what docs/host.md prepares (its sources are
    there): a kernel whose xe lists the B70, and the GPU firmware. Each line says when it
    needs a reboot; doctor prints them and never runs them."""

    name: str
    kernel: str
    firmware: str


HOST_DOC = "docs/host.md"
DISTRIBUTIONS = {
    ("ubuntu", "24.04"): Distribution(
        "Ubuntu 24.04",
        kernel="sudo apt install --install-recommends linux-generic-hwe-24.04 (the HWE "
        "kernel, 6.17), then reboot",
        firmware="sudo apt install linux-firmware (linux-firmware-intel-graphics), then "
        f"reboot; still missing: {HOST_DOC}#firmware",
    ),
    ("ubuntu", "25.10"): Distribution(
        "Ubuntu 25.10",
        kernel="sudo apt install linux-generic && sudo apt full-upgrade (25.10's kernel is "
        "6.17), then reboot",
        firmware="sudo apt install linux-firmware (linux-firmware-intel-graphics), then reboot",
    ),
    ("ubuntu", "26.04"): Distribution(
        "Ubuntu 26.04",
        kernel="sudo apt install linux-generic && sudo apt full-upgrade (26.04's kernel is "
        "7.0), then reboot",
        firmware="sudo apt install linux-firmware (linux-firmware-intel-graphics), then reboot",
    ),
    ("debian", "13"): Distribution(
        "Debian 13",
        kernel="trixie's 6.12 does not know the B70: add trixie-backports to apt's sources "
        f"({HOST_DOC}#debian-13), sudo apt install -t trixie-backports linux-image-amd64, "
        "then reboot",
        firmware="trixie-backports with non-free-firmware in apt's sources "
        f"({HOST_DOC}#debian-13), sudo apt install -t trixie-backports "
        "firmware-intel-graphics, then reboot",
    ),
}
# Any other system, and inside a container (whose os-release is the image's, not the
# host's): what to get, and where the steps are.
GENERIC = Distribution(
    "",
    kernel=f"a kernel whose xe lists 8086:e223 (Linux {dotted(MIN_KERNEL_B70)} or newer), "
    "then reboot: "
    f"{HOST_DOC} has the steps per distribution",
    firmware="xe/bmg_guc_70.bin and xe/bmg_huc.bin (linux-firmware 20250410 or newer), then "
    f"reboot: {HOST_DOC} has the steps per distribution",
)


def distribution(host: Host) -> Distribution | None:
    """This host's distribution among those docs/host.md prepares, or None (another one, or
    inside a container: the kernel and firmware are the host's, os-release the image's)."""
    if host.in_container():
        return None
    info = host.os_release()
    return DISTRIBUTIONS.get((info.get("ID", ""), info.get("VERSION_ID", "")))


def fixes(host: Host) -> Distribution:
    """The fix lines for this host: its distribution's, else the generic ones."""
    return distribution(host) or GENERIC


# dpkg package names of the GPU user-space stack, as the release debs name them.
COMPUTE_RUNTIME_PKGS = ("libze-intel-gpu1", "intel-level-zero-gpu", "intel-opencl-icd")
LEVEL_ZERO_PKGS = ("libze1", "level-zero")


@dataclass(frozen=True)
class Finding:
    """What one preflight check found: its status, what it saw, and how to fix it."""

    check: str
    status: str
    seen: str
    fix: str = ""


# ---- what the files say (pure reads) ----


def affinity_mask(host: Host, preset: Preset) -> tuple[str | None, str]:
    """ZE_AFFINITY_MASK as the server will get it, and from where: a non-empty value of the
    environment or the settings file wins over the preset's (arcvllm serve's rule)."""
    for where, values in (("environment", host.environ), ("settings", host.settings)):
        if values.get("ZE_AFFINITY_MASK"):
            return values["ZE_AFFINITY_MASK"], where
    value = preset.env.get("ZE_AFFINITY_MASK")
    return (str(value), "preset") if value else (None, "unset")


def version_tuple(text: str) -> tuple[int, ...]:
    """Leading dotted numbers of a version string: '25.48.36300.8-0' -> (25, 48, 36300, 8)."""
    numbers = []
    for part in text.replace("-", ".").replace("+", ".").split("."):
        if not part.isdigit():
            break
        numbers.append(int(part))
    return tuple(numbers)


def xe_aliases(host: Host) -> set[int] | None:
    """Intel device IDs the running kernel's xe module claims (modules.alias), or None."""
    release = host.kernel_release()
    text = host.read(f"/lib/modules/{release}/modules.alias") if release else None
    if text is None:
        return None
    ids = set()
    for line in text.splitlines():
        parts = line.split()
        if len(parts) == 3 and parts[2] == "xe" and parts[1].startswith("pci:v00008086d0000"):
            try:
                ids.add(int(parts[1][18:22], 16))
            except ValueError:
                continue
    return ids


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


def check_render_nodes(host: Host, preset: Preset) -> Finding:
    nodes = render_nodes(host)
    if nodes:
        return Finding("render node", OK, " ".join(f"/dev/dri/{n.name}" for n in nodes))
    if preset.flavor == "cpu":
        return Finding("render node", WARN, "no /dev/dri/renderD* (not needed: CPU preset)")
    fix = (
        "pass the B70s' nodes into the container, not all of /dev/dri (an iGPU would be"
        " device 0): `arcvllm gpus --compose FILE`, or --device /dev/dri/renderD<B70>"
        if host.in_container()
        else f"the GPU in a slot and a kernel whose xe driver knows it ({HOST_DOC}): the "
        "GPU, kernel and driver rows say which is missing"
    )
    return Finding("render node", FAIL, "no /dev/dri/renderD*: no XPU visible", fix)


def check_render_access(host: Host, preset: Preset) -> Finding:
    nodes = render_nodes(host)
    if not nodes:
        return Finding("render group", WARN, "no render node to open")
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
        return Finding(
            "render group",
            FAIL,
            f"{text}; uid {host.uid} cannot open it",
            f"add the serving user to GID {gid}: `--group-add {gid}` (docker), "
            f'`group_add: ["{gid}"]` (compose), `sudo usermod -aG {names.get(gid, gid)} USER` '
            "and log in again (host)",
        )
    if host.uid == 0:
        gid = host.stat(nodes[0]).st_gid
        return Finding(
            "render group",
            WARN,
            f"{text}; running as root",
            f"the image serves as a non-root user: give it GID {gid} with --group-add {gid}",
        )
    return Finding("render group", OK, f"{text}; uid {host.uid} can open it")


def check_render_gid(host: Host, preset: Preset) -> Finding:
    """The settings' RENDER_GID (the group compose adds) against the render nodes' GID."""
    value = host.settings.get("RENDER_GID") or host.environ.get("RENDER_GID") or ""
    if not value:
        return Finding("RENDER_GID", OK, "not set: `make up` passes the render nodes' GID")
    nodes = {f"/dev/dri/{n.name}": host.stat(n).st_gid for n in render_nodes(host)}
    if not nodes:
        status = OK if preset.flavor == "cpu" else WARN
        return Finding("RENDER_GID", status, f"RENDER_GID={value}; no render node to compare")
    mismatch = render_gid_mismatch(value, nodes)
    if mismatch is None:
        return Finding("RENDER_GID", OK, f"RENDER_GID={value}, the render nodes' group")
    node, gid = mismatch
    return Finding(
        "RENDER_GID",
        FAIL,
        f"RENDER_GID={value} but {node} belongs to GID {gid}",
        f"set RENDER_GID={gid} in the settings file (stat -c %g {node})",
    )


def check_gpu_identity(host: Host, preset: Preset) -> Finding:
    gpus = intel_gpus(host)
    b70 = [g for g in gpus if g.is_b70]
    need = max(preset.gpus, 1)
    seen = (
        ", ".join(f"{g.slot} 8086:{g.device:04x} ({g.name})" for g in gpus)
        or "no Intel GPU in sysfs"
    )
    if preset.flavor == "cpu":
        return Finding("GPU (sysfs)", OK if b70 else WARN, f"{seen} (not needed: CPU preset)")
    if len(b70) >= need:
        return Finding("GPU (sysfs)", OK, f"{len(b70)}x Arc Pro B70: {seen}")
    if not gpus:
        return Finding(
            "GPU (sysfs)", FAIL, f"{seen}: no XPU", "this host has no Intel GPU; use a CPU preset"
        )
    if len(gpus) >= need:
        other = "another Battlemage" if any(g.is_battlemage for g in gpus) else "not Battlemage"
        return Finding(
            "GPU (sysfs)",
            WARN,
            f"{seen}: {other}, not an Arc Pro B70 (8086:e223)",
            "the presets are sized for the B70's 32 GiB; other GPUs need other memory settings",
        )
    return Finding(
        "GPU (sysfs)",
        FAIL,
        f"{seen}: preset {preset.name} needs {need} GPU(s)",
        "pick a preset for fewer GPUs or add GPUs",
    )


def check_replicas(host: Host, preset: Preset) -> Finding:
    """The scale-out's layout of PRESET here: replicas of K B70s each, K its
    tensor-parallel-size, none left over (what `arcvllm scale up` refuses, as values:
    replicas.problems). A warning: one server of the preset does not need it."""
    if preset.flavor == "cpu":
        return Finding("replicas", OK, "not needed: CPU preset")
    k = replicas.tensor_parallel(preset)
    try:
        found = replicas.problems(host, preset)
        n = len(b70s(host)) // k
    except OSError as exc:  # a B70 in sysfs whose render node is not in /dev/dri
        seen = f"cannot stat {exc.filename}: {exc.strerror}"
        return Finding("replicas", WARN, seen, "the render node rows say why")
    if found:
        fix = f"a single server of {preset.name} is unaffected; for replicas, docs/multi-gpu.md"
        return Finding("replicas", WARN, "; ".join(found), fix)
    each = "1 B70" if k == 1 else f"{k} B70s"
    return Finding(
        "replicas",
        OK,
        f"{n} of {each} each: arcvllm scale up --replicas {n} --gpus-per-replica {k}",
    )


def check_driver(host: Host, preset: Preset) -> Finding:
    gpus = intel_gpus(host)
    if not gpus:
        return Finding("kernel driver", WARN, "no Intel GPU to check")
    seen = ", ".join(f"{g.slot}: {g.driver or 'none'}" for g in gpus)
    unbound = [g for g in gpus if g.driver is None]
    if unbound:
        aliases = xe_aliases(host)
        unknown = aliases is not None and any(g.device not in aliases for g in unbound)
        return Finding(
            "kernel driver",
            FAIL,
            seen,
            f"this kernel's xe does not know it: {fixes(host).kernel}"
            if unknown
            else "no driver bound: sudo modprobe xe (dmesg | grep xe says why it did not bind; "
            "the kernel row whether this kernel knows the GPU)",
        )
    wrong = next((g for g in gpus if g.is_battlemage and g.driver != "xe"), None)
    if wrong is not None:
        return Finding(
            "kernel driver",
            FAIL,
            seen,
            "Battlemage is driven by xe only: blacklist i915 for it or boot with "
            f"`i915.force_probe=!{wrong.device:04x} xe.force_probe={wrong.device:04x}`",
        )
    if all(g.driver == "xe" for g in gpus):
        return Finding("kernel driver", OK, seen)
    return Finding("kernel driver", WARN, seen, "vLLM on Intel GPUs is tested with the xe driver")


def check_runtime(host: Host, preset: Preset) -> Finding:
    pkgs = dpkg_versions(host)
    cr = next((f"{p} {pkgs[p]}" for p in COMPUTE_RUNTIME_PKGS if p in pkgs), None)
    l0 = next((f"{p} {pkgs[p]}" for p in LEVEL_ZERO_PKGS if p in pkgs), None)
    seen = f"compute-runtime: {cr or 'absent'}; level-zero: {l0 or 'absent'}"
    if cr and l0 and preset.flavor != "cpu" and host.in_container():
        version = version_tuple(cr.split(" ", 1)[1])
        if version < MIN_COMPUTE_RUNTIME_G31:
            want = ".".join(map(str, MIN_COMPUTE_RUNTIME_G31))
            return Finding(
                "GPU user-space",
                FAIL,
                seen,
                f"compute-runtime older than {want} does not know the Arc Pro B70 (BMG-G31): "
                "use an image of a newer stack",
            )
    if cr and l0:
        return Finding("GPU user-space", OK, seen)
    if preset.flavor == "cpu":
        return Finding("GPU user-space", OK, f"{seen} (not needed: CPU preset)")
    if host.in_container():
        return Finding(
            "GPU user-space",
            FAIL,
            seen,
            "this image has no GPU user-space driver: use the XPU image",
        )
    return Finding("GPU user-space", OK, f"{seen} (not needed on the host: the XPU image "
                   "carries its own; doctor inside the container checks it)")  # fmt: skip


# How the devices are checked where sycl-ls and xpu-smi are not (the XPU image has neither).
PROBE_HINT = (
    "docker run --rm --device /dev/dri/renderD<B70> --group-add <its GID> IMAGE arcvllm gpus "
    "--probe"
)


def missing_tool(host: Host, name: str) -> Finding:
    """A diagnostic tool that is not installed: in the image the XPU probe row covers it."""
    if host.in_container():
        return Finding(name, OK, "not in this image (the XPU probe row checks the devices)")
    fix = f"optional; from the image: {PROBE_HINT}"
    return Finding(name, WARN, "not installed on the host", fix)


def check_sycl_ls(host: Host, preset: Preset) -> Finding:
    tool = host.which("sycl-ls")
    if tool is None:
        return missing_tool(host, "sycl-ls")
    rc, out = host.run([tool], host.environ)
    gpus = [line.strip() for line in out.splitlines() if "level_zero:gpu" in line]
    if rc == 0 and gpus:
        return Finding("sycl-ls", OK, "; ".join(gpus))
    if preset.flavor == "cpu":
        return Finding("sycl-ls", WARN, f"no Level Zero GPU (rc {rc}; not needed: CPU preset)")
    return Finding(
        "sycl-ls",
        FAIL,
        f"no Level Zero GPU listed (rc {rc}): {out.splitlines()[-1] if out else 'no output'}",
        "the runtime cannot see the GPU: check the render node, the render group and the driver",
    )


def check_xpu_smi(host: Host, preset: Preset) -> Finding:
    tool = host.which("xpu-smi")
    if tool is None:
        return missing_tool(host, "xpu-smi")
    rc, out = host.run([tool, "discovery"], host.environ)
    names = [ln.strip(" |") for ln in out.splitlines() if "Device Name" in ln]
    if rc == 0 and names:
        return Finding("xpu-smi", OK, "; ".join(names))
    status = WARN if preset.flavor == "cpu" else FAIL
    if rc == 0:
        return Finding(
            "xpu-smi",
            status,
            "ran, but lists no device",
            "xpu-smi sees no GPU: check the render node, the render group and the driver",
        )
    last = out.splitlines()[-1] if out else "no output"
    return Finding("xpu-smi", status, f"rc {rc}: {last}", "xpu-smi cannot reach the GPU driver")


def probe_report(out: str) -> dict | None:
    """The JSON line of `arcvllm gpus --probe --json` in OUT (stdout and stderr), or None."""
    for line in out.splitlines():
        if line.startswith("{"):
            try:
                doc = json.loads(line)
            except ValueError:
                return None
            return doc if isinstance(doc, dict) else None
    return None


def check_xpu_probe(host: Host, preset: Preset) -> Finding:
    """The devices as this machine's PyTorch sees them, and a computation on each:
    `arcvllm gpus --probe` (arcvllm/serving/probe.py), found on $PATH under the root."""
    name = "XPU probe"
    if preset.flavor == "cpu":
        return Finding(name, OK, "not needed: CPU preset")
    tool = host.which("arcvllm")
    if tool is None:
        return Finding(name, WARN, "no arcvllm on PATH here", f"from the image: {PROBE_HINT}")
    rc, out = host.run([tool, "gpus", "--probe", "--json"], host.environ)
    doc = probe_report(out)
    if doc is None:
        last = out.splitlines()[-1] if out else "no output"
        fix = "the runtime may hang or crash on the device: check the driver (dmesg)"
        return Finding(name, FAIL, f"the probe gave no report (rc {rc}): {last}", fix)
    if doc.get("torch") is None:
        status = FAIL if host.in_container() else WARN
        return Finding(name, status, "no torch here", f"run it in the XPU image: {PROBE_HINT}")
    if doc.get("problem"):
        return Finding(name, FAIL, doc["problem"],
                       "the runtime cannot see the GPU: the render node, group and driver rows "
                       "above say why")  # fmt: skip
    devices = doc.get("devices") or []
    seen = "; ".join(
        f"xpu:{d['index']} {d['name']} ({d.get('pci_id') or '?'}) {d['total_gib']:.1f} GiB, "
        f"driver {d['driver']}" + ("" if d["computes"] else f": {d.get('error')}")
        for d in devices
    )
    failed = [d for d in devices if not d["computes"]]
    if failed:
        return Finding(name, FAIL, seen, "a device does not compute: the driver or firmware "
                       "(dmesg, the GPU firmware row), or the GPU itself")  # fmt: skip
    need = max(preset.gpus, 1)
    if len(devices) < need:
        return Finding(name, FAIL, f"{seen}: {preset.name} needs {need}",
                       "pass every B70 the preset needs: arcvllm gpus --compose FILE")  # fmt: skip
    other = [d for d in devices[:need] if d.get("integrated") or d.get("pci_id") != f"0x{B70:04x}"]
    if other:
        names = ", ".join(f"xpu:{d['index']} is {d['name']}" for d in other)
        return Finding(name, WARN, f"{seen}: {names}, not an Arc Pro B70",
                       "give the server only the B70s' render nodes (arcvllm gpus --compose "
                       "FILE): an iGPU as device 0 takes the preset's first GPU")  # fmt: skip
    return Finding(name, OK, seen + " (computes)")


def check_shm(host: Host, preset: Preset) -> Finding:
    path = host.path("/dev/shm")
    if not path.is_dir():
        return Finding("/dev/shm", FAIL, "missing", "mount a tmpfs at /dev/shm (--shm-size 16g)")
    total = host.disk_usage(path)[0]
    want = 16 * GIB if preset.gpus > 1 else 1 * GIB
    fix = f"give it {gib(want)} or more: --shm-size {want // GIB}g (docker), `shm_size` (compose)"
    if total >= want:
        return Finding("/dev/shm", OK, gib(total))
    # vLLM's processes talk through a shared-memory broadcast of ~160 MiB: Docker's default
    # 64 MiB stops the engine ("Insufficient space in /dev/shm"); tensor-parallel workers
    # also exchange activations there.
    floor = GIB if preset.gpus > 1 else 256 * 1024**2
    if total < floor:
        return Finding("/dev/shm", FAIL, f"{gib(total)}: too small for vLLM's shared memory", fix)
    return Finding("/dev/shm", WARN, f"{gib(total)} < {gib(want)}", fix)


def check_ram(host: Host, preset: Preset) -> Finding:
    info = meminfo(host)
    total, free = info.get("MemTotal", 0), info.get("MemAvailable", 0)
    need = preset.host_ram_gib * GIB
    seen = f"{gib(free)} available of {gib(total)}; {preset.name} needs {gib(need)}"
    if not info:
        return Finding("host RAM", WARN, "cannot read /proc/meminfo")
    if total < need:
        return Finding(
            "host RAM", FAIL, seen, "loading streams the weights through host RAM: add RAM"
        )
    if free < need:
        return Finding("host RAM", WARN, seen, "free memory first: other processes hold it")
    return Finding("host RAM", OK, seen)


def check_model(host: Host, preset: Preset) -> Finding:
    """The preset's weights where the server reads them: in the image's container the folder
    under /models (compose's mount of MODELS_DIR) or inside the image; on the host the folder under
    MODELS_DIR (environment, settings file, /models) that `arcvllm model fetch` fills, and
    room for the checkpoint (needs.disk_gib) while it is not there. Nothing is downloaded
    at start: the server reads a folder."""
    sub = weights.model_subdir(preset)
    inside = host.in_image()
    if sub is None and not inside:
        return Finding("model", OK, f"{preset.model} inside the image")
    label = (
        preset.model
        if inside or sub is None
        else str(weights.models_dir(host.settings, host.environ) / sub)
    )
    folder = host.path(label)
    why = weights.problem(folder)
    if why is None:
        return _model_contents(preset, folder, label)
    why = why.replace(str(folder), label)
    fetch = f"arcvllm model fetch {preset.name} (make model)"
    if inside:
        fix = (
            f"this image should carry {preset.model}: use the image of a preset's stack"
            if sub is None
            else f"mount MODELS_DIR holding it at /models (compose does); on the host: {fetch}"
        )
        return Finding("model", FAIL, why, fix)
    probe = host.existing(label)
    free = host.disk_usage(probe)[2] if probe is not None else 0
    need = preset.disk_gib * GIB
    rel = probe.relative_to(host.root).as_posix() if probe is not None else None
    at = label if rel is None else "/" if rel == "." else f"/{rel}"
    seen = f"{why}; {gib(free)} free at {at}, the checkpoint needs {gib(need)}"
    if free < need:
        return Finding(
            "model", FAIL, seen, f"free disk or set MODELS_DIR to a larger volume, then {fetch}"
        )
    return Finding("model", WARN, seen, f"{fetch} puts it in MODELS_DIR")


def check_kernel(host: Host, preset: Preset) -> Finding:
    """The running kernel against what the B70 needs: an xe that lists each Battlemage GPU
    present (the B70 when none is: the presets are sized for it), read from the kernel's
    own modules.alias; without one (a container), its version against MIN_KERNEL_B70. A
    failure's fix is the line for this host's distribution (docs/host.md)."""
    release = host.kernel_release()
    if release is None:
        return Finding("kernel", WARN, "cannot read /proc/sys/kernel/osrelease")
    seen = f"Linux {release}"
    if preset.flavor == "cpu":
        return Finding("kernel", OK, f"{seen} (not needed: CPU preset)")
    gpus = [g for g in intel_gpus(host) if g.is_battlemage]
    wanted = sorted({g.device for g in gpus if g.driver != "xe"} or ({B70} if not gpus else set()))
    ids = ", ".join(f"8086:{device:04x}" for device in wanted)
    version = version_tuple(release)[:2]
    fix = fixes(host).kernel
    if version < MIN_KERNEL:
        return Finding("kernel", FAIL, f"{seen}: xe drives Battlemage from "
                       f"{dotted(MIN_KERNEL)}, the B70 from {dotted(MIN_KERNEL_B70)}",
                       fix)  # fmt: skip
    aliases = xe_aliases(host)
    if aliases is not None:
        unknown = [device for device in wanted if device not in aliases]
        if unknown:
            missing = ", ".join(f"8086:{device:04x}" for device in unknown)
            return Finding("kernel", FAIL, f"{seen}: its xe does not list {missing}", fix)
        if not wanted:
            return Finding("kernel", OK, f"{seen}; xe drives {len(gpus)} Battlemage GPU(s)")
        back = f" (carried back: mainline from {dotted(MIN_KERNEL_B70)})"
        back = back if version < MIN_KERNEL_B70 else ""
        return Finding("kernel", OK, f"{seen}; its xe lists {ids}{back}")
    if not wanted:
        return Finding("kernel", OK, f"{seen}; xe drives {len(gpus)} Battlemage GPU(s)")
    if version < MIN_KERNEL_B70 and (not gpus or any(g.device in BMG_G31 for g in gpus)):
        return Finding("kernel", FAIL, f"{seen}: older than {dotted(MIN_KERNEL_B70)}, the "
                       "first whose xe lists the B70; no modules.alias to read", fix)  # fmt: skip
    return Finding("kernel", WARN, f"{seen}; no modules.alias to check {ids}",
                   "run doctor on the host")  # fmt: skip


def firmware_file(host: Host, name: str) -> str | None:
    for base in FIRMWARE_DIRS:
        for suffix in ("", ".zst", ".xz", ".gz"):
            path = f"{base}/{name}{suffix}"
            if host.path(path).is_file():
                return path
    return None


def guc_version(data: bytes) -> str | None:
    """The release version in a GuC blob's CSS header (drivers/gpu/drm/xe/xe_uc_fw_abi.h,
    struct uc_css_header: sw_version, the u32 at byte 64, major.minor.patch in bits 23-0),
    what xe compares with the version it recommends; None for a blob too short to hold it."""
    if len(data) < 68:
        return None
    word = int.from_bytes(data[64:68], "little")
    return f"{(word >> 16) & 0xFF}.{(word >> 8) & 0xFF}.{word & 0xFF}"


def firmware_bytes(host: Host, path: str) -> bytes | None:
    """PATH's content, unpacked where the standard library can (.xz, .gz); None for zstd,
    which it cannot (Ubuntu's firmware is zstd: dmesg names the version xe loaded)."""
    import gzip
    import lzma

    try:
        data = host.path(path).read_bytes()
        if path.endswith(".xz"):
            return lzma.decompress(data)
        if path.endswith(".gz"):
            return gzip.decompress(data)
    except (OSError, lzma.LZMAError, gzip.BadGzipFile, EOFError):
        return None
    return None if path.endswith(".zst") else data


def check_firmware(host: Host, preset: Preset) -> Finding:
    """GuC and HuC blobs the xe driver loads on Battlemage: a host file, not an image one."""
    if not any(g.is_battlemage for g in intel_gpus(host)):
        return Finding("GPU firmware", WARN if preset.flavor != "cpu" else OK, "no Battlemage GPU")
    if host.in_container():
        return Finding("GPU firmware", WARN, "in a container", "run doctor on the host to check it")
    found = {kind: firmware_file(host, name) for kind, name in FIRMWARE.items()}
    missing = [f"{kind} ({FIRMWARE[kind]})" for kind, path in found.items() if path is None]
    seen = "; ".join(f"{kind}: {path or 'missing'}" for kind, path in found.items())
    data = firmware_bytes(host, found["GuC"]) if found["GuC"] else None
    version = guc_version(data) if data else None
    if version:  # which GuC a B70 needs is not published: the version, for dmesg's advice
        seen += f" (GuC {version})"
    if missing:
        status = FAIL if preset.flavor != "cpu" else WARN
        return Finding(
            "GPU firmware",
            status,
            seen,
            f"{', '.join(missing)} missing (without GuC the GPU runs no compute work): "
            + fixes(host).firmware,
        )
    return Finding("GPU firmware", OK, seen)


def check_bar(host: Host, preset: Preset) -> Finding:
    """Resizable BAR: the largest BAR of each Battlemage GPU should map its whole VRAM."""
    gpus = [g for g in intel_gpus(host) if g.is_battlemage]
    if not gpus:
        return Finding("resizable BAR", WARN if preset.flavor != "cpu" else OK, "no Battlemage GPU")
    if any(not g.bars for g in gpus):
        return Finding("resizable BAR", WARN, "cannot read the PCI resources in sysfs")
    seen = ", ".join(f"{g.slot}: {gib(max(g.bars))}" for g in gpus)
    small = [g for g in gpus if max(g.bars) < FULL_BAR]
    if not small:
        return Finding("resizable BAR", OK, f"largest BAR {seen}")
    status = WARN if preset.flavor == "cpu" else FAIL
    return Finding(
        "resizable BAR",
        status,
        f"largest BAR {seen}: VRAM only partly CPU-visible",
        "in the firmware (BIOS/UEFI) setup: Above 4G Decoding and Re-Size BAR Support on, "
        f"then boot ({HOST_DOC}#resizable-bar)",
    )


def check_level_zero(host: Host, preset: Preset) -> Finding:
    """Which GPU each Level Zero index is, and whether the server's indices are B70s: an
    enabled Intel iGPU sorts first by PCI address, so with all of /dev/dri it is device 0."""
    devices = level_zero_devices(host)
    mask, source = affinity_mask(host, preset)
    seen = ", ".join(f"{i}: {g.slot} {g.name} ({node})" for i, (g, node) in enumerate(devices))
    if preset.flavor == "cpu":
        return Finding("Level Zero", OK, f"{seen or 'no Intel GPU node'} (not needed: CPU preset)")
    if not devices:
        return Finding("Level Zero", WARN, "no Intel GPU with a render node here")
    if mask is None:
        wanted, said = (
            list(range(max(preset.gpus, 1))),
            f"ZE_AFFINITY_MASK unset: devices 0-{max(preset.gpus, 1) - 1}",
        )
    else:
        wanted, said = [], f"ZE_AFFINITY_MASK={mask} ({source})"
        for part in mask.split(","):
            head = part.strip().split(".")[0]
            if head.isdigit():
                wanted.append(int(head))
    seen = f"{seen}; {said}"
    missing = [i for i in wanted if i >= len(devices)]
    wrong = [i for i in wanted if i < len(devices) and not devices[i][0].is_b70]
    fix = (
        "give the server only the B70s' render nodes (`arcvllm gpus --compose FILE`, "
        "docs/images.md), or set ZE_AFFINITY_MASK to the B70s' indices above"
    )
    if wrong:
        names = ", ".join(
            f"device {i} is {devices[i][0].slot} ({devices[i][0].name})" for i in wrong
        )
        return Finding("Level Zero", WARN, f"{seen}: {names}, not an Arc Pro B70", fix)
    if missing:
        return Finding(
            "Level Zero", WARN, f"{seen}: no device {', '.join(map(str, missing))} here", fix
        )
    return Finding("Level Zero", OK, seen)


def _model_contents(preset: Preset, folder, label: str) -> Finding:
    """A complete model folder against the preset (arcvllm model check)."""
    from arcvllm import model
    from arcvllm.errors import ArcvllmError

    try:
        line = model.problem(preset, folder, model.check(preset, folder))
    except ArcvllmError as exc:
        line = str(exc)
    if line:
        return Finding("model", FAIL, line, f"arcvllm model check {preset.name} {label}")
    return Finding("model", OK, f"{label}: config, tensors, size, tokenizer, template")


CHECKS = (
    check_render_nodes,
    check_render_access,
    check_render_gid,
    check_gpu_identity,
    check_replicas,
    check_driver,
    check_kernel,
    check_firmware,
    check_bar,
    check_level_zero,
    check_runtime,
    check_sycl_ls,
    check_xpu_smi,
    check_xpu_probe,
    check_shm,
    check_ram,
    check_model,
)


def diagnose(host: Host, preset: Preset) -> list[Finding]:
    return [check(host, preset) for check in CHECKS]


def render_table(rows: Sequence[Finding]) -> str:
    from arcvllm.text import columns

    return columns(
        [("CHECK", "STATUS", "SEEN", "FIX"), *((r.check, r.status, r.seen, r.fix) for r in rows)]
    )


def where(host: Host) -> str:
    """Container, or host with its distribution as doctor knows it (the fix lines' source)."""
    if host.in_container():
        return "container"
    known = distribution(host)
    name = host.os_release().get("PRETTY_NAME") or "unknown system"
    return f"host ({known.name if known else f'{name}: generic fix lines, {HOST_DOC}'})"


def report(host: Host, preset: Preset, rows: Sequence[Finding]) -> dict:
    """What --json prints: enough to read without the table."""
    known = distribution(host)
    return {
        "preset": preset.name,
        "where": "container" if host.in_container() else "host",
        "distribution": known.name if known else None,
        "root": str(host.root),
        "kernel": host.kernel_release(),
        "ok": not any(r.status == FAIL for r in rows),
        "rows": [asdict(r) for r in rows],
    }


def preflight(host: Host, preset_name: str | None, as_json: bool = False) -> int:
    """The table (or JSON) for PRESET_NAME (default: $ARCVLLM_PRESET, else the settings
    file's, else the production preset), CheckFailed on any fail."""
    name = preset_name or host.environ.get("ARCVLLM_PRESET") or host.settings.get("ARCVLLM_PRESET")
    preset = get_preset(name or DEFAULT_PRESET)
    rows = diagnose(host, preset)
    if as_json:
        print(json.dumps(report(host, preset, rows), indent=2))
    else:
        print(f"arcvllm doctor: {where(host)}, preset {preset.name}")
        print(render_table(rows))
    failed = [r.check for r in rows if r.status == FAIL]
    if failed:
        raise CheckFailed(f"cannot serve {preset.name}: {', '.join(failed)}")
    return 0
