"""docker/compose.yaml: validated by docker-compose itself (no engine needed)."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parent.parent
COMPOSE_FILE = ROOT / "docker" / "compose.yaml"
ENV_FILE = ROOT / "docker" / "arcvllm.env"


def compose_binary() -> list[str]:
    """Debian's docker-compose 1.29, or the v2 plugin where that is what the host has."""
    if shutil.which("docker-compose"):
        return ["docker-compose"]
    for docker in ("/usr/bin/docker", shutil.which("docker")):
        if (
            docker
            and subprocess.run([docker, "compose", "version"], capture_output=True).returncode == 0
        ):
            return [docker, "compose"]
    pytest.skip("no docker-compose and no compose plugin: scripts/ci/engine.sh up installs one")


def config(
    compose_file: Path, *extra: str, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess:
    return subprocess.run(
        [*compose_binary(), "--env-file", str(ENV_FILE), "-f", str(compose_file), *extra, "config"],
        capture_output=True,
        text=True,
        timeout=60,
        env={"PATH": "/usr/local/bin:/usr/bin:/bin", **(env or {})},
    )


@pytest.fixture(scope="module")
def rendered() -> dict:
    result = config(COMPOSE_FILE, "--profile", "cpu", env={"RENDER_GID": "4242"})
    assert result.returncode == 0, result.stderr
    return yaml.safe_load(result.stdout)


def test_compose_file_validates():
    result = config(COMPOSE_FILE)
    assert result.returncode == 0, result.stderr


def test_a_broken_compose_file_fails_validation(tmp_path):
    broken = tmp_path / "compose.yaml"
    broken.write_text(COMPOSE_FILE.read_text().replace("restart: unless-stopped", "restart: [1]"))
    (tmp_path / "arcvllm.env").write_text(ENV_FILE.read_text())
    result = config(broken)
    assert result.returncode != 0


def test_xpu_service_has_the_gpu_and_the_render_group(rendered):
    vllm = rendered["services"]["vllm"]
    assert any(str(d).startswith("/dev/dri") for d in vllm["devices"])
    assert [str(g) for g in vllm["group_add"]] == ["4242"]  # from the environment
    assert not vllm.get("privileged", False)
    assert "ALL" in vllm["cap_drop"]


def test_render_gid_comes_from_the_env_file():
    result = config(COMPOSE_FILE)
    vllm = yaml.safe_load(result.stdout)["services"]["vllm"]
    env_gid = next(
        line.split("=", 1)[1]
        for line in ENV_FILE.read_text().splitlines()
        if line.startswith("RENDER_GID=")
    )
    assert [str(g) for g in vllm["group_add"]] == [env_gid]


def test_ports_bind_to_localhost_by_default(rendered):
    for name in ("vllm", "vllm-cpu"):
        (port,) = rendered["services"][name]["ports"]
        host_ip = port["host_ip"] if isinstance(port, dict) else port.split(":")[0]
        assert host_ip == "127.0.0.1"


def test_production_settings(rendered):
    vllm = rendered["services"]["vllm"]
    assert vllm["restart"] == "unless-stopped"
    assert vllm["logging"]["driver"] == "json-file"
    assert vllm["logging"]["options"]["max-size"]
    assert "/health" in " ".join(vllm["healthcheck"]["test"])
    assert vllm["shm_size"]
    assert vllm["ipc"]
    assert vllm["environment"]["ZE_AFFINITY_MASK"] == "0"
    assert "VLLM_API_KEY" in vllm["environment"]
    volumes = {_target(v): v for v in vllm["volumes"]}
    assert _read_only(volumes["/models"])
    assert _source(volumes["/var/cache/arcvllm/huggingface"]) == "hf-cache"
    assert _source(volumes["/var/cache/arcvllm/compile"]) == "compile-cache"


def _target(volume) -> str:
    return volume["target"] if isinstance(volume, dict) else volume.split(":")[1]


def _source(volume) -> str:
    return volume["source"] if isinstance(volume, dict) else volume.split(":")[0]


def _read_only(volume) -> bool:
    if isinstance(volume, dict):
        return volume.get("read_only") is True
    return volume.split(":")[2:3] == ["ro"]


def test_cpu_profile_runs_the_tiny_model_without_a_gpu(rendered):
    cpu = rendered["services"]["vllm-cpu"]
    assert cpu["environment"]["ARCVLLM_PRESET"] == "tiny-hybrid-cpu"
    assert "devices" not in cpu and "group_add" not in cpu
    assert cpu["image"] == "arcvllm:cpu"


def test_cpu_service_is_behind_its_profile(rendered):
    assert rendered["services"]["vllm-cpu"]["profiles"] == ["cpu"]
    assert "profiles" not in rendered["services"]["vllm"]
