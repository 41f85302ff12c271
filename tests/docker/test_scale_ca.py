"""Single -> scale-out -> single, as docs/scale.md says, keeps the gateway's CA: a client
holding the first ca.pem still verifies the gateway and is served at each step.

One sequence on the CPU flavour: `arcvllm deploy up` (make up's command), the CA read from
the gateway, a completion over TLS; `arcvllm scale up --cpu` refused while the single
deployment serves the port; `arcvllm deploy down`, `arcvllm scale up --cpu` (two replicas
behind the router), the same CA and a completion; `arcvllm scale down --purge`,
`arcvllm deploy up` again, the same CA and a completion. Every project is taken down with
its volumes at the end, the shared certificate volume too."""

from __future__ import annotations

import json
import os
import re
import secrets
import ssl
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest
from support import ROOT
from support.docker import docker
from support.measured import measured
from support.processes import free_port
from support.scale import ROUTER_IMAGE, build_target, side_image

from arcvllm.client.api import Client

pytestmark = [pytest.mark.docker, pytest.mark.compose, pytest.mark.server]

SINGLE = os.environ.get("ARCVLLM_TEST_SCALE_CA_SINGLE", "arcvllm-ca-single")
SCALED = os.environ.get("ARCVLLM_TEST_SCALE_CA_SCALE", "arcvllm-ca-scale")
VOLUME = f"{SINGLE}_gateway-tls"  # the single deployment's, as compose names it
CERT = "/var/lib/arcvllm-gateway/tls/cert.pem"
GATEWAY_IMAGE = side_image("gateway")
MEASURED: dict[str, float] = {}


def arcvllm(env: dict[str, str], *args: str, timeout: float = 1800) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "arcvllm", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=env,
        cwd=ROOT,
    )


def ok(done: subprocess.CompletedProcess) -> str:
    assert done.returncode == 0, (
        f"exit {done.returncode}\n{done.stdout[-2000:]}\n{done.stderr[-3000:]}"
    )
    return done.stdout


def present(image: str) -> bool:
    return docker("image", "inspect", image, check=False).returncode == 0


def served_certificate(port: int) -> bytes:
    """The certificate the gateway on PORT presents (DER), whoever serves it."""
    return ssl.PEM_cert_to_DER_cert(ssl.get_server_certificate(("127.0.0.1", port), timeout=10))


def der(pem: Path) -> bytes:
    return ssl.PEM_cert_to_DER_cert(pem.read_text())


def completion(url: str, key: str, ca: Path) -> dict:
    """One completion through the gateway, the server verified with CA alone."""
    verify = ssl.create_default_context(cafile=str(ca))
    model = httpx.get(
        f"{url}/v1/models", headers={"Authorization": f"Bearer {key}"}, verify=verify, timeout=60
    ).json()["data"][0]["id"]
    answer = httpx.post(
        f"{url}/v1/completions",
        headers={"Authorization": f"Bearer {key}"},
        json={"model": model, "prompt": "block state", "max_tokens": 4, "temperature": 0},
        verify=verify,
        timeout=300,
    )
    assert answer.status_code == 200, answer.text[:500]
    return answer.json()


def leftovers() -> list[str]:
    """Containers and volumes of either project, and the certificate volume."""
    names = []
    for project in (SINGLE, SCALED):
        label = f"label=com.docker.compose.project={project}"
        names += docker("ps", "-a", "-q", "--filter", label).stdout.split()
        names += docker("volume", "ls", "-q", "--filter", label).stdout.split()
    names += docker("volume", "ls", "-q", "--filter", f"name=^{VOLUME}$").stdout.split()
    return sorted(set(names))


