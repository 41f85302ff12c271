"""The operator's host as arcvllm sees it: its GPUs and their render nodes, the key file
compose hands out, and a setting as compose resolves it (the shell's, else the settings
file's, else the compose file's default).

One home each: doctor, `arcvllm gpus`, the replicas of a scale-out and the compose
deployments read the GPUs from here (sysfs and /dev/dri under a root, so the tests build a
fake machine); the Docker client is arcvllm.docker's one choice, the checkout (compose
files, build/) arcvllm.paths.checkout_root. Runs where `docker compose` runs.
"""

from __future__ import annotations

import os
import secrets
import shlex
import shutil
import stat
import subprocess
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from arcvllm import options
from arcvllm.errors import Unavailable, UsageError

INTEL = 0x8086
# Battlemage PCI device IDs as the Linux kernel lists them for the xe driver
# (include/drm/intel/pciids.h: INTEL_BMG_G21_IDS, and INTEL_BMG_IDS adds the G31 IDs);
# compute-runtime's shared/source/xe2_hpg_core/bmg/definitions/device_ids_configs_bmg.h
# carries the same two lists (bmgG21DeviceIds, bmgG31DeviceIds).
BMG_G21 = frozenset(
    {0xE202, 0xE209, 0xE20B, 0xE20C, 0xE20D, 0xE210, 0xE211, 0xE212, 0xE215, 0xE216}
)
BMG_G31 = frozenset({0xE220, 0xE221, 0xE222, 0xE223})
BATTLEMAGE = BMG_G21 | BMG_G31
B70 = 0xE223  # Arc Pro B70 (BMG-G31), the GPU the presets are sized for

# Every arcvllm image carries its patch manifest here (docker/Dockerfile).
IMAGE_MARKER = "/opt/arcvllm/patches.json"


# Where the GPU's device nodes are: the render nodes' group is what RENDER_GID must name.
DRI_DIR = Path("/dev/dri")


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
    """The host (or a container, or a tree under ROOT) as read: every edge is injectable so
    tests can build a fake machine."""

    root: Path = Path("/")
    environ: Mapping[str, str] = field(default_factory=lambda: dict(os.environ))
    uid: int = field(default_factory=os.getuid)
    gids: frozenset[int] = field(default_factory=_groups)
    stat: Callable[[Path], os.stat_result] = os.stat
    disk_usage: Callable[[Path], tuple[int, int, int]] = shutil.disk_usage
    run: Callable[[Sequence[str], Mapping[str, str]], tuple[int, str]] = _run
    # The settings file's values (--env-file); inside the container compose has handed
    # them over as the environment.
    settings: Mapping[str, str] = field(default_factory=dict)

    def path(self, absolute: str) -> Path:
        return self.root / absolute.lstrip("/")

    def read(self, absolute: str) -> str | None:
        try:
            return self.path(absolute).read_text()
        except OSError:
            return None

    def in_container(self) -> bool:
        return self.path("/.dockerenv").exists() or self.path("/run/.containerenv").exists()

    def in_image(self) -> bool:
        """Inside an arcvllm image (its patch manifest is there), not merely in a container:
        a CI runner or a development container is a host to the model it would mount."""
        return self.in_container() and self.path(IMAGE_MARKER).is_file()

    def which(self, tool: str) -> str | None:
        """TOOL on $PATH, each entry read under the root (a tool outside it is not seen)."""
        for entry in self.environ.get("PATH", os.defpath).split(os.pathsep):
            if not entry.startswith("/"):
                continue  # relative entries mean nothing under another root
            candidate = self.path(entry) / tool
            if candidate.is_file() and os.access(candidate, os.X_OK):
                return str(candidate)
        return None

    def existing(self, absolute: str) -> Path | None:
        """ABSOLUTE or its nearest existing parent, never above the root."""
        probe = self.path(absolute)
        while not probe.exists():
            if probe == self.root or probe == probe.parent:
                return None
            probe = probe.parent
        return probe

    def kernel_release(self) -> str | None:
        text = self.read("/proc/sys/kernel/osrelease")
        return text.strip() if text else None

    def os_release(self) -> dict[str, str]:
        """The operating system's identification (os-release(5): /etc/os-release, else
        /usr/lib/os-release); empty when neither is readable."""
        for name in ("/etc/os-release", "/usr/lib/os-release"):
            text = self.read(name)
            if text is not None:
                return parse_os_release(text)
        return {}


