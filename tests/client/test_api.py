"""arcvllm.client.api against a real HTTP server in this process, speaking vLLM's shapes.

The server answers what vLLM 0.32 answers (health, models with max_model_len, tokenize,
metrics, streamed completions with continuous usage and token ids) and refuses a request
without its API key, as `vllm serve --api-key` does for /v1 and /tokenize.
"""

from __future__ import annotations

import json
import threading
import time

import httpx
import pytest
from support.httpd import QuietHandler
from support.processes import free_port

from arcvllm.client import metrics as m
from arcvllm.client.api import (
    Chunk,
    Client,
    Stream,
    WaitTimeout,
    root_url,
    tops_of,
    wait_until,
)
from arcvllm.errors import ArcvllmError

KEY = "s3cret"
METRICS = """\
# TYPE vllm:prefix_cache_hits_total counter
vllm:prefix_cache_hits_total{{engine="0",model_name="tiny-hybrid"}} {hits}
# TYPE vllm:prefix_cache_queries_total counter
vllm:prefix_cache_queries_total{{engine="0",model_name="tiny-hybrid"}} {queries}
# TYPE vllm:cache_config_info gauge
vllm:cache_config_info{{effective_attention_block_size="64"}} 1.0
"""


class Server:
    """Chunks of 1, 1, 3, 1 ... tokens (a held-back chunk of three), usage in each chunk."""

    def __init__(self, continuous_usage: bool = True, hits: int = 10) -> None:
        self.continuous_usage = continuous_usage
        self.hits = hits
        self.queries = 100
        self.health_after = 0.0  # /health answers 503 until this monotonic time
        self.bodies: list[dict] = []
        self.limited = 0  # answer this many more requests 429, as a gateway's rate limit
        self.drop_choices = 0  # a batch's answer leaves out this many of its choices

    def handler(self):
        fake = self

        class Handler(QuietHandler):
            def authorized(self) -> bool:
                if self.headers.get("Authorization") == f"Bearer {KEY}":
                    return True
                self.send(401, json.dumps({"error": "Unauthorized"}))
                return False

            def do_GET(self):
                if self.path == "/health":
                    self.send(200 if time.monotonic() >= fake.health_after else 503, "")
                elif self.path == "/metrics":
                    text = METRICS.format(hits=fake.hits, queries=fake.queries)
                    self.send(200, text, "text/plain; version=0.0.4")
                elif self.path == "/v1/models" and self.authorized():
                    data = [{"id": "tiny-hybrid", "object": "model", "max_model_len": 2048}]
                    self.send(200, json.dumps({"object": "list", "data": data}))

            def do_POST(self):
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                fake.bodies.append(body)
                if fake.limited > 0:
                    fake.limited -= 1
                    self.send_response(429)
                    self.send_header("Retry-After", "0.1")
                    self.send_header("Content-Length", "2")
                    self.end_headers()
                    self.wfile.write(b"{}")
                    return
                if not self.authorized():
                    return
                if self.path == "/tokenize":
                    self.send(200, json.dumps({"tokens": [len(w) for w in body["prompt"].split()]}))
                    return
                fake.queries += len(body["prompt"])
                if not body.get("stream"):
                    self.answer(body)
                    return
                self.start_events()
                base = {"id": "c", "object": "text_completion", "created": 0, "model": "m"}
                sizes = [1, 1, 3] + [1] * (body["max_tokens"] - 5)
                done, prompt = 0, len(body["prompt"])
                for i, n in enumerate(sizes):
                    ids = list(range(done, done + n))
                    done += n
                    last = i == len(sizes) - 1
                    choice = {
                        "index": 0,
                        "text": "".join(f"<{t}>" for t in ids),
                        "finish_reason": "length" if last else None,
                        "token_ids": ids,
                    }
                    chunk = {**base, "choices": [choice]}
                    if fake.continuous_usage:
                        chunk["usage"] = {
                            "prompt_tokens": prompt,
                            "completion_tokens": done,
                            "total_tokens": prompt + done,
                        }
                    self.event(chunk)
                    time.sleep(0.02 * n)
                usage = {"prompt_tokens": prompt, "completion_tokens": done}
                usage["total_tokens"] = prompt + done
                self.event({**base, "choices": [], "usage": usage})
                self.event("[DONE]")

            def answer(self, body):
                """A batch of token-id prompts, not streamed: choices out of order, each
                prompt's tokens counting on from its length (the last dropped if asked)."""
                n = body["max_tokens"]
                choices = [
                    {
                        "index": i,
                        "text": "",
                        "finish_reason": "length",
                        "token_ids": list(range(len(p), len(p) + n)),
                    }
                    for i, p in enumerate(body["prompt"])
                ][::-1][: len(body["prompt"]) - fake.drop_choices]
                self.send(200, json.dumps({"id": "c", "choices": choices}))

        return Handler


