"""`arcvllm smoke`: prove a running vLLM server decodes a hybrid model across mamba blocks.
Runs on any host that reaches the server: the operator's host (`make smoke-test`), CI, or
inside the image.

The checks target the path of the original XPU crash: with prefix caching in align mode,
vLLM copies each request's mamba state when its length crosses a block boundary. The smoke
test reads the block size from the server (never assumes it), decodes across two
boundaries, checks the server survives, that a long prompt sent twice hits the prefix
cache and gives the same greedy text, and that 8 concurrent streams crossing boundaries
all complete. It works against any OpenAI-compatible vLLM server; optionally it starts
and stops the server itself (`--start-cmd` / `--stop-cmd`), e.g. a container.

checks: the plan of token positions and the checks; report: the Check rows, the screen
and the JSON; session: a run from the options of `arcvllm smoke`, its report written and
printed (the command is arcvllm.commands.smoke). Talking to the server, and what its log
says, is arcvllm.client's.
"""
