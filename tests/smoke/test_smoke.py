"""`arcvllm smoke` without vLLM: its pure parts, and a fake server that can be broken.

The fake speaks just enough of vLLM's HTTP API (health, models, metrics, tokenize,
streamed completions with usage and token ids). Each check of the smoke test gets a
sibling here that shows it failing on a target broken in exactly that way; the real
servers (and the real crash) are in test_emulation_server.py.
"""

from __future__ import annotations

import json

import pytest
from support.fakeserver import BLOCK, Fake, handler
from support.processes import free_port

from arcvllm import cli
from arcvllm.client import log as serverlog
from arcvllm.client.report import Check, render_checks
from arcvllm.errors import ArcvllmError
from arcvllm.smoke import checks as S


@pytest.fixture
def serve(http_server):
    def start(fake: Fake, hits_in_metrics: bool = True) -> str:
        return http_server(handler(fake, hits_in_metrics))

    return start


def run_cli(capsys, *args: str) -> tuple[int, str, str]:
    code = cli.main(["smoke", *args])
    out = capsys.readouterr()
    return code, out.out, out.err


# ---------------------------------------------------------------- the fake, healthy and broken


def test_a_healthy_server_passes(serve, capsys, tmp_path):
    url = serve(Fake())
    report = tmp_path / "r.json"
    code, out, _ = run_cli(capsys, "--base-url", url, "--out", str(report))
    assert code == 0, out
    # The block size is what the checks are planned from: shown, not counted as passed.
    assert "smoke: PASS (5 checks)" in out
    assert next(line for line in out.splitlines() if line.startswith("block size")).endswith("INFO")
    data = json.loads(report.read_text())
    assert data["verdict"] == "pass"
    assert data["server"]["block_size"] == BLOCK
    assert data["checks"][0]["ok"] is None
    # The server's evidence of the crossing: both blocks the decode filled are cached.
    assert data["measurements"]["boundary_resend_hit_tokens"] == 2 * BLOCK
    assert [c["name"] for c in data["checks"]] == [
        "block size",
        "boundary decode",
        "healthy after crossing",
        "prefix cache hits",
        "prefix cache text",
        "concurrent streams",
    ]
    assert {"time_to_verdict_s", "ttft_cold_ms", "ttft_warm_ms", "itl_median_ms"} <= set(
        data["measurements"]
    )


@pytest.mark.parametrize(
    ("fault", "failing"),
    [
        # Every decode that crosses a boundary: the boundary decode and the 8 streams.
        ("short", ["boundary decode", "concurrent streams"]),
        # The decode completes but the blocks it filled are not kept: only the re-send shows.
        ("lost_state", ["boundary decode"]),
        # Dead after the boundary decode: everything after it.
        (
            "dies",
            [
                "healthy after crossing",
                "prefix cache hits",
                "prefix cache text",
                "concurrent streams",
                "healthy at the end",
            ],
        ),
        # No prefix-cache hit at all: nor for the re-sent decode.
        ("no_hits", ["boundary decode", "prefix cache hits"]),
        ("differs", ["prefix cache text"]),
        # Fluent, finite, wrong: one decoded token in 50 is not the plain model's choice.
        ("not_greedy", ["boundary decode"]),
        ("stream_error", ["concurrent streams"]),
    ],
)
def test_each_check_fails_on_a_server_broken_that_way(serve, capsys, tmp_path, fault, failing):
    log = tmp_path / "server.log"
    log.write_text("\n".join(f"line {i}" for i in range(80)) + "\n")
    report = tmp_path / "r.json"
    url = serve(Fake({fault}))
    code, out, _ = run_cli(capsys, "--base-url", url, "--log-file", str(log), "--out", str(report))
    assert code == 1
    assert json.loads(report.read_text())["failed"] == failing
    assert f"smoke: FAIL: {', '.join(failing)}\n" in out
    assert "--- last 50 lines of the server log ---" in out
    assert "line 79" in out and "line 29\n" not in out and "line 30" in out


def test_without_decode_checkpoints_the_boundary_decode_says_it_has_no_server_evidence(
    serve, capsys, tmp_path
):
    # vLLM's default retention (0) keeps no decode checkpoints: a lost state cannot show.
    report = tmp_path / "r.json"
    url = serve(Fake({"lost_state"}, retention="0"))
    code, out, _ = run_cli(capsys, "--base-url", url, "--out", str(report))
    assert code == 0, out
    data = json.loads(report.read_text())
    decode = next(c for c in data["checks"] if c["name"] == "boundary decode")
    assert decode["seen"].endswith("no server evidence (it keeps no decode checkpoints)")
    assert "boundary_resend_hit_tokens" not in data["measurements"]


