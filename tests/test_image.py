"""The images: Dockerfile lint, the entrypoint's contract, and the built CPU image itself.

Docker-marked tests need an engine (scripts/ci/engine.sh up, or `make test`, which wraps
pytest in scripts/ci/engine.sh run) and build the CPU image with `make build` (a cache hit
when CI built it just before).
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
import urllib.request
from pathlib import Path

import pytest
from conftest import free_port

from arcvllm.client import WaitTimeout, wait_until

ROOT = Path(__file__).resolve().parent.parent
DOCKERFILE = ROOT / "docker" / "Dockerfile"
ENTRYPOINT = ROOT / "docker" / "entrypoint.sh"
VENV_BIN = ROOT / ".venv" / "bin"
IMAGE = os.environ.get("ARCVLLM_TEST_IMAGE", "arcvllm:cpu")
ENGINE_SOCKET = "/run/arcvllm-docker/docker.sock"


def tool(name: str) -> str:
    path = VENV_BIN / name
    if path.exists():
        return str(path)
    found = shutil.which(name)
    if not found:
        pytest.fail(f"{name} not found: run `make venv`")
    return found


# ---- lint -------------------------------------------------------------------------------


def test_hadolint_passes_the_dockerfile():
    result = subprocess.run([tool("hadolint"), str(DOCKERFILE)], capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr


def test_hadolint_catches_a_bad_dockerfile(tmp_path):
    bad = tmp_path / "Dockerfile"
    bad.write_text("FROM debian\nRUN apt-get update && apt-get install -y curl\n")
    result = subprocess.run([tool("hadolint"), str(bad)], capture_output=True, text=True)
    assert result.returncode != 0
    assert "DL3008" in result.stdout or "DL3006" in result.stdout


def scripts() -> list[Path]:
    return [
        *sorted((ROOT / "docker").glob("*.sh")),
        *sorted((ROOT / "scripts" / "ci").glob("*.sh")),
        ROOT / ".ci" / "run",
    ]


def test_shellcheck_passes_the_image_and_ci_scripts():
    result = subprocess.run(
        [tool("shellcheck"), *map(str, scripts())], capture_output=True, text=True
    )
    assert result.returncode == 0, result.stdout


def test_shellcheck_catches_a_bad_script(tmp_path):
    bad = tmp_path / "bad.sh"
    bad.write_text("#!/usr/bin/env bash\nrm -rf $1/*\n")
    assert subprocess.run([tool("shellcheck"), str(bad)], capture_output=True).returncode != 0


# ---- entrypoint: run on the host with stand-ins for python3 and arcvllm -------------------


@pytest.fixture
def fake_image(tmp_path):
    """A PATH where python3 and arcvllm only print how they were called."""
    bin_dir, presets = tmp_path / "bin", tmp_path / "presets"
    bin_dir.mkdir()
    presets.mkdir()
    (presets / "tiny-hybrid-cpu.yaml").write_text("name: tiny-hybrid-cpu\n")
    (bin_dir / "python3").write_text(
        f'#!/bin/sh\nif [ "$1" = -c ]; then echo {presets}; else echo "python3 $*"; fi\n'
    )
    (bin_dir / "arcvllm").write_text('#!/bin/sh\necho "arcvllm $*"\n')
    for f in bin_dir.iterdir():
        f.chmod(0o755)

    def run(*args: str, **env: str) -> str:
        result = subprocess.run(
            ["bash", str(ENTRYPOINT), *args],
            capture_output=True,
            text=True,
            env={
                "PATH": f"{bin_dir}:/usr/bin:/bin",
                "HOME": str(tmp_path),
                "TMPDIR": str(tmp_path / "tmp"),
                "HF_HOME": str(tmp_path / "hf"),
                "VLLM_CACHE_ROOT": str(tmp_path / "vllm"),
                "TORCHINDUCTOR_CACHE_DIR": str(tmp_path / "inductor"),
                "TRITON_CACHE_DIR": str(tmp_path / "triton"),
                **env,
            },
        )
        assert result.returncode == 0, result.stderr
        return result.stdout.strip()

    return run


def test_entrypoint_options_go_to_the_openai_server(fake_image):
    assert fake_image("--model", "/models/m", "--port", "8000") == (
        "python3 -m vllm.entrypoints.openai.api_server --model /models/m --port 8000"
    )


def test_entrypoint_preset_name_goes_to_arcvllm_serve(fake_image):
    assert fake_image("tiny-hybrid-cpu", "--max-num-seqs", "2") == (
        "arcvllm serve --preset tiny-hybrid-cpu -- --max-num-seqs 2"
    )


def test_entrypoint_without_args_serves_the_default_preset(fake_image):
    assert fake_image(ARCVLLM_PRESET="tiny-hybrid-cpu") == (
        "arcvllm serve --preset tiny-hybrid-cpu --"
    )


def test_entrypoint_runs_other_commands_as_they_are(fake_image):
    assert fake_image("arcvllm", "doctor") == "arcvllm doctor"
    assert fake_image("echo", "hello") == "hello"


def test_entrypoint_reads_the_key_file_into_the_environment_never_an_argument(fake_image, tmp_path):
    key = tmp_path / "api-key"
    key.write_text("k-from-file\n")
    env = {"VLLM_API_KEY_FILE": str(key), "VLLM_API_KEY": "k-value"}
    assert fake_image("printenv", "VLLM_API_KEY", **env) == "k-from-file"  # the file wins
    assert fake_image("tiny-hybrid-cpu", **env) == "arcvllm serve --preset tiny-hybrid-cpu --"


@pytest.mark.parametrize("content", [None, ""])
def test_entrypoint_with_a_missing_or_empty_key_file_stops_in_one_line(tmp_path, content):
    key = tmp_path / "api-key"
    if content is not None:
        key.write_text(content)
    result = subprocess.run(
        ["bash", str(ENTRYPOINT), "echo", "served"],
        capture_output=True,
        text=True,
        env={"PATH": "/usr/bin:/bin", "HOME": str(tmp_path), "VLLM_API_KEY_FILE": str(key)},
    )
    assert result.returncode == 3
    assert result.stdout == ""
    (line,) = result.stderr.splitlines()
    assert line.startswith(f"arcvllm-entrypoint: VLLM_API_KEY_FILE={key} ")


def test_entrypoint_unknown_word_is_a_command_not_a_preset(fake_image, tmp_path):
    result = subprocess.run(
        ["bash", str(ENTRYPOINT), "no-such-preset-or-command"],
        capture_output=True,
        text=True,
        env={"PATH": "/usr/bin:/bin", "HOME": str(tmp_path), "TMPDIR": str(tmp_path)},
    )
    assert result.returncode == 127  # exec failed: not silently served


# ---- the built CPU image -----------------------------------------------------------------


def docker(*args: str, timeout: float = 120, check: bool = True) -> subprocess.CompletedProcess:
    result = subprocess.run(
        [docker_client(), *args], capture_output=True, text=True, timeout=timeout
    )
    if check and result.returncode != 0:
        raise AssertionError(f"docker {' '.join(args)}: {result.stderr.strip()}")
    return result


def docker_client() -> str:
    return "/usr/bin/docker" if Path("/usr/bin/docker").exists() else "docker"


@pytest.fixture(scope="session")
def engine() -> None:
    if "DOCKER_HOST" not in os.environ and Path(ENGINE_SOCKET).exists():
        os.environ["DOCKER_HOST"] = f"unix://{ENGINE_SOCKET}"
    result = subprocess.run([docker_client(), "version"], capture_output=True, timeout=30)
    if result.returncode != 0:
        pytest.fail("no Docker engine answers: run scripts/ci/engine.sh up (or make test)")


@pytest.fixture(scope="session")
def cpu_image(engine) -> str:
    """The CPU image of this tree (make build: a cache hit when nothing changed)."""
    if os.environ.get("ARCVLLM_TEST_IMAGE"):
        return IMAGE
    result = subprocess.run(
        ["make", "-s", "build", "STACK=cpu", f"IMAGE={IMAGE}"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=3600,
    )
    assert result.returncode == 0, result.stderr[-4000:]
    return IMAGE


def inspect(image: str) -> dict:
    return json.loads(docker("image", "inspect", image).stdout)[0]


@pytest.mark.docker
def test_labels_name_the_stack_and_the_applied_patches(cpu_image):
    labels = inspect(cpu_image)["Config"]["Labels"]
    plan = subprocess.run(
        [tool("arcvllm"), "patches", "plan", "--vllm-version", "0.32.0"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    assert labels["org.arcvllm.patches"] == plan
    assert labels["org.arcvllm.stack"] == "cpu"
    assert labels["org.arcvllm.flavor"] == "cpu"
    assert labels["org.arcvllm.vllm.version"] == "0.32.0"
    for key in ("version", "revision", "source", "created"):
        assert labels[f"org.opencontainers.image.{key}"]


@pytest.mark.docker
def test_manifest_in_the_image_matches_the_label(cpu_image):
    labels = inspect(cpu_image)["Config"]["Labels"]
    path = labels["org.arcvllm.patches.manifest"]
    manifest = json.loads(docker("run", "--rm", cpu_image, "cat", path).stdout)
    assert manifest["summary"] == labels["org.arcvllm.patches"]
    assert manifest["vllm"]["version"] == labels["org.arcvllm.vllm.version"]
    assert {p["name"] for p in manifest["patches"]} == {
        item.split("=")[0] for item in labels["org.arcvllm.patches"].split(",")
    }


@pytest.mark.docker
def test_runtime_is_non_root_in_render_group_with_the_compiler_and_caches_on_the_volume(cpu_image):
    """vLLM's default (compiled) mode needs g++ and Python.h at run time; dynamo is not
    switched off; every compile cache lives under the image's one volume."""
    config = inspect(cpu_image)["Config"]
    assert "8000/tcp" in config["ExposedPorts"]
    assert "/health" in " ".join(config["Healthcheck"]["Test"])
    env = dict(item.split("=", 1) for item in config["Env"])
    assert "TORCHDYNAMO_DISABLE" not in env
    (volume,) = config["Volumes"]
    for key in ("VLLM_CACHE_ROOT", "TORCHINDUCTOR_CACHE_DIR", "TRITON_CACHE_DIR", "TMPDIR"):
        assert env[key].startswith(volume + "/"), (key, env[key], volume)
    out = docker(
        "run",
        "--rm",
        cpu_image,
        "bash",
        "-c",
        "id -u; id -Gn; command -v g++; "
        "python3 -c 'import sysconfig; print(sysconfig.get_paths()[\"include\"])'; "
        "command -v patch || true",
    ).stdout.split("\n")
    assert out[0] == "1000"
    assert "render" in out[1].split()
    assert out[2] == "/usr/bin/g++"
    header = docker("run", "--rm", cpu_image, "test", "-f", f"{out[3]}/Python.h", check=False)
    assert header.returncode == 0, f"no Python.h in {out[3]}"
    assert "LD_PRELOAD" not in env  # vLLM preloads torch's libgomp itself, as on a host
    assert [line for line in out[4:] if line.strip()] == []  # GNU patch stays in the build