def parse_os_release(text: str) -> dict[str, str]:
    """KEY=value lines of an os-release file, values unquoted as a shell would (os-release(5)
    allows shell quoting); comments, blank and malformed lines are skipped."""
    values = {}
    for line in text.splitlines():
        key, eq, raw = line.strip().partition("=")
        if not eq or not key.isidentifier():
            continue
        try:
            words = shlex.split(raw)
        except ValueError:
            continue
        values[key] = " ".join(words)
    return values


@dataclass(frozen=True)
class Gpu:
    slot: str
    device: int
    driver: str | None
    bars: tuple[int, ...] = ()  # sizes of the PCI BARs in bytes (sysfs `resource`)

    @property
    def is_b70(self) -> bool:
        return self.device == B70

    @property
    def is_battlemage(self) -> bool:
        return self.device in BATTLEMAGE

    @property
    def name(self) -> str:
        if self.is_b70:
            return "Arc Pro B70"
        if self.device in BMG_G31:
            return "Battlemage G31"
        if self.device in BMG_G21:
            return "Battlemage G21"
        return "Intel GPU"


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
        gpus.append(Gpu(dev.name, device, name, bar_sizes(dev)))
    return gpus


def render_node(host: Host, gpu: Gpu) -> str | None:
    """GPU's render node name (renderD129) from sysfs, or None (no driver bound)."""
    drm = host.path(f"/sys/bus/pci/devices/{gpu.slot}/drm")
    nodes = sorted(drm.glob("renderD*")) if drm.is_dir() else []
    return nodes[0].name if nodes else None


def level_zero_devices(host: Host) -> list[tuple[Gpu, str]]:
    """The Intel GPUs Level Zero enumerates here, in order: those whose render node this
    machine (or container: sysfs shows the host's PCI devices, /dev/dri only the nodes it
    was given) can see, by PCI address, the order of /dev/dri/by-path that compute-runtime
    walks (ZE_ENABLE_PCI_ID_DEVICE_ORDER=1 forces it). Index i is ZE_AFFINITY_MASK's i."""
    found = []
    for gpu in intel_gpus(host):
        node = render_node(host, gpu)
        if node and host.path(f"/dev/dri/{node}").exists():
            found.append((gpu, node))
    return found


def bar_sizes(dev: Path) -> tuple[int, ...]:
    """Sizes of BARs 0-5 from sysfs `resource` (one `start end flags` line each)."""
    sizes = []
    try:
        lines = (dev / "resource").read_text().splitlines()[:6]
    except OSError:
        return ()
    for line in lines:
        try:
            start, end = (int(x, 16) for x in line.split()[:2])
        except ValueError:
            continue
        sizes.append(end - start + 1 if end > start else 0)
    return tuple(sizes)


@dataclass(frozen=True)
class RenderNode:
    """One B70's render node as a replica gets it: the GPU's PCI slot, the node's path, its
    GID, its by-path names."""

    slot: str
    path: str  # /dev/dri/renderD129
    gid: int
    by_path: tuple[str, ...]  # e.g. ("pci-0000:04:00.0-render",)


def b70s(host: Host) -> list[RenderNode]:
    """The B70s in sysfs with the render node each one has, in PCI slot order."""
    cards = []
    by_path_dir = host.path("/dev/dri/by-path")
    links = sorted(by_path_dir.iterdir()) if by_path_dir.is_dir() else []
    for gpu in intel_gpus(host):
        if not gpu.is_b70:
            continue
        name = render_node(host, gpu)
        if name is None:
            continue  # no driver bound: doctor says why
        names = tuple(
            link.name
            for link in links
            if link.is_symlink() and Path(os.readlink(link)).name == name
        )
        gid = host.stat(host.path(f"/dev/dri/{name}")).st_gid
        cards.append(RenderNode(gpu.slot, f"/dev/dri/{name}", gid, names))
    return cards


def render_gid(dri_dir: Path = DRI_DIR) -> str:
    """The GID compose gives the server (RENDER_GID): the first render node's group, ""
    on a host without one (a CPU host)."""
    return next((str(gid) for gid in render_node_gids(dri_dir).values()), "")


def default_flavor(dri_dir: Path = DRI_DIR) -> str:
    """xpu where this host has a GPU render node, cpu everywhere else: what a deployment or
    a build runs when none is named."""
    return "xpu" if any(dri_dir.glob("renderD*")) else "cpu"


def effective(
    key: str, settings: Mapping[str, str], environ: Mapping[str, str], default: str
) -> str:
    """A setting as compose resolves it: the shell's value wins, then the settings file's
    (SETTINGS: arcvllm.operate.settings.load of it), then compose.yaml's default."""
    return environ.get(key) or settings.get(key) or default


