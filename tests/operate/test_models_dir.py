"""The operator's path to a served model on the CPU, whole: `arcvllm model fetch` fills a
MODELS_DIR from the stand-in of the hub's HTTP interface (tests/support/hub.py) with the
real huggingface_hub client, then `make up FLAVOR=cpu PRESET=tiny-hybrid-cpu-models
MODELS_DIR=...` serves it read-only at /models through the gateway (real compose, the
image's real vLLM server), then `make down`. And `make up` on an empty MODELS_DIR refuses
in one line before compose creates anything.

The stand-in publishes the files of the tiny model the CPU image carries (`arcvllm
tinymodel build`'s output, copied out of the image) under the repository and commit the
preset pins, as a hub mirror would.
"""

from __future__ import annotations

import json
import os
import ssl
import subprocess
import sys
from pathlib import Path

import pytest
from support import ROOT
from support.docker import IMAGE, docker
from support.hub import HubStandIn, hub_standin
from support.processes import free_port, make
from support.scale import build_target, side_image

from arcvllm.presets import get_preset

PRESET = "tiny-hybrid-cpu-models"
TEMPLATE = ROOT / "docker" / "arcvllm.env"
KEY = "k-5d1c0b7e93"
GATEWAY_IMAGE = os.environ.get("ARCVLLM_TEST_GATEWAY_IMAGE") or side_image("gateway")


def deployment(folder: Path, image: str, models: Path) -> list[str]:
    """`make up`'s names for a deployment of PRESET of its own (settings file with a key
    file, project, port) serving MODELS."""
    key_file = folder / "api-key"
    key_file.write_text(f"{KEY}\n")
    key_file.chmod(0o644)  # the containers' UID 1000 reads the bind-mounted file
    mine = folder / "mine.env"
    text = TEMPLATE.read_text().replace(
        "\nVLLM_API_KEY_FILE=../secrets/api-key\n", f"\nVLLM_API_KEY_FILE={key_file}\n"
    )
    assert f"VLLM_API_KEY_FILE={key_file}" in text
    mine.write_text(text.replace("\nSHM_SIZE=16g\n", "\nSHM_SIZE=1g\n"))
    port = free_port()
    return [
        "FLAVOR=cpu",
        "STACK=cpu",
        f"PRESET={PRESET}",
        f"MODELS_DIR={models}",
        f"IMAGE={image}",
        f"GATEWAY_IMAGE={GATEWAY_IMAGE}",
        f"ENV_FILE={mine}",
        f"PROJECT=arcvllm-models-{port}",
        f"PORT={port}",
    ]


def named(args: list[str], name: str) -> str:
    return next(a.split("=", 1)[1] for a in args if a.startswith(f"{name}="))


def made_by(project: str) -> dict[str, list[str]]:
    """What the engine holds of compose project PROJECT: containers (running or not),
    networks and volumes."""
    label = f"label=com.docker.compose.project={project}"
    return {
        "containers": docker("ps", "-aq", "--filter", label).stdout.split(),
        "networks": docker("network", "ls", "-q", "--filter", label).stdout.split(),
        "volumes": docker("volume", "ls", "-q", "--filter", label).stdout.split(),
    }


@pytest.fixture(scope="module")
def published(cpu_image, tmp_path_factory):
    """The stand-in hub publishing the tiny model under the preset's repo and pinned commit."""
    checkpoint = get_preset(PRESET).checkpoint
    folder = tmp_path_factory.mktemp("hub") / "tiny-hybrid"
    made = docker("create", cpu_image).stdout.strip()
    try:
        docker("cp", f"{made}:/opt/arcvllm/models/tiny-hybrid", str(folder))
    finally:
        docker("rm", "-v", made)  # and its anonymous /var/cache/arcvllm volume
    with hub_standin() as hub:
        hub.add(checkpoint["repo"], folder, commit=checkpoint["revision"])
        yield hub


def fetch(hub: HubStandIn, models: Path, home: Path) -> subprocess.CompletedProcess:
    """`arcvllm model fetch PRESET --models-dir MODELS` with HF_ENDPOINT the stand-in."""
    return subprocess.run(
        [sys.executable, "-m", "arcvllm", "model", "fetch", PRESET, "--models-dir", str(models),
         "--json"],
        capture_output=True, text=True, timeout=300, cwd=home,
        env={**os.environ, "HF_ENDPOINT": hub.url, "HF_HOME": str(home / "hf")},
    )  # fmt: skip