@pytest.mark.docker
def test_torch_compile_builds_and_runs_a_cpu_kernel_as_the_image_user(cpu_image):
    """What the compiled preset's first start does, in small: Inductor's C++ backend
    compiles a kernel (g++, Python.h) into the cache on the volume, and it runs."""
    script = (
        "import os, torch\n"
        "f = torch.compile(lambda x: torch.sin(x) * 2 + 1)\n"
        "x = torch.arange(8, dtype=torch.float32)\n"
        "assert torch.allclose(f(x), torch.sin(x) * 2 + 1)\n"
        "cache = os.environ['TORCHINDUCTOR_CACHE_DIR']\n"
        "print(sum(n.endswith('.so') for _, _, ns in os.walk(cache) for n in ns))\n"
    )
    result = docker("run", "--rm", cpu_image, "python3", "-c", script, timeout=600, check=False)
    assert result.returncode == 0, result.stderr[-3000:]
    assert int(result.stdout.strip().splitlines()[-1]) >= 1


@pytest.mark.docker
def test_a_build_without_the_stacks_args_stops_at_once_in_one_line(engine, tmp_path):
    """No ARG has a default (configs/stacks.yaml is the one home of every pin): a plain
    `docker build` stops before any step runs, naming what to run instead."""
    result = subprocess.run(
        [docker_client(), "build", "-f", str(DOCKERFILE), "--target", "runtime", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "DOCKER_BUILDKIT": "1"},
    )
    assert result.returncode != 0
    last = result.stderr.strip().splitlines()[-1]
    assert "make-build-STACK=NAME" in last and "configs/stacks.yaml" in last, result.stderr
    assert " RUN " not in result.stderr  # stopped before any step


