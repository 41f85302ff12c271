"""`arcvllm bench`: vLLM's own `vllm bench serve`, plus what it does not measure for hybrids.

runner: vLLM's benchmark in a Python that carries vLLM; measurements: block-boundary
inter-token latency and the prefix cache, against the same server; reference: the
headline numbers and their ratios to the preset's reference figures; plot: latency over
position (matplotlib, the 'bench' extra); command: `arcvllm bench` and `bench replot`.
"""

from arcvllm.bench.command import register

__all__ = ["register"]