@pytest.mark.parametrize(
    ("interval", "tokens"), [("None", 256), ("0", 0), ("128", 256), ("384", 0), (None, 0)]
)
def test_decode_checkpoint_tokens(interval, tokens):
    labels = {} if interval is None else {"prefix_cache_retention_interval": interval}
    assert S.decode_checkpoint_tokens(labels, 128) == tokens


def test_a_crash_in_the_log_is_named(serve, capsys, tmp_path):
    log = tmp_path / "server.log"
    log.write_text(CRASH_LOG)
    code, out, _ = run_cli(capsys, "--base-url", serve(Fake({"dies"})), "--log-cmd", f"cat {log}")
    assert code == 1
    assert "server crashed: OverflowError: Python int too large to convert to C long" in out


# ---------------------------------------------------------------- bad input: one line


def test_unreachable_server_is_one_line(capsys):
    code, out, err = run_cli(capsys, "--base-url", f"http://127.0.0.1:{free_port()}")
    assert code == 3
    assert err.startswith("arcvllm: no vLLM server answers") and err.count("\n") == 1
    assert out == ""


def test_wrong_model_is_one_line(serve, capsys):
    code, _, err = run_cli(capsys, "--base-url", serve(Fake()), "--model", "qwen")
    assert code == 2
    assert err.startswith("arcvllm: model 'qwen' is not served at http://127.0.0.1:")
    assert "is not served" in err and err.count("\n") == 1


def test_a_key_the_server_refuses_is_one_line_exit_2(serve, capsys):
    url = serve(Fake(api_key="s3cret"))
    code, out, err = run_cli(capsys, "--base-url", url, "--api-key", "wrong")
    assert (code, out) == (2, "")
    assert err == f"arcvllm: {url}/v1/models answered 401 (wrong --api-key?)\n"
    code, out, _ = run_cli(capsys, "--base-url", url, "--api-key", "s3cret")
    assert code == 0, out


def test_undeterminable_block_size_is_one_line(serve, capsys, tmp_path):
    log = tmp_path / "server.log"
    log.write_text("INFO nothing about blocks\n")
    url = serve(Fake(block_in_metrics=False))
    code, _, err = run_cli(capsys, "--base-url", url, "--log-file", str(log))
    assert code == 3
    assert "cannot determine the server's block size" in err and err.count("\n") == 1


def test_block_size_falls_back_to_the_log(serve, capsys, tmp_path):
    log = tmp_path / "server.log"
    log.write_text("(EngineCore pid=1) INFO Setting attention block size to 64 tokens to ...\n")
    url = serve(Fake(block_in_metrics=False))
    code, out, _ = run_cli(capsys, "--base-url", url, "--log-file", str(log))
    assert code == 0, out
    assert "64 (from server log)" in out


def test_start_cmd_timeout_fails_and_shows_the_log(capsys, tmp_path):
    log = tmp_path / "server.log"
    log.write_text("starting...\nstill starting\n")
    stopped = tmp_path / "stopped"
    code, out, _ = run_cli(
        capsys,
        *("--base-url", f"http://127.0.0.1:{free_port()}"),
        *("--start-cmd", "true", "--stop-cmd", f"touch {stopped}"),
        *("--health-timeout", "2", "--log-file", str(log)),
    )
    assert code == 1
    assert "smoke: FAIL: server start" in out and "still starting" in out
    assert stopped.exists()


def test_start_cmd_is_run_and_stopped(serve, capsys, tmp_path):
    url = serve(Fake())
    started, stopped = tmp_path / "started", tmp_path / "stopped"
    code, out, _ = run_cli(
        capsys,
        *("--base-url", url, "--start-cmd", f"touch {started}", "--stop-cmd", f"touch {stopped}"),
    )
    assert code == 0, out
    assert started.exists() and stopped.exists()
    assert "startup_to_healthy_s=" in out


# ---------------------------------------------------------------- pure parts


def test_plan_for_the_tiny_model():
    p = S.plan_checks(128, 2048)
    assert (p.decode_prompt, p.decode_tokens) == (120, 152)
    assert S.boundary_tokens(p.decode_prompt, p.decode_tokens, 128) == [9, 137]
    assert (p.prefix_blocks, p.prefix_prompt, p.prefix_expected_hits) == (12, 1537, 1382)


def test_plan_for_the_production_block_on_xpu():
    p = S.plan_checks(2112, 262144)
    assert p.decode_prompt + p.decode_tokens > 2 * 2112
    assert len(S.boundary_tokens(p.decode_prompt, p.decode_tokens, 2112)) == 2
    assert p.prefix_blocks == 7 and p.prefix_prompt == 7 * 2112 + 1


