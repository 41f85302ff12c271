"""The prompt logprobs `arcvllm verify` and the canary ask for, counted in each preset's
memory fit (`arcvllm presets --check`): one prefill chunk's logits and their log-softmax
must fit in what --gpu-memory-utilization leaves outside vLLM's budget (pure)."""

from __future__ import annotations

from dataclasses import replace

import pytest

from arcvllm import presets as P
from arcvllm.presets import fit as F

QWEN36 = "qwen3.6-35b-a3b-w4a16-1xb70"


@pytest.mark.parametrize("name", sorted(n for n, p in P.load_all().items() if p.model_config))
def test_every_shipped_preset_leaves_room_for_a_chunk_of_prompt_logprobs(name):
    fit = P.memory_fit(P.get_preset(name))
    assert fit is not None and fit.logprobs_fit, fit.summary()
    print(f"{name}: {fit.summary()}")


def test_qwen36s_chunk_of_prompt_logprobs_is_2048_x_its_vocabulary_x_6_bytes():
    preset = P.get_preset(QWEN36)
    fit = P.memory_fit(preset)
    assert fit is not None
    assert "max-num-batched-tokens" not in preset.vllm_args  # vLLM's default chunk, 2048
    assert fit.logprobs_gib == pytest.approx(2048 * 248_320 * 6 / 1024**3)  # 2.84 GiB
    assert fit.outside_gib == pytest.approx(0.1 * F.GPU_GIB)
    assert "prompt logprobs 2.84/3.20 GiB" in fit.summary()


def test_a_preset_whose_utilisation_leaves_too_little_fails_its_fit():
    preset = P.get_preset(QWEN36)
    tight = replace(preset, vllm_args={**preset.vllm_args, "gpu-memory-utilization": 0.95})
    fit = P.memory_fit(tight)
    assert fit is not None and not fit.logprobs_fit and not fit.ok, fit.summary()
    # ... and fits again with a smaller chunk (the figure is the chunk's, not the prompt's)
    smaller = replace(tight, vllm_args={**tight.vllm_args, "max-num-batched-tokens": 1024})
    fit = P.memory_fit(smaller)
    assert fit is not None and fit.logprobs_fit, fit.summary()
    assert P.fit_rows([tight])[1] == [QWEN36]
