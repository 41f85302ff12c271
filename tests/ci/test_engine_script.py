"""scripts/ci/engine.sh on the hosts README promises: apt only on Debian, as root, when no
engine answers; an engine that answers is used as it is, by any user.

Each test runs the real script on a fake machine: a PATH whose docker, apt-get, id and
dpkg-query are stubs that record their calls, an os-release file, and engine folders under
the test's own directory (no real engine is reached, no real apt file is written).
"""

from __future__ import annotations

import os
import subprocess
from dataclasses import dataclass
from pathlib import Path

import pytest
from support import ROOT

SCRIPT = ROOT / "scripts" / "ci" / "engine.sh"

UBUNTU = 'PRETTY_NAME="Ubuntu 24.04.3 LTS"\nID=ubuntu\nID_LIKE=debian\nVERSION_CODENAME=noble\n'
DEBIAN = 'PRETTY_NAME="Debian GNU/Linux 13 (trixie)"\nID=debian\nVERSION_CODENAME=trixie\n'

# The docker stub: `version` answers per $FAKE_ENGINE (at: the DOCKER_HOST it names; system:
# only with DOCKER_HOST unset; none), the plugins per $FAKE_PLUGINS, images exist.
DOCKER = r"""#!/bin/bash
echo "docker $*" >>"$FAKE_LOG"
case $1 in
version)
	case $FAKE_ENGINE in
	at:*) [[ ${DOCKER_HOST-} == "${FAKE_ENGINE#at:}" ]] ;;
	system) [[ -z ${DOCKER_HOST+x} ]] ;;
	*) exit 1 ;;
	esac
	;;
buildx | compose) [[ " $FAKE_PLUGINS " == *" $1 "* ]] ;;
context) echo unix:///var/run/docker.sock ;;
image) exit 0 ;;
*) exit 1 ;;
esac
"""
RECORD_AND_FAIL = '#!/bin/bash\necho "$(basename "$0") $*" >>"$FAKE_LOG"\nexit 100\n'
ID = '#!/bin/bash\n[[ $1 == -u ]] && echo "$FAKE_UID" || exec /usr/bin/id "$@"\n'


@dataclass
class FakeHost:
    root: Path
    os_release: str = UBUNTU
    uid: int = 1000
    engine: str = "none"
    plugins: str = "buildx compose"

    @property
    def log(self) -> Path:
        return self.root / "calls.log"

    def calls(self, tool: str) -> list[str]:
        lines = self.log.read_text().splitlines() if self.log.exists() else []
        return [line for line in lines if line.split(" ", 1)[0] == tool]

    def run(self, *args: str, system: bool = False, **env: str) -> subprocess.CompletedProcess:
        """The script with ARGS; SYSTEM: no data root named, so the system's engine may be
        taken. Our engine's run folder is always the test's, never /run/arcvllm-docker."""
        bin_dir = self.root / "bin"
        bin_dir.mkdir(exist_ok=True)
        for name, body in (
            ("docker", DOCKER),
            ("apt-get", RECORD_AND_FAIL),
            ("dpkg-query", RECORD_AND_FAIL),
            ("id", ID),
        ):
            (bin_dir / name).write_text(body)
            (bin_dir / name).chmod(0o755)
        (self.root / "os-release").write_text(self.os_release)
        base = {
            "PATH": f"{bin_dir}:/usr/bin:/bin",
            "HOME": str(self.root),
            "DOCKER": str(bin_dir / "docker"),
            "ARCVLLM_OS_RELEASE": str(self.root / "os-release"),
            "FAKE_LOG": str(self.log),
            "FAKE_UID": str(self.uid),
            "FAKE_ENGINE": self.engine,
            "FAKE_PLUGINS": self.plugins,
            "ARCVLLM_DOCKER_RUN": str(self.root / "run"),
        }
        if not system:
            base["ARCVLLM_DOCKER_ROOT"] = str(self.root / "data")
        return subprocess.run(
            ["bash", str(SCRIPT), *args],
            capture_output=True,
            text=True,
            env={**base, **env},
            timeout=60,
        )


@pytest.fixture
def host(tmp_path) -> FakeHost:
    return FakeHost(tmp_path)


