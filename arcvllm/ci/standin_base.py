"""The base image stand-in: ubuntu:24.04's shape made from Debian's archive.

No registry answers here, so the image is a minbase mmdebstrap from the mirror in apt's
sources (arcvllm/ci/standins.yaml says which suite and why), with what the XPU build relies
on of ubuntu:24.04: glibc >= 2.39, `python3.12` and `python3.12-dev` installed as dpkg
packages laid out as Ubuntu's (built here from a CPython 3.12 on this host, since Debian has
no 3.12), and the user `ubuntu` with UID/GID 1000. mmdebstrap runs in a container on the
engine, as that container's root: a user who may use the engine needs no root here.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import tempfile
from collections.abc import Mapping
from pathlib import Path

from arcvllm.errors import ArcvllmError

# Bump when the way the image is made changes: the image's label then differs (stale).
VERSION = 4
LABEL = "org.arcvllm.standin.fingerprint"
# The fields of the stand-in's entry the image is made of (its label's fingerprint).
INPUTS = ("image", "suite", "python", "runtime_debs", "user")
MULTIARCH = "usr/lib/x86_64-linux-gnu"
# Not packaged: tests, IDLE and Tk (whose X11 libraries the base does not carry), pip's own
# site-packages of the host, byte code.
SKIP = ("site-packages", "test", "idlelib", "tkinter", "turtledemo", "__pycache__", "_tkinter*")


def _run(cmd: list[str], log: Path | None = None, **kwargs) -> None:
    proc = subprocess.run(cmd, capture_output=True, text=True, **kwargs)
    if log is not None:
        log.write_text(proc.stdout + proc.stderr)
    if proc.returncode != 0:
        tail = " | ".join((proc.stderr or proc.stdout).strip().splitlines()[-3:])
        raise ArcvllmError(f"standins: {' '.join(cmd[:3])} failed: {tail}")


def _control(name: str, version: str, depends: str, provides: str, what: str) -> str:
    return (
        f"Package: {name}\nVersion: {version}\nArchitecture: amd64\n"
        f"Maintainer: arcvllm CI <ci@arcvllm.invalid>\nDepends: {depends}\n"
        + (f"Provides: {provides}\n" if provides else "")
        + f"Description: CI stand-in for Ubuntu 24.04's {name}\n {what}\n"
    )


def recorded_prefix(lib: Path, python: Path) -> str:
    """The prefix the CPython at PYTHON was built for, as its sysconfig data records it: a
    copy (a user's of another's pyenv) or a relocatable build (python-build-standalone's
    `/install`) was built for another path than the one it is at."""
    for data in lib.glob("_sysconfigdata_*.py"):
        if found := re.search(r"'prefix': '([^']+)'", data.read_text()):
            return found.group(1)
    return str(python)


def _rewrite_prefix(path: Path, prefix: str) -> None:
    text = path.read_text()
    path.write_text(text.replace(prefix, "/usr"))


def python_debs(python: Path, entry: Mapping, out: Path) -> list[Path]:
    """python3.12 and python3.12-dev as .debs, from the host CPython at PYTHON."""
    ver = entry["python"]["version"]
    deb_ver = entry["python"]["deb_version"]
    runtime = ", ".join(["libc6 (>= 2.39)", *entry["runtime_debs"].split()])
    lib = python / "lib" / f"python{ver}"
    prefix = recorded_prefix(lib, python)
    config = next(lib.glob(f"config-{ver}-*"))

    main = out / f"python{ver}"
    (main / "usr/bin").mkdir(parents=True)
    shutil.copy2(python / "bin" / f"python{ver}", main / "usr/bin")
    skip = shutil.ignore_patterns(*SKIP, config.name)
    shutil.copytree(lib, main / f"usr/lib/python{ver}", ignore=skip, symlinks=True)
    for data in (main / f"usr/lib/python{ver}").glob("_sysconfigdata_*.py"):
        _rewrite_prefix(data, prefix)
    (main / MULTIARCH).mkdir(parents=True)
    shutil.copy2(python / "lib" / f"libpython{ver}.so.1.0", main / MULTIARCH)
    provides = f"python{ver}-minimal, python{ver}-venv, libpython{ver}-stdlib, libpython{ver}t64"
    what = f"CPython {python.name} as /usr/bin/python{ver}, /usr/lib/python{ver}, {MULTIARCH}"
    (main / "DEBIAN").mkdir()
    (main / "DEBIAN/control").write_text(_control(main.name, deb_ver, runtime, provides, what))

    dev = out / f"python{ver}-dev"
    (dev / "usr/include").mkdir(parents=True)
    shutil.copytree(python / "include" / f"python{ver}", dev / f"usr/include/python{ver}")
    shutil.copytree(config, dev / f"usr/lib/python{ver}/{config.name}", symlinks=True)
    (dev / "usr/bin").mkdir()
    shutil.copy2(python / "bin" / f"python{ver}-config", dev / "usr/bin")
    _rewrite_prefix(dev / f"usr/bin/python{ver}-config", prefix)
    makefile = dev / f"usr/lib/python{ver}/{config.name}/Makefile"
    if makefile.is_file():
        _rewrite_prefix(makefile, prefix)
    (dev / MULTIARCH).mkdir(parents=True)
    (dev / MULTIARCH / f"libpython{ver}.so").symlink_to(f"libpython{ver}.so.1.0")
    what = f"CPython {python.name}'s headers as /usr/include/python{ver}"
    (dev / "DEBIAN").mkdir()
    depends = f"python{ver} (= {deb_ver})"
    (dev / "DEBIAN/control").write_text(
        _control(dev.name, deb_ver, depends, f"libpython{ver}-dev", what)
    )

    debs = []
    for tree in (main, dev):
        deb = out / f"{tree.name}_{deb_ver}_amd64.deb"
        # gzip at its fastest: these debs live only in this run (xz took 69 s of 2 cores)
        _run(["dpkg-deb", "--root-owner-group", "-Zgzip", "-z1", "--build", str(tree), str(deb)])
        debs.append(deb)
    return debs


# Where the maker container sees its inputs: the python debs and this host's apt snippets.
DEBS_AT, APT_AT = "/standin-debs", "/host-apt"
# The capabilities mmdebstrap's root mode needs in a container (its own mount namespace for
# /proc and /dev in the chroot), no more: not --privileged.
MAKER_CAPS = (
    "--cap-add", "SYS_ADMIN",
    "--security-opt", "apparmor=unconfined",
    "--security-opt", "seccomp=unconfined",
)  # fmt: skip
# The maker's own shell: this host's apt snippets (a mirror's settings) for its apt, then
# mmdebstrap from that mirror, the tar on stdout. Arguments: suite, mirror, include, user
# name, uid, gid; DEBS_AT and APT_AT in its environment; the hooks' $1 is mmdebstrap's root.
MAKER = r"""
set -eu
suite=$1 mirror=$2 include=$3 user=$4 uid=$5 gid=$6
cp "$APT_AT"/99* /etc/apt/apt.conf.d/ 2>/dev/null || true
apt-get update -qq >&2 && apt-get install -y -qq --no-install-recommends mmdebstrap >&2
# for the hooks (each its own shell)
export PIP_CONF='[global]\ncert = /etc/ssl/certs/ca-certificates.crt\n'
export JUNK='var/cache/apt/archives var/lib/apt/lists'
set --
for f in "$APT_AT"/99*; do [ ! -f "$f" ] || set -- "$@" "--aptopt=$f"; done
exec mmdebstrap --quiet --variant=minbase --include="$include" "$@" \
    --customize-hook='rm -f "$1/etc/apt/apt.conf.d/99mmdebstrap"' \
    --customize-hook='cp "$DEBS_AT"/*.deb "$1/tmp/"' \
    --customize-hook='chroot "$1" sh -c "dpkg -i /tmp/*.deb && rm /tmp/*.deb"' \
    --customize-hook="chroot \"\$1\" groupadd -g $gid $user" \
    --customize-hook="chroot \"\$1\" useradd -m -u $uid -g $gid -s /bin/bash $user" \
    --customize-hook='printf "$PIP_CONF" >"$1/etc/pip.conf"' \
    --customize-hook='cp "$APT_AT"/99* "$1/etc/apt/apt.conf.d/" 2>/dev/null || :' \
    --customize-hook='cd "$1" && find $JUNK -maxdepth 1 -type f -delete' \
    "$suite" - "$mirror"
