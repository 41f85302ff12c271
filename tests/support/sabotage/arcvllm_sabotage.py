"""A vLLM plugin for tests only: one deliberate defect per path `arcvllm verify` checks.

Never installed and never in an image: a test puts this folder on PYTHONPATH, where its
dist-info carries the `vllm.general_plugins` entry point. It does nothing unless
ARCVLLM_SABOTAGE names a defect, or ARCVLLM_SABOTAGE_FILE names a file that holds one
(read again whenever it changes, so one server shows each defect in turn; an empty file
is no defect). ARCVLLM_SABOTAGE_AFTER=K holds the defect back until K requests have been
scheduled: a server that goes wrong after K requests (the canary's alert test).

Each defect spoils what one path carries, the way the defects reported on Arc GPUs do
(a state lost at a block boundary, NaN for one prompt length, a cached state corrupted on
resume): the server stays up, answers 200, and only the tokens show it.

    defect           what goes wrong                                        row it fails
    decode-boundary  the state carried into a new block in decode is lost   boundary decode
    chunk-boundary   the state carried from one prefill chunk to the next   chunked prefill
                     is lost
    resume           the state a new request resumes from the prefix cache  cached prefix resumed
                     is lost
    mixed-batch      decoding requests lose their state from a step that    mixed batches
                     also prefills another request on
    preemption       a request recomputed after preemption loses its state  preemption
    max-len          the state is lost within 64 tokens of max-model-len    max-model-len
    nan-residue:R    NaN state after the prefill of a prompt whose length   prompt residues mod 64
                     is R mod 64
    lost-residue:R   the state after the prefill of a prompt whose length   prompt residues mod 64
                     is R mod 64 is lost (once, finite: vllm-xpu-kernels
                     #548 without the NaN)
    zero-boundary    the state carried into a new block in decode is        boundary decode
                     zeroed (not noise)
    stale-boundary   the state carried into a new block in decode is the    boundary decode
                     one a block older (the block before the one it left)
    drop-token       the state update of the first token decoded in a new   boundary decode
                     block is dropped (the next token reads the state
                     from before it)
    round:B          every state a step reads is rounded to B significant   boundary decode
                     bits (B=4: fp8 e4m3's precision; 8: bf16's)
    degenerate       sampled requests (temperature > 0) get logits that     degeneration
                     pick token 0 every time ("!!!!")
    moe-scale:F      every MoE block's output is F times what it should be, none: prefill and
                     in prefill and decode alike (a wrong grouped GEMM or   decode agree;
                     activation shared by every path)                       the independent
                                                                            reference's

"Lost" is replaced by noise (SPOIL_STD). `NAME~STD` keeps the state where NAME would lose
it and adds noise of STD times the state's own RMS: a perturbation of that relative size
(the sweep in tests/verify/test_verify_server.py). The hooks wrap vLLM's
`mamba_utils.preprocess_mamba` (align mode: where the running state of each request is
moved to the block it writes this step) and `Sampler.forward`, installed when vLLM
imports them (the engine's worker).
"""

from __future__ import annotations

import importlib.abc
import importlib.util
import inspect
import logging
import os
import sys
from typing import Any

ENV = "ARCVLLM_SABOTAGE"
ENV_FILE = "ARCVLLM_SABOTAGE_FILE"
ENV_AFTER = "ARCVLLM_SABOTAGE_AFTER"
DEFECTS = (
    "decode-boundary",
    "chunk-boundary",
    "resume",
    "mixed-batch",
    "preemption",
    "max-len",
    "nan-residue",
    "degenerate",
    "moe-scale",
    "lost-residue",
    "zero-boundary",
    "stale-boundary",
    "drop-token",
    "round",
)
MAX_LEN_WINDOW = 64
# A spoiled state is noise of this spread: what a copy from the wrong place, or into a
# block never written, leaves. (Zeros barely move the tiny model's random-weight output.)
SPOIL_STD = 1.0
TARGETS = (
    "vllm.v1.worker.mamba_utils",
    "vllm.v1.sample.sampler",
    "vllm.model_executor.models.qwen3_next",
)
# Defects with an argument: a residue mod 64, moe-scale's factor, round's bits.
ARGUMENTS = {"nan-residue": int, "lost-residue": int, "moe-scale": float, "round": int}
RESIDUES = ("nan-residue", "lost-residue")

logger = logging.getLogger("vllm.arcvllm.sabotage")


