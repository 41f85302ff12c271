"""The prompt logprobs `arcvllm verify` and the canary ask for, counted in each preset's
memory fit (`arcvllm presets --check`): one prefill chunk's logits, their float32 copy
and log-softmax, against what --gpu-memory-utilization leaves outside vLLM's budget
(pure). A preset where they do not fit fails: Qwen3.6's at vLLM's default chunk would."""

from __future__ import annotations

from dataclasses import replace

import pytest

from arcvllm import presets as P
from arcvllm.presets import fit as F

QWEN36 = "qwen3.6-35b-a3b-w4a16-1xb70"


@pytest.mark.parametrize("name", sorted(n for n, p in P.load_all().items() if p.model_config))
def test_every_shipped_preset_says_its_chunk_of_prompt_logprobs(name):
    fit = P.memory_fit(P.get_preset(name))
    assert fit is not None and "prompt logprobs" in fit.summary()
    assert fit.logprobs_fit == (fit.logprobs_gib <= fit.outside_gib)
    print(f"{name}: {fit.summary()}")


def test_qwen36s_chunk_of_prompt_logprobs_is_one_block_x_its_vocabulary_x_10_bytes():
    preset = P.get_preset(QWEN36)
    fit = P.memory_fit(preset)
    assert fit is not None
    assert preset.vllm_args["max-num-batched-tokens"] == 1088  # one B70 block of this model
    assert fit.logprobs_gib == pytest.approx(1088 * 248_320 * 10 / 1024**3)  # 2.52 GiB
    assert fit.outside_gib == pytest.approx(0.1 * F.GPU_GIB)
    assert fit.ok and "prompt logprobs 2.52/3.20 GiB" in fit.summary()
    # vLLM's default chunk, 2048, would take 4.74 GiB of the 3.20: the preset fails the fit
    default = {k: v for k, v in preset.vllm_args.items() if k != "max-num-batched-tokens"}
    fit = P.memory_fit(replace(preset, vllm_args=default))
    assert fit is not None and fit.logprobs_gib == pytest.approx(2048 * 248_320 * 10 / 1024**3)
    assert not fit.ok and "prompt logprobs 4.74/3.20 GiB OVER" in fit.summary()
    rows, failures = P.fit_rows([replace(preset, vllm_args=default)])
    assert failures == [QWEN36] and rows[1][-1] == "FAIL"
    # ... or room at 0.85 utilisation (4.80 GiB left)
    fit = P.memory_fit(replace(preset, vllm_args={**default, "gpu-memory-utilization": 0.85}))
    assert fit is not None and fit.ok, fit.summary()


def test_a_preset_whose_utilisation_leaves_too_little_is_over():
    preset = P.get_preset("granite-4.0-h-tiny-1xb70")
    fit = P.memory_fit(preset)
    assert fit is not None and fit.logprobs_fit, fit.summary()
    tight = replace(preset, vllm_args={**preset.vllm_args, "gpu-memory-utilization": 0.95})
    fit = P.memory_fit(tight)
    assert fit is not None and not fit.logprobs_fit and fit.summary().endswith("OVER")
    assert not fit.ok
