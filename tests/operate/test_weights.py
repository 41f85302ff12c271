"""`arcvllm model fetch`: the real huggingface_hub client against a stand-in of the hub's
HTTP interface (tests/support/hub.py), into a MODELS_DIR; and `make up` refusing a model
folder that is not there or not finished."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
from support import ROOT
from support.hub import HubStandIn, hub_standin

from arcvllm.operate import weights

REPO = "arcvllm-test/tiny-fetch"
BIG = 22 * 1024 * 1024  # over huggingface_hub's 10 MiB download chunk: a resumable cut


def checkpoint(folder: Path, shard_bytes: int = 4096) -> Path:
    """A repository as the hub holds one: configs, tokenizer, two shards and their index,
    a model card and remote code (which the default patterns leave out)."""
    folder.mkdir(parents=True)
    (folder / "config.json").write_text('{"architectures": ["Qwen3NextForCausalLM"]}')
    (folder / "generation_config.json").write_text("{}")
    (folder / "tokenizer.json").write_text('{"model": {}}')
    (folder / "chat_template.jinja").write_text("{{ messages }}")
    shards = {}
    for number in (1, 2):
        name = f"model-0000{number}-of-00002.safetensors"
        (folder / name).write_bytes(os.urandom(shard_bytes if number == 1 else 2048))
        shards[f"layer.{number}.weight"] = name
    (folder / "model.safetensors.index.json").write_text(json.dumps({"weight_map": shards}))
    (folder / "README.md").write_text("# card\n")
    (folder / "modeling_tiny.py").write_text("raise SystemExit('remote code')\n")
    return folder


def preset_dir(tmp_path: Path, revision: str | None, repo: str = REPO) -> Path:
    folder = tmp_path / "presets"
    folder.mkdir(exist_ok=True)
    pin = f"\n  revision: {revision}" if revision else ""
    (folder / "tiny-fetch.yaml").write_text(
        "name: tiny-fetch\ndescription: a fetched model\nmodel: /models/tiny-fetch\n"
        "served_model_name: tiny\nflavor: cpu\ngpus: 0\nstacks: [cpu]\n"
        f"checkpoint:\n  repo: {repo}{pin}\n"
    )
    return folder


def fetch(tmp_path: Path, *args: str, env: dict[str, str] | None = None):
    """`arcvllm model fetch` as an operator runs it, its caches under tmp_path."""
    return subprocess.run(
        [sys.executable, "-m", "arcvllm", "model", "fetch", *args],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=tmp_path,
        env={**os.environ, "HF_HOME": str(tmp_path / "hf"), **(env or {})},
    )


@pytest.fixture
def hub(tmp_path):
    with hub_standin() as standin:
        yield standin


def setup(tmp_path: Path, hub: HubStandIn, shard_bytes: int = 4096, pinned: bool = True):
    repo = hub.add(REPO, checkpoint(tmp_path / "hub" / "tiny", shard_bytes))
    presets = preset_dir(tmp_path, repo.commit if pinned else None)
    models = tmp_path / "models"
    args = ("tiny-fetch", "--presets-dir", str(presets), "--models-dir", str(models))
    return repo, models / "tiny-fetch", (*args, "--endpoint", hub.url)


def test_fetch_puts_the_pinned_commits_files_in_models_dir_and_no_others(tmp_path, hub):
    repo, folder, args = setup(tmp_path, hub)
    done = fetch(tmp_path, *args, "--json")
    assert done.returncode == 0, done.stderr
    doc = json.loads(done.stdout)
    assert doc["commit"] == repo.commit and doc["fetched"] is True and doc["dir"] == str(folder)
    for name in ("config.json", "tokenizer.json", "chat_template.jinja",
                 "model-00001-of-00002.safetensors", "model.safetensors.index.json"):  # fmt: skip
        assert (folder / name).read_bytes() == (repo.folder / name).read_bytes(), name
    assert not (folder / "README.md").exists() and not (folder / "modeling_tiny.py").exists()
    assert weights.problem(folder) is None
    # every request names the pinned commit, never a branch
    assert all(repo.commit in s.path for s in hub.seen), hub.seen


def test_a_complete_folder_is_not_asked_of_the_hub_again(tmp_path, hub):
    _, folder, args = setup(tmp_path, hub)
    assert fetch(tmp_path, *args).returncode == 0
    asked = len(hub.seen)
    again = fetch(tmp_path, *args)
    assert again.returncode == 0, again.stderr
    assert "complete, nothing fetched" in again.stdout and len(hub.seen) == asked
    with socket.socket() as closed:  # and with no hub at all (a port nobody answers)
        closed.bind(("127.0.0.1", 0))
        gone = f"http://127.0.0.1:{closed.getsockname()[1]}"
        offline = fetch(tmp_path, *args[:-1], gone, env={"HF_HUB_OFFLINE": "1"})
    assert offline.returncode == 0, offline.stderr
    (folder / "model-00002-of-00002.safetensors").unlink()  # no longer complete: asked again
    assert fetch(tmp_path, *args).returncode == 0 and len(hub.seen) > asked


def test_a_cut_download_is_resumed_with_a_range_request(tmp_path, hub):
    repo, folder, args = setup(tmp_path, hub, shard_bytes=BIG)
    hub.cut_after = 12 * 1024 * 1024
    done = fetch(tmp_path, *args)
    assert done.returncode == 0, done.stderr
    shard = "model-00001-of-00002.safetensors"
    assert (folder / shard).read_bytes() == (repo.folder / shard).read_bytes()
    ranges = [s.range for s in hub.requests("GET") if s.path.endswith(shard) and s.range]
    assert ranges == ["bytes=10485760-"], hub.seen


def test_a_failed_fetch_is_one_line_leaves_an_unfinished_folder_and_resumes(tmp_path, hub):
    _, folder, args = setup(tmp_path, hub)
    hub.broken = {"model-00002-of-00002.safetensors"}
    failed = fetch(tmp_path, *args)
    assert failed.returncode == 3
    said = [line for line in failed.stderr.splitlines() if line.startswith("arcvllm:")]
    assert len(said) == 1 and "run it again to resume" in said[0], failed.stderr
    assert weights.problem(folder) == f"the fetch into {folder} did not finish"
    hub.broken = set()
    before = len(hub.seen)
    assert fetch(tmp_path, *args).returncode == 0
    got = [s.path.rsplit("/", 1)[1] for s in hub.seen[before:]
           if s.method == "GET" and "/resolve/" in s.path]  # fmt: skip
    assert got == ["model-00002-of-00002.safetensors"]  # the others were not fetched again
    assert weights.problem(folder) is None


def test_a_token_file_is_sent_and_never_shown(tmp_path, hub):
    _, _, args = setup(tmp_path, hub)
    hub.token = "hf_standin_secret_1234"
    refused = fetch(tmp_path, *args)
    assert refused.returncode == 3 and "--token-file" in refused.stderr.splitlines()[-1]
    token = tmp_path / "token"
    token.write_text(f"{hub.token}\n")
    done = fetch(tmp_path, *args, "--token-file", str(token))
    assert done.returncode == 0, done.stderr
    assert all(s.authorized for s in hub.requests("GET")[-3:])
    assert hub.token not in done.stdout + done.stderr + refused.stdout + refused.stderr


def test_hf_endpoint_names_the_mirror(tmp_path, hub):
    _, folder, args = setup(tmp_path, hub)
    done = fetch(tmp_path, *args[:-2], env={"HF_ENDPOINT": hub.url})
    assert done.returncode == 0, done.stderr
    assert (folder / "config.json").is_file() and hub.seen


def test_a_preset_without_a_pin_needs_a_revision_which_is_resolved_and_named(tmp_path, hub):
    repo, _, args = setup(tmp_path, hub, pinned=False)
    unpinned = fetch(tmp_path, *args)
    assert unpinned.returncode == 2 and "pins no revision" in unpinned.stderr
    assert not hub.seen
    done = fetch(tmp_path, *args, "--revision", "main")
    assert done.returncode == 0, done.stderr
    assert hub.seen[0].path == f"/api/models/{REPO}/revision/main"
    assert f"main is commit {repo.commit}: pin it" in done.stderr
    wrong = fetch(tmp_path, *args, "--revision", "f" * 40)
    assert wrong.returncode == 2 and f"has no revision {'f' * 40}" in wrong.stderr


def test_a_model_inside_the_image_has_nothing_to_fetch(tmp_path):
    done = fetch(tmp_path, "tiny-hybrid-cpu", "--models-dir", str(tmp_path))
    assert done.returncode == 2 and "inside the image: nothing to fetch" in done.stderr


def test_the_weights_are_readable_in_the_container_whatever_the_umask(tmp_path, hub):
    _, folder, args = setup(tmp_path, hub)
    done = subprocess.run(["bash", "-c", 'umask 077 && exec "$@"', "-", sys.executable, "-m",
                           "arcvllm", "model", "fetch", *args], capture_output=True, text=True,
                          cwd=tmp_path, env={**os.environ, "HF_HOME": str(tmp_path / "hf")},
                          timeout=300)  # fmt: skip
    assert done.returncode == 0, done.stderr
    for path in [folder, *folder.iterdir()]:
        assert path.stat().st_mode & 0o004, path


def test_what_makes_a_folder_unservable_is_said(tmp_path):
    folder = tmp_path / "m"
    assert weights.problem(folder) == f"no folder {folder}"
    folder.mkdir()
    assert weights.problem(folder) == f"{folder} has no config.json"
    (folder / "config.json").write_text("{}")
    assert weights.problem(folder) == f"{folder} has no weights (*.safetensors)"
    (folder / "model.safetensors.index.json").write_text('{"weight_map": {"a": "s1.safetensors"}}')
    assert "lacks 1 shard(s) its index names (s1.safetensors" in weights.problem(folder)
    (folder / "s1.safetensors").write_bytes(b"x")
    assert weights.problem(folder) is None


# ---- make up: the model is there before anything starts ----

FAKE_COMPOSE = '#!/bin/sh\necho "$*" >> {calls}\n'


def deploy_up(tmp_path: Path, models: Path, *args: str) -> subprocess.CompletedProcess:
    key = tmp_path / "secrets" / "api-key"
    if not key.exists():
        from arcvllm.operate.host import new_api_key_file

        new_api_key_file(key)
    mine = tmp_path / "mine.env"
    mine.write_text(f"MODELS_DIR={models}\nVLLM_API_KEY_FILE={key}\n")
    compose = tmp_path / "compose"
    compose.write_text(FAKE_COMPOSE.format(calls=tmp_path / "calls"))
    compose.chmod(0o755)
    return subprocess.run(
        [sys.executable, "-m", "arcvllm", "deploy", "up", "--env-file", str(mine), *args],
        capture_output=True, text=True, timeout=120, cwd=ROOT,
        env={**os.environ, "COMPOSE": str(compose), "DOCKER": "true"},  # every image there
    )  # fmt: skip


def test_make_up_refuses_a_missing_model_before_anything_starts(tmp_path):
    models = tmp_path / "models"
    models.mkdir()
    gpus = tmp_path / "gpus.yaml"
    done = deploy_up(tmp_path, models, "--flavor", "xpu", "--gpus-file", str(gpus))
    assert done.returncode == 3
    (line,) = done.stderr.splitlines()
    folder = models / "Qwen3.6-35B-A3B-W4A16"
    assert line == (
        f"arcvllm: the model of qwen3.6-35b-a3b-w4a16-1xb70 is not ready: no folder {folder} "
        "(MODELS_DIR): arcvllm model fetch qwen3.6-35b-a3b-w4a16-1xb70 (make model)"
    )
    assert not (tmp_path / "calls").exists() and not gpus.exists()
    # the CPU service serves the model inside its image: nothing to check
    assert deploy_up(tmp_path, models, "--flavor", "cpu").returncode == 0


def test_make_up_checks_a_cpu_presets_model_in_models_dir_and_mounts_that_folder(tmp_path):
    """tiny-hybrid-cpu-models: refused while MODELS_DIR lacks it, or holds another
    checkpoint's fetch, or a folder the model check refuses; once there, compose is handed
    MODELS_DIR as the CPU service's /models (CPU_MODELS_DIR)."""
    models = tmp_path / "models"
    models.mkdir()
    preset = "tiny-hybrid-cpu-models"
    done = deploy_up(tmp_path, models, "--preset", preset)
    assert done.returncode == 3 and not (tmp_path / "calls").exists()
    (line,) = done.stderr.splitlines()
    assert f"the model of {preset} is not ready: no folder {models / 'tiny-hybrid'}" in line
    folder = models / "tiny-hybrid"
    folder.mkdir()
    (folder / "config.json").write_text('{"architectures": ["Qwen3NextForCausalLM"]}')
    (folder / "model.safetensors").write_bytes(b"\x02\x00\x00\x00\x00\x00\x00\x00{}")
    done = deploy_up(tmp_path, models, "--preset", preset)  # no tensors, no tokenizer
    assert done.returncode == 1 and not (tmp_path / "calls").exists()
    (line,) = done.stderr.splitlines()
    assert f"model {folder} cannot serve {preset}: " in line and "tokenizer: none of" in line
    weights.write_record(folder, {"repo": "someone/else", "commit": "a" * 40, "complete": True})
    done = deploy_up(tmp_path, models, "--preset", preset)
    assert done.returncode == 3 and f"holds someone/else@{'a' * 40}, not arcvllm/tiny-hybrid" in (
        done.stderr
    )
    assert not (tmp_path / "calls").exists()
    dry = deploy_up(tmp_path, models, "--preset", preset, "--dry-run")
    assert dry.returncode == 0 and f"CPU_MODELS_DIR={models} " in dry.stdout, dry.stdout


