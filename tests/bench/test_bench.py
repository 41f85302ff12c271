"""bench: the pure arithmetic, vLLM's own bench parser, and whole runs against the fake
server (tests/support/fakeserver.py) with a stand-in for vLLM's bench; the run against a
real server is tests/serving/test_emulation_server.py's: it shares that module's stock server."""

from __future__ import annotations

import itertools
import json
import subprocess
import sys

import pytest
from support import ROOT
from support.venvs import vllm_env

from arcvllm.bench import measurements, plot, reference, runner, session
from arcvllm.bench.measurements import TokenStep, token_steps
from arcvllm.client.api import Chunk, Stream
from arcvllm.errors import ArcvllmError


def stream(prompt_len: int, sizes: list[int], gap: float = 0.01) -> Stream:
    return Stream(prompt_len, [Chunk(n, 0.1 + i * gap) for i, n in enumerate(sizes)])


def test_steps_are_placed_at_the_positions_the_engine_computed():
    # Prompt of 6 tokens, block 8: output token k is computed from position 6 + k - 1.
    ss = token_steps(stream(6, [1, 1, 1, 1, 1]), block=8)
    assert [s.position for s in ss] == [6, 7, 8, 9]
    assert [s.crosses for s in ss] == [False, False, True, False]
    assert all(abs(s.itl_ms - 10) < 1e-9 for s in ss)


def test_a_chunk_of_several_tokens_crosses_if_any_of_them_does():
    """Positions 7-9 in one chunk (a loaded client reads tokens together): it crosses, at 8,
    the block boundary it holds (a report's boundary positions are multiples of the block)."""
    ss = token_steps(stream(6, [1, 1, 3, 1]), block=8)
    assert [(s.position, s.tokens, s.crosses) for s in ss] == [
        (6, 1, False),
        (8, 3, True),
        (10, 1, False),
    ]
    assert abs(ss[1].itl_ms - 10 / 3) < 1e-9


def test_boundary_summary_separates_crossing_steps_and_would_see_a_slow_copy():
    steps = [TokenStep(p, 1, 50.0 if p % 8 == 0 else 5.0, p % 8 == 0) for p in range(4, 40)]
    summary = measurements.boundary_summary(steps)
    assert summary["boundary_steps"] == 4 and summary["boundary_positions"] == [8, 16, 24, 32]
    assert summary["itl_ms_boundary_p50"] == 50.0 and summary["itl_ms_other_p50"] == 5.0
    assert summary["boundary_over_other_p50"] == 10.0


def test_plans_cross_the_boundaries_and_fit_the_context():
    assert measurements.boundary_lengths(128, 2048, 3) == (64, 322)
    prompt, decode = measurements.boundary_lengths(2112, 32768, 3)
    assert prompt + decode - 1 >= 3 * 2112
    assert measurements.boundary_lengths(128, 300, 3) == (64, 235)  # capped by max-model-len
    with pytest.raises(ArcvllmError, match="no room"):
        measurements.boundary_lengths(2112, 2048, 3)
    assert measurements.prefix_length(128, 2048) == 12 * 128 + 1
    assert measurements.prefix_length(2112, 32768) == 11 * 2112 + 1
    with pytest.raises(ArcvllmError, match="no full block"):
        measurements.prefix_length(2112, 2048)


def test_ratios_against_scalar_and_range_references():
    rows = reference.ratio_rows(
        {"decode_tok_s": 31.5, "prefill_tok_s": 2900.0, "itl_ms_p50": None},
        {"decode_tok_s": 63, "prefill_tok_s": [5800, 7600], "itl_ms_p50": 6, "nope": 1},
    )
    assert rows == [
        {"metric": "decode_tok_s", "measured": 31.5, "reference": "63", "ratio": "0.50"},
        {
            "metric": "prefill_tok_s",
            "measured": 2900.0,
            "reference": "5800-7600",
            "ratio": "0.38-0.50",
        },
    ]


def test_the_b70_reference_carries_the_reports_figures():
    ref = reference.load_reference("qwen3.6-35b-a3b-w4a16-1xb70")
    assert ref["metrics"]["decode_tok_s"] == 63
    assert ref["metrics"]["prefill_tok_s"] == [5800, 7600]
    assert reference.load_reference("no-such-reference") is None


def test_tokenizer_must_exist_locally(tmp_path):
    assert session.resolve_tokenizer(None, str(tmp_path), "tiny") == str(tmp_path)
    with pytest.raises(ArcvllmError, match="--tokenizer"):
        session.resolve_tokenizer(None, str(tmp_path / "absent"), "tiny")


