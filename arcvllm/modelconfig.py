"""A model's config.json as a preset carries it (its excerpt): the language model's part
and the shape of its experts. Pure, and read everywhere: the presets' memory fit, the
defects' quantization check, the kernels probe inside a release's Python.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any


def moe_shape(text_config: Mapping[str, Any]) -> dict[str, Any] | None:
    """Experts, top-k, hidden and per-expert intermediate size, in either naming scheme."""
    experts = text_config.get("num_experts") or text_config.get("num_local_experts")
    if not experts:
        return None
    return {
        "num_experts": int(experts),
        "top_k": int(text_config["num_experts_per_tok"]),
        "hidden_size": int(text_config["hidden_size"]),
        "intermediate_size": int(
            text_config.get("moe_intermediate_size") or text_config["intermediate_size"]
        ),
        "renormalize": bool(text_config.get("norm_topk_prob", True)),
    }


def text_config(model_config: Mapping[str, Any]) -> Mapping[str, Any]:
    """The language model's part of a config.json (VLMs nest it under text_config)."""
    return model_config.get("text_config") or model_config
