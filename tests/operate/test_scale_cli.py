"""`arcvllm scale`: bad input is one line, and a failed start leaves nothing running."""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
import pytest
import yaml
from support import ROOT
from support.docker import docker
from support.hosts import B70, FOUR, IGPU, fake_host
from support.models import put_model
from support.processes import free_port
from support.scale import ROUTER_IMAGE, SCALE, build_target, side_image

from arcvllm import options
from arcvllm.commands import scale as scale_command
from arcvllm.errors import ArcvllmError
from arcvllm.operate import replicas, scale, single
from arcvllm.presets import get_preset


def arcvllm(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "arcvllm", *args],
        capture_output=True,
        text=True,
        timeout=900,
        cwd=ROOT,
        env={**os.environ, **(env or {})},
    )


@pytest.fixture(autouse=True)
def state(tmp_path, monkeypatch) -> Path:
    """The deployments' made files (replicas' compose file, by-path folders) of this test."""
    monkeypatch.setenv("ARCVLLM_STATE_DIR", str(tmp_path / "state"))
    return tmp_path / "state" / scale.PROJECT


@pytest.fixture(autouse=True)
def key_file(tmp_path, monkeypatch) -> Path:
    """The key file compose hands the replicas and the gateway (a fresh clone has none at
    compose.yaml's default, secrets/api-key); readable by the containers' UID 1000."""
    key = tmp_path / "api-key"
    key.write_text("scale-cli-test-key\n")
    key.chmod(0o644)
    monkeypatch.setenv("VLLM_API_KEY_FILE", str(key))
    return key


@pytest.fixture(autouse=True)
def models(tmp_path, monkeypatch) -> Path:
    """MODELS_DIR holding the XPU presets' models `scale up` checks (as `make up` does)."""
    folder = tmp_path / "models"
    for name in ("qwen3.6-35b-a3b-w4a16-1xb70", "qwen3.6-35b-a3b-w4a16-2xb70"):
        preset = get_preset(name)
        put_model(folder / preset.model.removeprefix("/models/"), preset)
    monkeypatch.setenv("MODELS_DIR", str(folder))
    return folder


@pytest.mark.parametrize("problem", ["missing", "empty"])
def test_a_key_file_that_is_missing_or_empty_is_one_line_and_starts_nothing(
    tmp_path, key_file, problem
):
    if problem == "missing":
        key_file.unlink()
    else:
        key_file.write_text("\n")
    called = tmp_path / "compose-was-called"
    result = arcvllm("scale", "up", "--cpu", env={"COMPOSE": f"touch {called}"})
    assert result.returncode == 3, result.stderr
    (line,) = result.stderr.strip().splitlines()
    assert line.startswith(f"arcvllm: VLLM_API_KEY_FILE={key_file}")
    assert ("is not a readable file" if problem == "missing" else options.KEY_RULE) in line
    assert not called.exists()


def test_a_relative_key_file_is_read_from_the_compose_folder(tmp_path, monkeypatch):
    from arcvllm.operate.host import api_key_file

    settings = {"VLLM_API_KEY_FILE": "../secrets/mine"}
    docker_dir = ROOT / "docker"
    assert api_key_file(settings, docker_dir, {}) == docker_dir / "../secrets/mine"
    assert api_key_file(settings, docker_dir, {"VLLM_API_KEY_FILE": "/k"}) == Path("/k")
    assert api_key_file({}, docker_dir, {}) == docker_dir / "../secrets/api-key"


def test_more_replicas_than_b70s_is_one_line_and_starts_nothing(tmp_path, state):
    igpu, b70 = ("0000:00:02.0", IGPU, "renderD128"), ("0000:03:00.0", B70, "renderD129")
    host = fake_host(tmp_path, [igpu, b70])
    called = tmp_path / "compose-was-called"
    result = arcvllm(
        "scale", "up", "--replicas", "2", "--dev-root", str(host.root),
        env={"COMPOSE": f"touch {called}"},
    )  # fmt: skip
    assert result.returncode == 3
    assert result.stderr.strip() == (
        "arcvllm: 2 replicas need 2 Arc Pro B70s; this host has 1 with a render node "
        "(0000:03:00.0 /dev/dri/renderD129; `arcvllm doctor` says more)"
    )
    assert not called.exists() and not state.exists()


