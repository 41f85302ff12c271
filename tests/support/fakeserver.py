"""A fake OpenAI-compatible vLLM server in this process, for the smoke test and bench."""

from __future__ import annotations

import json
import threading

from support.httpd import QuietHandler

BLOCK = 64


MAX_LEN = 1024


class Fake:
    """State and faults of one fake server."""

    def __init__(
        self,
        faults: set[str] = frozenset(),
        block_in_metrics: bool = True,
        models: tuple[str, ...] = ("tiny-hybrid",),
        retention: str = "None",
        speculative: bool = False,
        api_key: str | None = None,
        max_model_len: int | None = MAX_LEN,
    ) -> None:
        self.max_model_len = max_model_len  # None: /v1/models does not say it
        self.api_key = api_key  # as `vllm serve --api-key`: /v1 and /tokenize need it
        self.speculative = speculative  # vllm:spec_decode_* counters, prompt_logprobs
        self.generated: dict[tuple[int, ...], int] = {}  # decoded sequence -> prompt length
        self.retention = retention  # prefix_cache_retention_interval: "None" keeps every block
        self.faults = set(faults)
        self.block_in_metrics = block_in_metrics
        self.models = models
        self.asked_for: set[str] = set()  # the model named by each tokenize/completion
        self.hits = 0
        self.queries = 0
        self.seen: set[tuple[int, ...]] = set()
        self.cached: set[tuple[int, ...]] = set()  # token prefixes of whole cached blocks
        self.completions = 0
        self.lock = threading.Lock()

    def metrics(self, hits: bool = True) -> str:
        lines = [
            "# TYPE vllm:prefix_cache_hits_total counter",
            'vllm:prefix_cache_hits_total{engine="0",model_name="tiny-hybrid"} '
            f"{self.hits if hits else 0}",
            "# TYPE vllm:prefix_cache_queries_total counter",
            f'vllm:prefix_cache_queries_total{{model_name="tiny-hybrid"}} {self.queries}',
        ]
        if self.speculative:
            n = self.completions
            lines += [
                "# TYPE vllm:spec_decode_num_drafts counter",
                f'vllm:spec_decode_num_drafts_total{{model_name="tiny-hybrid"}} {100 * n}',
                "# TYPE vllm:spec_decode_num_draft_tokens counter",
                f'vllm:spec_decode_num_draft_tokens_total{{model_name="tiny-hybrid"}} {200 * n}',
                "# TYPE vllm:spec_decode_num_accepted_tokens counter",
                f'vllm:spec_decode_num_accepted_tokens_total{{model_name="tiny-hybrid"}} {50 * n}',
            ]
        if self.block_in_metrics:
            lines += [
                "# TYPE vllm:cache_config_info gauge",
                "vllm:cache_config_info{"
                f'effective_attention_block_size="{BLOCK}",'
                f'prefix_cache_retention_interval="{self.retention}"}} 1.0',
            ]
        return "\n".join(lines) + "\n"

    def complete(self, prompt: list[int], max_tokens: int) -> list[int] | None:
        """Like vLLM with prefix caching: whole blocks of a sequence are cached once
        computed, prompt and decode alike, and a prompt hits its longest cached prefix of
        whole blocks (never its last token)."""
        key = tuple(prompt)
        with self.lock:
            self.completions += 1
            again = key in self.seen
            self.seen.add(key)
            self.queries += len(prompt)
            hit = 0
            while (hit + 1) * BLOCK <= len(prompt) - 1 and key[: (hit + 1) * BLOCK] in self.cached:
                hit += 1
            if "no_hits" not in self.faults:
                self.hits += hit * BLOCK
        if "stream_error" in self.faults and BLOCK - 16 < len(prompt) < BLOCK - 8:
            return None
        # "short": a decode that crosses a block boundary stops one token early.
        crosses = len(prompt) // BLOCK != (len(prompt) + max_tokens - 1) // BLOCK
        n = max_tokens - 1 if "short" in self.faults and crosses else max_tokens
        salt = 7 if again and "differs" in self.faults else 0
        ids = [(sum(prompt) + i * 31 + salt) % 500 for i in range(n)]
        # The blocks a decode fills are kept only with dense retention, and not at all
        # under "lost_state" (their state was not copied across the boundary).
        sequence = key + tuple(ids)
        with self.lock:
            self.generated[sequence] = len(prompt)
        dense = self.retention == "None" and "lost_state" not in self.faults
        computed = len(sequence) - 1 if dense else len(prompt)
        with self.lock:
            self.cached.update(sequence[: k * BLOCK] for k in range(1, computed // BLOCK + 1))
        return ids

    def prompt_logprobs(self, sequence: list[int]) -> list[dict[str, dict] | None]:
        """The plain model's view of SEQUENCE: its decoded tokens are the top ones, or
        (fault "not_greedy") one token in 50 is off by 2 nats, as a corrupted state is."""
        start = self.generated.get(tuple(sequence), len(sequence))
        out: list[dict[str, dict] | None] = [None]
        for j in range(1, len(sequence)):
            token = sequence[j]
            entry = {str(token): {"logprob": -1.0 if j < start else -0.1}}
            if j >= start and "not_greedy" in self.faults and (j - start) % 50 == 7:
                entry = {str(token): {"logprob": -2.1}, str(token + 1): {"logprob": -0.1}}
            out.append(entry)
        return out

    def healthy(self) -> bool:
        # "dies": after the boundary decode and its re-send, the first two requests.
        return not ("dies" in self.faults and self.completions > 1)


def handler(fake: Fake, hits_in_metrics: bool = True):
    class Handler(QuietHandler):
        def refused(self) -> bool:
            """Without the fake's API key, /v1 and /tokenize answer 401, as vLLM does."""
            if fake.api_key is None or not self.path.startswith(("/v1", "/tokenize")):
                return False
            if self.headers.get("Authorization") == f"Bearer {fake.api_key}":
                return False
            self.send(401, json.dumps({"error": "Unauthorized"}))
            return True

        def do_GET(self):
            if self.refused():
                return
            if self.path == "/health":
                self.send(200 if fake.healthy() else 503, "")
            elif self.path == "/v1/models":
                models = [
                    {"id": name, "object": "model", "max_model_len": fake.max_model_len}
                    for name in fake.models
                ]
                self.send(200, json.dumps({"object": "list", "data": models}))
            elif self.path == "/metrics":
                self.send(200, fake.metrics(hits_in_metrics), "text/plain; version=0.0.4")
            else:
                self.send(404, "{}")

        def do_POST(self):
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            if self.refused():
                return
            fake.asked_for.add(body.get("model"))
            if self.path == "/tokenize":
                words = body["prompt"].split()
                self.send(200, json.dumps({"tokens": [len(w) * 13 % 500 for w in words]}))
                return
            if self.path != "/v1/completions" or not fake.healthy():
                self.send(500, json.dumps({"error": {"message": "engine dead"}}))
                return
            if body.get("prompt_logprobs"):
                entries = fake.prompt_logprobs(body["prompt"])
                self.send(200, json.dumps({"choices": [{"prompt_logprobs": entries}]}))
                return
            ids = fake.complete(body["prompt"], body["max_tokens"])
            if ids is None:
                self.send(500, json.dumps({"error": {"message": "boom"}}))
                return
            self.start_events()
            base = {"id": "c", "object": "text_completion", "created": 0, "model": "tiny-hybrid"}
            for i in ids:
                choice = {"index": 0, "text": f"t{i} ", "finish_reason": None, "token_ids": [i]}
                self.event({**base, "choices": [choice]})
            usage = {
                "prompt_tokens": len(body["prompt"]),
                "completion_tokens": len(ids),
                "total_tokens": len(body["prompt"]) + len(ids),
            }
            self.event({**base, "choices": [], "usage": usage})
            self.event("[DONE]")

    return Handler