# compose.yaml's default for the gateway's published port (PORT).
DEFAULT_PORT = "8443"

# compose.yaml's default for the key file: the secret `api-key` of every server and the gateway.
DEFAULT_API_KEY_FILE = "../secrets/api-key"


def api_key_file(
    settings: Mapping[str, str], compose_dir: Path, environ: Mapping[str, str]
) -> Path:
    """The host file compose hands out as the secret `api-key`: VLLM_API_KEY_FILE from the
    shell (which wins, as in compose), else the settings file's, else compose.yaml's default;
    a relative path is read from COMPOSE_DIR (docker/), as compose reads it."""
    path = Path(effective("VLLM_API_KEY_FILE", settings, environ, DEFAULT_API_KEY_FILE))
    return path if path.is_absolute() else compose_dir / path


# The images' user (docker/Dockerfile: `vllm` and the gateway's, UID 1000 with its own
# group 1000): the one that reads the key file compose bind-mounts as a secret.
CONTAINER_UID = 1000
CONTAINER_GID = 1000


def readable_by(st: os.stat_result, uid: int, gids: frozenset[int]) -> bool:
    """Read access by mode bits, the way the kernel decides for a non-root UID in GIDS."""
    if st.st_uid == uid:
        return bool(st.st_mode & stat.S_IRUSR)
    if st.st_gid in gids:
        return bool(st.st_mode & stat.S_IRGRP)
    return bool(st.st_mode & stat.S_IROTH)


def check_api_key_file(path: Path) -> None:
    """A key file compose can hand out: one line, exit 3, before anything starts (compose
    would fail on a missing file, and every server and the gateway refuse a key that breaks
    the key rule, options.KEY_RULE, or one their user cannot read). Readable is decided for
    the containers' UID 1000, not for the caller: root reads anything."""
    hint = "make one: arcvllm deploy key (make key)"
    try:
        data = path.read_bytes()
        st = path.stat()
    except OSError as exc:
        raise Unavailable(
            f"VLLM_API_KEY_FILE={path} is not a readable file ({exc.strerror}): {hint}"
        ) from None
    try:
        options.key_in(data)
    except ValueError:
        raise Unavailable(f"VLLM_API_KEY_FILE={path}: {options.KEY_RULE}") from None
    if not readable_by(st, CONTAINER_UID, frozenset({CONTAINER_GID})):
        raise Unavailable(
            f"VLLM_API_KEY_FILE={path} is not readable by UID {CONTAINER_UID}, the containers' "
            f"user (owner UID {st.st_uid}, mode {stat.S_IMODE(st.st_mode):04o}): chmod 644 it "
            f"in a folder only you enter (chmod 700 {path.parent}), or {hint}"
        )


def new_api_key_file(path: Path, replace: bool = False) -> str:
    """A new key (openssl rand -hex 32's form) in PATH, made so the containers read it and
    no other user of this host does. In a folder only its owner enters (made 0700 when
    missing) the file is 0644: the containers' UID 1000 reads the bind-mounted file by its
    own mode. In a folder others enter, root gives the file to UID 1000 (0600); anyone else
    is refused. An existing PATH is a usage error unless REPLACE. Returns the key; nothing
    prints it."""
    if path.is_dir():
        raise UsageError(f"{path} is a directory")
    if path.exists() and not replace:
        raise UsageError(f"{path} already exists: --force replaces it (clients need the new key)")
    folder = path.parent
    if not folder.exists():
        folder.mkdir(parents=True, mode=0o700)
    private = not folder.stat().st_mode & (stat.S_IXGRP | stat.S_IXOTH)
    if not private and os.geteuid() != 0:
        raise UsageError(
            f"{folder} lets other users of this host in: put the key in a folder only you "
            "enter (the default secrets/ is made 0700), or run this as root"
        )
    key = secrets.token_hex(32)
    scratch = folder / f".{path.name}.new"
    scratch.unlink(missing_ok=True)
    descriptor = os.open(scratch, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(descriptor, "w") as out:
        out.write(f"{key}\n")
    if private:
        scratch.chmod(0o644)
    else:
        os.chown(scratch, CONTAINER_UID, CONTAINER_GID)
    scratch.replace(path)
    return key


def render_node_gids(dri_dir: Path = DRI_DIR) -> dict[str, int]:
    """The group of each render node (renderD*) under DRI_DIR, by path; none (a CPU host,
    no /dev/dri) is an empty mapping."""
    gids = {}
    for node in sorted(dri_dir.glob("renderD*")):
        try:
            gids[str(node)] = node.stat().st_gid
        except OSError:
            continue
    return gids