@pytest.mark.parametrize(("block", "max_len"), [(128, 200), (1024, 2048), (8, 4096)])
def test_plan_refuses_what_cannot_cross_two_boundaries(block, max_len):
    with pytest.raises(ArcvllmError):
        S.plan_checks(block, max_len)


@pytest.mark.parametrize(
    ("lines", "expected"),
    [
        (["INFO [interface.py:1120] Setting attention block size to 96 tokens to ensure"], 96),
        (["INFO [kv_cache_utils.py:853] kv cache group sizes (128, 128)"], 128),
        (["kv cache group sizes (128, 64)"], None),
        (
            [
                "Setting attention block size to 96 tokens",
                "Setting attention block size to 2112 tokens",
            ],
            2112,
        ),
        ([], None),
    ],
)
def test_block_size_from_log(lines, expected):
    assert serverlog.block_size_from_log(lines) == expected


_CORE = "(EngineCore pid=10) ERROR 11-30 16:30:01 [core.py:1131] "
_API = "(APIServer pid=9) ERROR 11-30 16:30:01 [async_llm.py:700] "
CRASH_LOG = "\n".join(
    [
        _CORE + "EngineCore encountered a fatal error.",
        _CORE + "Traceback (most recent call last):",
        _CORE + '  File "vllm/v1/worker/mamba_utils.py", line 1378, in collect_mamba_copy_meta',
        _CORE + "    src_ptrs_np[offset] = copy_spec.start_addr",
        _CORE + "OverflowError: Python int too large to convert to C long",
        _CORE + "Traceback (most recent call last):",
        _CORE + "RuntimeError: Worker failed with error 'Python int too large to convert to C "
        "long', please check the stack trace above for the root cause",
        _API + "AsyncLLM output_handler failed.",
        _API + "Traceback (most recent call last):",
        _API + "vllm.v1.engine.exceptions.EngineDeadError: EngineCore encountered an issue.",
    ]
)


def test_find_crash_names_the_root_cause_not_the_echo():
    assert serverlog.find_crash(CRASH_LOG.splitlines()) == (
        "OverflowError: Python int too large to convert to C long"
    )


def test_find_crash_plain_traceback():
    lines = ["Traceback (most recent call last):", '  File "x.py"', "ValueError: bad"]
    assert serverlog.find_crash(lines) == "ValueError: bad"


def test_find_crash_none_in_a_clean_log():
    assert serverlog.find_crash(["INFO ok", "ERROR: not an exception line"]) is None


def test_table_fits_one_screen():
    checks = [Check("boundary decode", "x" * 200, "y" * 200, False), Check("b", "e", "s", True)]
    table = render_checks(checks, width=100)
    assert all(len(line) <= 100 for line in table.splitlines())
    assert table.splitlines()[2].endswith("FAIL") and table.splitlines()[3].endswith("PASS")


def test_preset_names_the_model(serve, capsys, tmp_path):
    # Two models served, the preset's listed second: only the preset can pick it.
    fake = Fake(models=("decoy", "tiny-hybrid"))
    url = serve(fake)
    code, _, err = run_cli(capsys, "--base-url", url)
    assert code == 2 and "choose one with --model" in err
    report = tmp_path / "r.json"
    code, out, _ = run_cli(
        capsys, "--base-url", url, "--preset", "tiny-hybrid-cpu", "--out", str(report)
    )
    assert code == 0, out
    assert json.loads(report.read_text())["server"]["model"] == "tiny-hybrid"
    assert fake.asked_for == {"tiny-hybrid"}


def test_unknown_preset_is_one_line_and_starts_nothing(capsys, tmp_path):
    started = tmp_path / "started"
    code, out, err = run_cli(
        capsys,
        *("--base-url", f"http://127.0.0.1:{free_port()}", "--preset", "nope"),
        *("--start-cmd", f"touch {started}"),
    )
    assert code == 2 and out == ""
    assert err.startswith("arcvllm: unknown preset 'nope'") and err.count("\n") == 1
    assert not started.exists()


def test_model_and_preset_must_agree(capsys):
    code, _, err = run_cli(
        capsys, "--base-url", "http://127.0.0.1:1", "--preset", "tiny-hybrid-cpu", "--model", "x"
    )
    assert code == 2 and "is not the model of preset 'tiny-hybrid-cpu'" in err


