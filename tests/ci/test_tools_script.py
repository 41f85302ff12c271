"""scripts/ci/tools.sh (`make tools`) on a fake machine: a PATH without the four tools whose
apt-get is a stub (it records its calls, and `download` writes small .debs holding the
tools), an os-release file, the tools folder under the test's own directory. The real
download, as a user without root, is tests/ci/test_nonroot.py's. And pipeline.sh's first
check, of the tools the release rehearsal needs beside the engine."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
from support import ROOT

SCRIPT = ROOT / "scripts" / "ci" / "tools.sh"
TOOLS = ("promtool", "prometheus", "prometheus-alertmanager", "amtool", "kubectl")
FILES = {
    "prometheus": ("promtool", "prometheus"),
    "prometheus-alertmanager": ("prometheus-alertmanager", "amtool"),
    "kubectl": ("kubectl",),
    "kubernetes-client": ("kubectl",),
}
DEBIAN = 'PRETTY_NAME="Debian GNU/Linux 13 (trixie)"\nID=debian\nVERSION_CODENAME=trixie\n'
UBUNTU = 'PRETTY_NAME="Ubuntu 24.04.3 LTS"\nID=ubuntu\nID_LIKE=debian\nVERSION_CODENAME=noble\n'

# `download PKG[/SUITE]...`: one .deb per package in the current folder, built from a tree
# under $FAKE_DEBS/PKG (the test makes them); `install PKG...`: the package's programs in
# $FAKE_SYSTEM, the system's folder on PATH; every call is recorded.
APT_GET = r"""#!/bin/bash
echo "apt-get $*" >>"$FAKE_LOG"
verb=
for arg; do
	[[ $arg == download || $arg == install ]] && { verb=$arg; continue; }
	[[ -n $verb && $arg != -* ]] || continue
	name=${arg%%/*}
	if [[ $verb == install ]]; then
		cp -a "$FAKE_DEBS/$name/usr/bin/." "$FAKE_SYSTEM/"
	else
		dpkg-deb --build --root-owner-group "$FAKE_DEBS/$name" "${name}_1.0_amd64.deb" >/dev/null
	fi
done
"""
ID = '#!/bin/bash\n[[ $1 == -u ]] && echo "$FAKE_UID" || exec /usr/bin/id "$@"\n'


def fake_debs(root: Path) -> Path:
    debs = root / "debs"
    for package, tools in FILES.items():
        tree = debs / package
        (tree / "DEBIAN").mkdir(parents=True)
        (tree / "DEBIAN" / "control").write_text(
            f"Package: {package}\nVersion: 1.0\nArchitecture: amd64\n"
            "Maintainer: test <t@example.invalid>\nDescription: stand-in\n"
        )
        (tree / "usr" / "bin").mkdir(parents=True)
        for tool in tools:
            (tree / "usr" / "bin" / tool).write_text(f"#!/bin/sh\necho {tool} {package}\n")
            (tree / "usr" / "bin" / tool).chmod(0o755)
    return debs


def run(root: Path, os_release: str, uid: int = 1000) -> subprocess.CompletedProcess:
    bin_dir = root / "bin"
    if not bin_dir.exists():
        bin_dir.mkdir()
        for system in (Path("/usr/bin"), Path("/bin")):
            for tool in system.iterdir():
                if (
                    tool.name not in (*TOOLS, "apt-get", "id")
                    and not (bin_dir / tool.name).exists()
                ):
                    (bin_dir / tool.name).symlink_to(tool)
        for name, body in (("apt-get", APT_GET), ("id", ID)):
            (bin_dir / name).write_text(body)
            (bin_dir / name).chmod(0o755)
    (root / "system").mkdir(exist_ok=True)
    (root / "os-release").write_text(os_release)
    debs = root / "debs" if (root / "debs").exists() else fake_debs(root)
    env = {
        "PATH": f"{bin_dir}:{root / 'system'}",
        "HOME": str(root),
        "TOOLS_DIR": str(root / "tools"),
        "ARCVLLM_OS_RELEASE": str(root / "os-release"),
        "FAKE_LOG": str(root / "calls.log"),
        "FAKE_DEBS": str(debs),
        "FAKE_UID": str(uid),
        "FAKE_SYSTEM": str(root / "system"),
    }
    return subprocess.run(
        ["bash", str(SCRIPT)], capture_output=True, text=True, env=env, timeout=120
    )


def calls(root: Path) -> list[str]:
    log = root / "calls.log"
    return log.read_text().splitlines() if log.exists() else []


@pytest.mark.parametrize(
    ("os_release", "kube"),
    [(DEBIAN, "kubectl/trixie"), (UBUNTU, "kubernetes-client")],
    ids=["debian", "ubuntu"],
)
def test_a_user_gets_the_tools_unpacked_in_the_checkout_by_apts_download(
    tmp_path, os_release, kube
):
    done = run(tmp_path, os_release)
    assert done.returncode == 0, done.stderr
    state = f"-oDir::State::Lists={tmp_path}/tools/apt/lists"
    assert [c.split()[-4:] for c in calls(tmp_path) if " download " in c] == [
        ["download", "prometheus", "prometheus-alertmanager", kube]
    ]
    assert all(state in c for c in calls(tmp_path)), calls(tmp_path)
    assert not any(" install" in c for c in calls(tmp_path))
    for tool in TOOLS:
        link = tmp_path / "tools" / "bin" / tool
        said = subprocess.run([str(link)], capture_output=True, text=True).stdout.split()
        assert said[0] == tool
        if tool == "kubectl":
            assert said[1] == kube.split("/")[0]  # from the package asked for
        assert link.resolve().is_relative_to(tmp_path / "tools" / "root")
    assert not (tmp_path / "tools" / "apt").exists()  # the private apt state goes


def test_a_user_is_told_which_tests_the_unpacked_servers_cannot_serve(tmp_path):
    done = run(tmp_path, DEBIAN)
    assert done.returncode == 0, done.stderr
    assert "lack their assets under /usr/share/prometheus" in done.stderr


def test_root_installs_prometheus_and_alertmanager_and_unpacks_kubectl(tmp_path):
    """Debian's prometheus and alertmanager read assets at fixed paths under /usr/share:
    installed by apt as root; kubectl, one static program, still unpacked in the checkout
    (apt's download as root without its sandbox user, which cannot write there)."""
    done = run(tmp_path, DEBIAN, uid=0)
    assert done.returncode == 0, done.stderr
    installs = [c.split()[-2:] for c in calls(tmp_path) if " install " in c]
    assert installs == [["prometheus", "prometheus-alertmanager"]], calls(tmp_path)
    downloads = [c for c in calls(tmp_path) if " download " in c]
    assert [c.split()[-2:] for c in downloads] == [["download", "kubectl/trixie"]]
    assert all("-oAPT::Sandbox::User=root" in c for c in downloads)
    for tool in ("promtool", "prometheus", "prometheus-alertmanager", "amtool"):
        assert (tmp_path / "system" / tool).exists() and not (
            tmp_path / "tools" / "bin" / tool
        ).exists()
    assert (tmp_path / "tools" / "bin" / "kubectl").resolve().is_relative_to(tmp_path / "tools")
    assert "lack their assets" not in done.stderr


def test_tools_already_there_are_not_fetched_again(tmp_path):
    assert run(tmp_path, DEBIAN).returncode == 0
    (tmp_path / "calls.log").unlink()
    again = run(tmp_path, DEBIAN)
    assert again.returncode == 0, again.stderr
    assert calls(tmp_path) == [] and again.stdout == ""


def test_the_pipeline_without_the_release_tools_stops_at_once_in_one_line(tmp_path):
    """A user's own engine may come without cosign, skopeo and the registry (engine.sh
    installs them only with Debian's engine): said before anything is built or removed."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for name in ("bash", "dirname"):
        (bin_dir / name).symlink_to(subprocess.check_output(["which", name], text=True).strip())
    done = subprocess.run(
        ["bash", str(ROOT / "scripts" / "ci" / "pipeline.sh")],
        capture_output=True,
        text=True,
        env={"PATH": str(bin_dir), "DOCKER": "/nonexistent/docker", "HOME": str(tmp_path)},
        timeout=60,
    )
    assert done.returncode == 3, done.stderr
    assert done.stderr.strip().splitlines() == [
        "pipeline: no cosign skopeo docker-registry on PATH (the release rehearsal's): install"
        " Debian's packages of those names (scripts/ci/engine.sh installs them as root with the"
        " engine it installs)"
    ]
    assert done.stdout == ""
