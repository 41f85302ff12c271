"""`arcvllm bench`: vLLM's own `vllm bench serve`, plus what it does not measure for hybrids.
Runs on any host that reaches the server (the operator's host: `make bench`, the field
report), with a Python that carries vLLM for vLLM's own part (the image's, by default).

runner: vLLM's benchmark in a Python that carries vLLM; measurements: block-boundary
inter-token latency and the prefix cache, against the same server; reference: the
headline numbers and their ratios to the preset's reference figures; plot: latency over
position (matplotlib, the 'bench' extra); session: a run, its report and its replot (the
command is arcvllm.commands.bench).
"""