def test_failing_start_cmd_is_one_line_and_still_stopped(capsys, tmp_path):
    stopped = tmp_path / "stopped"
    code, _, err = run_cli(
        capsys,
        *("--base-url", f"http://127.0.0.1:{free_port()}"),
        *("--start-cmd", "exit 3", "--stop-cmd", f"touch {stopped}"),
    )
    assert code == 3 and err == "arcvllm: --start-cmd failed with exit code 3\n"
    assert stopped.exists()


def test_behind_a_router_the_replicas_metrics_are_summed(serve, capsys, tmp_path):
    """The router's /metrics is one replica's; --metrics-url reads every replica's.

    The "router" serves the completions, but its /metrics shows no prefix-cache hit; the
    replica behind it (the same engine, served again) does. Only the summed metrics make
    the prefix-cache checks pass.
    """
    fake = Fake()
    router_url, replica_url = serve(fake, hits_in_metrics=False), serve(fake)
    code, out, _ = run_cli(capsys, "--base-url", router_url)
    assert code == 1 and "smoke: FAIL: boundary decode, prefix cache hits\n" in out
    code, out, _ = run_cli(
        capsys, "--base-url", router_url, "--metrics-url", router_url, "--metrics-url", replica_url
    )
    assert code == 0, out


def test_json_prints_the_report_and_the_exit_status_is_the_verdict(serve, capsys):
    code, out, _ = run_cli(capsys, "--base-url", serve(Fake({"differs"})), "--json")
    data = json.loads(out)
    assert code == 1 and data["verdict"] == "fail" and data["failed"] == ["prefix cache text"]


@pytest.mark.parametrize("url", ["localhost:8000", "ftp://h/", "http://"])
def test_a_bad_url_is_a_usage_error(capsys, url):
    with pytest.raises(SystemExit) as done:
        cli.main(["smoke", "--base-url", url])
    assert done.value.code == 2
    assert "not an http(s) URL" in capsys.readouterr().err


# ---------------------------------------------------------------- speculative decoding


def test_with_eagle_or_mtp_speculation_the_prefix_repeat_hits_one_block_less():
    assert S.expected_prefix_hits(7, 256, speculative=False) == int(0.9 * 7 * 256)
    assert S.expected_prefix_hits(7, 256, speculative=True) == int(0.9 * 6 * 256)


def test_a_speculative_server_gets_the_greedy_check_and_its_acceptance(serve, capsys, tmp_path):
    report = tmp_path / "r.json"
    code, out, _ = run_cli(
        capsys, "--base-url", serve(Fake(speculative=True)), "--out", str(report)
    )
    assert code == 0, out
    data = json.loads(report.read_text())
    names = [c["name"] for c in data["checks"]]
    assert names[-2:] == ["speculative == plain", "speculation"]
    plan = data["server"]["plan"]
    assert data["outputs"]["greedy_check"]["tokens"] == 9 * plan["decode_tokens"]
    assert data["measurements"]["spec_acceptance_rate"] == 0.25
    assert data["measurements"]["spec_mean_accepted_length"] == 1.5
    assert data["server"]["speculative"] is True


def test_a_speculative_server_off_the_plain_greedy_choice_fails_the_token_checks(
    serve, capsys, tmp_path
):
    report = tmp_path / "r.json"
    url = serve(Fake({"not_greedy"}, speculative=True))
    code, out, _ = run_cli(capsys, "--base-url", url, "--out", str(report))
    assert code == 1, out
    data = json.loads(report.read_text())
    # The boundary decode checks its own tokens; the speculation row checks every sequence.
    assert data["failed"] == ["boundary decode", "speculative == plain"]
    name, index, gap = data["outputs"]["greedy_check"]["misses"][0]
    assert (name, index, round(gap, 2)) == ("decode", 7, 2.0)


def test_a_plain_server_gets_no_speculation_rows(serve, capsys, tmp_path):
    report = tmp_path / "r.json"
    code, out, _ = run_cli(capsys, "--base-url", serve(Fake()), "--out", str(report))
    assert code == 0, out
    assert "speculative == plain" not in out and "greedy_check" not in report.read_text()


def test_a_plain_server_checked_as_a_speculative_preset_fails_the_speculation_row(
    serve, capsys, tmp_path
):
    # E.g. an image whose compose service starts its default preset, not the MTP one.
    report = tmp_path / "r.json"
    url = serve(Fake())
    code, out, _ = run_cli(
        capsys, "--base-url", url, "--preset", "tiny-hybrid-cpu-mtp", "--out", str(report)
    )
    assert code == 1, out
    assert json.loads(report.read_text())["failed"] == ["speculation"]
    assert "the server does not speculate" in out
