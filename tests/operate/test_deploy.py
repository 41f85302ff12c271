"""`make up` as an operator runs it: the CPU service and its gateway started from a settings
file of their own (ENV_FILE) under its own compose project and port, then torn down.

Proves the settings file reaches the deployment: the key file it names (VLLM_API_KEY_FILE)
makes the API answer 401 without the key and 200 with it, through the gateway; and the
container's environment, which is that file, leaves the TP=2 preset both GPUs
(ZE_AFFINITY_MASK empty). tests/deploy/test_gateway.py looks at the gateway itself.
"""

from __future__ import annotations

import json
import os
import ssl
import subprocess
import sys
from pathlib import Path
from typing import NamedTuple

import pytest
from support import ROOT
from support.docker import docker
from support.processes import free_port, make
from support.scale import build_target, side_image

from arcvllm.client.api import wait_until

TEMPLATE = ROOT / "docker" / "arcvllm.env"
KEY = "k-7f3e9a1c2b"
MODEL = "tiny-hybrid"
GATEWAY_IMAGE = os.environ.get("ARCVLLM_TEST_GATEWAY_IMAGE") or side_image("gateway")


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
    from arcvllm.client.api import Client, WaitTimeout

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


# ---- the deployment as named (arcvllm/operate/single.py), no engine ----


def names(**given):
    from arcvllm.operate.single import Names

    fields = dict(env_file=TEMPLATE, flavor=None, stack=None, preset=None, image=None)
    fields |= dict(gateway_image=None, port=None, project="arcvllm", gpus_file=None)
    return Names(**{**fields, **given})


def test_a_deployment_named_by_flavour_alone_is_its_default_stack_and_the_stacks_preset(tmp_path):
    from arcvllm.operate import single
    from arcvllm.stack import load, side_images

    defaults = load()[1]
    cpu = single.resolve(names(flavor="cpu"), environ={}, dri_dir=tmp_path)
    assert (cpu.stack, cpu.preset, cpu.service) == (defaults["cpu"], "tiny-hybrid-cpu", "vllm-cpu")
    assert cpu.image == f"arcvllm:{defaults['cpu']}" and cpu.port == "8443"
    assert cpu.gateway_image == side_images()["gateway"].ref
    assert cpu.render_gid == ""  # no render node under tmp_path
    xpu = single.resolve(names(flavor="xpu"), environ={}, dri_dir=tmp_path)
    assert (xpu.stack, xpu.service) == (defaults["xpu"], "vllm")
    assert single.resolve(names(stack="cpu"), environ={}, dri_dir=tmp_path).flavor == "cpu"


def test_the_image_and_port_are_the_shells_then_the_settings_files_then_the_flag_wins(tmp_path):
    from arcvllm.operate import single

    mine = tmp_path / "mine.env"
    mine.write_text("IMAGE=foo:bar\nPORT=8123\n")
    named = single.resolve(names(env_file=mine, flavor="cpu"), environ={}, dri_dir=tmp_path)
    assert (named.image, named.port) == ("foo:bar", "8123")
    shell = {"IMAGE": "baz:qux", "PORT": "7443", "RENDER_GID": "993"}
    named = single.resolve(names(env_file=mine, flavor="cpu"), environ=shell, dri_dir=tmp_path)
    assert (named.image, named.port, named.render_gid) == ("baz:qux", "7443", "993")
    given = names(env_file=mine, flavor="cpu", image="a:b", port="1")
    assert single.resolve(given, environ=shell, dri_dir=tmp_path).image == "a:b"
    assert named.variables()["RENDER_GID"] == "993"


def test_a_stack_of_another_flavour_or_none_is_a_usage_error(tmp_path):
    from arcvllm.errors import UsageError
    from arcvllm.operate import single

    with pytest.raises(UsageError, match="stack cpu is cpu, not xpu"):
        single.resolve(names(flavor="xpu", stack="cpu"), environ={}, dri_dir=tmp_path)
    with pytest.raises(UsageError, match="unknown stack 'nope'; stacks: "):
        single.resolve(names(stack="nope"), environ={}, dri_dir=tmp_path)


