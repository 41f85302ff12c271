"""A model folder that `arcvllm model check` reads as a preset's, made in a test's tree."""

from __future__ import annotations

import json
import struct
from pathlib import Path

from arcvllm.presets import Preset, get_preset


def put_model(folder: Path, preset: Preset | None = None, mtp: bool = False) -> Path:
    """PRESET's folder (the 1-B70 XPU preset's by default): its config excerpt, one
    safetensors file (the documented header), a tokenizer, a chat template."""
    preset = preset or get_preset("qwen3.6-35b-a3b-w4a16-1xb70")
    folder.mkdir(parents=True, exist_ok=True)
    config = {**preset.model_config} or {"architectures": ["Qwen3NextForCausalLM"]}
    (folder / "config.json").write_text(json.dumps(config))
    names = ["model.layers.0.mlp.gate.weight"] + (["mtp.fc.weight"] if mtp else [])
    head = {n: {"dtype": "BF16", "shape": [1], "data_offsets": [0, 2]} for n in names}
    text = json.dumps(head).encode()
    (folder / "model.safetensors").write_bytes(struct.pack("<Q", len(text)) + text + b"\0\0")
    (folder / "tokenizer.json").write_text("{}")
    (folder / "chat_template.jinja").write_text("{{ messages }}")
    return folder