"""


def build(
    entry: Mapping,
    python: Path,
    mirror: str,
    fingerprint: str,
    scratch: Path,
    docker: str,
    maker: str,
) -> None:
    """The python debs made here; mmdebstrap, the debs and the user in a container of MAKER
    (a Debian image on the engine) as its root, not this host's: any user of the engine can
    make it. The tar goes straight to `docker import` as entry['image'] with its label.

    In the image, besides mmdebstrap's minbase of the suite: the python debs installed;
    Ubuntu's user (UID/GID 1000); a site-wide pip config trusting the system CA store, as
    Ubuntu's patched pip does (the host's CPython bundles pip's own certifi; the build's CA
    secret is mounted over that store); this host's apt snippets, as scripts/ci/engine.sh
    gives the Debian base."""
    scratch.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix="standin-base.", dir=scratch)).resolve()
    try:
        debs = work / "debs"
        debs.mkdir()
        for deb in python_debs(python, entry, work / "trees"):
            shutil.move(deb, debs / deb.name)
        debs.chmod(0o755)  # read by the maker's root: a user's umask may say otherwise
        user = entry["user"]
        args = [entry["suite"], mirror, ",".join(entry["runtime_debs"].split()), user["name"],
                str(user["uid"]), str(user["gid"])]  # fmt: skip
        make = subprocess.Popen(
            [docker, "run", "--rm", *MAKER_CAPS,
             "-e", f"DEBS_AT={DEBS_AT}", "-v", f"{debs}:{DEBS_AT}:ro",
             "-e", f"APT_AT={APT_AT}", "-v", f"/etc/apt/apt.conf.d:{APT_AT}:ro",
             maker, "sh", "-c", MAKER, "maker", *args],
            stdout=subprocess.PIPE,
            stderr=(work / "maker.log").open("w"),
        )  # fmt: skip
        # Imported under a name of its own, given the image's name only once both ends
        # succeeded: a maker that fails leaves no image (an empty one would carry the label).
        partial = f"{entry['image'].split(':')[0]}:partial-{os.getpid()}"
        changes = [f"LABEL {LABEL}={fingerprint}", 'CMD ["/bin/bash"]']
        cmd = [docker, "import", *(x for c in changes for x in ("--change", c)), "-", partial]
        imported = subprocess.run(cmd, stdin=make.stdout, capture_output=True, text=True)
        make.wait()
        try:
            if make.returncode != 0:
                tail = " | ".join((work / "maker.log").read_text().strip().splitlines()[-3:])
                raise ArcvllmError(f"standins: mmdebstrap in {maker} failed: {tail}")
            if imported.returncode != 0:
                raise ArcvllmError(f"standins: docker import failed: {imported.stderr.strip()}")
            _run([docker, "tag", partial, entry["image"]])
        finally:
            subprocess.run([docker, "image", "rm", partial], capture_output=True)
    finally:
        shutil.rmtree(work, ignore_errors=True)


# One container: the shape of ubuntu:24.04 the build relies on, then the Dockerfile's own
# apt steps (python3.12 must already be there; the GPU debs must install and give ze_api.h).
CHECK = r"""
set -u
echo "glibc=$(ldd --version | head -n 1 | grep -oE '[0-9]+\.[0-9]+$')"
echo "uid1000=$(getent passwd 1000 | cut -d: -f1,4)"
python3.12 -m venv /tmp/v >/dev/null 2>&1 \
    && echo "pip=$(/tmp/v/bin/pip --version | cut -d' ' -f1,2)"
