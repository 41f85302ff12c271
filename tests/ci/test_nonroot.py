"""README's commands for a user who is not root but may use a running Docker engine (a
member of its socket's group): the engine is taken as it is, `make tools` fetches the Debian
tools into the checkout, and release-check.sh takes the release on that same engine, with
no apt, no dpkg lock and no second dockerd.

As root (CI here) each test makes a throwaway user in the group of the engine's socket,
runs the scripts as that user (runuser, a clean environment), and deletes the user and its
files afterwards; the socket itself is not changed. As any other user the tests run as that
user. Either way the apt and dpkg files' mtimes are compared before and after.

Two of them failed on the scripts before this change (run here as root, with the user they
make): `make tools` as a user stopped with "make tools: missing Debian packages: prometheus
prometheus-alertmanager kubernetes-client (apt-get install them as root)" (exit 3, make's
2), and release-check.sh as a user with "release-check: a Docker engine still answers on
/run/arcvllm-docker: stop it first" (exit 3: it starts a second dockerd, which needs root).
"""

from __future__ import annotations

import grp
import json
import os
import pwd
import shutil
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from support import ROOT
from support.docker import docker

pytestmark = pytest.mark.docker

BASE_IMAGE = "debian:bookworm-slim"  # scripts/ci/engine.sh's, on every engine it prepares
TOOLS = ("promtool", "prometheus", "prometheus-alertmanager", "kubectl")
# What apt and dpkg write when they install or update (locks, state, sources): none may move.
APT_FILES = (
    "/var/lib/dpkg/status",
    "/var/lib/dpkg/lock",
    "/var/lib/dpkg/lock-frontend",
    "/var/lib/dpkg/updates",
    "/var/lib/apt/lists",
    "/var/lib/apt/lists/lock",
    "/var/lib/apt/extended_states",
    "/var/cache/apt/archives",
    "/var/cache/apt/archives/lock",
    "/etc/apt",
    "/etc/apt/sources.list.d",
    "/etc/apt/preferences.d",
)


def apt_state() -> dict[str, int | None]:
    """Each apt/dpkg file's mtime (ns), None if absent, and what /etc/apt holds."""
    state: dict[str, int | None] = {
        p: os.stat(p).st_mtime_ns if os.path.exists(p) else None for p in APT_FILES
    }
    for path in sorted(Path("/etc/apt").rglob("*")):
        state[str(path)] = path.lstat().st_mtime_ns
    return state


def socket_path() -> Path:
    host = os.environ.get("DOCKER_HOST", "")
    if host.startswith("unix://"):
        return Path(host.removeprefix("unix://"))
    return Path("/var/run/docker.sock")


@dataclass
class User:
    """Runs commands as NAME (runuser when we are root) in a clean environment."""

    name: str
    home: Path
    as_root: bool

    def env(self, **extra: str) -> dict[str, str]:
        env = {
            "PATH": "/usr/local/bin:/usr/bin:/bin",
            "HOME": str(self.home),
            "TMPDIR": str(self.home / "tmp"),
            "LANG": "C.UTF-8",
        }
        if "DOCKER_HOST" in os.environ:
            env["DOCKER_HOST"] = os.environ["DOCKER_HOST"]
        return {**env, **extra}

    def run(self, *args: str, timeout: float = 300, **extra: str) -> subprocess.CompletedProcess:
        prefix = ["runuser", "-u", self.name, "--"] if self.as_root else []
        env = [f"{k}={v}" for k, v in self.env(**extra).items()]
        return subprocess.run(
            [*prefix, "env", "-i", *env, *args],
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=timeout,
        )