def test_plot_writes_a_png_with_boundaries(tmp_path):
    pytest.importorskip("matplotlib")
    path = tmp_path / "p.png"
    runs = [token_steps(stream(60, [1] * 200), 64), token_steps(stream(60, [1] * 150), 64)]
    plot.plot(runs, 64, "t", path)
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_replot_draws_the_png_of_a_bench_json_elsewhere(tmp_path, capsys):
    """The image may lack matplotlib: the JSON carries every step, the host draws it."""
    pytest.importorskip("matplotlib")
    from dataclasses import asdict

    from arcvllm import cli

    runs = [[asdict(s) for s in token_steps(stream(60, [1] * 100), 64)]]
    source = tmp_path / session.REPORT_JSON
    source.write_text(json.dumps({"model": "m", "block_size": 64, "runs": runs}))
    assert cli.main(["bench", "replot", str(source)]) == 0
    assert (tmp_path / session.REPORT_PNG).read_bytes()[:4] == b"\x89PNG"
    assert capsys.readouterr().out == f"wrote {tmp_path / session.REPORT_PNG}\n"
    assert cli.main(["bench", "replot", "--json", str(source)]) == 0
    assert json.loads(capsys.readouterr().out) == {"png": str(tmp_path / session.REPORT_PNG)}
    # A file that is not there, or not a bench.json: one line, usage.
    assert cli.main(["bench", "replot", str(tmp_path / "absent.json")]) == 2
    assert capsys.readouterr().err.startswith("arcvllm: cannot read")
    (tmp_path / "other.json").write_text("{}")
    assert cli.main(["bench", "replot", str(tmp_path / "other.json")]) == 2
    err = capsys.readouterr().err
    assert "no runs, model, block_size" in err and err.count("\n") == 1


def test_replot_without_matplotlib_is_one_line_and_exit_3(tmp_path):
    """An environment without the 'bench' extra (matplotlib cannot be imported)."""
    source = tmp_path / session.REPORT_JSON
    source.write_text(json.dumps({"model": "m", "block_size": 64, "runs": [[]]}))
    code = (
        "import sys; sys.modules['matplotlib'] = None\n"
        "from arcvllm import cli\n"
        f"raise SystemExit(cli.main(['bench', 'replot', {str(source)!r}]))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=60
    )
    assert done.returncode == 3, done.stderr
    assert done.stderr.splitlines() == [
        "arcvllm: arcvllm bench needs the 'bench' extra: pip install 'arcvllm[bench]' "
        "(no module named matplotlib)"
    ]
    assert not (tmp_path / session.REPORT_PNG).exists()


def test_bench_without_a_server_is_a_usage_error(capsys):
    from arcvllm import cli

    assert cli.main(["bench"]) == 2
    assert capsys.readouterr().err == "arcvllm: name the server: --base-url URL\n"


def test_vllm_bench_args_name_the_random_dataset_and_the_result_file(tmp_path):
    args = runner.vllm_bench_args("http://h:1", "m", "/tok", tmp_path, 256, 64, 4, 1)
    pairs = dict(itertools.pairwise(args))
    assert pairs["--dataset-name"] == "random" and pairs["--tokenizer"] == "/tok"
    assert pairs["--result-filename"] == runner.VLLM_BENCH_JSON and "--ignore-eos" in args


@pytest.mark.vllm
def test_vllm_bench_args_parse_with_vllms_own_bench_parser(tmp_path):
    """vLLM's own `bench serve` parser accepts them; a misspelt flag is rejected."""
    env = vllm_env("0.32.0")
    args = runner.vllm_bench_args("http://h:1", "m", "/tok", tmp_path, 256, 64, 4, 1)
    code = (
        "import sys\n"
        "from vllm.entrypoints.cli.benchmark.serve import BenchmarkServingSubcommand as S\n"
        "from vllm.utils.argparse_utils import FlexibleArgumentParser\n"
        "p = FlexibleArgumentParser(); S.add_cli_args(p); a = p.parse_args(sys.argv[1:])\n"
        "print(a.dataset_name, a.random_input_len, a.result_filename)\n"
    )
    extra = {"TMPDIR": str(tmp_path), "VLLM_CACHE_ROOT": str(tmp_path / "c")}
    good = env.run("-c", code, *args, env=extra, timeout=300)
    assert good.returncode == 0, good.stderr[-2000:]
    assert good.stdout.split()[-3:] == ["random", "256", runner.VLLM_BENCH_JSON]
    bad = env.run("-c", code, *args, "--random-inptu-len", "3", env=extra, timeout=300)
    assert bad.returncode != 0 and "--random-inptu-len" in bad.stderr