def test_the_throwaway_secrets_are_a_key_by_the_key_rule_and_a_certificate_for_localhost(tmp_path):
    from arcvllm import options
    from arcvllm.operate import single

    folder = tmp_path / "smoke-gateway"
    key = single.make_secrets(folder)
    assert options.read_key(folder / "api-key") == key and len(key) == 48
    assert folder.stat().st_mode & 0o777 == 0o700
    assert all((folder / n).stat().st_mode & 0o777 == 0o644 for n in ("api-key", "key.pem"))
    text = subprocess.run(
        ["openssl", "x509", "-in", str(folder / "cert.pem"), "-noout", "-subject", "-ext",
         "subjectAltName"], capture_output=True, text=True, check=True,
    ).stdout  # fmt: skip
    assert "CN = localhost" in text and "IP Address:127.0.0.1" in text
    assert single.make_secrets(folder) != key  # made anew each time


def test_the_emulated_settings_have_the_emulation_on_once(tmp_path):
    from arcvllm.operate import single

    mine = tmp_path / "mine.env"
    mine.write_text("PORT=8123\nARCVLLM_EMULATE_HIGH_ADDRESSES=0\n")
    out = single.emulated(mine, tmp_path / "build" / "emulated.env")
    assert out.read_text() == "PORT=8123\nARCVLLM_EMULATE_HIGH_ADDRESSES=1\n"


FAKE_COMPOSE = """#!/bin/sh
echo "$*" >> {calls}
case " $* " in *" logs "*) echo "the server's log line";; esac
exit 0
"""


def run_cli(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "arcvllm", *args],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=ROOT,
        env={**os.environ, **env},
    )


def test_the_smoke_test_of_a_server_that_never_answers_saves_its_log_and_removes_it_all(
    tmp_path,
):
    """The lifecycle of `make smoke-check`: compose up, no /health in time, then the log
    into the report's .log, `down -v`, and the secrets removed; exit 1."""
    calls, fake = tmp_path / "calls", tmp_path / "compose"
    fake.write_text(FAKE_COMPOSE.format(calls=calls))
    fake.chmod(0o755)
    secrets, report = tmp_path / "secrets", tmp_path / "reports" / "smoke.json"
    done = run_cli(
        "deploy", "smoke", "--flavor", "cpu", "--port", str(free_port()),
        "--secrets", str(secrets), "--out", str(report), "--health-timeout", "1",
        env={"COMPOSE": str(fake)},
    )  # fmt: skip
    assert done.returncode == 1, done.stderr
    said = calls.read_text().splitlines()
    assert said[0].endswith("--profile cpu up -d vllm-cpu gateway")
    assert said[-1].endswith("--profile cpu down -v --remove-orphans")
    assert report.with_suffix(".log").read_text() == "the server's log line\n"
    assert json.loads(report.read_text())["failed"] == ["server start"]
    assert not secrets.exists()


def test_make_up_refuses_a_bad_key_file_before_compose_runs(tmp_path):
    calls, fake = tmp_path / "calls", tmp_path / "compose"
    fake.write_text(FAKE_COMPOSE.format(calls=calls))
    fake.chmod(0o755)
    mine = tmp_path / "mine.env"
    mine.write_text(f"VLLM_API_KEY_FILE={tmp_path / 'none'}\n")
    done = run_cli("deploy", "up", "--flavor", "cpu", "--env-file", str(mine),
                   env={"COMPOSE": str(fake)})  # fmt: skip
    assert done.returncode == 3 and "is not a readable file" in done.stderr
    assert not calls.exists()
    (tmp_path / "none").write_text("k-1\n")
    done = run_cli("deploy", "up", "--flavor", "cpu", "--env-file", str(mine),
                   env={"COMPOSE": str(fake), "DOCKER": fake_docker(tmp_path)})  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert calls.read_text().strip().endswith("--profile cpu up -d vllm-cpu gateway")