@pytest.fixture
def user(engine) -> Iterator[User]:
    if os.geteuid() != 0:
        home = ROOT / "build" / f"nonroot-{os.getpid()}"
        home.mkdir(parents=True)
        (home / "tmp").mkdir()
        try:
            yield User(pwd.getpwuid(os.getuid()).pw_name, home, as_root=False)
        finally:
            shutil.rmtree(home, ignore_errors=True)
        return
    gid = socket_path().stat().st_gid
    if gid == 0:
        pytest.fail(f"{socket_path()} belongs to root's group: no group a user may join")
    group = grp.getgrgid(gid).gr_name
    name = f"arcvnr{os.getpid()}"
    home = ROOT / "build" / f"nonroot-{name}"
    made = subprocess.run(
        ["useradd", "--no-create-home", "--home-dir", str(home), "--shell", "/bin/bash",
         "--groups", group, name],
        capture_output=True, text=True,
    )  # fmt: skip
    assert made.returncode == 0, made.stderr
    try:
        entry = pwd.getpwnam(name)
        (home / "tmp").mkdir(parents=True)
        for path in (home, home / "tmp"):
            os.chown(path, entry.pw_uid, entry.pw_gid)
        made = User(name, home, as_root=True)
        if made.run("test", "-x", "scripts/ci/engine.sh", timeout=30).returncode != 0:
            pytest.fail(f"{name}, not root, cannot read this checkout ({ROOT}): make it readable")
        yield made
    finally:
        gone = subprocess.run(["userdel", name], capture_output=True, text=True)
        shutil.rmtree(home, ignore_errors=True)
        assert gone.returncode == 0, gone.stderr
        assert subprocess.run(["id", name], capture_output=True).returncode != 0


def user_venv(user: User) -> Path:
    """The checkout's venv as USER can run it: a venv made by root may point at a Python
    under /root (pyenv); then a venv of the system's Python reading .venv's packages."""
    if user.run(".venv/bin/python", "-c", "", timeout=60).returncode == 0:
        return ROOT / ".venv"
    site = next((ROOT / ".venv" / "lib").glob("python3*/site-packages"))
    venv = user.home / "venv"
    made = user.run("/usr/bin/python3", "-m", "venv", "--without-pip", str(venv), timeout=120)
    assert made.returncode == 0, made.stderr
    own = venv / "lib" / site.parent.name / "site-packages"
    assert own.is_dir(), f"the system's Python is not {site.parent.name}, as .venv's is"
    (own / "checkout.pth").write_text(f"import site; site.addsitedir({str(site)!r})\n")
    wrapper = venv / "bin" / "arcvllm"
    wrapper.write_text(f'#!/bin/sh\nexec {venv}/bin/python -m arcvllm "$@"\n')
    wrapper.chmod(0o755)
    return venv


def test_engine_sh_takes_the_running_engine_for_a_user_in_its_group(user):
    before = apt_state()
    up = user.run("bash", "scripts/ci/engine.sh", "up", timeout=120)
    assert up.returncode == 0, up.stderr
    assert up.stdout.strip().startswith("DOCKER_HOST=unix://"), up.stdout
    version = user.run("docker", "version", "--format", "{{.Server.Version}}", timeout=60,
                       DOCKER_HOST=up.stdout.strip().removeprefix("DOCKER_HOST="))  # fmt: skip
    assert version.returncode == 0, version.stderr
    assert apt_state() == before


