"""`python -m arcvllm.bench ARGS`: vLLM's `bench serve` (what runner.run_vllm_bench runs)."""

import sys

from arcvllm.bench.runner import vllm_bench_serve

vllm_bench_serve(sys.argv[1:])