# ---- make up: the images are on the engine before anything starts ----

# A Docker client whose engine holds the images named in the file HAVE (one a line): what
# `docker image inspect` says of each, as Docker 26 says it.
FAKE_DOCKER = """#!/bin/sh
echo "$*" >> {calls}
for ref; do :; done
if grep -qxF "$ref" {have} 2>/dev/null; then echo sha256:0; exit 0; fi
echo "Error response from daemon: No such image: $ref" >&2
exit 1
"""


def fake_docker(tmp_path: Path, *have: str) -> str:
    """A Docker client whose engine holds HAVE (none given: every image)."""
    fake, listed = tmp_path / "docker", tmp_path / "images"
    script = FAKE_DOCKER.format(calls=tmp_path / "docker-calls", have=listed)
    fake.write_text(script if have else "#!/bin/sh\necho sha256:0\n")
    fake.chmod(0o755)
    listed.write_text("".join(f"{ref}\n" for ref in have))
    return str(fake)


@pytest.mark.parametrize(
    ("ref", "side", "command"),
    [
        ("arcvllm:xpu-0.33", None, "make build STACK=xpu-0.33"),
        ("arcvllm:cpu", None, "make build STACK=cpu"),
        ("arcvllm:xpu-0.32", None, "make build STACK=xpu-0.32"),  # a stack's, not the default's
        ("arcvllm:cpu-a", None, "make build STACK=cpu IMAGE=arcvllm:cpu-a"),
        ("registry.example.org/arcvllm@sha256:" + "0" * 64, None,
         "docker pull registry.example.org/arcvllm@sha256:" + "0" * 64),
        ("localhost:5000/arcvllm:cpu", None, "docker pull localhost:5000/arcvllm:cpu"),
        ("arcvllm-gateway:1.22.1", "gateway", "make gateway-image"),
        ("gw:mine", "gateway", "make gateway-image GATEWAY_IMAGE=gw:mine"),
        ("ghcr.io/example/gateway:1", "gateway", "docker pull ghcr.io/example/gateway:1"),
        ("arcvllm-prometheus:2.42", "prometheus", "make scale-images"),
        ("arcvllm-alertmanager:0.25", "alertmanager", "make scale-images"),
        ("prom:mine", "prometheus",
         "make scale-images && docker tag arcvllm-prometheus:2.42 prom:mine"),
    ],
)  # fmt: skip
def test_a_missing_image_names_the_command_that_builds_or_pulls_it(ref, side, command):
    from arcvllm import stack
    from arcvllm.operate import single

    sides = stack.side_images()
    assert [sides[s].ref for s in ("gateway", "prometheus", "alertmanager")] == [
        "arcvllm-gateway:1.22.1", "arcvllm-prometheus:2.42", "arcvllm-alertmanager:0.25"
    ]  # the defaults above  # fmt: skip
    stacks, _ = stack.load()
    assert single.image_source(ref, side, "cpu", stacks) == command


def test_make_up_without_the_image_is_one_line_exit_3_and_compose_never_runs(tmp_path):
    from arcvllm.stack import side_images

    calls, fake = tmp_path / "calls", tmp_path / "compose"
    fake.write_text(FAKE_COMPOSE.format(calls=calls))
    fake.chmod(0o755)
    key = tmp_path / "key"
    key.write_text("k-1\n")
    mine = tmp_path / "mine.env"
    mine.write_text(f"VLLM_API_KEY_FILE={key}\nIMAGE=\n")
    gateway = side_images()["gateway"].ref
    up = ("deploy", "up", "--flavor", "cpu", "--stack", "cpu", "--env-file", str(mine))
    docker = fake_docker(tmp_path, gateway)
    done = run_cli(*up, env={"COMPOSE": str(fake), "DOCKER": docker})
    assert done.returncode == 3, done.stderr
    assert done.stderr.splitlines() == [
        "arcvllm: no image arcvllm:cpu on the Docker engine: make build STACK=cpu"
    ]
    assert not calls.exists()
    docker = fake_docker(tmp_path, "arcvllm:cpu")
    done = run_cli(*up, env={"COMPOSE": str(fake), "DOCKER": docker})
    assert done.returncode == 3 and done.stderr.splitlines() == [
        f"arcvllm: no image {gateway} on the Docker engine: make gateway-image"
    ], done.stderr
    assert not calls.exists()
    docker = fake_docker(tmp_path, "arcvllm:cpu", gateway)
    done = run_cli(*up, env={"COMPOSE": str(fake), "DOCKER": docker})
    assert done.returncode == 0, done.stderr
    assert calls.read_text().strip().endswith("--profile cpu up -d vllm-cpu gateway")