def test_make_tools_unpacks_the_debian_tools_in_the_checkout_for_a_user(user):
    """A PATH without the four tools (every other command of /usr/bin and /bin linked), so
    `make tools` fetches all three packages even where the system has them."""
    shadow = user.home / "path"
    shadow.mkdir()
    for bin_dir in (Path("/usr/bin"), Path("/bin")):
        for tool in bin_dir.iterdir():
            if tool.name not in TOOLS and not (shadow / tool.name).exists():
                (shadow / tool.name).symlink_to(tool)
    build = user.home / "build"
    before = apt_state()
    done = user.run("make", "--no-print-directory", "tools", f"BUILD={build}",
                    timeout=900, PATH=str(shadow))  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    assert "make tools: fetching prometheus prometheus-alertmanager kube" in done.stdout
    for tool in TOOLS:
        binary = build / "tools" / "bin" / tool
        assert binary.resolve().is_relative_to(build / "tools" / "root"), binary
        flag = "version" if tool == "kubectl" else "--version"
        extra = ["--client"] if tool == "kubectl" else []
        ran = user.run(str(binary), flag, *extra, timeout=60)
        assert ran.returncode == 0, f"{tool}: {ran.stderr}"
    # kubectl builds the overlays (Debian bookworm's 1.20 did not: kustomize v2)
    overlay = ROOT / "deploy" / "kubernetes" / "overlays" / "one-b70"
    built = user.run(str(build / "tools" / "bin" / "kubectl"), "kustomize", str(overlay))
    assert built.returncode == 0, built.stderr
    # Once there, found on the Makefile's PATH: a second run fetches nothing.
    again = user.run("make", "--no-print-directory", "tools", f"BUILD={build}",
                     timeout=120, PATH=str(shadow))  # fmt: skip
    assert again.returncode == 0, again.stderr
    assert "fetching" not in again.stdout
    assert apt_state() == before


def test_release_check_takes_the_release_on_the_running_engine_for_a_user(user):
    """A stand-in release (the base image under two repositories of its own, unsigned): the
    user's release-check removes both from the engine it is given, starts no engine of its
    own, and fails at the signature check, the first step that needs a real release."""
    digest = docker("image", "inspect", "--format", "{{.Id}}", BASE_IMAGE).stdout.strip()
    repos = {n: f"127.0.0.1:1/arcvllm-{user.name}/{n}" for n in ("cpu", "gateway")}
    release = user.home / "release"
    release.mkdir()
    images = [{"name": n, "ref": f"{r}@{digest}", "repository": r} for n, r in repos.items()]
    (release / "manifest.json").write_text(json.dumps({"images": images}))
    (release / "cosign.pub").write_text("not a key\n")
    before, clean_engine = apt_state(), Path("/run/arcvllm-docker-clean").exists()
    try:
        for repo in repos.values():
            tagged = user.run("docker", "tag", BASE_IMAGE, f"{repo}:ci", timeout=60)
            assert tagged.returncode == 0, tagged.stderr
        done = user.run(
            "bash", "scripts/ci/release-check.sh", timeout=300, VENV=str(user_venv(user)),
            RELEASE_DIR=str(release), REGISTRY_DIR=str(user.home / "registry"),
        )  # fmt: skip
        out = done.stdout + done.stderr
        assert done.returncode != 0, out
        assert "release-check: not root, so no clean engine" in out
        assert f"FAIL {repos['cpu']}@" in out  # the signature check
        assert "release-pull: the engine that answers, 2 references of the release removed" in out
        assert "still answers" not in out
        assert Path("/run/arcvllm-docker-clean").exists() == clean_engine
        for repo in repos.values():
            gone = docker("image", "inspect", f"{repo}@{digest}", check=False)
            assert gone.returncode != 0, f"{repo} is still on the engine"
        docker("image", "inspect", BASE_IMAGE)  # what the release's images shared stays
        assert apt_state() == before
    finally:
        for repo in repos.values():
            docker("image", "rm", f"{repo}:ci", check=False)


MAKE_BASE = """
import sys
from pathlib import Path
from arcvllm.ci import standin_base, standins
from arcvllm.docker import docker_binary
entry = {**standins.load().entry("base-image"), "image": sys.argv[1]}
python = standins.host_python(entry["python"]["host_globs"])
print(python)
standin_base.build(entry, python, standins.apt_mirror(), "test", Path(sys.argv[2]),
                   docker_binary(), entry["maker"])
"""