def parse(text: str) -> tuple[str, Any] | None:
    """'name', 'name:ARG' (nan-residue:R, lost-residue:R, moe-scale:F, round:B) or
    'name~STD' (a lost state's noise spread) -> (name, ARG or STD); '' -> None; anything
    else is refused."""
    raw = text = text.strip()
    if not text:
        return None
    text, tilde, spread = text.partition("~")
    name, _, arg = text.partition(":")
    if name not in DEFECTS or (name in ARGUMENTS) != bool(arg) or (tilde and arg):
        raise ValueError(
            f"unknown sabotage {raw!r}; known: {', '.join(DEFECTS)} "
            "(nan-residue:R, lost-residue:R, moe-scale:F, round:B, NAME~STD)"
        )
    if tilde:
        return name, float(spread)
    if name in RESIDUES:
        return name, int(arg) % 64
    return name, ARGUMENTS[name](arg) if arg else None


class _State:
    """The defect in force, and what it needs to remember across steps."""

    def __init__(self) -> None:
        self.seen: set[str] = set()  # requests scheduled at least once
        self.resumed: set[str] = set()  # requests resumed after a preemption
        self.poisoned: set[str] = set()  # requests spoiled at every step from now on
        self.after = int(os.environ.get(ENV_AFTER, "0") or 0)
        self.fired: dict[str, int] = {}
        self.chunk = 0  # the server's prefill chunk, read in the worker's first step
        self.spent: set[str] = set()  # requests a once-only defect has spoiled
        self.block_size = 0  # the mamba block size, read in the worker's first step
        self.dtypes_said: set[str] = set()
        self._file = os.environ.get(ENV_FILE)
        self._stamp: float | None = None
        self._defect = None if self._file else parse(os.environ.get(ENV, ""))

    def defect(self) -> tuple[str, int | None] | None:
        """The defect now in force: the file's, read again when its mtime changed."""
        if self._file:
            try:
                stamp = os.stat(self._file).st_mtime_ns
            except FileNotFoundError:
                return None
            if stamp != self._stamp:
                with open(self._file) as f:
                    self._defect = parse(f.read())
                self._stamp = stamp
                self.poisoned.clear()  # a new defect starts from clean requests
                self.spent.clear()
                logger.warning("arcvllm sabotage: now %s", self._defect)
        return self._defect if len(self.seen) > self.after else None

    def fire(self, name: str, req_id: str, position: int) -> None:
        count = self.fired.get(name, 0) + 1
        self.fired[name] = count
        if count <= 3 or count % 100 == 0:
            logger.warning(
                "arcvllm sabotage: %s (#%d) spoiled request %s at position %d",
                name,
                count,
                req_id,
                position,
            )


def _chunk_tokens() -> int:
    """The server's max-num-batched-tokens: from the model runner that called the hook."""
    frame = sys._getframe(1)
    while frame is not None:
        runner = frame.f_locals.get("self")
        config = getattr(runner, "scheduler_config", None)
        if config is not None:
            return int(config.max_num_batched_tokens)
        frame = frame.f_back
    return 1 << 62


_state: _State | None = None


def state() -> _State:
    global _state
    if _state is None:
        _state = _State()
    return _state


def _victims(
    defect: tuple[str, int | None], sched: Any, batch: Any, requests: dict, known: dict
) -> list[tuple[str, str]]:
    """(request, how) of every request this step's defect spoils."""
    name, residue = defect
    s = state()
    out: list[tuple[str, str]] = []
    new = [r for r in batch.req_ids if r not in s.seen]
    for req_id in batch.req_ids:
        req = requests[req_id]
        done = req.num_computed_tokens
        prompt = req.num_prompt_tokens
        step = sched.num_scheduled_tokens.get(req_id, 0)
        decoding = req_id in known and done >= prompt
        if name == "decode-boundary":
            block = known.get(req_id)
            hit = decoding and block is not None and block != _block_now(req_id)
        elif name == "chunk-boundary":
            # a chunk the token budget cut (align mode also splits every prompt at its
            # last block boundary, to keep that state: those carries stay intact)
            hit = req_id in known and 0 < done < prompt and done % s.chunk == 0
        elif name == "resume":
            hit = req_id in new and done > 0 and req_id not in s.resumed
        elif name == "mixed-batch":
            # from a step that also prefills another request (new, or its next chunk), for
            # good; not a recompute after preemption (the preemption row's)
            if decoding and any(
                requests[r].num_computed_tokens < requests[r].num_prompt_tokens
                and r not in s.resumed
                for r in batch.req_ids
            ):
                s.poisoned.add(req_id)
            hit = req_id in s.poisoned
        elif name == "preemption":
            hit = req_id in s.resumed and done > 0
        elif name == "max-len":
            hit = done > 0 and done + step > batch.max_model_len - MAX_LEN_WINDOW
        elif name == "nan-residue":
            if req_id in new and done == 0 and prompt % 64 == residue:
                s.poisoned.add(req_id)
            hit = req_id in s.poisoned and done > 0
        elif name in HOW and name != "nan-residue":
            hit = _hit(name, residue, req_id, done, prompt, req_id in new, decoding, known)
        else:
            hit = False
        if hit:
            out.append((req_id, HOW.get(name, "noise")))
    return out