def test_an_engine_that_does_not_answer_is_one_line_exit_3(tmp_path):
    key = tmp_path / "key"
    key.write_text("k-1\n")
    mine = tmp_path / "mine.env"
    mine.write_text(f"VLLM_API_KEY_FILE={key}\n")
    done = run_cli("deploy", "up", "--flavor", "cpu", "--env-file", str(mine),
                   env={"COMPOSE": "false", "DOCKER_HOST": "unix:///nonexistent.sock"})  # fmt: skip
    assert done.returncode == 3, done.stderr
    (line,) = done.stderr.splitlines()
    assert line.startswith("arcvllm: docker image inspect arcvllm:cpu failed: ") and (
        "Cannot connect to the Docker daemon" in line
    ), line


# ---- the preset named is the preset served (issue: `deploy up --preset X`) ----


def test_the_preset_named_is_the_one_compose_gives_the_server(tmp_path):
    for flavor, preset, variable in (
        ("xpu", "qwen3.6-35b-a3b-w4a16-2xb70", "ARCVLLM_PRESET"),
        ("cpu", "tiny-hybrid-cpu-mtp", "CPU_PRESET"),
    ):
        done = run_cli("deploy", "up", "--dry-run", "--flavor", flavor, "--preset", preset,
                       env={"COMPOSE": "compose"})  # fmt: skip
        assert done.returncode == 0, done.stderr
        assert f"{variable}={preset} " in done.stdout, done.stdout


def test_the_settings_files_preset_is_served_when_none_is_named(tmp_path):
    from arcvllm.operate import single

    mine = tmp_path / "mine.env"
    mine.write_text("ARCVLLM_PRESET=qwen3.6-35b-a3b-w4a16-2xb70\n")
    named = single.resolve(names(env_file=mine, flavor="xpu"), environ={}, dri_dir=tmp_path)
    assert named.preset == "qwen3.6-35b-a3b-w4a16-2xb70"
    assert named.variables()["ARCVLLM_PRESET"] == "qwen3.6-35b-a3b-w4a16-2xb70"
    shell = {"ARCVLLM_PRESET": "qwen3.6-35b-a3b-w4a16-1xb70"}
    given = names(env_file=mine, flavor="xpu")
    assert single.resolve(given, environ=shell, dri_dir=tmp_path).preset == (
        "qwen3.6-35b-a3b-w4a16-1xb70"
    )  # the shell's wins, as in compose
    # the CPU server's is CPU_PRESET: the settings file's ARCVLLM_PRESET is the XPU server's
    cpu = single.resolve(names(env_file=mine, flavor="cpu"), environ={}, dri_dir=tmp_path)
    assert cpu.preset == "tiny-hybrid-cpu"
    given = names(env_file=mine, preset="granite-4.0-h-tiny-1xb70")
    assert single.resolve(given, environ=shell, dri_dir=tmp_path).preset == (
        "granite-4.0-h-tiny-1xb70"
    )


def test_a_preset_named_alone_chooses_its_flavour_and_a_stack_it_runs_on(tmp_path):
    from arcvllm.operate import single

    cpu = single.resolve(names(preset="tiny-hybrid-cpu-mtp"), environ={}, dri_dir=tmp_path)
    assert (cpu.flavor, cpu.stack, cpu.service) == ("cpu", "cpu", "vllm-cpu")
    xpu = single.resolve(names(preset="qwen3.6-35b-a3b-w4a16-2xb70"), environ={}, dri_dir=tmp_path)
    assert xpu.flavor == "xpu" and xpu.stack in ("xpu-0.23", "xpu-0.33")


