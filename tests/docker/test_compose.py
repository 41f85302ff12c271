"""docker/compose.yaml: validated by compose v2 itself (no engine needed).

Tests that run the compose tool are marked `compose`: scripts/ci/engine.sh up installs the
engine with the compose v2 plugin."""

from __future__ import annotations

import json
import os
import re
import subprocess
from pathlib import Path

import pytest
import yaml
from support import ROOT
from support.compose import COMPOSE_FILE, ENV_FILE, compose_binary, config

SCALE_FILE = ROOT / "docker" / "compose.scale.yaml"
STACKS_FILE = ROOT / "configs" / "stacks.yaml"
DOCS = (ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md")), COMPOSE_FILE, SCALE_FILE)


@pytest.fixture(scope="module")
def rendered() -> dict:
    result = config(COMPOSE_FILE, "--profile", "cpu", env={"RENDER_GID": "4242"})
    assert result.returncode == 0, result.stderr
    return yaml.safe_load(result.stdout)


@pytest.mark.compose
def test_compose_file_validates():
    result = config(COMPOSE_FILE)
    assert result.returncode == 0, result.stderr


@pytest.mark.compose
def test_a_broken_compose_file_fails_validation(tmp_path):
    broken = tmp_path / "compose.yaml"
    broken.write_text(COMPOSE_FILE.read_text().replace("restart: unless-stopped", "restart: [1]"))
    (tmp_path / "arcvllm.env").write_text(ENV_FILE.read_text())
    result = config(broken)
    assert result.returncode != 0


@pytest.mark.compose
def test_xpu_service_has_the_gpu_and_the_render_group(rendered):
    """Its device is the placeholder `arcvllm gpus --compose` replaces with the B70s' render
    nodes (never all of /dev/dri: tests/operate/test_gpus.py)."""
    vllm = rendered["services"]["vllm"]
    sources = [d["source"] if isinstance(d, dict) else str(d) for d in vllm["devices"]]
    assert sources and all(s.startswith("/dev/dri/") for s in sources), sources
    assert "/dev/dri" not in sources
    assert [str(g) for g in vllm["group_add"]] == ["4242"]  # from the environment
    assert not vllm.get("privileged", False)
    assert "ALL" in vllm["cap_drop"]


@pytest.mark.compose
def test_render_gid_comes_from_the_env_file(tmp_path):
    mine = tmp_path / "mine.env"
    mine.write_text("RENDER_GID=4243\n")
    result = config(COMPOSE_FILE, env={"ENV_FILE": str(mine)}, env_file=mine)
    assert result.returncode == 0, result.stderr
    vllm = yaml.safe_load(result.stdout)["services"]["vllm"]
    assert [str(g) for g in vllm["group_add"]] == ["4243"]


@pytest.mark.compose
@pytest.mark.parametrize(
    ("compose_files", "profiles", "xpu_services"),
    [
        ((COMPOSE_FILE,), (), ("vllm",)),
        ((COMPOSE_FILE,), ("cpu",), ("vllm",)),
        ((COMPOSE_FILE, SCALE_FILE), ("cpu-scale",), ()),
    ],
)
def test_without_render_gid_every_profile_validates_and_no_gid_is_made_up(
    compose_files, profiles, xpu_services
):
    """The shipped file leaves RENDER_GID empty: the CPU services need none, and an XPU
    service gets no built-in number (the engine then refuses to start it, naming
    RENDER_GID) instead of a GID that is wrong on most hosts."""
    files = [arg for f in compose_files[1:] for arg in ("-f", str(f))]
    flags = [arg for p in profiles for arg in ("--profile", p)]
    result = config(compose_files[0], *files, *flags)
    assert result.returncode == 0, result.stderr
    services = yaml.safe_load(result.stdout)["services"]
    for name in xpu_services:
        (group,) = services[name]["group_add"]
        assert not str(group).isdigit() and "RENDER_GID" in str(group)
    for name in ("vllm-cpu", "vllm-cpu-0", "vllm-cpu-1"):
        assert "group_add" not in services.get(name, {})


def _port(port) -> tuple[str, str, str]:
    """(host address, published, target) of a port in the long or the short form."""
    if isinstance(port, dict):
        return port.get("host_ip", ""), str(port["published"]), str(port["target"])
    host, published, target = port.split("/")[0].rsplit(":", 2)
    return host, published, target


@pytest.mark.compose
def test_only_the_gateway_is_published_on_localhost_by_default(rendered):
    (port,) = rendered["services"]["gateway"]["ports"]
    assert _port(port) == ("127.0.0.1", "8443", "8443")
    for name in ("vllm", "vllm-cpu"):
        assert "ports" not in rendered["services"][name]
        assert [str(p) for p in rendered["services"][name]["expose"]] == ["8000"]


@pytest.mark.compose
def test_the_key_is_a_secret_file_for_the_gateway_and_vllm(rendered, tmp_path):
    for name in ("vllm", "vllm-cpu", "gateway"):
        service = rendered["services"][name]
        assert "api-key" in [s if isinstance(s, str) else s["source"] for s in service["secrets"]]
        assert service["environment"]["VLLM_API_KEY_FILE"] == "/run/secrets/api-key"
    assert rendered["secrets"]["api-key"]["file"] == str(ROOT / "secrets" / "api-key")
    mine = tmp_path / "key"
    result = config(COMPOSE_FILE, env={"VLLM_API_KEY_FILE": str(mine)})
    assert yaml.safe_load(result.stdout)["secrets"]["api-key"]["file"] == str(mine)


@pytest.mark.compose
def test_the_gateway_fronts_either_profile_without_a_setting(rendered):
    gateway = rendered["services"]["gateway"]
    assert gateway["environment"]["GATEWAY_UPSTREAM"] == "http://vllm:8000"
    assert rendered["services"]["vllm-cpu"]["networks"]["default"]["aliases"] == ["vllm"]
    assert gateway["read_only"] is True and "ALL" in gateway["cap_drop"]
    assert "env_file" not in gateway  # the settings file (and any VLLM_API_KEY) stays out
    assert "profiles" not in gateway  # started with either: make up names it beside the server


@pytest.mark.compose
def test_production_settings(rendered):
    vllm = rendered["services"]["vllm"]
    assert vllm["restart"] == "unless-stopped"
    assert vllm["logging"]["driver"] == "json-file"
    assert vllm["logging"]["options"]["max-size"]
    assert "/health" in " ".join(vllm["healthcheck"]["test"])
    assert vllm["shm_size"]
    assert vllm["ipc"]
    assert vllm["environment"]["ZE_AFFINITY_MASK"] == ""  # empty: the preset chooses
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


@pytest.mark.compose
def test_cpu_profile_runs_the_tiny_model_without_a_gpu(rendered):
    cpu = rendered["services"]["vllm-cpu"]
    assert cpu["environment"]["ARCVLLM_PRESET"] == "tiny-hybrid-cpu"
    assert "devices" not in cpu and "group_add" not in cpu
    assert cpu["image"] == "arcvllm:cpu"


@pytest.mark.compose
def test_the_cpu_service_mounts_models_read_only_and_nothing_of_the_host_unless_told(tmp_path):
    """tiny-hybrid-cpu-models serves /models/tiny-hybrid: CPU_MODELS_DIR (which `make up`
    sets to MODELS_DIR for it) at /models, read-only; unset, an empty folder of the
    checkout, so a CPU deployment of the model inside the image makes no /models on the host."""
    volumes = {
        _target(v): v
        for v in yaml.safe_load(config(COMPOSE_FILE, "--profile", "cpu").stdout)["services"][
            "vllm-cpu"
        ]["volumes"]
    }
    assert _read_only(volumes["/models"])
    empty = ROOT / "deploy" / "no-models"
    assert _source(volumes["/models"]) == str(empty)
    assert [p.name for p in empty.iterdir()] == ["README"]
    result = config(COMPOSE_FILE, "--profile", "cpu", env={"CPU_MODELS_DIR": str(tmp_path)})
    assert result.returncode == 0, result.stderr
    cpu = yaml.safe_load(result.stdout)["services"]["vllm-cpu"]
    volumes = {_target(v): v for v in cpu["volumes"]}
    assert _source(volumes["/models"]) == str(tmp_path) and _read_only(volumes["/models"])


@pytest.mark.compose
def test_cpu_service_is_behind_its_profile(rendered):
    assert rendered["services"]["vllm-cpu"]["profiles"] == ["cpu"]
    assert "profiles" not in rendered["services"]["vllm"]


# ---- one settings file for both uses (ENV_FILE) ----


@pytest.mark.compose
def test_the_settings_file_named_by_env_file_is_the_containers_environment(tmp_path):
    mine = tmp_path / "mine.env"
    mine.write_text("VLLM_API_KEY=k-123\nPORT=8123\n")
    result = config(COMPOSE_FILE, "--profile", "cpu", env={"ENV_FILE": str(mine)}, env_file=mine)
    assert result.returncode == 0, result.stderr
    services = yaml.safe_load(result.stdout)["services"]
    for name in ("vllm", "vllm-cpu"):
        assert services[name]["environment"]["VLLM_API_KEY"] == "k-123"
    (port,) = services["gateway"]["ports"]
    assert _port(port)[1] == "8123"


@pytest.mark.compose
def test_without_env_file_the_container_gets_the_shipped_file_not_the_other_one(tmp_path):
    """The bug this guards: --env-file mine.env fed ${...} while env_file stayed fixed."""
    mine = tmp_path / "mine.env"
    mine.write_text("VLLM_API_KEY=k-123\n")
    result = config(COMPOSE_FILE, env_file=mine)
    assert result.returncode == 0, result.stderr
    assert yaml.safe_load(result.stdout)["services"]["vllm"]["environment"]["VLLM_API_KEY"] == ""


# ---- the image a by-hand compose command runs: the stack `make build` tags ----


def stack_defaults() -> dict[str, str]:
    """Flavour -> default stack (configs/stacks.yaml `defaults:`), checked by the loader."""
    from arcvllm.stack import load

    return load(STACKS_FILE)[1]


def server_images(compose_file: Path) -> dict[str, tuple[str, str]]:
    """Service -> (flavour, image when IMAGE/CPU_IMAGE is unset) for every vLLM server in
    COMPOSE_FILE: the services that read the settings file (env_file); xpu if /dev/dri is
    passed in. Read as plain YAML, so the anchors' merge keys apply."""
    doc = yaml.safe_load(compose_file.read_text())
    # compose.scale.yaml's XPU replicas are made from its x-xpu-replica
    # (arcvllm/operate/replicas.py)
    services = {
        **doc["services"],
        **({"x-xpu-replica": doc["x-xpu-replica"]} if "x-xpu-replica" in doc else {}),
    }
    found = {}
    for name, service in services.items():
        if "env_file" not in service:
            continue  # the router and Prometheus: images of their own
        gpu = any("/dev/dri" in str(d) for d in service.get("devices", ()))
        flavor = "xpu" if gpu or name == "x-xpu-replica" else "cpu"
        match = re.fullmatch(r"\$\{[A-Z_]+:-([^}]+)\}", service["image"])
        assert match, f"{compose_file.name}: {name}: image {service['image']!r} has no default"
        found[name] = (flavor, match.group(1))
    return found


@pytest.mark.parametrize(
    ("compose_file", "servers"),
    [
        (COMPOSE_FILE, {"vllm", "vllm-cpu"}),
        (SCALE_FILE, {"x-xpu-replica", "vllm-cpu-0", "vllm-cpu-1"}),
    ],
)
def test_each_servers_default_image_is_the_default_stack_of_its_flavour(compose_file, servers):
    """`make build` tags arcvllm:<default stack>: a by-hand `compose up` must run that image,
    not one nobody built (the XPU service once defaulted to xpu-0.20 and restart-looped)."""
    images = server_images(compose_file)
    assert set(images) == servers
    defaults = stack_defaults()
    for name, (flavor, image) in images.items():
        assert image == f"arcvllm:{defaults[flavor]}", f"{compose_file.name}: {name}"


STACK_IMAGE = re.compile(r"\barcvllm:((?:xpu-\d+\.\d+|cpu)(?![\w.-]))")
# A line that picks an image on purpose (another stack, another tag) names it with these.
CHOSEN = ("STACK=", "IMAGE=", "--before-image", "set image")


def stale_image_refs(text: str, defaults: dict[str, str]) -> list[str]:
    """Lines that name a stack's image without choosing it (no STACK=, IMAGE=, ...) where
    that stack is not its flavour's default: what a reader would take as the default."""
    wanted = set(defaults.values())
    return [
        line.strip()
        for line in text.splitlines()
        if not any(word in line for word in CHOSEN)
        and any(stack not in wanted for stack in STACK_IMAGE.findall(line))
    ]


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: p.name)
def test_the_docs_name_no_other_stack_as_the_default_image(doc):
    assert stale_image_refs(doc.read_text(), stack_defaults()) == []


