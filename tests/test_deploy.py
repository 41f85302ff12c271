"""`make up` as an operator runs it: the CPU service and its gateway started from a settings
file of their own (ENV_FILE) under its own compose project and port, then torn down.

Proves the settings file reaches the deployment: the key file it names (VLLM_API_KEY_FILE)
makes the API answer 401 without the key and 200 with it, through the gateway; and the
container's environment, which is that file, leaves the TP=2 preset both GPUs
(ZE_AFFINITY_MASK empty). tests/test_gateway.py looks at the gateway itself.
"""

from __future__ import annotations

import json
import os
import ssl
import subprocess
from pathlib import Path
from typing import NamedTuple

import pytest
from conftest import ROOT, free_port
from support.engine import docker
from support.scale import build_target

from arcvllm.server.client import wait_until

TEMPLATE = ROOT / "docker" / "arcvllm.env"
KEY = "k-7f3e9a1c2b"
MODEL = "tiny-hybrid"
GATEWAY_IMAGE = os.environ.get("ARCVLLM_TEST_GATEWAY_IMAGE", "arcvllm-gateway:1.22.1")


def make(*args: str, timeout: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run(
        # -o: the tests run from this venv; never reinstall it under them
        ["make", "--no-print-directory", "-C", str(ROOT), "-o", ".venv/.stamp", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
    )


class Service(NamedTuple):
    url: str
    cid: str
    project: str
    port: int
    settings: Path
    image: str
    ca_cert: Path


@pytest.fixture(scope="module")
def keyed_service(cpu_image, tmp_path_factory):
    """`make up FLAVOR=cpu ENV_FILE=mine.env` with a key in mine.env, under its own project."""
    build_target("gateway", GATEWAY_IMAGE)
    port = free_port()
    project = f"arcvllm-keytest-{port}"
    folder = tmp_path_factory.mktemp("deploy")  # 0700: only this user reaches the files
    key_file = folder / "api-key"
    key_file.write_text(f"{KEY}\n")
    key_file.chmod(0o644)  # the containers' UID 1000 reads the bind-mounted file
    mine = folder / "mine.env"
    text = TEMPLATE.read_text().replace(
        "\nVLLM_API_KEY_FILE=../secrets/api-key\n", f"\nVLLM_API_KEY_FILE={key_file}\n"
    )
    assert f"VLLM_API_KEY_FILE={key_file}" in text
    mine.write_text(text.replace("\nSHM_SIZE=16g\n", "\nSHM_SIZE=1g\n"))
    args = [
        "FLAVOR=cpu",
        "STACK=cpu",
        f"IMAGE={cpu_image}",
        f"GATEWAY_IMAGE={GATEWAY_IMAGE}",
        f"ENV_FILE={mine}",
        f"PROJECT={project}",
        f"PORT={port}",
    ]
    up = make("up", *args)
    try:
        assert up.returncode == 0, up.stdout + up.stderr
        label = f"label=com.docker.compose.project={project}"
        service = "label=com.docker.compose.service=vllm-cpu"
        cid = docker("ps", "-q", "--filter", label, "--filter", service).stdout.strip()
        gateway = "label=com.docker.compose.service=gateway"
        gid = docker("ps", "-q", "--filter", label, "--filter", gateway).stdout.strip()
        assert cid and gid, f"no containers for compose project {project}"
        ca_cert = folder / "ca.pem"
        cert = "/var/lib/arcvllm-gateway/tls/cert.pem"
        wait_until(lambda: docker("exec", gid, "test", "-s", cert, check=False).returncode == 0,
                   60, 0.5, "the gateway's certificate")  # fmt: skip
        ca_cert.write_text(docker("exec", gid, "cat", cert).stdout)
        url = f"https://127.0.0.1:{port}"
        yield Service(url, cid, project, port, mine, cpu_image, ca_cert)
    finally:
        # -v: the project's cache volumes and the image's anonymous /var/cache/arcvllm
        make("down", *args, "DOWN_FLAGS=-v")


def wait_healthy(url: str, cid: str, ca_cert: Path, timeout: float = 600) -> None:
    from arcvllm.server.client import Client, WaitTimeout

    def running() -> None:
        if not json.loads(docker("inspect", cid).stdout)[0]["State"]["Running"]:
            raise WaitTimeout("the service's container exited")

    try:
        Client(url, ca_cert=str(ca_cert)).wait_healthy(timeout, interval=2, alive=running)
    except WaitTimeout as exc:
        logs = docker("logs", "--tail", "40", cid, check=False)
        pytest.fail(f"service not healthy: {exc}\n{logs.stdout[-3000:]}{logs.stderr[-3000:]}")


@pytest.mark.docker
def test_a_key_in_the_settings_file_is_required_by_the_served_api(keyed_service):
    import httpx

    url, cid = keyed_service.url, keyed_service.cid
    wait_healthy(url, cid, keyed_service.ca_cert)
    verify = ssl.create_default_context(cafile=str(keyed_service.ca_cert))
    body = {"model": MODEL, "prompt": "block state", "max_tokens": 4, "temperature": 0}

    def post(headers: dict[str, str]) -> httpx.Response:
        return httpx.post(
            f"{url}/v1/completions", json=body, headers=headers, verify=verify, timeout=120
        )

    without = post({})
    wrong = post({"Authorization": "Bearer not-the-key"})
    with_key = post({"Authorization": f"Bearer {KEY}"})
    assert (without.status_code, wrong.status_code) == (401, 401)
    assert with_key.status_code == 200, with_key.text
    assert with_key.json()["usage"]["completion_tokens"] == 4


@pytest.mark.docker
def test_the_containers_environment_leaves_tp2_both_gpus(keyed_service):
    """The container's environment is the settings file (env_file): its empty
    ZE_AFFINITY_MASK must leave the TP=2 preset's 0,1 in place."""
    cid = keyed_service.cid
    env = docker("exec", cid, "printenv", "ZE_AFFINITY_MASK", check=False)
    assert (env.returncode, env.stdout.strip()) == (0, "")  # set, and empty
    dry = docker(
        "exec",
        cid,
        "arcvllm",
        "serve",
        "--preset",
        "qwen3.6-35b-a3b-w4a16-2xb70",
        "--dry-run",
        check=False,
    )
    assert "ZE_AFFINITY_MASK=0,1" in dry.stdout.splitlines(), dry.stdout + dry.stderr


@pytest.mark.docker
def test_field_report_tarball_has_every_part_and_never_the_key(keyed_service, tmp_path):
    import tarfile

    svc = keyed_service
    wait_healthy(svc.url, svc.cid, svc.ca_cert)
    out = tmp_path / "field-report.tar.gz"
    done = make(
        "field-report",
        "FLAVOR=cpu",
        "STACK=cpu",
        f"IMAGE={svc.image}",
        f"GATEWAY_IMAGE={GATEWAY_IMAGE}",
        f"ENV_FILE={svc.settings}",
        f"PROJECT={svc.project}",
        f"PORT={svc.port}",
        f"FIELD_REPORT={out}",
        timeout=1200,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert KEY not in done.stdout + done.stderr
    with tarfile.open(out) as tar:
        blobs = {m.name.split("/", 1)[1]: tar.extractfile(m).read() for m in tar.getmembers()}
    assert set(blobs) >= {
        "host/doctor.json",
        "container/doctor.json",
        "host/versions.txt",
        "image/labels.json",
        "image/patch-manifest.json",
        "container/packages.txt",
        "container/sycl-ls.txt",
        "container/xpu-smi.txt",
        "smoke/smoke.json",
        "bench/bench.json",
        "server.log",
        "commands.txt",
        "summary.txt",
    }
    leaks = [name for name, blob in blobs.items() if KEY.encode() in blob]
    assert leaks == []
    assert json.loads(blobs["image/labels.json"])["org.arcvllm.stack"] == "cpu"
    assert json.loads(blobs["image/patch-manifest.json"])["vllm"]["version"] == "0.32.0"
    assert json.loads(blobs["host/doctor.json"])["preset"] == "tiny-hybrid-cpu"
    # The smoke verdict is the smoke test's business (make smoke-emulated gates it); here the
    # report must carry it, whatever it is, and every other step must have worked.
    smoke = json.loads(blobs["smoke/smoke.json"])
    assert smoke["verdict"] in ("pass", "fail") and smoke["checks"]
    assert f"smoke: {smoke['verdict']}".encode() in blobs["summary.txt"]
    assert json.loads(blobs["bench/bench.json"])
    assert json.loads(blobs["container/doctor.json"])["preset"] == "tiny-hybrid-cpu"
    assert b"sycl-ls: not installed in this image" in blobs["container/sycl-ls.txt"]
    failed = blobs["summary.txt"].decode().rsplit("failed steps: ", 1)[1].strip()
    assert failed in ("none", "smoke/smoke.txt"), blobs["summary.txt"]
    assert b"Application startup complete" in blobs["server.log"]