@pytest.mark.parametrize(
    ("args", "said"),
    [
        (("--preset", "nope"), "arcvllm: unknown preset 'nope'; presets: "),
        (("--preset", "tiny-hybrid-cpu", "--flavor", "xpu"), "preset tiny-hybrid-cpu is cpu, not"),
        (
            ("--preset", "qwen3.6-35b-a3b-w4a16-1xb70", "--stack", "xpu-0.20"),
            "preset qwen3.6-35b-a3b-w4a16-1xb70 does not run on stack xpu-0.20 "
            "(its stacks: xpu-0.23, xpu-0.32, xpu-0.33)",
        ),
    ],
)
def test_a_preset_that_cannot_be_served_is_one_line_and_exit_2(tmp_path, args, said):
    calls, fake = tmp_path / "calls", tmp_path / "compose"
    fake.write_text(FAKE_COMPOSE.format(calls=calls))
    fake.chmod(0o755)
    for dry in ((), ("--dry-run",)):
        done = run_cli("deploy", "up", *args, *dry, env={"COMPOSE": str(fake)})
        assert done.returncode == 2, done.stderr
        assert done.stderr.count("\n") == 1 and said in done.stderr, done.stderr
        assert not calls.exists()


def test_deploy_doctor_checks_the_settings_files_preset_two_b70s(tmp_path):
    """A two-B70 operator's settings file gets the two-GPU verdict, not the default's."""
    mine = tmp_path / "mine.env"
    mine.write_text("ARCVLLM_PRESET=qwen3.6-35b-a3b-w4a16-2xb70\n")
    for command in (("deploy", "doctor", "--flavor", "xpu"), ("doctor",)):
        done = run_cli(*command, "--env-file", str(mine), "--json", env={})
        doc = json.loads(done.stdout)
        assert doc["preset"] == "qwen3.6-35b-a3b-w4a16-2xb70", (command, done.stderr)
        (gpu,) = [r for r in doc["rows"] if r["check"] == "GPU (sysfs)"]
        assert "needs 2 GPU(s)" in gpu["seen"] or "no XPU" in gpu["seen"], gpu


# ---- the key file: made so the containers' user (UID 1000) reads it ----


def test_deploy_key_makes_the_settings_files_key_file_once(tmp_path):
    mine = tmp_path / "mine.env"
    key_file = tmp_path / "secrets" / "api-key"
    mine.write_text(f"VLLM_API_KEY_FILE={key_file}\n")
    done = run_cli("deploy", "key", "--env-file", str(mine), env={})
    assert done.returncode == 0, done.stderr
    key = key_file.read_text().strip()
    assert key not in done.stdout + done.stderr and str(key_file) in done.stdout
    assert key_file.stat().st_mode & 0o777 == 0o644
    again = run_cli("deploy", "key", "--env-file", str(mine), env={})
    assert again.returncode == 2 and "already exists" in again.stderr
    assert key_file.read_text().strip() == key


@pytest.mark.docker
def test_the_key_deploy_key_makes_is_read_in_a_container_as_uid_1000_and_a_private_one_is_not(
    engine, tmp_path
):
    """What the check says is what a container of UID 1000 finds: the key `deploy key`
    makes is read there; one made with umask 077 by root is refused by both."""
    from arcvllm.errors import Unavailable
    from arcvllm.operate import host

    made = tmp_path / "secrets" / "api-key"
    host.new_api_key_file(made)
    private = tmp_path / "private"
    private.write_text("k-1\n")
    private.chmod(0o600)

    def read_in_container(path: Path) -> int:
        return docker("run", "--rm", "--user", "1000:1000", "-v", f"{path}:/run/secrets/api-key:ro",
                      "debian:bookworm-slim", "cat", "/run/secrets/api-key",
                      check=False).returncode  # fmt: skip

    assert read_in_container(made) == 0
    host.check_api_key_file(made)
    if os.geteuid() != 1000:
        assert read_in_container(private) != 0
        with pytest.raises(Unavailable, match="not readable by UID 1000"):
            host.check_api_key_file(private)