def _hit(
    name: str,
    residue: Any,
    req_id: str,
    done: int,
    prompt: int,
    new: bool,
    decoding: bool,
    known: dict,
) -> bool:
    """Whether the defects of the state's own kinds (lost once, zeroed, stale, dropped,
    rounded) spoil REQ_ID this step."""
    s = state()
    if name == "lost-residue":
        # new with or without a cached prefix; lost once, at the first decode step
        if new and prompt % 64 == residue:
            s.poisoned.add(req_id)
        return req_id in s.poisoned and done >= prompt and req_id not in s.spent
    block = _block_now(req_id)
    if name in ("zero-boundary", "stale-boundary"):
        return decoding and known.get(req_id) is not None and known[req_id] != block
    if name == "drop-token":
        # the step after the first crossing in decode: its state holds the crossing
        # token's update, which is dropped
        return (
            decoding
            and block is not None
            and done % s.block_size == 1
            and done // s.block_size == block
            and req_id not in s.spent
        )
    return name == "round" and done > 0


# How each defect spoils the state it hits (the rest: noise).
HOW = {
    "nan-residue": "nan",
    "lost-residue": "noise",
    "zero-boundary": "zero",
    "stale-boundary": "stale",
    "drop-token": "drop",
    "round": "round",
}


_after: dict[str, int] = {}  # the block each request writes this step (preprocess's result)


def _block_now(req_id: str) -> int | None:
    return _after.get(req_id)


def _spoil(req: Any, blocks: set[int], how: str, copy_bufs: Any, kv_cache_config: Any, ctx: dict):
    """Spoil the state in each of BLOCKS (indices in REQ's block list) of every mamba layer:
    "stale" and "drop" put there the state of an older block of REQ (two blocks back: the
    state a block older; one back: the state before the last token), when it has one."""
    back = {"stale": 2, "drop": 1}.get(how)
    for gid in copy_bufs.mamba_group_ids:
        ids = req.block_ids[gid]
        for block_idx in blocks:
            source = None
            if back is not None:
                if block_idx - back < 0:
                    continue
                source = ids[block_idx - back]
            _spoil_block(ids[block_idx], how, gid, kv_cache_config, ctx, source)


def _spoil_block(
    block_id: int, how: str, gid: int, kv_cache_config: Any, ctx: dict, source: int | None
) -> None:
    import torch

    s = state()
    defect = s.defect()
    arg = defect[1] if defect is not None else None
    for layer in kv_cache_config.kv_cache_groups[gid].layer_names:
        if how not in s.dtypes_said:  # (conv state, SSM state)
            s.dtypes_said.add(how)
            dtypes = ", ".join(str(t.dtype) for t in ctx[layer].kv_cache)
            logger.warning("arcvllm sabotage: the states spoiled (%s) are %s", how, dtypes)
        for tensor in ctx[layer].kv_cache:
            block = tensor[block_id]
            if how == "nan":
                block.fill_(float("nan"))
            elif how == "zero":
                block.zero_()
            elif source is not None:
                block.copy_(tensor[source])
            elif how == "round":
                if block.is_floating_point():
                    block.copy_(_rounded(block, int(arg or 8)))
            elif arg is not None and defect is not None and defect[0] not in ARGUMENTS:
                # NAME~STD: the state kept, noise of STD times its own RMS added (a
                # perturbation of that relative size, not a state lost)
                rms = float(block.float().pow(2).mean().sqrt())
                block.add_(torch.randn_like(block.float()).mul_(arg * rms).to(block.dtype))
            else:
                block.normal_(0.0, SPOIL_STD)


def _rounded(x: Any, bits: int) -> Any:
    """X with B significant bits (round to nearest), in its own dtype."""
    import torch

    mantissa, exponent = torch.frexp(x.float())
    scale = float(1 << bits)
    return torch.ldexp(torch.round(mantissa * scale) / scale, exponent).to(x.dtype)