# ---- the whole way: weights out of the hub stand-in, served by the CPU image ----


@pytest.mark.docker
def test_a_fetched_model_is_served_read_only_from_models_dir(cpu_image, tmp_path, hub):
    """The tiny model the CPU image carries, published on the stand-in hub, fetched by
    `arcvllm model fetch` into a MODELS_DIR, mounted read-only at /models and served by the
    image as its user (UID 1000): the fetched files are a model vLLM loads."""
    import httpx
    from support.docker import docker
    from support.processes import free_port

    from arcvllm.client.api import wait_until

    repo_dir = tmp_path / "hub"
    repo_dir.mkdir()
    made = docker("create", cpu_image).stdout.strip()
    try:
        docker("cp", f"{made}:/opt/arcvllm/models/tiny-hybrid", str(repo_dir / "tiny"))
    finally:
        docker("rm", "-v", made)  # and its anonymous /var/cache/arcvllm volume
    repo = hub.add(REPO, repo_dir / "tiny")
    presets = preset_dir(tmp_path, repo.commit)
    models = tmp_path / "models"
    done = fetch(tmp_path, "tiny-fetch", "--presets-dir", str(presets), "--models-dir",
                 str(models), "--endpoint", hub.url)  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert weights.problem(models / "tiny-fetch") is None
    port = free_port()
    cid = docker(
        "run", "-d", "--shm-size", "1g", "-p", f"127.0.0.1:{port}:8000",
        "-v", f"{models}:/models:ro", cpu_image, "tiny-hybrid-cpu", "--model", "/models/tiny-fetch",
    ).stdout.strip()  # fmt: skip
    try:
        url = f"http://127.0.0.1:{port}"

        def healthy() -> bool:
            state = docker("inspect", "-f", "{{.State.Running}}", cid).stdout.strip()
            if state != "true":  # stopped: its log says why, no use waiting
                logs = docker("logs", cid, check=False)
                raise AssertionError((logs.stdout + logs.stderr)[-3000:])
            try:
                return httpx.get(f"{url}/health", timeout=5).status_code == 200
            except httpx.HTTPError:
                return False

        wait_until(healthy, 900, 2, "the server on the fetched model")
        answer = httpx.post(f"{url}/v1/completions", timeout=120, json={
            "model": "tiny-hybrid", "prompt": "hello", "max_tokens": 8})  # fmt: skip
        assert answer.status_code == 200, answer.text
        assert answer.json()["choices"][0]["text"]
        log = docker("logs", cid).stderr + docker("logs", cid).stdout
        assert "/models/tiny-fetch" in log
    finally:
        docker("rm", "-f", "-v", cid, check=False)


def test_the_folder_checked_is_the_folder_compose_mounts(tmp_path):
    """The CPU service's /models: CPU_MODELS_DIR (shell, settings file), else MODELS_DIR,
    absolute; none for a model inside the image. The XPU service's: MODELS_DIR."""
    from arcvllm.operate import single

    mine = tmp_path / "mine.env"
    mine.write_text("MODELS_DIR=/srv/models\n")

    def mount(preset: str, environ: dict[str, str]) -> Path | None:
        names = single.Names(env_file=mine, project="arcvllm", preset=preset)
        return single.resolve(names, environ=environ, dri_dir=tmp_path).models_dir

    cpu = "tiny-hybrid-cpu-models"
    assert mount(cpu, {}) == Path("/srv/models")
    assert mount(cpu, {"CPU_MODELS_DIR": "/elsewhere"}) == Path("/elsewhere")
    assert mount(cpu, {"MODELS_DIR": "rel"}) == Path.cwd() / "rel"
    assert mount("tiny-hybrid-cpu", {}) is None
    assert mount("qwen3.6-35b-a3b-w4a16-1xb70", {"CPU_MODELS_DIR": "/x"}) == Path("/srv/models")
