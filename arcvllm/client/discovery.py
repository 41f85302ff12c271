"""What a running server serves: the model, its context length and its block size.

The one discovery of `arcvllm smoke` and `arcvllm bench`, before anything is measured,
with one set of fallbacks:
- the model: the one named (--model, or the preset's served name; the two must agree),
  else the server's only one; /v1/models must list it;
- its context length: its max_model_len on /v1/models;
- the block size of the KV and mamba pages: the operator's, if given; else the server's
  /metrics (vllm:cache_config_info); else its log ('Setting attention block size to N').
and one error behaviour, each a line: 2 for what the operator named wrongly (a key the
server refuses, a model it does not serve, a model that is not the preset's), 3 for what
the environment lacks (no server answers, it does not tell its context or block size).
"""

from __future__ import annotations

from dataclasses import dataclass

from arcvllm.client import metrics as m
from arcvllm.client.api import Client
from arcvllm.client.log import LogSource, block_size_from_log, chunk_tokens_from_log
from arcvllm.errors import Unavailable, UsageError
from arcvllm.text import error_line


@dataclass(frozen=True)
class Served:
    """What the server serves, as the checks and the measurements are planned from."""

    model: str
    max_model_len: int
    block_size: int
    block_size_source: str  # "given", "/metrics" or "server log"


def requested_model(model: str | None, preset: str | None) -> str | None:
    """The model name asked for: MODEL, or PRESET's served name (None: the server's only
    one). A MODEL that is not PRESET's is a usage error, found before any server is asked."""
    if preset is None:
        return model
    from arcvllm.presets import get_preset

    served = get_preset(preset).served_model_name
    if model is not None and model != served:
        raise UsageError(f"--model {model!r} is not the model of preset {preset!r} ({served!r})")
    return served


def served_model(client: Client, model: str | None = None) -> tuple[str, int]:
    """(model, max_model_len) from /v1/models: MODEL, which it must list, or its only one."""
    entries = _models(client)
    names = [entry["id"] for entry in entries]
    if model is None:
        if len(names) != 1:
            raise UsageError(f"the server serves {names}; choose one with --model")
        model = names[0]
    elif model not in names:
        raise UsageError(
            f"model {model!r} is not served at {client.root}; it serves: {', '.join(names)}"
        )
    max_len = next(int(e.get("max_model_len") or 0) for e in entries if e["id"] == model)
    if max_len <= 0:
        raise Unavailable(f"{client.root}/v1/models does not say max_model_len of {model!r}")
    return model, max_len


def _models(client: Client) -> list[dict]:
    """The entries of /v1/models. An answer that refuses (4xx: the key, the URL) is the
    operator's to fix, no answer or a broken one the environment's."""
    import httpx

    try:
        return client.models()
    except httpx.HTTPStatusError as exc:
        status = exc.response.status_code
        hint = " (wrong --api-key?)" if status in (401, 403) else ""
        kind = UsageError if status < 500 else Unavailable
        raise kind(f"{client.root}/v1/models answered {status}{hint}") from exc
    except (httpx.HTTPError, ValueError, KeyError, TypeError) as exc:
        raise Unavailable(
            f"cannot reach a vLLM server at {client.root}: {error_line(exc)}"
        ) from exc


def block_size(
    client: Client, given: int | None = None, log: LogSource | None = None
) -> tuple[int, str]:
    """(block size, where it came from): GIVEN, else /metrics, else the server's LOG."""
    import httpx

    if given is not None:
        if given <= 0:
            raise UsageError(f"--block-size {given} is not a number of tokens")
        return given, "given"
    try:
        found = m.block_size(client.metrics())
    except (httpx.HTTPError, ValueError):
        found = None
    if found:
        return found, "/metrics"
    found = block_size_from_log(log.lines()) if log else None
    if found:
        return found, "server log"
    raise Unavailable(
        "cannot determine the server's block size: /metrics has no "
        "vllm:cache_config_info effective_attention_block_size and no server log "
        "(--log-file/--log-cmd) says 'Setting attention block size to N tokens'"
    )


def chunk_tokens(
    given: int | None = None, preset: str | None = None, log: LogSource | None = None
) -> tuple[int | None, str]:
    """(the server's prefill chunk, where it came from): GIVEN, else PRESET's
    max-num-batched-tokens, else the server's LOG; (None, "unknown") when none says (vLLM's
    default depends on the device and its memory)."""
    if given is not None:
        if given <= 0:
            raise UsageError(f"--max-num-batched-tokens {given} is not a number of tokens")
        return given, "given"
    if preset is not None:
        from arcvllm.presets import get_preset

        value = get_preset(preset).vllm_args.get("max-num-batched-tokens")
        if value:
            return int(value), "preset"
    found = chunk_tokens_from_log(log.lines()) if log else None
    return (found, "server log") if found else (None, "unknown")


def discover(
    client: Client,
    model: str | None = None,
    preset: str | None = None,
    given_block_size: int | None = None,
    log: LogSource | None = None,
) -> Served:
    """What CLIENT's server serves (see the module's docstring); ArcvllmError if it
    cannot be told, before any check or measurement runs."""
    name, max_len = served_model(client, requested_model(model, preset))
    block, source = block_size(client, given_block_size, log)
    return Served(name, max_len, block, source)