@pytest.mark.base
def test_a_user_in_the_engines_group_makes_the_standin_base_from_a_python_of_their_own(user):
    """The XPU rehearsal's base image (arcvllm/ci/standin_base.py) for a user: mmdebstrap runs
    as a container's root on the engine, from the user's own CPython 3.12 (here a copy of the
    host's in ~/.pyenv, as pyenv puts it). Before, mmdebstrap ran on the host into a
    directory, then chroot: `make standins` refused any user ("needs root ... run `make
    standins` once as root", exit 3), and the CPython was looked for under /root only."""
    from arcvllm.ci import standin_base, standins
    from arcvllm.docker import docker_binary

    entry = standins.load().entry("base-image")
    theirs = user.home / ".pyenv" / "versions"
    source = standins.host_python(entry["python"]["host_globs"])
    named = {}
    if user.as_root:  # the test's own CPython, copied as the user's (root's is mode 700 here)
        skip = shutil.ignore_patterns(*standin_base.SKIP)
        shutil.copytree(source, theirs / source.name, symlinks=True, ignore=skip)
        subprocess.run(["chown", "-R", f"{user.name}:", str(user.home / ".pyenv")], check=True)
    else:  # the user's own, under the HOME the tests do not give it
        named[standins.PYTHON_ENV] = str(source)
    image = f"arcvllm-test-standin-{os.getpid()}:base"
    before = apt_state()
    try:
        made = user.run(str(user_venv(user) / "bin" / "python"), "-c", MAKE_BASE, image,
                        str(user.home / "scratch"), timeout=900, **named)  # fmt: skip
        assert made.returncode == 0, made.stdout + made.stderr[-3000:]
        if user.as_root:
            assert made.stdout.strip().startswith(str(theirs)), made.stdout
        assert standin_base.check({**entry, "image": image}, None, docker_binary()) == []
        label = docker(
            "image", "inspect", "-f", f'{{{{index .Config.Labels "{standin_base.LABEL}"}}}}', image
        )
        assert label.stdout.strip() == "test"
        assert apt_state() == before
    finally:
        docker("image", "rm", image, check=False)


def test_uv_fetches_for_a_user_as_pip_does_with_the_platforms_certificates(user):
    """scripts/test-venvs.sh's uv, with the options arcvllm.builder.index gives it, for a user
    whose environment names no CA file (root's here sets SSL_CERT_FILE): uv's own bundled
    roots refused this machine's index ("invalid peer certificate: UnknownIssuer", make
    test-venvs failed for a user), where pip, trusting the platform's store, did not."""
    venv = user_venv(user)
    sources = user.run(str(venv / "bin" / "python"), "-m", "arcvllm.builder.index", "--uv-sources")
    assert sources.returncode == 0, sources.stderr
    uv = ROOT / ".venv" / "bin" / "uv"
    python = str(venv / "bin" / "python")
    resolved = user.run(
        str(uv), "pip", "install", "--dry-run", "--no-deps", "--python", python,
        *sources.stdout.split(), "six==1.16.0", timeout=300,
        UV_CACHE_DIR=str(user.home / "uv-cache"),
    )  # fmt: skip
    assert resolved.returncode == 0, resolved.stderr
    assert "six==1.16.0" in resolved.stderr + resolved.stdout


def test_the_index_is_read_for_a_user_with_pips_certificates(user):
    """`python -m arcvllm.builder.index` (test-venvs' and the build's fetcher of pinned
    files) for a user whose environment names no CA file: its HTTP clients' own bundles
    refused this machine's index ("CERTIFICATE_VERIFY_FAILED", reported as "has no
    vllm-0.20.2.tar.gz"), where pip, with its configured cert, did not."""
    venv = user_venv(user)
    sha256 = "0b0a0bbfad8ac5c1e0a2ffb71a5d0b6bc1d1d35c56d41a15d15d5a3e5b9d1ee1"  # not checked here
    found = user.run(
        str(venv / "bin" / "python"), "-m", "arcvllm.builder.index", "vllm", "vllm-0.20.2.tar.gz",
        sha256, timeout=300,
    )  # fmt: skip
    out = found.stdout + found.stderr
    assert "cannot read" not in out and "CERTIFICATE_VERIFY_FAILED" not in out, out
    # the listed sum differs from the made-up one: the index answered with the file's entry
    assert "vllm-0.20.2.tar.gz has sha256" in out or found.stdout.startswith("http"), out