def test_an_engine_that_answers_is_used_without_apt_on_ubuntu_by_a_user(host):
    host.engine = "at:unix:///srv/their.sock"
    done = host.run("up", DOCKER_HOST="unix:///srv/their.sock")
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "DOCKER_HOST=unix:///srv/their.sock"
    assert host.calls("apt-get") == []
    assert not (host.root / "run").exists()  # nothing of ours started


def test_an_engine_that_answers_on_debian_as_root_is_not_reinstalled(host):
    host.os_release, host.uid, host.engine = DEBIAN, 0, "at:unix:///srv/their.sock"
    done = host.run("up", DOCKER_HOST="unix:///srv/their.sock")
    assert done.returncode == 0, done.stderr
    assert host.calls("apt-get") == []


def test_the_systems_engine_is_taken_when_docker_host_is_unset(host):
    """A user in the docker group: DOCKER_HOST unset, the client's default engine answers."""
    host.engine = "system"
    done = host.run("up", system=True)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "DOCKER_HOST=unix:///var/run/docker.sock"
    assert host.calls("apt-get") == []


def test_readme_commands_run_for_a_user_with_a_running_docker(host):
    """`make smoke-test` is `engine.sh run make ...`: the command gets the engine, no apt."""
    host.engine = "system"
    out = host.root / "seen"
    done = host.run("run", "bash", "-c", f'echo "$DOCKER_HOST $DOCKER" >{out}', system=True)
    assert done.returncode == 0, done.stderr
    assert out.read_text().split() == ["unix:///var/run/docker.sock", str(host.root / "bin/docker")]
    assert host.calls("apt-get") == []


def test_no_engine_on_ubuntu_is_one_line_naming_what_to_install_and_apt_untouched(host):
    host.uid = 0
    done = host.run("up")
    assert done.returncode == 3
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, done.stderr
    assert "Ubuntu 24.04.3 LTS" in lines[0]
    assert "install Docker Engine with its buildx and compose plugins" in lines[0]
    assert host.calls("apt-get") == []


def test_no_engine_on_debian_as_a_user_is_one_line_and_apt_untouched(host):
    host.os_release = DEBIAN
    done = host.run("up")
    assert done.returncode == 3
    assert len(done.stderr.strip().splitlines()) == 1, done.stderr
    assert "no Docker engine answers" in done.stderr
    assert host.calls("apt-get") == []


def test_no_engine_on_debian_as_root_installs_debians_engine(host):
    host.os_release, host.uid = DEBIAN, 0
    done = host.run("up")
    assert done.returncode != 0  # the stub apt-get fails: nothing is started after it
    assert host.calls("apt-get") == ["apt-get update -qq"]
    assert not (host.root / "run").exists()


def test_a_client_without_the_compose_plugin_is_one_line(host):
    host.engine, host.plugins = "at:unix:///srv/their.sock", "buildx"
    done = host.run("up", DOCKER_HOST="unix:///srv/their.sock")
    assert done.returncode == 3
    assert len(done.stderr.strip().splitlines()) == 1, done.stderr
    assert "has no compose plugin" in done.stderr
    assert host.calls("apt-get") == []


def test_env_names_the_systems_engine_when_ours_is_not_running(host):
    host.engine = "system"
    done = host.run("env", system=True)
    assert done.stdout.strip() == "DOCKER_HOST=unix:///var/run/docker.sock"


def test_the_script_reads_no_os_release_but_the_one_it_is_given():
    assert "/etc/os-release" not in SCRIPT.read_text().replace(
        "${ARCVLLM_OS_RELEASE:-/etc/os-release}", ""
    )
    assert os.access(SCRIPT, os.X_OK)


def test_run_on_an_engine_it_did_not_start_stops_nothing(host):
    """An engine started earlier (its pid in our run folder) is not stopped by a `run` that
    took another engine: only a dockerd this run started is stopped at its end."""
    earlier = subprocess.Popen(["sleep", "60"])
    try:
        (host.root / "run").mkdir()
        (host.root / "run" / "started-by-engine-sh").write_text(f"{earlier.pid}\n")
        host.engine = "system"
        done = host.run("run", "true", system=True)
        assert done.returncode == 0, done.stderr
        assert earlier.poll() is None, "engine.sh run stopped a process it did not start"
    finally:
        earlier.kill()
        earlier.wait()