# ---- the measurements against a server in this process (test_smoke's fake vLLM)


def test_measurements_against_a_fake_server_find_the_boundaries_and_the_hits(http_server):
    import random

    from support.fakeserver import BLOCK, MAX_LEN, Fake, handler

    from arcvllm.client.api import Client

    client = Client(http_server(handler(Fake())))
    rng = random.Random(0)
    streams, summary = measurements.measure_boundaries(
        client, "tiny-hybrid", BLOCK, MAX_LEN, 2, 1, rng
    )
    prompt, decode = measurements.boundary_lengths(BLOCK, MAX_LEN, 2)
    assert streams[0].tokens == decode and streams[0].prompt_len == prompt
    assert summary["boundary_positions"] == [BLOCK, 2 * BLOCK]
    assert summary["boundary_steps"] == 2 and summary["other_steps"] == decode - 1 - 2
    prefix = measurements.measure_prefix(client, "tiny-hybrid", BLOCK, MAX_LEN, 1, rng)
    length = measurements.prefix_length(BLOCK, MAX_LEN)
    # The warm request hits every whole block of the prompt (never its last token).
    assert (prefix["warm_hits"], prefix["warm_queries"]) == (length - 1, length)


def test_a_server_that_counts_no_hits_shows_a_zero_hit_rate(http_server):
    import random

    from support.fakeserver import BLOCK, MAX_LEN, Fake, handler

    from arcvllm.client.api import Client

    client = Client(http_server(handler(Fake({"no_hits"}))))
    prefix = measurements.measure_prefix(client, "tiny-hybrid", BLOCK, MAX_LEN, 1, random.Random(0))
    assert prefix["warm_hit_rate"] == 0.0 and prefix["warm_queries"] > 0


def test_decode_summary_gives_tokens_per_second_and_itl_percentiles():
    # Two streams: 1 token per 10 ms, and chunks of 3 tokens per 30 ms (speculation), each
    # first token 100 ms after its request: tokens over wall time, 11 / 0.2 s and 31 / 0.4 s.
    plain = stream(0, [1] * 11, gap=0.010)
    spec = stream(0, [1] + [3] * 10, gap=0.030)
    summary = measurements.decode_summary([plain, spec])
    assert summary["decode_tok_s"] == pytest.approx((55.0 + 77.5) / 2)
    assert summary["itl_ms_p50"] == pytest.approx(10.0)
    assert summary["tokens"] == 11 + 31 and summary["streams"] == 2
    assert summary["bulk_streams"] == 0 and summary["bulk_delivery"] is False


# ---- tokens delivered in bulk (a buffering hop, a loaded client) ------------------------

# Chunk timings in tests/bench/recorded/: what a client saw, seconds after its request.
RECORDED = ROOT / "tests" / "bench" / "recorded"


def recorded(name: str) -> Stream:
    """A stream from a recording: {"chunks": [[tokens, at], ...]}."""
    doc = json.loads((RECORDED / f"{name}.json").read_text())
    return Stream(doc.get("prompt_len", 0), [Chunk(n, at) for n, at in doc["chunks"]])


def test_a_stream_held_back_then_let_go_is_rated_by_wall_time_and_called_bulk():
    """The CI run of the issue: 5 chunks 6.5 s after the request, the other 1996 within
    0.1 s. The span of arrival gave 3457 tok/s and ITL p50 0.1 ms for a server that makes
    ~300 tok/s; tokens over wall time gives ~300, and the stream is said to be bulk."""
    held = recorded("held-back-2000")
    assert held.tokens == 2000 and held.chunks[4].at > 6.4
    span = held.chunks[-1].at - held.chunks[0].at
    assert (held.tokens - 1) / span > 3000  # what the span of arrival would say
    assert held.decode_tok_s() == pytest.approx(held.tokens / held.chunks[-1].at)
    assert 250 < held.decode_tok_s() < 350
    assert measurements.bulk_share(held) > 0.99 and measurements.in_bulk(held)
    summary = measurements.decode_summary([held])
    assert summary["bulk_streams"] == 1 and summary["bulk_delivery"] is True


def steady() -> Stream:
    """Decode step by step: a token every 5-7 ms (the tiny CPU model's pace), the first
    after 30 ms of prefill."""
    gaps = itertools.cycle([0.005, 0.006, 0.007, 0.006])
    at = list(itertools.accumulate(itertools.islice(gaps, 299), initial=0.030))
    return Stream(0, [Chunk(1, t) for t in at])


