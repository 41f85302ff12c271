"""`arcvllm scale`: bad input is one line, and a failed start leaves nothing running."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from conftest import ROOT, free_port
from test_image import docker, engine  # noqa: F401 (fixture)
from test_scale import ROUTER_IMAGE, build_target

from arcvllm import scale
from arcvllm.errors import ArcvllmError


def arcvllm(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "arcvllm", *args],
        capture_output=True,
        text=True,
        timeout=900,
        cwd=ROOT,
        env={**os.environ, **(env or {})},
    )


def test_more_replicas_than_gpus_is_one_line_and_starts_nothing(tmp_path):
    (tmp_path / "dev" / "dri").mkdir(parents=True)
    (tmp_path / "dev" / "dri" / "renderD128").touch()
    called = tmp_path / "compose-was-called"
    result = arcvllm(
        "scale", "up", "--replicas", "2", "--dev-root", str(tmp_path),
        env={"COMPOSE": f"touch {called}"},
    )  # fmt: skip
    assert result.returncode == 3
    assert result.stderr.strip() == (
        f"arcvllm: 2 replicas need 2 GPUs; this host has 1 render node "
        f"({tmp_path}/dev/dri/renderD*)"
    )
    assert not called.exists()


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


def test_xpu_replicas_get_the_render_nodes_gid(tmp_path):
    """compose.scale.yaml has no default render GID: `scale up` passes the nodes' own."""
    for node in ("renderD128", "renderD129"):
        (tmp_path / "dev" / "dri").mkdir(parents=True, exist_ok=True)
        (tmp_path / "dev" / "dri" / node).touch()
    gid = (tmp_path / "dev" / "dri" / "renderD128").stat().st_gid
    seen = tmp_path / "render-gid"
    result = arcvllm(
        "scale", "up", "--replicas", "2", "--dev-root", str(tmp_path),
        env={"COMPOSE": f"sh -c 'echo \"$RENDER_GID\" >> {seen}; exit 1' compose"},
    )  # fmt: skip
    assert result.returncode == 3 and "compose up failed" in result.stderr
    assert seen.read_text().splitlines()[0] == str(gid)


def test_a_replica_count_without_a_profile_is_a_usage_error():
    result = arcvllm("scale", "up", "--replicas", "3")
    assert result.returncode == 2
    assert result.stderr.strip() == "arcvllm: --replicas must be one of (2, 4) (compose.scale.yaml)"


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
    assert json.loads(result.stdout) == {"project": "arcvllm-scale", "down": True}
    assert "down -v --remove-orphans" in called.read_text()


def test_a_router_that_does_not_answer_is_an_environment_error():
    url = f"http://127.0.0.1:{free_port()}"
    with pytest.raises(ArcvllmError) as failure:
        scale.wait_router(url, timeout=1, interval=0.2)
    assert failure.value.exit_code == 3
    assert str(failure.value) == (
        f"the router at {url} has no healthy worker after 1 s (/readiness: no answer)"
    )


def test_layout_names_the_services_of_each_profile():
    assert scale.layout(4, cpu=False, monitoring=True) == scale.Layout(
        ("scale", "scale-4", "monitoring"),
        ("router", "vllm-2", "vllm-3", "prometheus", "alertmanager"),
        ("vllm-0", "vllm-1", "vllm-2", "vllm-3"),
    )
    assert scale.layout(2, cpu=True, monitoring=False).replicas == ("vllm-cpu-0", "vllm-cpu-1")


def test_four_replicas_tell_the_router_and_prometheus(tmp_path):
    settings = scale.layout(4, cpu=False, monitoring=True).settings()
    assert settings["ROUTER_WORKER_URLS"].split() == [f"http://vllm-{i}:8000" for i in range(4)]
    assert settings["PROMETHEUS_TARGETS"] == "replicas-4.yml"
    assert (ROOT / "deploy" / "prometheus" / "targets" / "replicas-4.yml").is_file()
    rendered = scale.Deployment(ROOT / "docker" / "arcvllm.env", settings=settings).run(
        "config", profiles=("scale", "scale-4", "monitoring"), timeout=120
    )
    assert rendered.returncode == 0, rendered.stderr
    assert "http://vllm-3:8000" in rendered.stdout


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
    result = arcvllm("scale", "up", "--cpu", "--timeout", "120", env=env)
    assert result.returncode == 3, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "never became healthy" in lines[0], result.stderr
    assert lines[0].startswith("arcvllm: replica vllm-cpu-")
    dep = scale.Deployment((ROOT / "docker" / "arcvllm.env").resolve())
    left = dep.run("ps", "-q", profiles=("cpu-scale",), timeout=60).stdout.strip()
    assert left == "", left


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
    """The router publishes no port: `compose exec -T router python3 -c CODE URL` prints the
    status (0: no answer). A stand-in compose prints ANSWER and records its arguments."""
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
    assert "exec -T router-cpu python3 -c" in args.read_text()
    assert args.read_text().rstrip().endswith("http://127.0.0.1:8000/readiness")
