"""docker/compose.scale.yaml: N replicas behind vLLM's router, and Prometheus.

The profiles are validated by docker-compose itself (no engine needed)."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
import yaml
from conftest import ROOT
from test_compose import compose_binary

BASE = ROOT / "docker" / "compose.yaml"
SCALE = ROOT / "docker" / "compose.scale.yaml"
ENV_FILE = ROOT / "docker" / "arcvllm.env"


def compose_config(
    *profiles: str, env: dict[str, str] | None = None, scale: Path = SCALE
) -> subprocess.CompletedProcess:
    args = [*compose_binary(), "--env-file", str(ENV_FILE), "-f", str(BASE), "-f", str(scale)]
    for profile in profiles:
        args += ["--profile", profile]
    return subprocess.run(
        [*args, "config"],
        capture_output=True,
        text=True,
        timeout=60,
        env={"PATH": "/usr/local/bin:/usr/bin:/bin", **(env or {})},
    )


def services(*profiles: str, env: dict[str, str] | None = None) -> dict[str, dict]:
    result = compose_config(*profiles, env=env)
    assert result.returncode == 0, result.stderr
    return yaml.safe_load(result.stdout)["services"]


def ports(service: dict) -> list[tuple[str, int, int]]:
    """(host address, published, target) whether compose printed the short or long form."""
    out = []
    for p in service.get("ports", []):
        if isinstance(p, str):
            host, published, target = p.split("/")[0].rsplit(":", 2)
            out.append((host, int(published), int(target)))
        else:
            out.append((p.get("host_ip", ""), int(p["published"]), int(p["target"])))
    return out


def bind_mounts(service: dict) -> dict[str, str]:
    """target -> host source of the bind mounts, in either form."""
    out = {}
    for v in service.get("volumes", []):
        if isinstance(v, str):
            source, target = v.split(":")[:2]
            if source.startswith("/"):
                out[target] = source
        elif v["type"] == "bind":
            out[v["target"]] = v["source"]
    return out


@pytest.mark.parametrize(
    "profiles", [("scale",), ("scale", "scale-4"), ("cpu-scale",), ("monitoring",)]
)
def test_every_profile_validates(profiles):
    result = compose_config(*profiles)
    assert result.returncode == 0, result.stderr


def test_a_broken_scale_file_fails_validation(tmp_path):
    broken = tmp_path / "compose.scale.yaml"
    broken.write_text(SCALE.read_text().replace("read_only: true", "read_only: [yes]", 1))
    result = compose_config("scale", scale=broken)
    assert result.returncode != 0
    assert "read_only" in result.stderr


def test_one_b70_per_replica_no_host_ports_behind_the_router():
    svc = services("scale", "scale-4", env={"BIND_ADDRESS": "0.0.0.0", "PORT": "8080"})
    masks = [svc[f"vllm-{i}"]["environment"]["ZE_AFFINITY_MASK"] for i in range(4)]
    assert masks == ["0", "1", "2", "3"]
    for i in range(4):
        replica = svc[f"vllm-{i}"]
        assert "ports" not in replica, replica.get("ports")
        assert replica["devices"] == ["/dev/dri:/dev/dri"]
        assert "--enable-scale-out" not in replica["command"]  # xpu-0.23: not needed
    router = svc["router"]
    assert ports(router) == [("0.0.0.0", 8080, 8000)]
    assert router["environment"]["ROUTER_POLICY"] == "cache_aware"
    assert router["command"] == "--worker-urls http://vllm-0:8000 http://vllm-1:8000"
    assert router["build"]["target"] == "router"


def test_router_policy_thresholds_and_scale_out_flag_are_settings():
    env = {
        "ROUTER_POLICY": "round_robin",
        "ROUTER_CACHE_THRESHOLD": "0.5",
        "SCALE_OUT_ARGS": "--enable-scale-out",
        "IMAGE": "arcvllm:xpu-0.33",
    }
    svc = services("scale", env=env)
    assert svc["router"]["environment"]["ROUTER_POLICY"] == "round_robin"
    assert svc["router"]["environment"]["ROUTER_CACHE_THRESHOLD"] == "0.5"
    assert svc["vllm-0"]["image"] == "arcvllm:xpu-0.33"
    assert svc["vllm-0"]["command"].split()[1:] == ["--enable-scale-out"]


def test_cpu_replicas_answer_as_vllm_0_and_1_with_scale_out_and_a_cpu_set_each():
    svc = services("cpu-scale")
    for i in range(2):
        replica = svc[f"vllm-cpu-{i}"]
        assert replica["image"] == "arcvllm:cpu"
        assert replica["command"] == ["tiny-hybrid-cpu", "--enable-scale-out"]
        assert replica["networks"]["default"]["aliases"] == [f"vllm-{i}"]
        assert replica["cpuset"] == str(i)
        assert "ports" not in replica
    assert svc["router-cpu"]["networks"]["default"]["aliases"] == ["router"]


def test_prometheus_mounts_the_targets_of_its_n():
    svc = services("monitoring", env={"PROMETHEUS_TARGETS": "replicas-4.yml"})
    prom = svc["prometheus"]
    assert prom["build"]["target"] == "prometheus"
    source = Path(bind_mounts(prom)["/etc/arcvllm/prometheus/targets/replicas.yml"])
    assert source == ROOT / "deploy" / "prometheus" / "targets" / "replicas-4.yml"
    assert source.exists()
    assert [t["labels"]["replica"] for t in yaml.safe_load(source.read_text())] == [
        f"vllm-{i}" for i in range(4)
    ]