@pytest.fixture(scope="module")
def settings(cpu_image, tmp_path_factory):
    """A settings file of the CPU flavour on a free port with a key file, the environment
    the commands run in, and a teardown of everything either project made."""
    for side, ref in (("gateway", GATEWAY_IMAGE), ("router", ROUTER_IMAGE)):
        if not present(ref):
            build_target(side, ref)  # as make gateway-image / scale-images
    folder = tmp_path_factory.mktemp("scale-ca")
    key = secrets.token_hex(32)
    key_file = folder / "api-key"
    key_file.write_text(key + "\n")
    key_file.chmod(0o644)  # the containers' UID 1000 reads it
    port = free_port()
    text = (
        (ROOT / "docker" / "arcvllm.env").read_text().replace("\nSHM_SIZE=16g\n", "\nSHM_SIZE=1g\n")
    )
    text = re.sub(r"\nVLLM_API_KEY_FILE=.*\n", f"\nVLLM_API_KEY_FILE={key_file}\n", text)
    mine = folder / "mine.env"
    text = re.sub(r"\nPORT=.*\n", f"\nPORT={port}\n", text)
    text = re.sub(r"\nIMAGE=.*\n", f"\nIMAGE={cpu_image}\n", text)
    mine.write_text(text + f"CPU_IMAGE={cpu_image}\n")
    env = {**os.environ, "ARCVLLM_STATE_DIR": str(folder / "state")}
    for name in ("PORT", "IMAGE", "CPU_IMAGE", "GATEWAY_TLS_VOLUME", "ENV_FILE"):
        env.pop(name, None)
    single = ("--env-file", str(mine), "--project", SINGLE, "--flavor", "cpu")
    scaled = ("--env-file", str(mine), "--project", SCALED)
    try:
        yield env, single, scaled, port, key, folder
    finally:
        arcvllm(env, "scale", "down", *scaled, "--purge", timeout=600)
        arcvllm(env, "deploy", "down", *single, "-v", timeout=600)
        docker("volume", "rm", VOLUME, check=False)
        measured(f"scale CA measurements: {json.dumps(MEASURED)}")
        assert not leftovers(), leftovers()


def test_single_scale_single_keeps_the_gateways_ca(settings):
    env, single, scaled, port, key, folder = settings
    url = f"https://127.0.0.1:{port}"
    ca = folder / "ca.pem"
    t0 = time.monotonic()

    # 1. The single deployment, as make up starts it; the teammate's ca.pem from its gateway.
    ok(arcvllm(env, "deploy", "up", *single))
    gateway = docker(
        "ps", "-q", "--filter", f"label=com.docker.compose.project={SINGLE}",
        "--filter", "label=com.docker.compose.service=gateway",
    ).stdout.strip()  # fmt: skip
    deadline = time.monotonic() + 60
    while docker("exec", gateway, "test", "-s", CERT, check=False).returncode != 0:
        assert time.monotonic() < deadline, "no self-signed certificate in the gateway after 60 s"
        time.sleep(0.5)
    ca.write_text(docker("exec", gateway, "cat", CERT).stdout)
    Client(url, key, ca_cert=str(ca)).wait_healthy(600, interval=2)
    assert completion(url, key, ca)["choices"][0]["text"] is not None
    MEASURED["single_s"] = round(time.monotonic() - t0, 1)

    # 2. Scale-out while the single deployment still publishes the port: one line, exit 2,
    # nothing of the scale project started.
    refused = arcvllm(env, "scale", "up", "--cpu", *scaled, "--single-project", SINGLE)
    assert refused.returncode == 2, refused.stderr
    assert refused.stderr.strip().splitlines() == [
        f"arcvllm: the single deployment (project {SINGLE}) still serves the gateway's port "
        f"{port}: stop it first (make down ENV_FILE={single[1]} PROJECT={SINGLE}; its "
        "certificate is kept)"
    ]
    label = f"label=com.docker.compose.project={SCALED}"
    assert not docker("ps", "-a", "-q", "--filter", label).stdout.split()

    # 3. As docs/scale.md says: the single deployment down, then two replicas behind the
    # router; the same CA verifies the gateway and the client is served.
    t1 = time.monotonic()
    ok(arcvllm(env, "deploy", "down", *single, timeout=600))
    ok(
        arcvllm(
            env, "scale", "up", "--cpu", *scaled, "--single-project", SINGLE, "--timeout", "1500"
        )
    )
    MEASURED["scale_up_s"] = round(time.monotonic() - t1, 1)
    assert served_certificate(port) == der(ca)
    assert completion(url, key, ca)["choices"]

    # 4. Back to one server: the same CA again.
    t2 = time.monotonic()
    ok(arcvllm(env, "scale", "down", *scaled, "--purge", timeout=600))
    assert docker("volume", "ls", "-q", "--filter", f"name=^{VOLUME}$").stdout.split() == [VOLUME]
    ok(arcvllm(env, "deploy", "up", *single))
    Client(url, key, ca_cert=str(ca)).wait_healthy(600, interval=2)
    assert served_certificate(port) == der(ca)
    assert completion(url, key, ca)["choices"]
    MEASURED["back_to_single_s"] = round(time.monotonic() - t2, 1)