def test_a_stream_that_arrived_step_by_step_is_not_bulk_even_with_a_stall_in_it():
    """A stream step by step, and the same with one stall of the client, after which it
    read 5 chunks together."""
    decoded = steady()
    assert len(decoded.chunks) > 50 and not measurements.in_bulk(decoded)
    assert measurements.bulk_share(decoded) == 0.0
    assert decoded.decode_tok_s() == pytest.approx(300 / decoded.chunks[-1].at)
    stalled = Stream(decoded.prompt_len, list(decoded.chunks))
    at = stalled.chunks[20].at
    for i in range(16, 21):  # chunks 16-20 read together when the client came back
        stalled.chunks[i] = Chunk(stalled.chunks[i].tokens, at + (i - 16) * 1e-5)
    assert 0 < measurements.bulk_share(stalled) < measurements.BULK_SHARE
    assert not measurements.in_bulk(stalled)
    assert measurements.bulk_share(stream(0, [3])) == 0.0  # one chunk: nothing to judge


def test_a_report_with_bulk_streams_says_so_in_its_table():
    from arcvllm.bench.session import format_report

    report = {
        "summary": {"decode_tok_s": 300.0},
        "boundary": {
            "boundary_steps": 3, "itl_ms_boundary_p50": 0.1,
            "other_steps": 300, "itl_ms_other_p50": 0.1,
        },
        "bulk_delivery": {"bulk": True, "bulk_streams": 2, "streams": 4},
    }  # fmt: skip
    table = format_report(report).splitlines()
    said = [line for line in table if "in bulk" in line]
    assert said == [measurements.bulk_note(4, 2)] and said[0].startswith("warning: 2 of 4 ")
    report["bulk_delivery"] = {"bulk": False, "bulk_streams": 0, "streams": 4}
    assert "in bulk" not in format_report(report)


def test_bench_json_flags_the_streams_it_timed_that_arrived_in_bulk():
    from arcvllm.bench.session import delivery

    held = recorded("held-back-2000")
    compare = {
        "plain": measurements.decode_summary([held]),
        "speculative": measurements.decode_summary([steady()]),
    }
    assert delivery([steady(), steady()], compare) == {
        "bulk": True, "bulk_streams": 1, "streams": 4,
    }  # fmt: skip
    assert delivery([steady()], None) == {"bulk": False, "bulk_streams": 0, "streams": 1}


def test_speculation_summary_is_the_servers_counters_or_nothing():
    from arcvllm.client.metrics import SpecDecode

    run = measurements.speculation_summary(SpecDecode(100, 200, 50))
    assert run == {
        "draft_tokens": 200,
        "accepted_tokens": 50,
        "acceptance_rate": 0.25,
        "mean_accepted_length": 1.5,
    }
    assert measurements.speculation_summary(None) is None


def test_the_summary_names_acceptance_and_speedup():
    report = {"speculation": {"acceptance_rate": 0.25, "mean_accepted_length": 1.5},
              "compare": {"speedup": 1.2}}  # fmt: skip
    summary = reference.summary_metrics(report)
    assert summary["spec_acceptance_rate"] == 0.25
    assert summary["spec_mean_accepted_length"] == 1.5
    assert summary["spec_speedup"] == 1.2


# ---- `arcvllm bench` against the fake server, with a stand-in for vLLM's own bench

VLLM_STAND_IN = """\
import json, sys
from pathlib import Path

if sys.argv[1:] == ["-c", "import vllm"]:
    raise SystemExit(0)
args = dict(zip(sys.argv, sys.argv[1:]))
result = Path(args["--result-dir"]) / args["--result-filename"]
result.write_text(json.dumps({"completed": int(args["--num-prompts"]), "failed": 0}))
"""


@pytest.fixture
def bench_cli(http_server, tmp_path, capsys):
    """run(fake, *args) -> (exit status, stdout, stderr) of `arcvllm bench` against FAKE,
    with a Python that 'carries vLLM': it imports vllm, and its `vllm bench serve` writes
    a result file (the real one is test_emulation_server.py's)."""
    from support.fakeserver import handler

    from arcvllm import cli

    script = tmp_path / "vllm_stand_in.py"
    script.write_text(VLLM_STAND_IN)
    python = tmp_path / "python"
    python.write_text(f'#!/bin/sh\nexec "{sys.executable}" "{script}" "$@"\n')
    python.chmod(0o755)

    def run(fake, *args: str) -> tuple[int, str, str]:
        url = http_server(handler(fake))
        code = cli.main(
            [
                *("bench", "--base-url", url, "--vllm-python", str(python)),
                *("--tokenizer", str(tmp_path), "--out", str(tmp_path / "out"), "--seed", "1"),
                *("--num-prompts", "2", "--runs", "1", "--crossings", "2", *args),
            ]
        )
        out = capsys.readouterr()
        return code, out.out, out.err.replace(url, "URL")

    return run