def test_a_doc_naming_another_stack_as_the_image_is_caught():
    defaults = stack_defaults()
    other = next(s for s in ("xpu-0.20", "xpu-0.33") if s != defaults["xpu"])
    text = f"By hand, compose runs `arcvllm:{other}`.\nmake build STACK={other}: arcvllm:{other}\n"
    assert stale_image_refs(text, defaults) == [f"By hand, compose runs `arcvllm:{other}`."]


def make_dry(*args: str, path: str | None = None) -> str:
    env = {**os.environ, "PATH": path or os.environ["PATH"]}
    env.pop("MAKEFLAGS", None)
    done = subprocess.run(
        ["make", "--no-print-directory", "-n", "-C", str(ROOT), "-o", ".venv/.stamp", *args],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    return done.stdout


def menu_dry(target: str, *args: str, env: dict[str, str] | None = None) -> str:
    """The one command the menu runs for TARGET (make -n), run with --dry-run: the compose
    command lines it would run."""
    (command,) = [line for line in make_dry(target, *args).splitlines() if " deploy " in line]
    done = subprocess.run(
        f"{command} --dry-run",
        shell=True,
        cwd=ROOT,
        capture_output=True,
        text=True,
        env={**os.environ, **(env or {})},
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    return done.stdout


def test_make_up_checks_the_file_and_hands_compose_one_absolute_path(tmp_path):
    mine = tmp_path / "mine.env"
    mine.write_text("PORT=8123\n")
    assert f"deploy up --env-file {mine} --flavor cpu" in make_dry(
        "up", "FLAVOR=cpu", f"ENV_FILE={mine}"
    )
    up = menu_dry("up", "FLAVOR=cpu", f"ENV_FILE={mine}", env={"COMPOSE": "docker-compose"})
    assert f"ENV_FILE={mine} " in up and f"--env-file {mine} " in up
    assert "PORT=8123 " in up  # the file's PORT, not compose's default
    assert " docker-compose -p arcvllm " in up
    relative = menu_dry("up", "FLAVOR=cpu", "ENV_FILE=docker/arcvllm.env")
    assert f"ENV_FILE={ROOT}/docker/arcvllm.env " in relative


def fake_docker(tmp_path: Path, has_plugin: bool) -> Path:
    docker = tmp_path / ("docker-v2" if has_plugin else "docker-v1")
    docker.write_text(
        f'#!/bin/sh\n[ "$1 $2" = "compose version" ] && exit {0 if has_plugin else 1}\nexit 0\n'
    )
    docker.chmod(0o755)
    return docker


def test_make_runs_the_compose_v2_plugin(tmp_path):
    docker = fake_docker(tmp_path, has_plugin=True)
    out = menu_dry("up", "FLAVOR=cpu", env={"DOCKER": str(docker)})
    assert f"{docker} compose -p arcvllm " in out
    assert "docker-compose" not in out


def test_the_compose_here_is_v2():
    """The engine scripts/ci/engine.sh installs carries compose v2, as operators run it."""
    out = subprocess.run(
        [*compose_binary(), "version", "--short"], capture_output=True, text=True, check=True
    ).stdout.strip()
    assert int(out.lstrip("v").split(".")[0]) >= 2, out


def test_make_up_refuses_an_unknown_setting_before_compose_runs(tmp_path):
    bad = tmp_path / "bad.env"
    bad.write_text("VLLM_API_KYE=secret\n")
    done = subprocess.run(
        [
            "make",
            "-C",
            str(ROOT),
            "-o",
            ".venv/.stamp",
            "up",
            f"ENV_FILE={bad}",
            "COMPOSE=echo RAN",
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode != 0
    assert "unknown setting VLLM_API_KYE" in done.stderr
    assert "RAN" not in done.stdout


def test_smoke_check_runs_its_own_project_with_a_throwaway_key_file_never_a_key(tmp_path):
    """`make smoke-check` is `arcvllm deploy smoke`: its own project and port, the key and
    certificate it makes (build/smoke-gateway/), the gateway's diagnostic routes on."""
    mine = tmp_path / "mine.env"
    mine.write_text("VLLM_API_KEY=k-zz9-secret\n")
    make = make_dry("smoke-check", "FLAVOR=cpu", f"ENV_FILE={mine}")
    assert f"deploy smoke --env-file {mine} --flavor cpu " in make and " --port 8001 " in make
    done = subprocess.run(
        [str(ROOT / ".venv/bin/arcvllm"), "deploy", "smoke", "--dry-run", "--flavor", "cpu",
         "--env-file", str(mine)], capture_output=True, text=True, check=True, cwd=ROOT,
    )  # fmt: skip
    up, log, down = done.stdout.splitlines()
    secrets = ROOT / "build" / "smoke-gateway"
    assert f"VLLM_API_KEY_FILE={secrets}/api-key " in up
    assert f"GATEWAY_TLS_CERT={secrets}/cert.pem " in up and "GATEWAY_DIAGNOSTIC_ROUTES=1 " in up
    assert " PORT=8001 " in up and " -p arcvllm-smoke " in up
    assert up.endswith(" up -d vllm-cpu gateway") and down.endswith(" down -v")
    assert log.endswith(" logs --no-color vllm-cpu > reports/smoke-cpu.log")
    assert "k-zz9-secret" not in done.stdout + make


def test_verify_check_runs_its_own_project_and_port_through_the_gateway(tmp_path):
    """`make verify-check` is `arcvllm deploy verify`: a project and port of its own (not
    the smoke test's: both may run), the throwaway key and certificate, the report and
    the server's log beside it."""
    mine = tmp_path / "mine.env"
    mine.write_text("VLLM_API_KEY=k-zz9-secret\n")
    make = make_dry("verify-check", "FLAVOR=cpu", f"ENV_FILE={mine}")
    assert f"deploy verify --env-file {mine} --flavor cpu " in make and " --port 8002" in make
    done = subprocess.run(
        [str(ROOT / ".venv/bin/arcvllm"), "deploy", "verify", "--dry-run", "--flavor", "cpu",
         "--env-file", str(mine)], capture_output=True, text=True, check=True, cwd=ROOT,
    )  # fmt: skip
    up, log, down = done.stdout.splitlines()
    secrets = ROOT / "build" / "verify-gateway"
    assert f"VLLM_API_KEY_FILE={secrets}/api-key " in up and "GATEWAY_DIAGNOSTIC_ROUTES=1 " in up
    assert " PORT=8002 " in up and " -p arcvllm-verify " in up
    assert up.endswith(" up -d vllm-cpu gateway") and down.endswith(" down -v")
    assert log.endswith(" logs --no-color vllm-cpu > reports/verify-cpu.log")
    assert "k-zz9-secret" not in done.stdout + make


def up_line(*args: str) -> str:
    return next(line for line in menu_dry("up", *args).splitlines() if " up -d " in line)


def test_make_up_runs_the_settings_files_image_and_the_command_line_wins(tmp_path):
    """IMAGE in the settings file was overridden by the Makefile's arcvllm:$(STACK)."""
    mine = tmp_path / "mine.env"
    mine.write_text("IMAGE=foo:bar\n")
    assert "IMAGE=foo:bar " in up_line("FLAVOR=cpu", f"ENV_FILE={mine}")
    assert "IMAGE=baz:qux " in up_line("FLAVOR=cpu", f"ENV_FILE={mine}", "IMAGE=baz:qux")
    mine.write_text("PORT=8123\n")
    assert "IMAGE=arcvllm:cpu " in up_line("FLAVOR=cpu", f"ENV_FILE={mine}")


def test_make_builds_and_runs_the_default_stack_of_each_flavour(tmp_path):
    """The flavour's default stack is configs/stacks.yaml's `defaults:` (the Makefile names
    none), so the image `make up` runs is the one compose alone defaults to."""
    mine = tmp_path / "mine.env"
    mine.write_text("PORT=8123\n")
    for flavor, stack in stack_defaults().items():
        assert f"IMAGE=arcvllm:{stack} " in up_line(f"FLAVOR={flavor}", f"ENV_FILE={mine}")


def test_make_doctor_checks_the_settings_file_of_make_up(tmp_path):
    """`make doctor` checks the deployment's settings file for the flavour's preset."""
    mine = tmp_path / "mine.env"
    mine.write_text("RENDER_GID=993\n")
    (command,) = make_dry("doctor", "FLAVOR=cpu", f"ENV_FILE={mine}").strip().splitlines()
    assert command.endswith(f"arcvllm deploy doctor --env-file {mine} --flavor cpu")
    done = subprocess.run(
        f"{command.lstrip('@')} --json", shell=True, cwd=ROOT, capture_output=True, text=True
    )
    doc = json.loads(done.stdout)
    assert doc["preset"] == "tiny-hybrid-cpu", done.stderr
    (gid,) = [r for r in doc["rows"] if r["check"] == "RENDER_GID"]
    assert "993" in gid["seen"]


def test_make_up_refuses_a_missing_key_file_before_compose_runs(tmp_path):
    mine = tmp_path / "mine.env"
    mine.write_text(f"VLLM_API_KEY_FILE={tmp_path / 'no-key'}\n")

    def up() -> subprocess.CompletedProcess:
        # (FLAVOR=xpu would stop first at `arcvllm gpus`: no B70 here)
        settings = [f"ENV_FILE={mine}", "FLAVOR=cpu", "COMPOSE=echo RAN", "DOCKER=true"]
        return subprocess.run(
            ["make", "-s", "-C", str(ROOT), "-o", ".venv/.stamp", "up", *settings],
            capture_output=True,
            text=True,
            timeout=60,
        )

    refused = up()
    assert refused.returncode != 0
    said = f"arcvllm: VLLM_API_KEY_FILE={tmp_path / 'no-key'} is not a readable file"
    assert said in refused.stderr, refused.stderr
    assert "RAN" not in refused.stdout
    (tmp_path / "no-key").write_text("k-1\n")
    ran = up()
    assert ran.returncode == 0, ran.stderr
    assert "RAN" in ran.stdout and "up -d vllm-cpu gateway" in ran.stdout


def seconds(duration) -> float:
    """A compose duration as compose config prints it ("2m30s", "150s", 150) in seconds."""
    if isinstance(duration, int | float):
        return float(duration)
    parts = re.fullmatch(r"(?:(\d+)h)?(?:(\d+)m)?(?:(\d+(?:\.\d+)?)s)?", str(duration))
    assert parts and any(parts.groups()), f"not a duration: {duration!r}"
    hours, minutes, secs = (float(g or 0) for g in parts.groups())
    return hours * 3600 + minutes * 60 + secs


def test_seconds_reads_every_spelling_and_refuses_garbage():
    assert seconds("2m30s") == seconds("150s") == seconds(150) == 150
    with pytest.raises(AssertionError):
        seconds("soon")


@pytest.mark.compose
@pytest.mark.parametrize(
    ("compose_files", "profiles"),
    [
        ((COMPOSE_FILE,), ("cpu",)),
        ((COMPOSE_FILE, SCALE_FILE), ("scale", "scale-4", "cpu-scale")),
    ],
)
def test_every_vllm_service_waits_longer_than_any_presets_drain(compose_files, profiles):
    """On stop, vLLM drains for up to its preset's --shutdown-timeout; the engine kills at
    the end of stop_grace_period, which must be longer than the longest drain."""
    from arcvllm import presets

    longest = max(p.shutdown_timeout or 0 for p in presets.load_all().values())
    assert longest > 0
    files = [arg for f in compose_files[1:] for arg in ("-f", str(f))]
    flags = [arg for p in profiles for arg in ("--profile", p)]
    result = config(compose_files[0], *files, *flags, env={"RENDER_GID": "4242"})
    assert result.returncode == 0, result.stderr
    services = yaml.safe_load(result.stdout)["services"]
    servers = [name for name in services if name.startswith("vllm")]
    assert len(servers) >= 2, servers
    for name in servers:
        grace = seconds(services[name].get("stop_grace_period", "10s"))  # the engine's default
        assert grace >= longest + 20, f"{name}: stop_grace_period {grace:.0f} s"


def test_make_up_refuses_a_key_file_that_breaks_the_key_rule(tmp_path):
    """One key rule (options.KEY_RULE) before compose runs: a two-line key stops `make up` in
    one line, not in the containers."""
    from arcvllm.options import KEY_RULE

    key = tmp_path / "key"
    key.write_text("first\nsecond\n")
    mine = tmp_path / "mine.env"
    mine.write_text(f"VLLM_API_KEY_FILE={key}\n")
    argv = ["make", "-s", "-C", str(ROOT), "-o", ".venv/.stamp", "up", f"ENV_FILE={mine}"]
    done = subprocess.run(
        [*argv, "FLAVOR=cpu", "COMPOSE=echo RAN"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode != 0 and "RAN" not in done.stdout
    assert KEY_RULE in done.stderr, done.stderr


# ---- the argv of a project (arcvllm/operate/compose.py), as pure functions ----


def test_a_projects_argv_names_the_settings_file_the_files_and_the_profiles(monkeypatch):
    from arcvllm.operate import compose

    monkeypatch.setenv("COMPOSE", "docker compose")
    project = compose.Project(
        "p", Path("/s/mine.env"), (Path("/d/compose.yaml"),), ("cpu",), {"PORT": "8123"}
    )
    assert project.argv("up", "-d", "vllm-cpu", profiles=("monitoring",)) == [
        *("docker", "compose", "-p", "p", "--env-file", "/s/mine.env", "-f", "/d/compose.yaml"),
        *("--profile", "cpu", "--profile", "monitoring", "up", "-d", "vllm-cpu"),
    ]
    assert project.environ({"PATH": "/bin", "PORT": "1"}) == {
        "PATH": "/bin",
        "ENV_FILE": "/s/mine.env",
        "PORT": "8123",
    }
    assert project.shell("logs", "vllm-cpu") == (
        "ENV_FILE=/s/mine.env PORT=8123 docker compose -p p --env-file /s/mine.env "
        "-f /d/compose.yaml --profile cpu logs vllm-cpu"
    )


def test_the_single_server_is_the_cpu_profile_or_the_xpu_service_with_its_gpus_file():
    from arcvllm.operate import compose

    cpu = compose.server("arcvllm", Path("/s/e.env"), "cpu", {})
    assert cpu.files == (COMPOSE_FILE,) and cpu.profiles == ("cpu",)
    xpu = compose.server("arcvllm", Path("/s/e.env"), "xpu", {}, gpus=Path("/b/gpus.yaml"))
    assert xpu.files == (COMPOSE_FILE, Path("/b/gpus.yaml")) and xpu.profiles == ()
    assert compose.server("a", Path("/e"), "xpu", {}).files[1] == ROOT / "build" / "gpus.yaml"


def test_a_missing_compose_tool_is_one_line(monkeypatch):
    from arcvllm.errors import Unavailable
    from arcvllm.operate import compose

    monkeypatch.setenv("COMPOSE", "/nonexistent/compose")
    project = compose.Project("p", Path("/e"), (COMPOSE_FILE,))
    with pytest.raises(Unavailable, match="no compose tool: /nonexistent/compose not found"):
        project.run("ps")


@pytest.mark.compose
def test_the_preset_deploy_up_names_is_the_servers_environment(tmp_path):
    """`arcvllm deploy up --preset X` hands compose X: compose's own rendering of the
    project it runs gives each flavour's server ARCVLLM_PRESET=X over the settings file's."""
    from arcvllm.operate import single

    compose_binary()
    gpus = tmp_path / "gpus.yaml"  # what `arcvllm gpus --compose` writes, for one node
    gpus.write_text('services:\n  vllm:\n    devices: ["/dev/null:/dev/dri/renderD128"]\n')
    for flavor, preset, service in (
        ("xpu", "qwen3.6-35b-a3b-w4a16-2xb70", "vllm"),
        ("cpu", "tiny-hybrid-cpu-mtp", "vllm-cpu"),
    ):
        names = single.Names(
            env_file=ENV_FILE, flavor=flavor, stack=None, preset=preset, image=None,
            gateway_image=None, port=None, project="opr-preset", gpus_file=gpus,
        )  # fmt: skip
        project = single.resolve(names, environ={}, dri_dir=tmp_path).compose()
        done = subprocess.run(
            project.argv("config"), capture_output=True, text=True, timeout=60,
            env=project.environ({"PATH": os.environ["PATH"], "RENDER_GID": "4242"}),
        )  # fmt: skip
        assert done.returncode == 0, done.stderr
        env = yaml.safe_load(done.stdout)["services"][service]["environment"]
        assert env["ARCVLLM_PRESET"] == preset, (flavor, env["ARCVLLM_PRESET"])


# ---- one project: the server, its gateway and its Prometheus together (name: arcvllm) ----


@pytest.mark.compose
@pytest.mark.parametrize("files", [(COMPOSE_FILE,), (COMPOSE_FILE, SCALE_FILE)])
def test_the_compose_files_name_their_project_wherever_compose_runs(tmp_path, files):
    """By hand, without -p, compose named the project after the folder (`docker`): the
    monitoring profile's Prometheus landed in another network than `make up`'s server."""
    argv = [*compose_binary(), "--env-file", str(ENV_FILE)]
    for path in files:
        argv += ["-f", str(path)]
    done = subprocess.run([*argv, "config", "--format", "json"], capture_output=True, text=True,
                          timeout=60, cwd=tmp_path, env={"PATH": os.environ["PATH"]})  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["name"] == "arcvllm"


COMPOSE_CALL = re.compile(r"docker compose +-")


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: p.name)
def test_every_compose_command_in_the_docs_names_its_project(doc):
    """A command an operator copies lands in the project `make up` (arcvllm) or `arcvllm
    scale up` (arcvllm-scale) made, whatever folder it runs from."""
    unnamed = [
        f"{doc.name}:{number}: {line.strip()}"
        for number, line in enumerate(doc.read_text().splitlines(), start=1)
        if COMPOSE_CALL.search(line) and not re.search(r" -p arcvllm(-[a-z]+)? ", line)
    ]
    assert not unnamed, "\n".join(unnamed)
