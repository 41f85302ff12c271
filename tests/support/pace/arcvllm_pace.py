"""A vLLM plugin for tests only: the engine sleeps ARCVLLM_PACE_MS after each step that ran
the model, so what shares its cores gets them.

Never installed and never in an image: a test puts this folder on PYTHONPATH (in a
container: mounts it and sets PYTHONPATH), where its dist-info carries the
`vllm.general_plugins` entry point. Unset or 0, it does nothing.

Why: on two cores vLLM 0.32's engine-core process busy-waits for its worker beside the
API process, which then takes a stop (SIGTERM) only after the last token of a short
stream: the drain is not exercised, and a test of it flakes. Paced, a stream lasts as long
as the test needs, the API process forwards the stop while the engine still generates, and
the engine says so in its own log ("draining in-flight requests"). A sleep in the engine's
step, between steps, changes no output.
"""

from __future__ import annotations

import functools
import importlib.abc
import importlib.util
import logging
import os
import sys
import time

ENV = "ARCVLLM_PACE_MS"
TARGET = "vllm.v1.engine.core"

logger = logging.getLogger("vllm.arcvllm.pace")


def pace_ms() -> float:
    """The pause after each model step, in ms; a bad value fails the start in one line."""
    text = os.environ.get(ENV, "").strip() or "0"
    try:
        ms = float(text)
    except ValueError:
        raise ValueError(f"{ENV}={text!r}: not a number of milliseconds") from None
    if ms < 0:
        raise ValueError(f"{ENV}={text!r}: must be 0 or more")
    return ms


def install(module) -> None:
    """Wraps EngineCoreProc._process_engine_step (looked up on the class at every turn of
    the busy loop, so a wrapper installed after the engine started still takes effect)."""
    proc = getattr(module, "EngineCoreProc", None)
    step = getattr(proc, "_process_engine_step", None)
    if step is None or getattr(step, "_arcvllm_paced", False):
        return
    pause = pace_ms() / 1000

    @functools.wraps(step)
    def paced(self):
        executed = step(self)
        if executed:
            time.sleep(pause)
        return executed

    paced._arcvllm_paced = True  # type: ignore[attr-defined]
    proc._process_engine_step = paced
    logger.warning("arcvllm pace: the engine sleeps %.0f ms after each model step", pause * 1000)


class _Hook(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Installs the wrapper as soon as the engine's module has been executed (a process
    that loads its plugins before it imports the engine, and forks the engine later)."""

    def find_spec(self, fullname, path, target=None):
        if fullname != TARGET:
            return None
        sys.meta_path.remove(self)
        spec = importlib.util.find_spec(fullname)
        if spec is None or spec.loader is None:
            return None
        self._loader = spec.loader
        spec.loader = self
        return spec

    def create_module(self, spec):
        return self._loader.create_module(spec)

    def exec_module(self, module):
        self._loader.exec_module(module)
        install(module)


def register() -> None:
    """The `vllm.general_plugins` entry point: a no-op unless ARCVLLM_PACE_MS > 0. Every
    vLLM process loads it; only the engine core's has the module, imported before its
    plugins load."""
    if pace_ms() <= 0:
        return
    if TARGET in sys.modules:
        install(sys.modules[TARGET])
    elif not any(isinstance(f, _Hook) for f in sys.meta_path):
        sys.meta_path.insert(0, _Hook())