def test_monitoring_without_an_alert_receiver_is_one_line_and_starts_nothing(tmp_path):
    called = tmp_path / "compose-was-called"
    env_file = tmp_path / "mine.env"
    env_file.write_text("VLLM_API_KEY=k\n")
    env = {k: v for k, v in os.environ.items() if k != "ALERT_WEBHOOK_URL"}
    result = subprocess.run(
        [sys.executable, "-m", "arcvllm", "scale", "up", "--cpu", "--monitoring",
         "--env-file", str(env_file)],
        capture_output=True, text=True, timeout=60, cwd=ROOT,
        env={**env, "COMPOSE": f"touch {called}"},
    )  # fmt: skip
    assert result.returncode == 3
    assert result.stderr.strip() == (
        "arcvllm: --monitoring: ALERT_WEBHOOK_URL is not set (the webhook Alertmanager sends"
        f" alerts to; export it or put it in {env_file})"
    )
    assert not called.exists()


@pytest.mark.parametrize("where", ["environment", "settings file"])
def test_monitoring_takes_the_receiver_from_the_environment_or_the_settings_file(tmp_path, where):
    seen = tmp_path / "compose-args"
    env_file = tmp_path / "mine.env"
    url = "https://hooks.example.org/arcvllm"
    env_file.write_text(f"ALERT_WEBHOOK_URL={url}\n" if where == "settings file" else "")
    env = {k: v for k, v in os.environ.items() if k != "ALERT_WEBHOOK_URL"}
    if where == "environment":
        env["ALERT_WEBHOOK_URL"] = url
    result = subprocess.run(
        [sys.executable, "-m", "arcvllm", "scale", "up", "--cpu", "--monitoring",
         "--env-file", str(env_file)],
        capture_output=True, text=True, timeout=60, cwd=ROOT,
        env={**env, "COMPOSE": f"sh -c 'echo \"$*\" >> {seen}; exit 1' compose"},
    )  # fmt: skip
    assert result.returncode == 3 and "compose up failed" in result.stderr
    assert "prometheus alertmanager" in seen.read_text().splitlines()[0]


def test_any_n_up_to_the_b70s_starts_that_many_from_their_own_file(tmp_path, state):
    """3 of 4 B70s: compose is given the replicas' file and told to start the router and
    vllm-0 .. vllm-2; its failure takes them down again and removes the file."""
    host = fake_host(tmp_path, FOUR)
    calls = tmp_path / "compose-calls"
    copy = tmp_path / "replicas-seen.yaml"
    stand_in = (
        f'sh -c \'echo "$*" >> {calls}; cp {state}/replicas.yaml {copy} 2>/dev/null; '
        'case "$*" in *" up "*) exit 1;; esac\' compose'
    )
    result = arcvllm(
        "scale", "up", "--replicas", "3", "--dev-root", str(host.root),
        env={"COMPOSE": stand_in},
    )  # fmt: skip
    assert result.returncode == 3 and "compose up failed" in result.stderr
    up, down = calls.read_text().splitlines()
    assert f"-f {state}/replicas.yaml" in up
    assert up.split(" up -d ")[1].split() == ["vllm-0", "vllm-1", "vllm-2", "gateway"]
    assert down.endswith("down --remove-orphans")
    seen = yaml.safe_load(copy.read_text())["services"]
    gid = str(os.stat(host.root / "dev/dri/renderD130").st_gid)  # real stat: the file's own
    assert seen["vllm-2"]["devices"] == ["/dev/dri/renderD130:/dev/dri/renderD130"]
    assert seen["vllm-2"]["group_add"] == [gid]
    assert "vllm-3" not in seen
    assert not state.exists()  # nothing left of a failed start


def test_two_replicas_of_two_b70s_each_start_from_their_own_file(tmp_path, state):
    """`scale up --gpus-per-replica 2` on 4 B70s with a TP=2 preset: compose is given a
    file of vllm-0 (renderD128, 129) and vllm-1 (renderD130, 131), mask 0,1 each."""
    host = fake_host(tmp_path, FOUR)
    calls = tmp_path / "compose-calls"
    copy = tmp_path / "replicas-seen.yaml"
    stand_in = (
        f'sh -c \'echo "$*" >> {calls}; cp {state}/replicas.yaml {copy} 2>/dev/null; '
        'case "$*" in *" up "*) exit 1;; esac\' compose'
    )
    result = arcvllm(
        "scale", "up", "--gpus-per-replica", "2", "--dev-root", str(host.root),
        env={"COMPOSE": stand_in, "ARCVLLM_PRESET": "qwen3.6-35b-a3b-w4a16-2xb70"},
    )  # fmt: skip
    assert result.returncode == 3 and "compose up failed" in result.stderr
    up = calls.read_text().splitlines()[0]
    assert up.split(" up -d ")[1].split() == ["vllm-0", "vllm-1", "gateway"]
    seen = yaml.safe_load(copy.read_text())["services"]
    for i in range(2):
        nodes = [f"/dev/dri/renderD{128 + 2 * i + j}" for j in range(2)]
        assert seen[f"vllm-{i}"]["devices"] == [f"{n}:{n}" for n in nodes]
        assert seen[f"vllm-{i}"]["environment"]["ZE_AFFINITY_MASK"] == "0,1"
    assert "vllm-2" not in seen