@pytest.mark.docker
def test_healthcheck_fails_when_no_server_answers(cpu_image):
    """The sibling of the healthy run: the same check against a container with no server."""
    test = inspect(cpu_image)["Config"]["Healthcheck"]["Test"]
    assert test[0] == "CMD"
    result = docker("run", "--rm", cpu_image, *test[1:], check=False)
    assert result.returncode != 0


@pytest.mark.docker
def test_container_turns_healthy_and_serves_completions(cpu_image):
    port = free_port()
    name = f"arcvllm-test-{port}"
    cid = docker(
        "run",
        "-d",
        "--rm",
        "--name",
        name,
        "-p",
        f"127.0.0.1:{port}:8000",
        "--shm-size",
        "1g",
        "--health-interval",
        "5s",
        cpu_image,
    ).stdout.strip()
    try:
        status = "starting"

        def settled() -> bool:
            nonlocal status
            state = json.loads(docker("inspect", cid).stdout)[0]["State"]
            status = state.get("Health", {}).get("Status", "")
            return status == "healthy" or not state["Running"]

        with contextlib.suppress(WaitTimeout):
            wait_until(settled, 600, 2, "the container's healthcheck")
        logs = docker("logs", "--tail", "40", cid, check=False).stderr
        assert status == "healthy", logs
        # logprobs: vLLM compiles its sampler's rank op even in eager mode (needs g++)
        body = json.dumps(
            {
                "model": "tiny-hybrid",
                "prompt": "hello",
                "max_tokens": 16,
                "temperature": 0,
                "logprobs": 2,
            }
        ).encode()
        request = urllib.request.Request(
            f"http://127.0.0.1:{port}/v1/completions",
            data=body,
            headers={"Content-Type": "application/json"},
        )
        with urllib.request.urlopen(request, timeout=120) as response:
            reply = json.load(response)
        assert reply["usage"]["completion_tokens"] > 0
        assert reply["choices"][0]["text"]
        assert len(reply["choices"][0]["logprobs"]["token_logprobs"]) == 16
    finally:
        docker("rm", "-f", "-v", cid, check=False)  # -v: its anonymous cache volume too


