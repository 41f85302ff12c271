"""`arcvllm verify`: is a running server's output right? Runs on any host that reaches the
server: the operator's host before a deployment takes traffic (`make verify`), CI, or
inside the image.

Each row drives one path that touches a hybrid model's recurrent (mamba) state, and
judges what comes back by the model itself: decode across block boundaries (plain or
speculative), a prompt prefilled in chunks, a cached prefix resumed and extended, batches
that mix prefill and decode, preemption and recompute, a request run to max-model-len,
prompts of every length mod 64, and sampled answers to open prompts (degeneration).

plan: what each row sends, from the server's geometry, and the pure judgements; suite: the
rows against one server; session: a run from the options of `arcvllm verify` (the command
is arcvllm.commands.verify). The oracle and the report are arcvllm.client's.
"""