python3.12 -c 'import ssl, sqlite3, ctypes, lzma, bz2, zlib' && echo "stdlib=ok"
test -f /usr/include/python3.12/Python.h && test -e /usr/lib/x86_64-linux-gnu/libpython3.12.so.1.0 \
    && echo "layout=ok"
apt-get update -qq >/dev/null 2>&1 || echo "apt-update=failed"
echo "python-upgrades=$(apt-get install -s python3.12 python3.12-dev python3-venv 2>/dev/null \
    | grep -cE '^(Inst|Remv) python3\.12( |-dev )')"
if [ -d /debs ]; then
    apt-get install -y -qq --no-install-recommends /debs/*.deb >/tmp/debs.log 2>&1 \
        && echo "debs=ok" || echo "debs=$(tail -n 3 /tmp/debs.log | tr '\n' ' ')"
    test -f /usr/include/level_zero/ze_api.h && echo "ze_api=ok"
fi
"""


def check(entry: Mapping, debs: Path | None, docker: str) -> list[str]:
    """What differs from the shape the XPU build expects, one line each (empty: none)."""
    mount = ["-v", f"{debs}:/debs:ro"] if debs is not None and debs.is_dir() else []
    proc = subprocess.run(
        [docker, "run", "--rm", *mount, entry["image"], "bash", "-c", CHECK],
        capture_output=True,
        text=True,
    )
    if proc.returncode != 0 and not proc.stdout:
        return [f"{entry['image']}: does not run: {proc.stderr.strip()[-200:]}"]
    got = dict(line.split("=", 1) for line in proc.stdout.splitlines() if "=" in line)
    return problems(got, entry, with_debs=bool(mount))


def problems(got: Mapping[str, str], entry: Mapping, with_debs: bool) -> list[str]:
    """The checks of `check`, on its KEY=VALUE lines (pure: unit-tested)."""
    user = entry["user"]
    found = []
    glibc = got.get("glibc", "")
    if not re.fullmatch(r"\d+\.\d+", glibc) or tuple(map(int, glibc.split("."))) < (2, 39):
        found.append(f"glibc {glibc or '?'} < 2.39 (ubuntu:24.04 has 2.39)")
    if got.get("uid1000") != f"{user['name']}:{user['gid']}":
        found.append(f"UID 1000 is {got.get('uid1000') or 'nobody'}, not {user['name']}")
    if not got.get("pip", "").startswith("pip "):
        found.append("python3.12 -m venv gives no working pip")
    for key, what in (("stdlib", "python3.12 lacks ssl/sqlite3/ctypes/lzma/bz2/zlib"),
                      ("layout", "python3.12 not laid out as Ubuntu's")):  # fmt: skip
        if got.get(key) != "ok":
            found.append(what)
    if got.get("python-upgrades") != "0":
        found.append("apt would replace the python3.12 packages")
    if with_debs:
        if got.get("debs") != "ok":
            found.append(f"the GPU debs do not install: {got.get('debs', '?')}")
        if got.get("ze_api") != "ok":
            found.append("no /usr/include/level_zero/ze_api.h after the GPU debs")
    return found