XPU_CI_STACKS = [("xpu-0.20", "0.20.2"), ("xpu-0.23", "0.23.0"), ("xpu-0.33", "0.33.0")]


def xpu_ci_image(stack: str) -> str:
    """The CI build of an XPU stack (make build-xpu-ci, run by .ci/run) up to its runtime."""
    image = f"arcvllm:{stack}-ci"
    if docker("image", "inspect", image, check=False).returncode != 0:
        pytest.fail(f"{image} not built: make build-xpu-ci STACK={stack} (.ci/run does)")
    return image


@pytest.mark.docker
@pytest.mark.parametrize("stack,version", XPU_CI_STACKS)
def test_xpu_patch_stage_built_by_ci(engine, stack, version):
    """vLLM's XPU wheel from the release sdist, patched as the series plans for that release
    (the build's patch step fails unless every probe passes on the release's real code)."""
    image = xpu_ci_image(stack)
    plan = subprocess.run(
        [tool("arcvllm"), "patches", "plan", "--vllm-version", version],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    manifest = json.loads(docker("run", "--rm", image, "cat", "/opt/arcvllm/patches.json").stdout)
    assert manifest["summary"] == plan
    assert manifest["vllm"]["version"] == f"{version}+xpu"


@pytest.mark.docker
def test_the_flagship_build_applies_both_pointer_patches(engine):
    manifest = json.loads(
        docker("run", "--rm", xpu_ci_image("xpu-0.23"), "cat", "/opt/arcvllm/patches.json").stdout
    )
    states = dict(item.split("=") for item in manifest["summary"].split(","))
    assert states["mamba-copy-uint64"] == "applied"
    assert states["mamba-fused-u64"] == "applied"


@pytest.mark.docker
def test_xpu_ci_runtime_builds_and_loads_the_triton_launcher(engine):
    """As the image's user: compiler, Python.h, sycl.hpp + libsycl (intel-sycl-rt), Level
    Zero headers + libze_loader link (Debian's libze-dev standing in), loaded at run time."""
    result = docker(
        "run", "--rm", "--entrypoint", "arcvllm", xpu_ci_image("xpu-0.23"), "toolchain", "--json",
        check=False,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    assert report["sycl_include"].startswith("/opt/venv")


@pytest.mark.docker
def test_a_runtime_without_the_toolchain_fails_in_one_line(cpu_image):
    """The CPU runtime has a compiler but no SYCL runtime (no XPU launcher toolchain): the
    same check names what is missing, in one line, exit 3."""
    result = docker("run", "--rm", "--entrypoint", "arcvllm", cpu_image, "toolchain", check=False)
    assert result.returncode == 3
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "arcvllm:" in lines[0], result.stderr
