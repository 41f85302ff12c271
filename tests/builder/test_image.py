"""The images: Dockerfile lint, the entrypoint's contract, and the built CPU image itself.

Docker-marked tests need an engine (scripts/ci/engine.sh up, or `make test`, which wraps
pytest in scripts/ci/engine.sh run) and build the CPU image with `make build` (a cache hit
when CI built it just before).
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import subprocess
import urllib.request
from pathlib import Path

import pytest
from support import ROOT
from support.docker import docker, docker_client, xpu_ci_image
from support.entrypoint import ENTRYPOINT
from support.processes import free_port
from support.stacks import XPU_STACKS, XPU_VERSIONS

from arcvllm import stack as stack_module
from arcvllm.client.api import WaitTimeout, wait_until

DOCKERFILE = ROOT / "docker" / "Dockerfile"
VENV_BIN = ROOT / ".venv" / "bin"


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
    assert line.startswith(f"arcvllm-entrypoint: VLLM_API_KEY_FILE={key}")


def test_entrypoint_unknown_word_is_a_command_not_a_preset(fake_image, tmp_path):
    result = subprocess.run(
        ["bash", str(ENTRYPOINT), "no-such-preset-or-command"],
        capture_output=True,
        text=True,
        env={"PATH": "/usr/bin:/bin", "HOME": str(tmp_path), "TMPDIR": str(tmp_path)},
    )
    assert result.returncode == 127  # exec failed: not silently served


# ---- the built CPU image -----------------------------------------------------------------


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
@pytest.mark.parametrize("fresh", ["volume", "empty"])
def test_a_fresh_cache_volume_starts_with_the_tiny_models_classes_inspected(cpu_image, fresh):
    """The build resolved the MTP preset into the path compose's compile-cache volume
    covers: a new volume there (Docker copies the image's files into it) lets vLLM load
    both classes' inspection from its cache, by their files' hashes; an empty folder there
    (a host folder mounted) makes it inspect them in a subprocess, as every start did."""
    mount = (
        ["--mount", "type=volume,dst=/var/cache/arcvllm/compile"]
        if fresh == "volume"
        else ["--tmpfs", "/var/cache/arcvllm/compile:uid=1000,gid=1000"]
    )
    result = docker(
        "run", "--rm", *mount, "-e", "VLLM_LOGGING_LEVEL=DEBUG", cpu_image,
        "arcvllm", "serve", "--preset", "tiny-hybrid-cpu-mtp", "--resolve",
        timeout=600, check=False,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    log = result.stdout + result.stderr  # (vLLM logs to stdout)
    assert "vLLM resolved Qwen3NextForCausalLM, Qwen3NextMTP" in log
    cached = re.findall(r"Loaded model info for class (\S+) from cache", log)
    inspected = re.findall(r"Loaded model info for class (\S+)$", log, re.M)
    classes = {"qwen3_next.Qwen3NextForCausalLM", "qwen3_next_mtp.Qwen3NextMTP"}
    names = {f"vllm.model_executor.models.{c}" for c in classes}
    if fresh == "volume":
        assert set(cached) == names and not inspected, log[-3000:]
    else:
        assert set(inspected) == names and not cached, log[-3000:]


def shadow(image: str, path: str = "/etc/shadow") -> dict[str, list[str]]:
    """IMAGE's /etc/shadow (or its backup PATH, empty where there is none), by account."""
    script = f"if [ -e {path} ]; then cat {path}; fi"
    out = docker("run", "--rm", "--user", "0", "--entrypoint", "sh", image, "-c", script).stdout
    return {line.split(":")[0]: line.split(":") for line in out.splitlines() if line}


@pytest.mark.docker
@pytest.mark.parametrize("side", [None, "router", "prometheus", "alertmanager", "gateway"])
def test_no_account_the_image_adds_carries_the_day_it_was_built(cpu_image, side):
    """useradd writes the day it runs as the account's last password change (the third
    field of /etc/shadow): the same commit built on another day would be another image.
    The accounts each image adds have none, in /etc/shadow and in the backup chage leaves
    (their base's own keep the base's)."""
    from arcvllm import stack
    from arcvllm.builder import image

    if side is None:
        name = cpu_image
    else:
        from support.scale import build_target

        name = stack.side_images()[side].ref
        build_target(side, name)
    base = shadow(image.spec_for("cpu").args["DEBIAN_IMAGE"])
    added = {user: fields for user, fields in shadow(name).items() if user not in base}
    assert added, f"{name}: adds no account"
    assert {user: fields[2] for user, fields in added.items()} == dict.fromkeys(added, ""), name
    # chage keeps the file it rewrote as /etc/shadow-: useradd's dated line, in a layer.
    backup = {user: f[2] for user, f in shadow(name, "/etc/shadow-").items() if user not in base}
    assert backup == dict.fromkeys(backup, ""), f"{name}: /etc/shadow- {backup}"


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
        cpu_image,  # (its own healthcheck: every 2 s while starting)
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
        check = json.loads(docker("image", "inspect", cpu_image).stdout)[0]["Config"]["Healthcheck"]
        assert (check["StartInterval"], check["Interval"]) == (2 * 10**9, 10 * 10**9), check
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


SITE = "/opt/venv/lib/python3.12/site-packages"


def stack_args(stack: str) -> dict[str, str]:
    out = subprocess.run(
        [tool("arcvllm"), "stack", "show", stack, "--json"], capture_output=True, text=True
    )
    assert out.returncode == 0, out.stderr
    return {k: v["value"] for k, v in json.loads(out.stdout)["args"].items()}


def installed(image: str) -> dict[str, str]:
    listing = docker("run", "--rm", "--entrypoint", "pip", image, "list", "--format", "json")
    return {p["name"].lower().replace("_", "-"): p["version"] for p in json.loads(listing.stdout)}


def lock_pins(path: Path) -> dict[str, str]:
    pins = {}
    for line in path.read_text().splitlines():
        if line and line[0].isalnum() and "==" in line:
            name, _, rest = line.partition("==")
            pins[name.strip().lower().replace("_", "-")] = rest.split()[0]
    return pins


@pytest.mark.xpu_ci
@pytest.mark.docker
@pytest.mark.parametrize("stack,version", XPU_VERSIONS)
def test_the_xpu_venv_holds_exactly_the_locks_versions(engine, stack, version):
    """Everything the lock pins is installed at the lock's version: the wheel build's own
    tools (configs/locks/vllm-build.txt) never reach the runtime's venv. The only departures
    are the release's own steps: triton removed for the triton-xpu reinstall, the oneAPI
    override's versions, the oneccl wheels removed for the installer's oneCCL."""
    args = stack_args(stack)
    want = lock_pins(ROOT / args["XPU_LOCK"])
    got = installed(xpu_ci_image(stack))
    replaced = {}
    for spec in args.get("ONEAPI_PIP", "").split():
        name, _, pinned = spec.partition("==")
        replaced[name.lower().replace("_", "-")] = pinned
    removed = set()
    if args.get("TRITON_REINSTALL"):
        removed.add("triton")
    if args.get("ONECCL_INSTALLER_URL"):
        removed |= {"oneccl", "oneccl-devel"}
    wrong = {
        name: (pinned, got.get(name))
        for name, pinned in want.items()
        if name not in removed and got.get(name) != replaced.get(name, pinned)
    }
    assert not wrong, f"installed differs from {args['XPU_LOCK']} (lock, got): {wrong}"
    assert got["vllm"] == f"{version}+xpu"
    assert not removed & got.keys(), f"still installed: {removed & got.keys()}"


@pytest.mark.xpu_ci
@pytest.mark.docker
@pytest.mark.parametrize("stack,version", XPU_VERSIONS)
def test_the_xpu_build_patches_are_the_plan(engine, stack, version):
    """The build series went into the release's source before its wheel was built, each
    patch checked by its probe on the real setup.py (0.23: no spinloop on XPU)."""
    plan = subprocess.run(
        [tool("arcvllm"), "patches", "plan", "--build", "--vllm-version", version],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    manifest = json.loads(
        docker("run", "--rm", xpu_ci_image(stack), "cat", "/opt/arcvllm/build-patches.json").stdout
    )
    assert manifest["summary"] == plan
    assert not docker(
        "run", "--rm", xpu_ci_image(stack), "find", f"{SITE}/vllm", "-name", "spinloop*.so"
    ).stdout.strip()  # fmt: skip


@pytest.mark.xpu_ci
@pytest.mark.docker
@pytest.mark.parametrize("stack", [s for s, _ in XPU_VERSIONS])
def test_the_xpu_runtime_user_is_vllm_with_uid_1000_on_the_ubuntu_shaped_base(engine, stack):
    """Ubuntu 24.04 ships `ubuntu` with UID 1000 (so does CI's stand-in base): the runtime
    stage makes the UID vllm's, in the render group."""
    base = stack_args(stack)["XPU_BASE_IMAGE"]
    ci_base = subprocess.run(
        [tool("arcvllm"), "stack", "build-args", stack, "--ci", "--json"],
        capture_output=True,
        text=True,
    )
    if ci_base.returncode == 0:
        base = json.loads(ci_base.stdout).get("XPU_BASE_IMAGE", base)
    assert docker("run", "--rm", base, "getent", "passwd", "1000").stdout.startswith("ubuntu:")
    user = docker("run", "--rm", xpu_ci_image(stack, "-user"), "id", "vllm").stdout
    assert user.startswith("uid=1000(vllm) gid=1000(vllm)"), user
    assert "(render)" in user
    gone = docker("run", "--rm", xpu_ci_image(stack, "-user"), "getent", "passwd", "ubuntu",
                  check=False)  # fmt: skip
    assert gone.returncode != 0


@pytest.mark.xpu_ci
@pytest.mark.docker
def test_xpu_ci_runtime_builds_and_loads_the_triton_launcher(engine):
    """As the image's user, in the XPU build's venv: compiler, Python.h, sycl.hpp + libsycl
    (the lock's intel-sycl-rt), Level Zero headers + libze_loader link (Debian's libze-dev,
    the stand-in's GPU user space), loaded at run time. On the default XPU stack's
    rehearsal: CI runs this test in that stack's turn (its id names no stack)."""
    result = docker(
        "run", "--rm", "--user", "1000", "-v", f"{ROOT}:/src:ro", "-e", "PYTHONPATH=/src",
        "--entrypoint", "python3", xpu_ci_image(stack_module.load()[1]["xpu"]), "-m", "arcvllm",
        "toolchain",
        "--json", check=False,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    assert report["sycl_include"].startswith("/opt/venv")


def test_a_launcher_that_does_not_build_is_named_by_its_first_error():
    """sycl.hpp without -fsycl warns that it is "errorenous": the line named must be the
    error that stopped the compiler (CL/cl.h missing, as on the xpu-0.33 rehearsal)."""
    from arcvllm.builder.toolchain import first_error

    stderr = (
        "In file included from l.cpp:4:\n"
        "/opt/venv/include/sycl/sycl.hpp:33:29: warning: You are including <sycl/sycl.hpp> "
        "without -fsycl flag, which is errorenous for device code compilation.\n"
        "/opt/venv/include/sycl/detail/cl.h:22:10: fatal error: CL/cl.h: No such file or "
        "directory\ncompilation terminated.\n"
    )
    assert first_error(stderr).endswith("fatal error: CL/cl.h: No such file or directory")
    assert first_error("ld: cannot find -lze_loader\ncollect2: ld returned 1\n") == (
        "collect2: ld returned 1"
    )
    assert first_error("") == ""


@pytest.mark.docker
def test_a_runtime_without_the_toolchain_fails_in_one_line(cpu_image):
    """The CPU runtime has a compiler but no SYCL runtime (no XPU launcher toolchain): the
    same check names what is missing, in one line, exit 3."""
    result = docker("run", "--rm", "--entrypoint", "arcvllm", cpu_image, "toolchain", check=False)
    assert result.returncode == 3
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "arcvllm:" in lines[0], result.stderr


# ---- what `make build` asks of the one build command, no engine ----


def test_no_named_stack_is_the_flavours_default_the_flavour_the_hosts(monkeypatch):
    from arcvllm import stack
    from arcvllm.commands import image
    from arcvllm.operate import host

    defaults = stack.load()[1]
    assert image.default_stack("xpu") == defaults["xpu"]
    monkeypatch.setattr(host, "default_flavor", lambda: "cpu")
    assert image.default_stack(None) == defaults["cpu"]


def test_the_server_image_is_tagged_the_settings_image_the_shells_first(tmp_path, monkeypatch):
    from arcvllm.commands import image

    monkeypatch.delenv("IMAGE", raising=False)
    mine = tmp_path / "mine.env"
    mine.write_text("PORT=8123\n")
    assert image.tag_for("cpu", None) == image.tag_for("cpu", mine) == "arcvllm:cpu"
    mine.write_text("IMAGE=foo:bar\n")
    assert image.tag_for("cpu", mine) == "foo:bar"
    monkeypatch.setenv("IMAGE", "baz:qux")
    assert image.tag_for("cpu", mine) == "baz:qux"


def test_the_wheelhouse_links_every_wheel_once(tmp_path):
    from arcvllm.builder import image

    source, dest = tmp_path / "wheels", tmp_path / "build" / "wheelhouse"
    source.mkdir()
    (source / "a-1-py3-none-any.whl").write_text("a")
    (source / "notes.txt").write_text("not a wheel")
    assert [p.name for p in image.wheelhouse(source, dest)] == ["a-1-py3-none-any.whl"]
    wheel = "a-1-py3-none-any.whl"
    assert (dest / wheel).stat().st_ino == (source / wheel).stat().st_ino  # linked
    assert [p.name for p in image.wheelhouse(source, dest)] == ["a-1-py3-none-any.whl"]
    assert sorted(p.name for p in dest.iterdir()) == ["a-1-py3-none-any.whl"]


def built_argvs(monkeypatch, *args: str) -> list[list[str]]:
    """What `arcvllm image build ARGS` would build (each docker argv), nothing built."""
    from arcvllm.builder import image
    from arcvllm.cli import main

    seen: list[list[str]] = []
    monkeypatch.setattr(image, "run", lambda argv, cwd, layout=None: seen.append(list(argv)))
    assert main(["image", "build", *args]) == 0
    return seen


def test_several_side_images_are_built_one_after_the_other_each_its_own_tag(monkeypatch):
    from arcvllm import stack

    sides = stack.side_images()
    argvs = built_argvs(monkeypatch, "--side", "router", "--side", "prometheus")
    assert [a[a.index("--target") + 1] for a in argvs] == ["side", "side"]
    assert [[b for b in a if b.startswith("SIDE")] for a in argvs] == [
        ["SIDE=router", f"SIDE_IMAGE={sides['router'].image}", f"SIDE_TAG={sides['router'].tag}"],
        [
            "SIDE=prometheus",
            f"SIDE_IMAGE={sides['prometheus'].image}",
            f"SIDE_TAG={sides['prometheus'].tag}",
        ],
    ]
    assert [a[a.index("-t") + 1] for a in argvs] == [sides["router"].ref, sides["prometheus"].ref]


def test_the_rehearsal_builds_every_stage_up_to_models_and_the_runtimes_user(monkeypatch):
    """The `vllm` stage and the runtime's user to their tags, and the `models` stage (the
    patch series applied and probed, the tiny model built) checked by its own steps in the
    build cache, nothing exported: every stage of the XPU image that needs no GPU."""
    from arcvllm import stack
    from arcvllm.builder import image

    build = image.spec_for("cpu")
    monkeypatch.setattr(image, "spec_for", lambda *a, **k: image.Build(build.stack, "runtime"))
    argvs = built_argvs(monkeypatch, "--rehearsal")
    default = stack.load()[1]["xpu"]

    def output(argv: list[str]) -> str:
        return argv[argv.index("-t") + 1] if "-t" in argv else argv[argv.index("--output") + 1]

    assert [(a[a.index("--target") + 1], output(a)) for a in argvs] == [
        ("vllm", f"arcvllm:{default}-ci"),
        ("models", "type=cacheonly"),
        ("runtime-user", f"arcvllm:{default}-ci-user"),
    ]


@pytest.mark.parametrize("name", XPU_STACKS)
def test_the_rehearsal_runs_the_probes_with_the_locks_torch_version(name):
    """CI's stand-in for torch +xpu where the build runs torch (arcvllm/ci/standins.yaml
    probe-torch): the package index's build of the lock's torch version, every file
    sha256-pinned; a real build runs its own (PROBE_TORCH=none)."""
    from arcvllm.ci import standins

    the_stack = stack_module.get(name)
    lock = (ROOT / the_stack.build_args()["XPU_LOCK"]).read_text()

    def base_version(name: str) -> str:
        return re.search(rf"^{name}==(\S+)", lock, re.MULTILINE).group(1).split("+")[0]

    base = base_version("torch")
    probe = (ROOT / "configs" / "locks" / f"probe-torch-{base}.txt").read_text()
    pins = [line for line in probe.splitlines() if line and not line.startswith("#")]
    for dist in ("torch", "torchvision"):  # the stand-ins transformers and dynamo import
        assert f"{dist}=={base_version(dist)}" in [line.split()[0] for line in pins], pins
    assert all(re.search(r" --hash=sha256:[0-9a-f]{64}$", line) for line in pins), pins
    assert the_stack.build_args()["PROBE_TORCH"] == "none"
    config = standins.load()
    assert config.entry(config.stacks[name]["PROBE_TORCH"])["stage"] == "pypi"
    assert "FROM base-xpu AS probe-torch-pypi" in (ROOT / "docker" / "Dockerfile").read_text()


def test_the_probe_torch_stage_installs_the_lock_of_the_stacks_torch_and_no_layer_keeps_it():
    """docker/Dockerfile: the stage CI's PROBE_TORCH names installs probe-torch-VERSION.txt,
    and the patch and models stages only bind-mount it (PYTHONPATH for one command)."""
    text = (ROOT / "docker" / "Dockerfile").read_text()
    assert "FROM probe-torch-${PROBE_TORCH:-none} AS probe-torch" in text
    # A FROM line sees only the ARGs declared before the first FROM.
    assert "\nARG PROBE_TORCH\n" in text.split("\nFROM ", 1)[0]
    assert "/tmp/locks/probe-torch-${TORCH_VERSION%%+*}.txt" in text
    stage = lambda name: text.split(f" AS {name}\n", 1)[1].split("\nFROM ", 1)[0]  # noqa: E731
    for name in ("patch", "models"):
        body = stage(name)
        assert "--mount=type=bind,from=probe-torch,target=/probe" in body, name
        assert 'env ${probe:+PYTHONPATH="$probe"}' in body, name
        assert "COPY --from=probe-torch" not in text