@pytest.fixture
def serve(http_server):
    return lambda fake: http_server(fake.handler())


# ---- wait_until: the one polling loop


def test_wait_until_returns_what_the_condition_returned():
    calls = iter([None, 0, "ready"])
    assert wait_until(lambda: next(calls), 5, 0.01, "x") == "ready"


def test_wait_until_times_out_with_what_it_waited_for():
    calls = []
    start = time.monotonic()
    with pytest.raises(WaitTimeout, match=r"^the flag not within 0.2 s$") as raised:
        wait_until(lambda: calls.append(1), 0.2, 0.05, "the flag")
    assert 0.2 <= time.monotonic() - start < 1.0
    assert len(calls) >= 3  # it kept asking, and asked once more at the deadline
    assert raised.value.exit_code == 3 and isinstance(raised.value, ArcvllmError)


def test_wait_until_stops_at_once_when_the_condition_raises():
    def exited():
        raise RuntimeError("process exited")

    start = time.monotonic()
    with pytest.raises(RuntimeError, match="process exited"):
        wait_until(exited, 30, 1, "x")
    assert time.monotonic() - start < 1


# ---- the HTTP side


def test_root_url_strips_v1():
    assert root_url("http://h:8000/v1/") == "http://h:8000"
    assert root_url("http://h:8000/") == "http://h:8000"
    assert Client("http://h:8000/v1").root == "http://h:8000"


def test_health_waits_until_200_and_says_how_long(serve):
    fake = Server()
    fake.health_after = time.monotonic() + 60
    client = Client(serve(fake), KEY)
    assert not client.healthy()
    fake.health_after = time.monotonic() + 0.3
    took = client.wait_healthy(5, interval=0.05)
    assert 0.2 <= took < 3 and client.healthy()


def test_health_of_no_server_is_false_and_the_wait_times_out():
    client = Client(f"http://127.0.0.1:{free_port()}")
    assert client.healthy() is False
    with pytest.raises(WaitTimeout, match=r"/health 200 not within 0.3 s"):
        client.wait_healthy(0.3, interval=0.1)


def test_wait_healthy_stops_when_the_process_is_gone():
    def alive():
        raise ArcvllmError("server exited with 1")

    with pytest.raises(ArcvllmError, match="exited with 1"):
        Client(f"http://127.0.0.1:{free_port()}").wait_healthy(30, alive=alive)


def test_the_api_key_goes_with_every_request(serve):
    url = serve(Server())
    assert Client(url, KEY).models()[0]["max_model_len"] == 2048
    assert Client(url, KEY).tokenize("tiny-hybrid", "a bb ccc") == [1, 2, 3]
    with pytest.raises(httpx.HTTPStatusError):
        Client(url, "wrong").models()
    with pytest.raises(httpx.HTTPStatusError):
        Client(url, None).tokenize("tiny-hybrid", "a")


def test_behind_a_gateway_tokenize_asks_the_servers_own_root(serve):
    # A gateway serves neither /tokenize nor /metrics: both go to the server behind it.
    server = serve(Server())
    client = Client("http://gateway.invalid:1", KEY, metrics_urls=(server,))
    assert client.tokenize("tiny-hybrid", "a bb ccc") == [1, 2, 3]
    with pytest.raises(httpx.HTTPError):
        Client("http://gateway.invalid:1", KEY, timeout=2).tokenize("tiny-hybrid", "a")


def test_metrics_are_parsed_and_summed_over_replicas(serve):
    one, two = serve(Server(hits=10)), serve(Server(hits=5))
    assert m.block_size(Client(one).metrics()) == 64
    both = Client("http://router.invalid:1", metrics_urls=(one, two)).metrics()
    assert m.prefix_cache(both) == m.PrefixCache(15.0, 200.0)


def test_prefix_cache_after_waits_for_the_counters_to_move(serve):
    fake = Server()
    client = Client(serve(fake), KEY)
    before = m.prefix_cache(client.metrics())
    threading.Timer(0.3, lambda: setattr(fake, "queries", fake.queries + 7)).start()
    after = client.prefix_cache_after(before, timeout=5)
    assert after.queries == before.queries + 7
    # Counters that never move: the last read, after the timeout.
    start = time.monotonic()
    assert client.prefix_cache_after(after, timeout=0.3) == after
    assert time.monotonic() - start >= 0.3


# ---- streams