def made_by(project: str) -> dict[str, list[str]]:
    """What the engine holds of compose project PROJECT: containers, networks, volumes."""
    label = f"label=com.docker.compose.project={project}"
    return {
        "containers": docker("ps", "-aq", "--filter", label).stdout.split(),
        "networks": docker("network", "ls", "-q", "--filter", label).stdout.split(),
        "volumes": docker("volume", "ls", "-q", "--filter", label).stdout.split(),
    }


@pytest.mark.docker
def test_make_up_without_its_images_creates_nothing_on_the_engine(engine, tmp_path):
    """`make up` naming images the engine has not: one line naming the commands that make
    them, a non-zero exit, and no container, network or volume of the project."""
    key = tmp_path / "api-key"
    key.write_text(f"{KEY}\n")
    mine = tmp_path / "mine.env"
    mine.write_text(TEMPLATE.read_text().replace(
        "\nVLLM_API_KEY_FILE=../secrets/api-key\n", f"\nVLLM_API_KEY_FILE={key}\n"))  # fmt: skip
    project = f"arcvllm-noimage-{free_port()}"
    image, gateway = "arcvllm:cpu-never-built", "arcvllm-gateway:never-built"
    assert docker("image", "inspect", image, check=False).returncode != 0
    args = ["FLAVOR=cpu", "STACK=cpu", f"IMAGE={image}", f"GATEWAY_IMAGE={gateway}",
            f"ENV_FILE={mine}", f"PROJECT={project}", f"PORT={free_port()}"]  # fmt: skip
    up = make("up", *args)
    try:
        assert up.returncode != 0, up.stdout + up.stderr
        said = [line for line in up.stderr.splitlines() if line.startswith("arcvllm:")]
        assert said == [
            f"arcvllm: no image {image} on the Docker engine: make build STACK=cpu IMAGE={image}; "
            f"no image {gateway} on the Docker engine: make gateway-image GATEWAY_IMAGE={gateway}"
        ], up.stderr
        assert made_by(project) == {"containers": [], "networks": [], "volumes": []}
    finally:
        make("down", *args, "DOWN_FLAGS=-v")  # nothing to remove, unless the check is gone


# ---- make monitoring: beside the deployment, the gateway left as `make up` made it ----


def test_monitoring_runs_compose_with_up_s_settings_and_variables_and_no_deps(tmp_path):
    """The canary depends on the gateway: compose recreates a dependency whose settings
    differ from the ones it is given, so monitoring gives compose `make up`'s settings file
    and variables (the same project) and --no-deps."""
    mine = tmp_path / "mine.env"
    mine.write_text("PORT=8123\nIMAGE=arcvllm:cpu-a\n")
    argv = ("--flavor", "cpu", "--env-file", str(mine), "--project", "p1", "--dry-run")
    (up,) = run_cli("deploy", "up", *argv, env={}).stdout.splitlines()
    own, alerts = run_cli("deploy", "monitoring", *argv, env={}).stdout.splitlines()
    variables = up.split(" /")[0]  # ENV_FILE=... IMAGE=... PORT=... before the command
    assert "IMAGE=arcvllm:cpu-a PORT=8123 " in variables
    assert own.startswith(variables + " ") and alerts.startswith(variables + " ")
    assert up.endswith(f"-p p1 --env-file {mine} -f {ROOT}/docker/compose.yaml --profile cpu "
                       "up -d vllm-cpu gateway")  # fmt: skip
    assert own.endswith(
        f"-p p1 --env-file {mine} -f {ROOT}/docker/compose.yaml --profile cpu "
        "--profile monitoring up -d --no-deps prometheus-single canary"
    )
    both = f"-f {ROOT}/docker/compose.yaml -f {ROOT}/docker/compose.scale.yaml --profile cpu"
    assert alerts.endswith(
        f"-p p1 --env-file {mine} {both} --profile monitoring up -d --no-deps alertmanager"
    )
    # `make down` takes what monitoring started with it (else the network stays in use)
    (down,) = run_cli("deploy", "down", *argv, "-v", env={}).stdout.splitlines()
    assert down.startswith(variables + " ")
    assert down.endswith(f"-p p1 --env-file {mine} {both} --profile monitoring down -v")