def test_bench_runs_against_the_only_model_served_and_writes_its_report(bench_cli, tmp_path):
    from support.fakeserver import BLOCK, MAX_LEN, Fake

    code, out, err = bench_cli(Fake())
    assert code == 0, err
    report = json.loads((tmp_path / "out" / session.REPORT_JSON).read_text())
    assert report["model"] == "tiny-hybrid"
    assert (report["block_size"], report["max_model_len"]) == (BLOCK, MAX_LEN)
    assert report["vllm_bench"]["completed"] == 2
    assert report["boundary"]["boundary_positions"] == [BLOCK, 2 * BLOCK]
    assert report["prefix_cache"]["warm_hit_rate"] > 0.9
    assert f"wrote {tmp_path / 'out' / session.REPORT_JSON}" in out


def test_bench_takes_the_block_size_from_the_servers_log_as_smoke_does(bench_cli, tmp_path):
    from support.fakeserver import Fake

    log = tmp_path / "server.log"
    log.write_text("INFO Setting attention block size to 64 tokens to ...\n")
    code, _, err = bench_cli(Fake(block_in_metrics=False), "--log-file", str(log))
    assert code == 0, err
    assert json.loads((tmp_path / "out" / session.REPORT_JSON).read_text())["block_size"] == 64
    code, _, err = bench_cli(Fake(block_in_metrics=False))
    assert code == 3 and err.startswith("arcvllm: cannot determine the server's block size")


def test_bench_with_a_key_the_server_refuses_is_a_usage_error(bench_cli):
    from support.fakeserver import Fake

    code, out, err = bench_cli(Fake(api_key="s3cret"), "--api-key", "wrong")
    assert (code, out) == (2, "")
    assert err == "arcvllm: URL/v1/models answered 401 (wrong --api-key?)\n"


def test_bench_names_a_model_not_served_as_smoke_does(bench_cli):
    from support.fakeserver import Fake

    code, out, err = bench_cli(Fake(), "--model", "qwen")
    assert (code, out) == (2, "")
    assert err == "arcvllm: model 'qwen' is not served at URL; it serves: tiny-hybrid\n"


def test_bench_checks_the_model_against_the_preset_as_smoke_does(bench_cli, tmp_path):
    from support.fakeserver import Fake

    fake = Fake(models=("decoy", "tiny-hybrid"))
    code, _, err = bench_cli(fake, "--preset", "tiny-hybrid-cpu", "--model", "decoy")
    assert code == 2 and err == (
        "arcvllm: --model 'decoy' is not the model of preset 'tiny-hybrid-cpu' ('tiny-hybrid')\n"
    )
    assert fake.asked_for == set() and not (tmp_path / "out" / session.REPORT_JSON).exists()
    code, _, err = bench_cli(fake)
    assert code == 2 and "choose one with --model" in err


def test_bench_without_a_server_is_exit_3(bench_cli, tmp_path, capsys):
    from support.processes import free_port

    from arcvllm import cli

    url = f"http://127.0.0.1:{free_port()}"
    code = cli.main(["bench", "--base-url", url, "--vllm-python", str(tmp_path / "python")])
    err = capsys.readouterr().err
    assert code == 3 and err.startswith(f"arcvllm: cannot reach a vLLM server at {url}: ")
    assert err.count("\n") == 1


def test_bench_refuses_a_plain_url_pair_it_cannot_compare_before_anything_is_written(
    bench_cli, http_server, tmp_path
):
    """Neither fake speculates: the pair is refused naming --base-url (tests/bench/
    test_bench_servers.py refuses a speculating --plain-url with real servers)."""
    from support.fakeserver import Fake, handler

    plain = http_server(handler(Fake()))
    code, out, err = bench_cli(Fake(), "--plain-url", plain)
    assert (code, out) == (2, "")
    assert err.startswith("arcvllm: --base-url URL does not speculate: ") and err.count("\n") == 1
    assert not (tmp_path / "out").exists()
    code, _, err = bench_cli(Fake(), "--plain-url", http_server(handler(Fake(models=("x",)))))
    assert code == 2 and "model 'tiny-hybrid' is not served at" in err