@pytest.mark.parametrize(
    ("args", "preset", "line"),
    [
        (["--gpus-per-replica", "2"], "qwen3.6-35b-a3b-w4a16-1xb70",
         "preset qwen3.6-35b-a3b-w4a16-1xb70 has tensor-parallel-size 1, but "
         "--gpus-per-replica is 2: set ARCVLLM_PRESET to one of TP=2 ("),
        (["--gpus-per-replica", "1"], "qwen3.6-35b-a3b-w4a16-2xb70",
         "preset qwen3.6-35b-a3b-w4a16-2xb70 has tensor-parallel-size 2, but "
         "--gpus-per-replica is 1: set ARCVLLM_PRESET to one of TP=1 ("),
        (["--replicas", "1", "--gpus-per-replica", "3"], None,
         "--gpus-per-replica 3 does not divide this host's 4 Arc Pro B70s (it can be 1, 2, 4)"),
        (["--gpus-per-replica", "0"], None, "--gpus-per-replica must be 1 or more, not 0"),
        (["--cpu", "--gpus-per-replica", "2"], None,
         "--gpus-per-replica is for XPU replicas; the CPU ones have none"),
    ],
)  # fmt: skip
def test_a_replica_size_the_host_or_preset_does_not_fit_is_refused_in_one_line(
    tmp_path, state, args, preset, line
):
    host = fake_host(tmp_path, FOUR)
    called = tmp_path / "compose-was-called"
    env = {"COMPOSE": f"touch {called}"}
    if preset:
        env["ARCVLLM_PRESET"] = preset
    result = arcvllm("scale", "up", *args, "--dev-root", str(host.root), env=env)
    (said,) = result.stderr.strip().splitlines()
    assert said.startswith(f"arcvllm: {line}"), said
    assert result.returncode == 2
    assert not called.exists() and not state.exists()


def test_scale_render_names_each_replicas_gpus(tmp_path):
    host = fake_host(tmp_path, FOUR)
    out = tmp_path / "replicas.yaml"
    made = arcvllm(
        "scale", "render", "--replicas", "1", "--gpus-per-replica", "4", "--out", str(out),
        "--dev-root", str(host.root), "--json",
    )  # fmt: skip
    assert made.returncode == 0, made.stderr
    (replica,) = json.loads(made.stdout)["replicas"]
    assert replica["mask"] == "0,1,2,3"
    renders = [g["render"] for g in replica["gpus"]]
    assert renders == [f"/dev/dri/renderD{128 + i}" for i in range(4)]


def test_a_replica_count_below_one_is_a_usage_error():
    result = arcvllm("scale", "up", "--replicas", "0")
    assert result.returncode == 2
    assert result.stderr.strip() == "arcvllm: --replicas must be 1 or more, not 0"


def test_a_settings_file_that_does_not_exist_is_a_usage_error():
    result = arcvllm("scale", "down", "--env-file", "/nonexistent.env")
    assert result.returncode == 2
    assert result.stderr.strip() == (
        "arcvllm: scale down: argument --env-file: no such file: /nonexistent.env "
        "(see arcvllm scale down --help)"
    )


def test_no_compose_tool_is_an_environment_error_in_one_line(tmp_path):
    missing = tmp_path / "no-compose"
    result = arcvllm("scale", "down", "--json", env={"COMPOSE": str(missing)})
    assert result.returncode == 3 and result.stdout == ""
    assert result.stderr.strip() == f"arcvllm: no compose tool: {missing} not found (make tools)"


def test_down_json_says_what_it_took_down(tmp_path):
    called = tmp_path / "compose-args"
    result = arcvllm(
        "scale", "down", "--json", env={"COMPOSE": f"sh -c 'echo \"$*\" > {called}' compose"}
    )
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout) == {
        "project": "arcvllm-scale",
        "down": True,
        "volumes_removed": False,
    }
    assert "down --remove-orphans" in called.read_text()