@pytest.mark.parametrize("continuous_usage", [True, False])
def test_a_stream_counts_every_token_of_a_held_back_chunk(serve, continuous_usage):
    fake = Server(continuous_usage=continuous_usage)
    out = Client(serve(fake), KEY).stream("tiny-hybrid", [5, 6, 7], 8, salt="abc")
    assert [c.tokens for c in out.chunks] == [1, 1, 3, 1, 1, 1]
    assert out.tokens == out.completion_tokens == 8 and out.prompt_tokens == 3
    assert out.prompt_len == 3 and out.token_ids == list(range(8))
    assert out.text == "".join(f"<{t}>" for t in range(8))
    assert out.finish_reason == "length"
    assert 0 < out.ttft < out.chunks[-1].at
    gaps = out.token_gaps()
    assert len(gaps) == 7
    # The three tokens of one chunk share its gap: a third of the time since the chunk
    # before; the chunk after them, one token, has its whole gap. (Computed from the arrival
    # times, not the fake server's sleeps: a loaded machine moves every arrival.)
    at = [c.at for c in out.chunks]
    assert gaps[1] == gaps[2] == gaps[3] == pytest.approx((at[2] - at[1]) / 3)
    assert gaps[4] == pytest.approx(at[3] - at[2]) and gaps[0] == pytest.approx(at[1] - at[0])
    body = fake.bodies[-1]
    assert body["ignore_eos"] is True and body["temperature"] == 0.0
    assert body["cache_salt"] == "abc" and body["return_token_ids"] is True
    assert body["stream_options"] == {"include_usage": True, "continuous_usage_stats": True}


def test_a_batch_is_one_request_and_its_answers_come_back_in_prompt_order(serve):
    """The server answers the choices out of order; each goes back to its prompt."""
    fake = Server()
    client = Client(serve(fake), KEY)
    outs = client.batch("tiny-hybrid", [[1] * 3, [2] * 5, [3] * 4], 6, salt="abc")
    assert [o.token_ids for o in outs] == [list(range(k, k + 6)) for k in (3, 5, 4)]
    assert [o.completion_tokens for o in outs] == [6, 6, 6]
    assert [o.prompt_len for o in outs] == [3, 5, 4] and outs[0].finish_reason == "length"
    body = fake.bodies[-1]
    assert len(fake.bodies) == 1 and body["prompt"] == [[1] * 3, [2] * 5, [3] * 4]
    assert body["ignore_eos"] is True and body["temperature"] == 0.0
    assert body["cache_salt"] == "abc" and body["return_token_ids"] is True
    fake.drop_choices = 1
    with pytest.raises(ValueError, match="3 prompts got 2 completions"):
        client.batch("tiny-hybrid", [[1] * 3, [2] * 5, [3] * 4], 6, salt="abc")


def test_decode_rate_and_gaps_of_a_stream():
    s = Stream(prompt_len=4, chunks=[Chunk(1, 0.1), Chunk(1, 0.2), Chunk(2, 0.4)])
    assert s.tokens == 4 and s.ttft == 0.1
    assert [round(g, 9) for g in s.token_gaps()] == [0.1, 0.1, 0.1]
    assert round(s.decode_tok_s(), 9) == 10.0  # 4 tokens by 0.4 s after the request
    assert round(Stream(chunks=[Chunk(3, 0.1)]).decode_tok_s(), 9) == 30.0
    assert Stream().decode_tok_s() is None
    assert Stream().ttft == 0.0


def test_a_gateways_rate_limit_is_waited_out_for_tokenize_and_streams(serve):
    fake = Server()
    url = serve(fake)
    fake.limited = 2
    assert Client(url, KEY).tokenize("tiny-hybrid", "a bb") == [1, 2]
    fake.limited = 3
    out = Client(url, KEY).stream("tiny-hybrid", [1, 2, 3], 8)
    assert out.completion_tokens == 8
    assert len(fake.bodies) == 2 + 1 + 3 + 1


def test_a_rate_limit_that_outlasts_the_wait_stands(serve, monkeypatch):
    from arcvllm.client import api as C

    monkeypatch.setattr(C, "RATE_LIMIT_WAIT", 0.3)
    fake = Server()
    url = serve(fake)
    fake.limited = 1000
    with pytest.raises(httpx.HTTPStatusError, match="429"):
        Client(url, KEY).tokenize("tiny-hybrid", "a")


def test_the_paths_top_logprobs_are_read_by_token_id_with_the_chosen_one():
    answer = {
        "tokens": ["token_id:5", "token_id:9"],
        "token_logprobs": [-0.1, -2.5],
        "top_logprobs": [{"token_id:5": -0.1, "token_id:6": -2.0}, {"token_id:1": -0.3}],
    }
    assert tops_of(answer) == [{5: -0.1, 6: -2.0}, {1: -0.3, 9: -2.5}]
    assert tops_of(None) == []