def test_monitoring_is_refused_without_a_receiver_or_a_running_gateway_before_compose_starts(
    tmp_path,
):
    calls, fake = tmp_path / "calls", tmp_path / "compose"
    fake.write_text(FAKE_COMPOSE.format(calls=calls))  # `ps -q gateway`: nothing runs
    fake.chmod(0o755)
    mine = tmp_path / "mine.env"
    mine.write_text("PORT=8123\n")
    argv = ("deploy", "monitoring", "--flavor", "cpu", "--env-file", str(mine))
    env = {"COMPOSE": str(fake), "DOCKER": fake_docker(tmp_path), "ALERT_WEBHOOK_URL": ""}
    done = run_cli(*argv, env=env)
    assert done.returncode == 3 and done.stderr.splitlines() == [
        "arcvllm: ALERT_WEBHOOK_URL is not set (the webhook Alertmanager sends alerts to; "
        f"put it in {mine} or export it)"
    ], done.stderr
    assert not calls.exists()
    mine.write_text("PORT=8123\nALERT_WEBHOOK_URL=https://hooks.example.org/a\n")
    done = run_cli(*argv, env=env)
    assert done.returncode == 3 and done.stderr.splitlines() == [
        "arcvllm: no gateway of project arcvllm runs: make up first"
    ], done.stderr
    done = run_cli(*argv, "--scale", env=env)  # the scale-out's twin: its own project
    assert done.returncode == 3 and done.stderr.splitlines() == [
        "arcvllm: no gateway of project arcvllm-scale runs: arcvllm scale up first"
    ], done.stderr
    asked = [line.split(" -f ")[-1].split(" ", 1)[1] for line in calls.read_text().splitlines()]
    assert asked == ["--profile cpu ps -q gateway", "ps -q gateway"]  # asked, nothing started


def test_scale_monitoring_is_the_twin_in_the_scale_outs_project_with_the_replicas_image(
    tmp_path,
):
    """`make scale-monitoring`: compose.scale.yaml's Prometheus, Alertmanager and the canary
    in `arcvllm scale up`'s project and files, --no-deps; the canary in the CPU replicas'
    image (CPU_IMAGE), the XPU replicas' (IMAGE)."""
    mine = tmp_path / "mine.env"
    mine.write_text("IMAGE=arcvllm:xpu-0.33-b\nCPU_IMAGE=arcvllm:cpu-b\n")
    env = {"ARCVLLM_STATE_DIR": str(tmp_path / "state")}  # no replicas' file
    files = f"-f {ROOT}/docker/compose.yaml -f {ROOT}/docker/compose.scale.yaml"
    for flavor, image in (("cpu", "arcvllm:cpu-b"), ("xpu", "arcvllm:xpu-0.33-b")):
        argv = ("--flavor", flavor, "--env-file", str(mine), "--dry-run")
        done = run_cli("deploy", "monitoring", "--scale", *argv, env=env)
        (line,) = done.stdout.splitlines()
        assert line.startswith(f"ENV_FILE={mine} IMAGE={image} "), line
        assert line.endswith(f"-p arcvllm-scale --env-file {mine} {files} --profile monitoring "
                             "up -d --no-deps prometheus alertmanager canary"), line  # fmt: skip
    made = make("-n", "scale-monitoring", f"ENV_FILE={mine}", "FLAVOR=cpu")
    assert f"deploy monitoring --scale --env-file {mine} --flavor cpu" in made.stdout, made.stderr
