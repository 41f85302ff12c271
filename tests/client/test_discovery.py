"""arcvllm.client.discovery against the fake vLLM server (tests/support/fakeserver.py): the
one discovery of smoke and bench, its fallbacks and its exit statuses."""

from __future__ import annotations

import dataclasses

import pytest
from support.fakeserver import BLOCK, MAX_LEN, Fake, handler
from support.processes import free_port

from arcvllm.client import discovery as d
from arcvllm.client.api import Client
from arcvllm.client.log import LogSource
from arcvllm.errors import ArcvllmError

KEY = "s3cret"


@pytest.fixture
def serve(http_server):
    return lambda fake: http_server(handler(fake))


def refused(call, *args, **kwargs) -> ArcvllmError:
    with pytest.raises(ArcvllmError) as raised:
        call(*args, **kwargs)
    assert raised.value.exit_code in (2, 3) and "\n" not in str(raised.value)
    return raised.value


def test_the_only_model_its_context_and_the_block_size_of_metrics(serve):
    served = d.discover(Client(serve(Fake())))
    assert served == d.Served("tiny-hybrid", MAX_LEN, BLOCK, "/metrics")
    with pytest.raises(dataclasses.FrozenInstanceError):
        served.model = "other"  # type: ignore[misc]


def test_the_preset_names_the_model_among_several(serve):
    client = Client(serve(Fake(models=("decoy", "tiny-hybrid"))))
    error = refused(d.discover, client)
    assert error.exit_code == 2 and "choose one with --model" in str(error)
    assert d.discover(client, preset="tiny-hybrid-cpu").model == "tiny-hybrid"
    assert d.discover(client, "decoy").model == "decoy"


def test_a_model_the_server_does_not_serve_is_named_in_one_line_exit_2(serve):
    url = serve(Fake())
    error = refused(d.discover, Client(url), "qwen")
    assert error.exit_code == 2
    assert str(error) == f"model 'qwen' is not served at {url}; it serves: tiny-hybrid"


def test_a_model_that_is_not_the_presets_is_a_usage_error_before_any_server_is_asked():
    client = Client(f"http://127.0.0.1:{free_port()}")
    error = refused(d.discover, client, "x", "tiny-hybrid-cpu")
    assert error.exit_code == 2
    assert str(error) == "--model 'x' is not the model of preset 'tiny-hybrid-cpu' ('tiny-hybrid')"
    assert refused(d.requested_model, None, "nope").exit_code == 2
    assert d.requested_model("tiny-hybrid", "tiny-hybrid-cpu") == "tiny-hybrid"
    assert d.requested_model("any", None) == "any"


def test_a_key_the_server_refuses_is_a_usage_error(serve):
    url = serve(Fake(api_key=KEY))
    for key in (None, "wrong"):
        error = refused(d.discover, Client(url, key))
        assert error.exit_code == 2
        assert str(error) == f"{url}/v1/models answered 401 (wrong --api-key?)"
    assert d.discover(Client(url, KEY)).model == "tiny-hybrid"


def test_no_server_is_exit_3():
    url = f"http://127.0.0.1:{free_port()}"
    error = refused(d.discover, Client(url))
    assert error.exit_code == 3 and str(error).startswith(f"cannot reach a vLLM server at {url}: ")


def test_a_server_that_does_not_tell_its_context_length_is_exit_3(serve):
    error = refused(d.discover, Client(serve(Fake(max_model_len=None))))
    assert error.exit_code == 3 and "does not say max_model_len of 'tiny-hybrid'" in str(error)


def test_the_block_size_falls_back_from_metrics_to_the_log(serve, tmp_path):
    client = Client(serve(Fake(block_in_metrics=False)))
    log = tmp_path / "server.log"
    log.write_text("(EngineCore pid=1) INFO Setting attention block size to 96 tokens to ...\n")
    served = d.discover(client, log=LogSource(file=str(log)))
    assert (served.block_size, served.block_size_source) == (96, "server log")
    log.write_text("INFO nothing about blocks\n")
    for source in (LogSource(file=str(log)), None):
        error = refused(d.discover, client, log=source)
        assert error.exit_code == 3 and "cannot determine the server's block size" in str(error)


def test_a_given_block_size_is_taken_as_given(serve):
    client = Client(serve(Fake(block_in_metrics=False)))
    assert d.discover(client, given_block_size=128).block_size_source == "given"
    assert d.discover(client, given_block_size=128).block_size == 128
    assert refused(d.discover, client, given_block_size=0).exit_code == 2


def test_without_metrics_the_log_is_read(tmp_path, http_server):
    """A server whose /metrics answers 404 (e.g. a router that hides it)."""
    fake = Fake()
    inner = handler(fake)

    class NoMetrics(inner):
        def do_GET(self):
            if self.path == "/metrics":
                self.send(404, "")
            else:
                super().do_GET()

    log = tmp_path / "server.log"
    log.write_text("INFO kv cache group sizes (64, 64)\n")
    served = d.discover(Client(http_server(NoMetrics)), log=LogSource(file=str(log)))
    assert (served.block_size, served.block_size_source) == (64, "server log")