@pytest.mark.docker
def test_a_model_fetched_into_models_dir_is_served_by_make_up_through_the_gateway(
    cpu_image, published, tmp_path
):
    from arcvllm.client.api import Client, WaitTimeout, wait_until

    if not os.environ.get("ARCVLLM_TEST_GATEWAY_IMAGE"):
        build_target("gateway", GATEWAY_IMAGE)
    models = tmp_path / "models"
    done = fetch(published, models, tmp_path)
    assert done.returncode == 0, done.stderr
    doc = json.loads(done.stdout)
    assert (doc["commit"], doc["dir"]) == (get_preset(PRESET).checkpoint["revision"],
                                           str(models / "tiny-hybrid"))  # fmt: skip
    args = deployment(tmp_path, cpu_image, models)
    project, port = named(args, "PROJECT"), named(args, "PORT")
    up = make("up", *args)
    try:
        assert up.returncode == 0, up.stdout + up.stderr
        label = f"label=com.docker.compose.project={project}"
        ps = ("ps", "-q", "--filter", label, "--filter")
        (cid,) = docker(*ps, "label=com.docker.compose.service=vllm-cpu").stdout.split()
        (gid,) = docker(*ps, "label=com.docker.compose.service=gateway").stdout.split()
        (mount,) = [m for m in json.loads(docker("inspect", cid).stdout)[0]["Mounts"]
                    if m["Destination"] == "/models"]  # fmt: skip
        assert (mount["Source"], mount["RW"]) == (str(models), False)
        cert = "/var/lib/arcvllm-gateway/tls/cert.pem"
        wait_until(lambda: docker("exec", gid, "test", "-s", cert, check=False).returncode == 0,
                   60, 0.5, "the gateway's certificate")  # fmt: skip
        ca_cert = tmp_path / "ca.pem"
        ca_cert.write_text(docker("exec", gid, "cat", cert).stdout)
        url = f"https://127.0.0.1:{port}"

        def running() -> None:
            if not json.loads(docker("inspect", cid).stdout)[0]["State"]["Running"]:
                raise WaitTimeout("the server's container exited")

        try:
            Client(url, ca_cert=str(ca_cert)).wait_healthy(600, interval=2, alive=running)
        except WaitTimeout as exc:
            logs = docker("logs", "--tail", "40", cid, check=False)
            pytest.fail(f"not healthy: {exc}\n{logs.stdout[-3000:]}{logs.stderr[-3000:]}")
        import httpx

        answer = httpx.post(
            f"{url}/v1/completions",
            json={"model": "tiny-hybrid", "prompt": "block state", "max_tokens": 8,
                  "temperature": 0},
            headers={"Authorization": f"Bearer {KEY}"},
            verify=ssl.create_default_context(cafile=str(ca_cert)),
            timeout=120,
        )  # fmt: skip
        assert answer.status_code == 200, answer.text
        assert answer.json()["usage"]["completion_tokens"] == 8
        log = docker("logs", cid)
        assert "/models/tiny-hybrid" in log.stdout + log.stderr
    finally:
        down = make("down", *args, "DOWN_FLAGS=-v")
    assert down.returncode == 0, down.stderr
    assert made_by(project) == {"containers": [], "networks": [], "volumes": []}


@pytest.mark.docker
def test_make_up_refuses_an_empty_models_dir_before_it_creates_anything(engine, tmp_path):
    """One line naming the model and `make up` failing, and the engine holds nothing of the
    project: no container, network or volume.

    Shown failing without the check: with `return` as the first line of
    arcvllm.operate.single.check_model, `make up` exits 0 and the project has its two
    containers (a server with no model, restarting), one network and three volumes; this
    test then fails at its first assertion (tried once, 2026-12-06)."""
    models = tmp_path / "models"
    models.mkdir()
    args = deployment(tmp_path, IMAGE, models)
    project = named(args, "PROJECT")
    up = make("up", *args)
    try:
        assert up.returncode != 0, up.stdout + up.stderr
        said = [line for line in up.stderr.splitlines() if line.startswith("arcvllm:")]
        assert said == [
            f"arcvllm: the model of {PRESET} is not ready: no folder {models / 'tiny-hybrid'} "
            f"(MODELS_DIR): arcvllm model fetch {PRESET} (make model)"
        ], up.stderr
        assert made_by(project) == {"containers": [], "networks": [], "volumes": []}
    finally:
        make("down", *args, "DOWN_FLAGS=-v")  # nothing to remove, unless the check is gone