def _wrap_preprocess(module: Any, original: Any) -> Any:
    signature = inspect.signature(original)

    def preprocess_mamba(*args: Any, **kwargs: Any) -> Any:
        s = state()
        defect = s.defect()
        a = signature.bind(*args, **kwargs).arguments
        sched, batch, requests = a["scheduler_output"], a["input_batch"], a["requests"]
        s.resumed |= set(sched.scheduled_cached_reqs.resumed_req_ids)
        if not s.chunk:
            s.chunk = _chunk_tokens()
            logger.warning("arcvllm sabotage: the prefill chunk is %d tokens", s.chunk)
        if defect is None:
            result = original(*args, **kwargs)
            s.seen.update(batch.req_ids)
            return result
        module.cleanup_mamba_state_idx(sched, a["mamba_state_idx"])
        known = {r: a["mamba_state_idx"][r] for r in batch.req_ids if r in a["mamba_state_idx"]}
        result = original(*args, **kwargs)
        _after.clear()
        _after.update(a["mamba_state_idx"])
        s.block_size = a["copy_bufs"].mamba_spec.block_size
        for req_id, how in _victims(defect, sched, batch, requests, known):
            req = requests[req_id]
            # The state this step starts from: a prefill reads it from the block of its
            # last computed token, a decode from the block preprocess copied it into.
            # (Stale and dropped states are put only where the step reads: the block it
            # left keeps the state it had.)
            blocks = {a["mamba_state_idx"][req_id]}
            if req.num_computed_tokens > 0 and how not in ("stale", "drop"):
                blocks.add((req.num_computed_tokens - 1) // a["copy_bufs"].mamba_spec.block_size)
            s.spent.add(req_id)
            _spoil(
                req,
                blocks,
                how,
                a["copy_bufs"],
                a["kv_cache_config"],
                a["forward_context"],
            )
            s.fire(defect[0], req_id, req.num_computed_tokens)
        s.seen.update(batch.req_ids)
        return result

    preprocess_mamba.__wrapped__ = original
    return preprocess_mamba


def _wrap_sampler(original: Any) -> Any:
    def forward(self: Any, logits: Any, sampling_metadata: Any, *args: Any, **kwargs: Any) -> Any:
        s = state()
        defect = s.defect()
        temperature = sampling_metadata.temperature
        if defect is not None and defect[0] == "degenerate" and temperature is not None:
            rows = temperature > 1e-5
            if rows.shape[0] == logits.shape[0] and bool(rows.any()):
                logits = logits.clone()
                logits[rows] = 0.0
                logits[rows, 0] = 30.0
                s.fire("degenerate", "*", 0)
        return original(self, logits, sampling_metadata, *args, **kwargs)

    forward.__wrapped__ = original
    return forward


def _wrap_moe(original: Any) -> Any:
    def forward(self: Any, *args: Any, **kwargs: Any) -> Any:
        out = original(self, *args, **kwargs)
        defect = state().defect()
        if defect is not None and defect[0] == "moe-scale":
            state().fire("moe-scale", "*", 0)
            return out * defect[1]
        return out

    forward.__wrapped__ = original
    return forward


def install(module: Any) -> None:
    if getattr(module, "_arcvllm_sabotage", False):
        return
    if module.__name__ == TARGETS[0]:
        module.preprocess_mamba = _wrap_preprocess(module, module.preprocess_mamba)
    elif module.__name__ == TARGETS[1]:
        module.Sampler.forward = _wrap_sampler(module.Sampler.forward)
    else:
        block = module.Qwen3NextSparseMoeBlock
        block.forward = _wrap_moe(block.forward)
    module._arcvllm_sabotage = True
    logger.warning("arcvllm sabotage: wrapped %s in process %d", module.__name__, os.getpid())


class _Hook(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Installs the wrappers as soon as a target module has been executed."""

    def find_spec(self, fullname, path, target=None):
        if fullname not in TARGETS:
            return None
        sys.meta_path.remove(self)
        try:
            spec = importlib.util.find_spec(fullname)
        finally:
            sys.meta_path.insert(0, self)
        if spec is None or spec.loader is None:
            return None
        self._loaders = getattr(self, "_loaders", {})
        self._loaders[fullname] = spec.loader
        spec.loader = self
        return spec

    def create_module(self, spec):
        return self._loaders[spec.name].create_module(spec)

    def exec_module(self, module):
        self._loaders[module.__spec__.name].exec_module(module)
        install(module)


def register() -> None:
    """The `vllm.general_plugins` entry point: a no-op unless a sabotage is asked for."""
    if not (os.environ.get(ENV) or os.environ.get(ENV_FILE)):
        return
    state()  # a bad ARCVLLM_SABOTAGE fails the start here, in one line
    logger.warning("ARCVLLM SABOTAGE IS ON: this server gives wrong output on purpose (tests)")
    for target in TARGETS:
        if target in sys.modules:
            install(sys.modules[target])
    if not any(isinstance(f, _Hook) for f in sys.meta_path):
        sys.meta_path.insert(0, _Hook())