@pytest.mark.parametrize("purge", [False, True])
def test_down_keeps_the_named_volumes_unless_purge(tmp_path, purge):
    """Compile caches (a warm restart) and Prometheus history survive a plain `down`; no
    `-t` either, so each service's stop_grace_period covers its server's drain."""
    called = tmp_path / "compose-args"
    result = arcvllm(
        "scale", "down", *(["--purge"] if purge else []),
        env={"COMPOSE": f"sh -c 'echo \"$*\" > {called}' compose"},
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    words = called.read_text().split()
    assert words[words.index("down") :] == ["down", *(["-v"] if purge else []), "--remove-orphans"]
    said = "named volumes (compile caches, Prometheus data) removed" if purge else "volumes kept"
    assert said in result.stdout


def test_down_stops_the_servers_first_then_the_router_and_the_gateway(tmp_path, monkeypatch, state):
    """The servers drain their running streams on SIGTERM; the router and the gateway in
    front must still be there to carry them (compose down alone stops the router first).
    The replicas are those of the file `up` wrote, which goes with them."""
    replicas.write(replicas.pick(fake_host(tmp_path, FOUR), 3), SCALE, state)
    calls = recording_compose(tmp_path, monkeypatch)
    result = arcvllm("scale", "down")
    assert result.returncode == 0, result.stderr
    stop, down = actions(calls)
    assert stop == ["stop", "vllm-0", "vllm-1", "vllm-2", "vllm-cpu-0", "vllm-cpu-1"]
    assert down == ["down", "--remove-orphans"]
    assert f"-f {state}/replicas.yaml" in calls.read_text().splitlines()[1]
    assert not state.exists()


def recording_compose(tmp_path, monkeypatch, fail_on: str = "") -> Path:
    """A stand-in compose that records each call's arguments, one line each, and exits 1
    when they contain FAIL_ON."""
    calls = tmp_path / "compose-calls"
    fail = f'case "$*" in *"{fail_on}"*) exit 1;; esac' if fail_on else ""
    # (and, a line per call in compose-calls.workers, the ROUTER_WORKER_URLS it was given)
    record = f'echo "$*" >> {calls}; echo "${{ROUTER_WORKER_URLS-}}" >> {calls}.workers'
    monkeypatch.setenv("COMPOSE", f"sh -c '{record}; {fail}' compose")
    return calls


def actions(calls: Path) -> list[list[str]]:
    """Each recorded call from its action on (after the files and profiles)."""
    out = []
    for line in calls.read_text().splitlines():
        words = line.split()
        first = next(i for i, w in enumerate(words) if w in ("up", "down", "stop", "exec", "ps"))
        out.append(words[first:])
    return out


def up_args(**overrides) -> argparse.Namespace:
    args = {
        "replicas": 2, "cpu": True, "monitoring": False, "timeout": 1.0,
        "router_timeout": 1.0, "dev_root": "/", "json": False, "gpus_per_replica": 1,
        "env_file": ROOT / "docker" / "arcvllm.env", "project": scale.PROJECT,
        "single_project": single.PROJECT,
    }  # fmt: skip
    return argparse.Namespace(**{**args, **overrides})


def up(health, status, **overrides) -> int:
    """`scale up` of up_args(OVERRIDES) as the command runs it, HEALTH and STATUS standing
    in for Docker's and the router's answers: what it prints, and its exit status."""
    args = up_args(**overrides)
    started = scale.up(scale_command.start_of(args), health=health, status=status)
    return scale_command.said(started, args.json)


def test_an_up_that_fails_stops_what_it_started_and_keeps_the_volumes(tmp_path):
    calls = tmp_path / "compose-calls"
    stand_in = f'sh -c \'echo "$*" >> {calls}; case "$*" in *" up "*) exit 1;; esac\' compose'
    result = arcvllm("scale", "up", "--cpu", env={"COMPOSE": stand_in})
    assert result.returncode == 3 and "compose up failed" in result.stderr
    assert [a[0] for a in actions(calls)] == ["up", "down"]
    assert actions(calls)[1] == ["down", "--remove-orphans"]


def test_one_replica_never_healthy_is_stopped_alone_and_the_rest_serve(
    tmp_path, monkeypatch, capsys
):
    calls = recording_compose(tmp_path, monkeypatch)
    health = {"vllm-cpu-0": "healthy", "vllm-cpu-1": "starting"}.__getitem__
    assert up(health, lambda url: 200) == scale.DEGRADED == 4
    assert [a[0] for a in actions(calls)] == ["up", "stop", "up"]
    assert actions(calls)[1] == ["stop", "vllm-cpu-1"]
    # The router last, told only the healthy one (it waits for every worker it is given).
    assert actions(calls)[2] == ["up", "-d", "--no-deps", "router-cpu"]
    workers = (tmp_path / "compose-calls.workers").read_text().splitlines()
    assert workers[2] == "http://vllm-0:8000"
    out, err = capsys.readouterr()
    assert out.startswith("1 of 2 replicas healthy behind the router")
    assert err == (
        "arcvllm: degraded: replica vllm-cpu-1 is down (stopped): never became healthy within 1 s\n"
    )


def test_a_degraded_start_says_which_replica_is_down_in_json(tmp_path, monkeypatch, capsys):
    recording_compose(tmp_path, monkeypatch)
    exited = "it exited (code 1); see `docker logs` of it"
    health = {"vllm-cpu-0": exited, "vllm-cpu-1": "healthy"}.__getitem__
    assert up(health, lambda url: 200, json=True) == 4
    doc = json.loads(capsys.readouterr().out)
    assert doc["degraded"] is True and doc["replicas"] == ["vllm-cpu-1"]
    assert doc["down"] == [{"replica": "vllm-cpu-0", "why": f"never became healthy: {exited}"}]


def test_all_replicas_healthy_is_not_degraded(tmp_path, monkeypatch, capsys):
    calls = recording_compose(tmp_path, monkeypatch)
    assert up(lambda name: "healthy", lambda url: 200) == 0
    assert [a[0] for a in actions(calls)] == ["up", "up"]
    assert actions(calls)[0] == ["up", "-d", "vllm-cpu-0", "vllm-cpu-1", "gateway"]
    assert capsys.readouterr().err == ""


@pytest.mark.parametrize("environment, shown", [(None, "9443"), ("7443", "7443")])
def test_the_gateway_port_shown_is_the_one_compose_publishes(
    tmp_path, monkeypatch, capsys, environment, shown
):
    """It printed the process environment's PORT only: a settings file with PORT=9443 was
    shown as 8443. Compose takes the environment's first, then the settings file's."""
    recording_compose(tmp_path, monkeypatch)
    settings = tmp_path / "arcvllm.env"
    shipped = (ROOT / "docker" / "arcvllm.env").read_text()
    assert "\nPORT=8443\n" in shipped
    settings.write_text(shipped.replace("\nPORT=8443\n", "\nPORT=9443\n"))
    if environment is None:
        monkeypatch.delenv("PORT", raising=False)
    else:
        monkeypatch.setenv("PORT", environment)
    healthy = {"health": lambda name: "healthy", "status": lambda url: 200}
    assert up(**healthy, env_file=settings) == 0
    assert capsys.readouterr().out.endswith(f"gateway on port {shown}\n")
    assert up(**healthy, env_file=settings, json=True) == 0
    assert json.loads(capsys.readouterr().out)["gateway"] == f"https://127.0.0.1:{shown}"


def test_no_replica_healthy_stops_everything_without_removing_volumes(tmp_path, monkeypatch):
    calls = recording_compose(tmp_path, monkeypatch)
    with pytest.raises(ArcvllmError) as failure:
        up(lambda name: "starting", lambda url: 200)
    assert failure.value.exit_code == 3
    assert str(failure.value) == (
        "replica vllm-cpu-0 never became healthy within 1 s; nor did vllm-cpu-1"
    )
    assert [a for a in actions(calls) if a[0] != "up"] == [["down", "--remove-orphans"]]


def test_a_router_without_a_worker_after_a_degraded_start_takes_it_all_down(tmp_path, monkeypatch):
    calls = recording_compose(tmp_path, monkeypatch)
    health = {"vllm-cpu-0": "healthy", "vllm-cpu-1": "starting"}.__getitem__
    with pytest.raises(ArcvllmError, match="no healthy worker"):
        up(health, lambda url: 503)
    assert [a[0] for a in actions(calls)] == ["up", "stop", "up", "down"]
    assert "-v" not in actions(calls)[3]


def test_ctrl_c_while_waiting_stops_what_started_and_keeps_the_volumes(tmp_path, monkeypatch):
    calls = recording_compose(tmp_path, monkeypatch)

    def interrupted(name: str) -> str:
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        up(interrupted, lambda url: 200)
    assert actions(calls)[-1] == ["down", "--remove-orphans"]


def test_a_failed_stop_of_the_unhealthy_replica_is_one_line_and_takes_it_all_down(
    tmp_path, monkeypatch
):
    calls = recording_compose(tmp_path, monkeypatch, fail_on=" stop ")
    health = {"vllm-cpu-0": "healthy", "vllm-cpu-1": "starting"}.__getitem__
    with pytest.raises(ArcvllmError, match="compose stop failed") as failure:
        up(health, lambda url: 200)
    assert failure.value.exit_code == 3
    assert [a[0] for a in actions(calls)] == ["up", "stop", "down"]  # no router started


def test_an_exited_replica_is_not_waited_for():
    asked: list[str] = []

    def health(name: str) -> str:
        asked.append(name)
        return "healthy" if name == "a" else "it exited (code 2)"

    assert scale.wait_replicas(("a", "b"), health, timeout=60, interval=30) == {
        "b": "never became healthy: it exited (code 2)"
    }
    assert asked == ["a", "b"]  # settled at the first look, no 60 s wait


def test_scale_up_help_lists_the_degraded_exit_status():
    result = arcvllm("scale", "up", "--help")
    assert result.returncode == 0
    assert "  4  degraded: serving with fewer replicas than asked" in result.stdout


def test_a_router_that_does_not_answer_is_an_environment_error():
    url = f"http://127.0.0.1:{free_port()}"
    with pytest.raises(ArcvllmError) as failure:
        scale.wait_router(url, timeout=1, interval=0.2)
    assert failure.value.exit_code == 3
    assert str(failure.value) == (
        f"the router at {url} has no healthy worker after 1 s (/readiness: no answer)"
    )


def test_layout_names_the_services_of_each_profile():
    names = ("vllm-0", "vllm-1", "vllm-2")
    assert scale.layout(3, cpu=False, monitoring=True) == scale.Layout(
        ("scale", "monitoring"), names, names, "router", ("prometheus", "alertmanager")
    )
    cpu = scale.layout(2, cpu=True, monitoring=False)
    assert (cpu.replicas, cpu.workers) == (("vllm-cpu-0", "vllm-cpu-1"), ("vllm-0", "vllm-1"))
    assert cpu.worker_urls(["vllm-cpu-1"]) == "http://vllm-1:8000"


@pytest.mark.docker
@pytest.mark.usefixtures("engine")
def test_a_replica_that_never_becomes_healthy_is_named_and_nothing_is_left():
    """Replicas given an image that is no vLLM server exit at once: named, all taken down."""
    build_target("router", ROUTER_IMAGE)
    env = {
        "CPU_IMAGE": ROUTER_IMAGE,  # its entrypoint rejects the replicas' arguments
        "PORT": str(free_port()),
        "BIND_ADDRESS": "127.0.0.1",
    }
    dep = scale.Deployment((ROOT / "docker" / "arcvllm.env").resolve())
    try:
        result = arcvllm("scale", "up", "--cpu", "--timeout", "120", env=env)
        assert result.returncode == 3, result.stderr
        lines = result.stderr.strip().splitlines()
        assert len(lines) == 1 and "never became healthy" in lines[0], result.stderr
        assert lines[0].startswith("arcvllm: replica vllm-cpu-")
        left = dep.run("ps", "-a", "-q", profiles=("cpu-scale",), timeout=60).stdout.strip()
        assert left == "", left
    finally:
        dep.down(("cpu-scale",), purge=True)  # a failed up keeps the volumes: not a test's


@pytest.mark.docker
@pytest.mark.compose
def test_a_replica_that_dies_at_start_is_stopped_alone_the_other_serves_volumes_kept(
    cpu_image,
    key_file,
):
    """The operator's degraded start, for real: vllm-cpu-1 is killed as soon as it exists
    (as a replica that crashes on start); `scale up` names it, exits 4, and the router
    serves through the gateway with vllm-cpu-0. The named volumes (compile cache) stay."""
    build_target("router", ROUTER_IMAGE)
    build_target("gateway", side_image("gateway"))
    project, port = "arcvllm-scale-degraded", free_port()
    env = {"CPU_IMAGE": cpu_image, "PORT": str(port), "BIND_ADDRESS": "127.0.0.1"}
    labels = [f"label=com.docker.compose.project={project}"]
    victim = [*labels, "label=com.docker.compose.service=vllm-cpu-1"]
    killed: list[str] = []
    stop_watching = threading.Event()

    def kill_vllm_cpu_1() -> None:
        while not stop_watching.is_set() and not killed:
            found = docker("ps", "-q", *(f for v in victim for f in ("--filter", v)), check=False)
            if found.stdout.strip():
                killed.append(docker("kill", found.stdout.strip(), check=False).stdout.strip())
            time.sleep(0.5)

    watcher = threading.Thread(target=kill_vllm_cpu_1)
    watcher.start()
    try:
        result = arcvllm(
            "scale", "up", "--cpu", "--project", project, "--timeout", "600", env=env
        )  # fmt: skip
        stop_watching.set()
        watcher.join()
        assert killed, "vllm-cpu-1 was never seen"
        assert result.returncode == scale.DEGRADED, result.stderr
        assert result.stderr.strip().splitlines() == [
            "arcvllm: degraded: replica vllm-cpu-1 is down (stopped): never became healthy: "
            "it exited (code 137); see `docker logs` of it"
        ]
        assert result.stdout.startswith("1 of 2 replicas healthy behind the router")
        served = httpx.post(
            f"https://127.0.0.1:{port}/v1/completions",
            json={"model": "tiny-hybrid", "prompt": "one left", "max_tokens": 4},
            headers={"Authorization": f"Bearer {key_file.read_text().strip()}"},
            # the gateway's self-signed certificate (TLS: tests/deploy/test_gateway.py)
            verify=False,
            timeout=120,
        )
        assert served.status_code == 200, served.text[:500]
        volumes = docker("volume", "ls", "-q", *(f for v in labels for f in ("--filter", v)))
        assert f"{project}_compile-cache" in volumes.stdout.split()
    finally:
        stop_watching.set()
        watcher.join()
        done = arcvllm("scale", "down", "--project", project, "--purge", env=env)
        assert done.returncode == 0, done.stderr


@pytest.mark.docker
@pytest.mark.usefixtures("engine")
def test_a_router_with_no_healthy_worker_is_one_line():
    build_target("router", ROUTER_IMAGE)
    port = free_port()
    cid = docker(
        "run", "-d", "--rm", "-p", f"127.0.0.1:{port}:8000",
        "-e", "ROUTER_WORKER_STARTUP_TIMEOUT_SECS=5", "-e", "ROUTER_HEALTH_CHECK_INTERVAL_SECS=1",
        ROUTER_IMAGE, "--worker-urls", "http://127.0.0.1:9",
    ).stdout.strip()  # fmt: skip
    try:
        with pytest.raises(ArcvllmError) as failure:
            scale.wait_router(f"http://127.0.0.1:{port}", timeout=15, interval=1)
        assert str(failure.value).startswith(
            f"the router at http://127.0.0.1:{port} has no healthy worker after 15 s"
        )
        assert failure.value.exit_code == 3
    finally:
        docker("rm", "-f", "-v", cid, check=False)  # -v: its anonymous cache volume too


@pytest.mark.parametrize("answer, ok", [("200", True), ("503", False), ("0", False)])
def test_the_routers_readiness_is_asked_inside_its_container(tmp_path, monkeypatch, answer, ok):
    """The router publishes no port: `compose exec -T router arcvllm-healthcheck --status URL`
    prints the status (0: no answer). A stand-in compose prints ANSWER and records its
    arguments."""
    args = tmp_path / "args"
    monkeypatch.setenv("COMPOSE", f"sh -c 'echo \"$*\" > {args}; echo {answer}' compose")
    dep = scale.Deployment(ROOT / "docker" / "arcvllm.env")
    status = scale.status_inside(dep, "router-cpu", ("cpu-scale",))
    if ok:
        scale.wait_router("http://127.0.0.1:8000", timeout=1, interval=0.2, status=status)
    else:
        with pytest.raises(ArcvllmError) as failure:
            scale.wait_router("http://127.0.0.1:8000", timeout=1, interval=0.2, status=status)
        seen = "no answer" if answer == "0" else f"HTTP {answer}"
        assert str(failure.value).endswith(f"(/readiness: {seen})")
    assert "exec -T router-cpu arcvllm-healthcheck --status" in args.read_text()
    assert args.read_text().rstrip().endswith("http://127.0.0.1:8000/readiness")


def test_the_xpu_replicas_model_is_checked_before_anything_starts(tmp_path, state, models):
    """As `make up` checks the single server's: a missing model is one line naming the
    command that fetches it (exit 3), and compose is never called."""
    import shutil

    shutil.rmtree(models / "Qwen3.6-35B-A3B-W4A16")
    host = fake_host(tmp_path, FOUR)
    called = tmp_path / "compose-was-called"
    result = arcvllm(
        "scale", "up", "--dev-root", str(host.root), env={"COMPOSE": f"touch {called}"}
    )
    (said,) = result.stderr.strip().splitlines()
    assert result.returncode == 3
    assert said.startswith("arcvllm: the model of qwen3.6-35b-a3b-w4a16-1xb70 is not ready: ")
    assert said.endswith("arcvllm model fetch qwen3.6-35b-a3b-w4a16-1xb70 (make model)")
    assert not called.exists() and not state.exists()


def volume_names(project: str, env: dict[str, str], *files: Path) -> dict[str, str]:
    """Compose's name of each volume of PROJECT's FILES, ENV interpolated."""
    args = [*compose_tool(), "-p", project, "--env-file", str(ROOT / "docker" / "arcvllm.env")]
    for f in files:
        args += ["-f", str(f)]
    done = subprocess.run(
        [*args, "config", "--format", "json"],
        capture_output=True, text=True, timeout=60, env={**os.environ, **env},
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    return {k: v["name"] for k, v in json.loads(done.stdout)["volumes"].items()}


def compose_tool() -> list[str]:
    from support.compose import compose_binary

    return list(compose_binary())


@pytest.mark.compose
def test_the_scale_projects_gateway_serves_the_single_deployments_certificate(monkeypatch):
    """The gateway-tls volume (the self-signed CA clients hold) of `scale up`'s project is
    the single deployment's; the other volumes stay the project's own. Without the name
    scale up gives, each project would get its own volume: a new CA, clients refused."""
    monkeypatch.delenv("GATEWAY_TLS_VOLUME", raising=False)
    base = ROOT / "docker" / "compose.yaml"
    made = single.Names(ROOT / "docker" / "arcvllm.env", flavor="cpu")
    project = single.resolve(made).compose()
    assert project.name == "arcvllm"
    one = volume_names(project.name, {}, *project.files)
    assert one["gateway-tls"] == "arcvllm_gateway-tls"  # as before: kept on upgrade
    dep = scale.Deployment(ROOT / "docker" / "arcvllm.env", "arcvllm-scale")
    dep.overrides["GATEWAY_TLS_VOLUME"] = single.gateway_tls_volume({}, {})
    scaled = volume_names(dep.project, dep.overrides, *dep.compose().files)
    assert scaled["gateway-tls"] == one["gateway-tls"]
    assert scaled["compile-cache"] == "arcvllm-scale_compile-cache"
    # The control: the same files without it, a volume (and CA) of the project's own.
    alone = volume_names(dep.project, {}, base, ROOT / "docker" / "compose.scale.yaml")
    assert alone["gateway-tls"] == "arcvllm-scale_gateway-tls" != one["gateway-tls"]


def test_scale_up_names_the_single_deployments_volume_and_down_purge_keeps_it(
    tmp_path, monkeypatch
):
    """What `scale up` hands compose: GATEWAY_TLS_VOLUME of --single-project (the settings
    file's own GATEWAY_TLS_VOLUME wins); `scale down --purge` removes the project's
    volumes, never that one."""
    monkeypatch.delenv("GATEWAY_TLS_VOLUME", raising=False)
    seen = tmp_path / "seen"
    stand_in = f"sh -c 'echo \"$GATEWAY_TLS_VOLUME $*\" >> {seen}; exit 1' compose"
    result = arcvllm("scale", "up", "--cpu", "--single-project", "team", env={"COMPOSE": stand_in})
    assert result.returncode == 3
    first = seen.read_text().splitlines()[0]
    assert first.startswith("team_gateway-tls ") and " up -d " in first
    seen.unlink()
    down = arcvllm("scale", "down", "--purge", env={"COMPOSE": stand_in})
    assert down.returncode == 3
    assert all(line.startswith(" ") for line in seen.read_text().splitlines())  # unset
    mine = tmp_path / "mine.env"
    mine.write_text((ROOT / "docker" / "arcvllm.env").read_text() + "GATEWAY_TLS_VOLUME=ours\n")
    seen.unlink()
    arcvllm("scale", "up", "--cpu", "--env-file", str(mine), env={"COMPOSE": stand_in})
    assert seen.read_text().splitlines()[0].startswith("ours ")
