"""Talking to a running vLLM (OpenAI-compatible) server: the one client every tool uses.

Root URL and auth, health, models, tokenize, metrics, streamed completions timed token
by token, and `wait_until`, the one polling loop of the package and its tests (health
waits included). HTTP goes through httpx, completions through the official openai client;
both are imported lazily, so importing this module costs nothing.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any, TypeVar

from arcvllm.client import metrics as m
from arcvllm.errors import Unavailable

T = TypeVar("T")


class WaitTimeout(Unavailable):
    """What was waited for did not happen in time (the environment's fault: exit 3).

    Its own type: callers of wait_until catch it to tell "not in time" from an error
    the condition itself raised."""


def wait_until(
    condition: Callable[[], T], timeout: float, interval: float = 1.0, what: str = "condition"
) -> T:
    """Call CONDITION until it returns something true, and return that.

    It is called at least once, and once more at the deadline; an exception it raises
    ends the wait at once (e.g. "the server process exited"). After TIMEOUT seconds:
    WaitTimeout("WHAT not within TIMEOUT s").
    """
    deadline = time.monotonic() + timeout
    while True:
        result = condition()
        if result:
            return result
        left = deadline - time.monotonic()
        if left <= 0:
            raise WaitTimeout(f"{what} not within {timeout:g} s")
        time.sleep(min(interval, left))


# How long one request waits out a gateway's 429s (its rate limit: 10 r/s by default).
RATE_LIMIT_WAIT = 60.0


def rate_limited(
    send: Callable[[], T],
    limited: Callable[[Any], bool],
    retry_after: Callable[[Any], str | None],
    raises: type[BaseException] | None = None,
) -> T:
    """SEND until its answer (or, with RAISES, the error it raises) is no rate limit, or
    RATE_LIMIT_WAIT seconds have passed: then the last answer (or error) stands."""
    deadline = time.monotonic() + RATE_LIMIT_WAIT
    pause = 0.25
    answer: T | BaseException
    while True:
        try:
            answer = send()
        except BaseException as error:
            if raises is None or not isinstance(error, raises) or time.monotonic() > deadline:
                raise
            answer = error
        else:
            if not limited(answer) or time.monotonic() > deadline:
                return answer
        after = retry_after(answer)
        wait = float(after) if after and after.replace(".", "", 1).isdigit() else pause
        time.sleep(min(wait, 5.0))
        pause = min(pause * 2, 2.0)


def root_url(base_url: str) -> str:
    """The server's root (where /health and /metrics are): BASE_URL without /v1."""
    url = base_url.rstrip("/")
    return url[: -len("/v1")] if url.endswith("/v1") else url


def token_id(token: str) -> int:
    """The id of a token vLLM names 'token_id:N' (return_tokens_as_token_ids)."""
    return int(token.rpartition(":")[2])


def tops_of(logprobs: Any) -> list[dict[int, float]]:
    """Per token of a completion's LOGPROBS (vLLM's answer to `logprobs=K` with
    return_tokens_as_token_ids, as JSON or the openai client's object): the top K tokens'
    logprobs and the chosen one's, by id."""
    if logprobs is None:
        return []
    get = logprobs.get if isinstance(logprobs, dict) else lambda k: getattr(logprobs, k, None)
    tokens, chosen, tops = get("tokens") or [], get("token_logprobs") or [], get("top_logprobs")
    out = []
    for i, token in enumerate(tokens):
        top = (tops[i] if tops and i < len(tops) else None) or {}
        entry = {token_id(k): float(v) for k, v in top.items()}
        if i < len(chosen) and chosen[i] is not None:
            entry[token_id(token)] = float(chosen[i])
        out.append(entry)
    return out


def auth_headers(api_key: str | None) -> dict[str, str]:
    return {"Authorization": f"Bearer {api_key}"} if api_key else {}


@dataclass(frozen=True)
class Chunk:
    """One streamed chunk that carried tokens: how many, and when (s after the request)."""

    tokens: int
    at: float


@dataclass
class Stream:
    """One streamed completion: its text, token ids, usage, and when each token came.

    `prompt_len` is the length of a token-id prompt as sent (0 for a text prompt);
    `prompt_tokens` and `completion_tokens` are what the server counted (its usage).
    """

    prompt_len: int = 0
    chunks: list[Chunk] = field(default_factory=list)
    text: str = ""
    token_ids: list[int] = field(default_factory=list)
    finish_reason: str | None = None
    prompt_tokens: int = 0
    completion_tokens: int = 0
    # Per output token, when asked (`logprobs=K`): the path's own logprobs of its top K
    # tokens and of the token it chose, by token id.
    top: list[dict[int, float]] = field(default_factory=list)

    @property
    def tokens(self) -> int:
        """Tokens that arrived (counted per chunk)."""
        return sum(c.tokens for c in self.chunks)

    @property
    def ttft(self) -> float:
        """Seconds from the request to the first token; 0.0 if none came."""
        return self.chunks[0].at if self.chunks else 0.0

    def token_gaps(self) -> list[float]:
        """Inter-token latency (s) of every token after the first chunk's.

        A chunk of N tokens (the detokenizer may hold tokens back) spreads the time since
        the previous chunk evenly over its N tokens.
        """
        gaps: list[float] = []
        for before, chunk in zip(self.chunks, self.chunks[1:], strict=False):
            gaps.extend([(chunk.at - before.at) / chunk.tokens] * chunk.tokens)
        return gaps

    def decode_tok_s(self) -> float | None:
        """Tokens received per second of wall time, from the request to the last token;
        None if none came.

        Wall time, not the span between chunks: tokens held back on the way (a proxy's
        buffer, a loaded client) arrive bunched, and the span of their arrival says
        nothing of how fast the server made them. The first token's prefill is inside:
        for decode runs of a short prompt and hundreds of tokens, a few percent.
        """
        if not self.chunks or self.chunks[-1].at <= 0:
            return None
        return self.tokens / self.chunks[-1].at

    def output(self) -> dict[str, Any]:
        """What two greedy runs must agree on: the text and the token ids (if served)."""
        return {"text": self.text, "token_ids": self.token_ids}


@dataclass
class Client:
    """One vLLM server. BASE_URL may end in /v1; METRICS_URLS are the replicas behind a
    router, whose /metrics are summed (the router's own is one replica's)."""

    base_url: str
    api_key: str | None = None
    timeout: float = 300.0
    metrics_urls: tuple[str, ...] = ()
    ca_cert: str | None = None  # PEM file trusted for https (e.g. a self-signed gateway's)

    @property
    def root(self) -> str:
        return root_url(self.base_url)

    def headers(self) -> dict[str, str]:
        return auth_headers(self.api_key)

    @cached_property
    def verify(self) -> Any:
        """httpx's `verify`: the system's CAs, or a context that trusts CA_CERT too."""
        if not self.ca_cert:
            return True
        import ssl

        context = ssl.create_default_context()
        context.load_verify_locations(cafile=self.ca_cert)
        return context

    # ---- plain HTTP

    def request(self, method: str, url: str, json: Any = None, timeout: float | None = None) -> Any:
        """One HTTP request (the httpx response; httpx.HTTPError on no answer). A 429 of a
        gateway's rate limit is waited out, as a polite client does: again after its
        Retry-After (else a growing pause), for up to RATE_LIMIT_WAIT seconds in all."""
        import httpx

        return rate_limited(
            lambda: httpx.request(
                method,
                url,
                json=json,
                headers=self.headers(),
                timeout=timeout or self.timeout,
                verify=self.verify,
            ),
            lambda response: response.status_code == 429,
            lambda response: response.headers.get("Retry-After"),
        )

    def get(self, path: str, timeout: float | None = None):
        """GET ROOT/PATH (the httpx response; raises httpx.HTTPError on no answer)."""
        return self.request("GET", f"{self.root}{path}", timeout=timeout)

    def get_json(self, path: str) -> Any:
        response = self.get(path)
        response.raise_for_status()
        return response.json()

    def healthy(self, timeout: float = 5.0) -> bool:
        """/health answers 200 (any other answer, or none, is False)."""
        import httpx

        try:
            return self.get("/health", timeout=timeout).status_code == 200
        except httpx.HTTPError:
            return False

    def wait_healthy(
        self, timeout: float, interval: float = 1.0, alive: Callable[[], object] | None = None
    ) -> float:
        """Seconds until /health answered 200. ALIVE, if given, is called before each try
        and may raise to stop the wait (e.g. the server's process exited)."""
        start = time.monotonic()

        def ready() -> bool:
            if alive is not None:
                alive()
            return self.healthy(timeout=min(5.0, max(interval, 1.0)))

        wait_until(ready, timeout, interval, f"{self.root}/health 200")
        return time.monotonic() - start

    def models(self) -> list[dict[str, Any]]:
        """The entries of /v1/models (id, max_model_len, ...); which one is served and its
        context length, with the errors an operator gets, are arcvllm.client.discovery's."""
        return list(self.get_json("/v1/models")["data"])

    def tokenize(self, model: str, text: str) -> list[int]:
        """The token ids of TEXT in MODEL's tokenizer, without special tokens: asked of the
        first of METRICS_URLS when given (a gateway serves no /tokenize: the server's own
        root, beside /metrics), else of the root."""

        root = root_url(self.metrics_urls[0]) if self.metrics_urls else self.root
        body = {"model": model, "prompt": text, "add_special_tokens": False}
        response = self.request("POST", f"{root}/tokenize", json=body)
        response.raise_for_status()
        return list(response.json()["tokens"])

    def metrics(self) -> m.Metrics:
        """One scrape of /metrics (of every replica in METRICS_URLS, samples concatenated)."""
        scrapes = []
        for url in self.metrics_urls or (self.root,):
            response = Client(url, self.api_key, self.timeout, ca_cert=self.ca_cert).get("/metrics")
            response.raise_for_status()
            scrapes.append(m.Metrics.parse(response.text))
        return m.Metrics(tuple(sample for one in scrapes for sample in one.samples))

    def prefix_cache_after(
        self, before: m.PrefixCache, model: str | None = None, timeout: float = 5.0
    ) -> m.PrefixCache:
        """Prefix-cache counters once they moved past BEFORE: the engine publishes its
        stats a moment after the response. The last read if they never move."""
        last = before

        def moved() -> bool:
            nonlocal last
            last = m.prefix_cache(self.metrics(), model)
            return last.queries > before.queries

        with contextlib.suppress(WaitTimeout):
            wait_until(moved, timeout, 0.1, "prefix-cache counters")
        return last

    def completion(self, body: dict[str, Any]) -> dict[str, Any]:
        """POST /v1/completions with BODY, not streamed: the server's JSON answer. An
        answer other than 200 raises httpx.HTTPStatusError with the server's message (vLLM
        answers 400 "Out of range float values are not JSON compliant" when a logprob it
        should return is NaN)."""
        import httpx

        response = self.request("POST", f"{self.root}/v1/completions", json=body)
        if response.status_code != 200:
            raise httpx.HTTPStatusError(
                f"{response.status_code}: {response.text[:200]}",
                request=response.request,
                response=response,
            )
        return response.json()

    def prompt_logprobs(
        self, model: str, prompt: Sequence[int], salt: str | None = None, top: int = 1
    ) -> list[dict[int, float] | None]:
        """Per prompt position, the logprobs of the token there and of the model's TOP
        choices (vLLM's `prompt_logprobs`; None for the first position). One prefill, no
        decoding: what the plain model predicts at every position of PROMPT."""
        body: dict[str, Any] = {
            "model": model,
            "prompt": list(prompt),
            "max_tokens": 1,
            "temperature": 0.0,
            "prompt_logprobs": top,
        }
        if salt:
            body["cache_salt"] = salt
        entries = self.completion(body)["choices"][0]["prompt_logprobs"]
        return [
            None if e is None else {int(k): float(v["logprob"]) for k, v in e.items()}
            for e in entries
        ]

    # ---- completions

    @cached_property
    def openai(self):
        """The official openai client for ROOT/v1 (no retries: a fault must show)."""
        import httpx
        from openai import OpenAI

        return OpenAI(
            base_url=f"{self.root}/v1",
            api_key=self.api_key or "EMPTY",
            timeout=self.timeout,
            max_retries=0,
            http_client=httpx.Client(verify=self.verify, timeout=self.timeout),
        )

    def _create(
        self,
        model: str,
        prompt: Sequence[int] | str,
        max_tokens: int,
        extra: dict,
        logprobs: int | None = None,
    ):
        more: dict[str, Any] = {"logprobs": logprobs} if logprobs else {}
        return self.openai.completions.create(
            model=model,
            prompt=prompt if isinstance(prompt, str) else list(prompt),
            max_tokens=max_tokens,
            temperature=0.0,
            stream=True,
            stream_options={"include_usage": True, "continuous_usage_stats": True},
            extra_body=extra,
            **more,
        )

    def batch(
        self,
        model: str,
        prompts: Sequence[Sequence[int]],
        max_tokens: int,
        salt: str,
        logprobs: int | None = None,
    ) -> list[Stream]:
        """PROMPTS in one greedy, ignore_eos completion request (not streamed), one Stream
        per prompt in its order, with its token ids and finish reason and no chunks.

        The server hands a request's prompts to its engine one after the other, in their
        order, without waiting for anything else (separate requests wait for the server to
        read each). Traced on the CPU server: the first prompt in one engine step, the
        other seven in the next. With LOGPROBS=K each Stream has the path's top K."""
        body: dict[str, Any] = {
            "model": model,
            "prompt": [list(p) for p in prompts],
            "max_tokens": max_tokens,
            "temperature": 0.0,
            "ignore_eos": True,
            "return_token_ids": True,
            "cache_salt": salt,
        }
        if logprobs:
            body.update(logprobs=logprobs, return_tokens_as_token_ids=True)
        choices = sorted(self.completion(body)["choices"], key=lambda c: c["index"])
        if len(choices) != len(prompts):
            raise ValueError(f"{len(prompts)} prompts got {len(choices)} completions")
        outs = []
        for p, c in zip(prompts, choices, strict=True):
            ids = list(c.get("token_ids") or [])
            # usage is the request's, not each prompt's: completion_tokens are the ids served
            outs.append(
                Stream(
                    prompt_len=len(p),
                    text=c["text"],
                    token_ids=ids,
                    finish_reason=c["finish_reason"],
                    completion_tokens=len(ids),
                    top=tops_of(c.get("logprobs")),
                )
            )
        return outs

    def stream(
        self,
        model: str,
        prompt: Sequence[int] | str,
        max_tokens: int,
        salt: str | None = None,
        logprobs: int | None = None,
    ) -> Stream:
        """A greedy, ignore_eos completion, streamed and timed chunk by chunk.

        vLLM's `continuous_usage_stats` puts the running completion_tokens in every chunk,
        so a chunk that carries several tokens is counted right (else its token ids, else
        one per chunk with text); `return_token_ids` gives the ids two runs must agree on.
        SALT is a prefix-cache namespace (vLLM's cache_salt); with LOGPROBS=K the Stream
        has the path's top K per token.
        """
        extra: dict[str, Any] = {"ignore_eos": True, "return_token_ids": True}
        if salt:
            extra["cache_salt"] = salt
        if logprobs:
            extra["return_tokens_as_token_ids"] = True
        out = Stream(prompt_len=0 if isinstance(prompt, str) else len(prompt))
        parts: list[str] = []
        start = time.perf_counter()
        import openai

        response = rate_limited(
            lambda: self._create(model, prompt, max_tokens, extra, logprobs),
            lambda error: isinstance(error, openai.RateLimitError),
            lambda error: error.response.headers.get("Retry-After"),
            raises=openai.RateLimitError,
        )
        counted = 0
        for chunk in response:
            at = time.perf_counter() - start
            usage = getattr(chunk, "usage", None)
            if usage is not None:
                out.prompt_tokens = usage.prompt_tokens
                out.completion_tokens = usage.completion_tokens
            if not chunk.choices:
                continue
            choice = chunk.choices[0]
            parts.append(choice.text or "")
            ids = getattr(choice, "token_ids", None)
            out.token_ids.extend(ids or [])
            out.top.extend(tops_of(getattr(choice, "logprobs", None)))
            out.finish_reason = choice.finish_reason or out.finish_reason
            if usage is not None:
                n = usage.completion_tokens - counted
            elif ids is not None:
                n = len(ids)
            else:
                n = 1 if choice.text else 0
            if n > 0:
                counted += n
                out.chunks.append(Chunk(n, at))
        out.text = "".join(parts)
        return out
