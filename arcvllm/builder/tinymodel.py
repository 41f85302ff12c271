"""A tiny hybrid MoE model that ships with the project, so the CPU flavour serves offline.

It has the shape of the production model's family (Gated DeltaNet linear attention
interleaved with full attention, routed experts plus a shared expert), at 1.2 M parameters:
large enough to make vLLM allocate mamba states, pick a hybrid block size and copy states
at block boundaries; small enough to build in seconds with random weights.

The architecture is `Qwen3NextForCausalLM`. The production architecture
(`Qwen3_5MoeForConditionalGeneration`) also serves on the CPU path, but vLLM's Qwen3.5 code
imports torchvision, which the CPU flavour does not carry. Constraints of vLLM's CPU
kernels: linear-attention head dims of 64 or 128, bf16 weights.

The checkpoint also carries one multi-token-prediction (MTP) layer in Qwen3-Next's own
format, as the production checkpoints do: `num_nextn_predict_layers: 1` in config.json and
`mtp.*` weights (a full-attention MoE decoder layer, `fc` over [embedding; hidden], and
its norms), which vLLM's `Qwen3NextMTP` loads for `--speculative-config
'{"method": "mtp", ...}'` (vllm/model_executor/models/qwen3_next_mtp.py; method detection
in vllm/config/speculative.py). The main model's loaders skip `mtp.*` (vLLM's
`Qwen3NextForCausalLM` maps the prefix to None, transformers ignores it on load), so plain
serving is unchanged. The MTP weights are random like the rest: its drafts are mostly
rejected, which is what a correctness test wants (speculative output must equal plain
output whatever the drafts are).

Everything is deterministic for a given seed: the tokenizer is trained on text generated
here (no files, no network), the weights come from a seeded generator.
"""

from __future__ import annotations

import json
import random
from pathlib import Path

from arcvllm.errors import Unavailable, UsageError

SERVED_NAME = "tiny-hybrid"
VOCAB_SIZE = 512
EOS = "<|endoftext|>"

# Geometry: see the module docstring for the constraints behind the head dims.
CONFIG = {
    "vocab_size": VOCAB_SIZE,
    "hidden_size": 128,
    "intermediate_size": 256,
    "num_hidden_layers": 4,
    "layer_types": ["linear_attention", "full_attention", "linear_attention", "full_attention"],
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 64,
    "linear_key_head_dim": 64,
    "linear_value_head_dim": 64,
    "linear_num_key_heads": 2,
    "linear_num_value_heads": 4,
    "linear_conv_kernel_dim": 4,
    "num_experts": 4,
    "num_experts_per_tok": 2,
    "moe_intermediate_size": 64,
    "shared_expert_intermediate_size": 64,
    "decoder_sparse_step": 1,
    "max_position_embeddings": 4096,
    "tie_word_embeddings": False,
    # One MTP layer (Qwen3-Next's format, see the module docstring).
    "num_nextn_predict_layers": 1,
}
MTP_PREFIX = "mtp."
# The scale of the GDN output projections and the LM head (give_state_weight).
STATE_GAIN = 5.0

_WORDS = [
    "the",
    "a",
    "block",
    "state",
    "cache",
    "prefix",
    "token",
    "decode",
    "prefill",
    "layer",
    "expert",
    "router",
    "shared",
    "gate",
    "delta",
    "net",
    "attention",
    "linear",
    "full",
    "page",
    "size",
    "copy",
    "pointer",
    "address",
    "device",
    "memory",
    "host",
    "request",
    "stream",
    "server",
    "model",
    "weight",
    "bias",
    "norm",
    "head",
    "key",
    "value",
    "query",
    "rotary",
    "window",
    "arc",
    "pro",
    "graphics",
    "card",
    "xpu",
    "cpu",
    "kernel",
    "triton",
    "numpy",
    "torch",
    "boundary",
    "align",
    "mode",
    "hybrid",
]

_CHAT_TEMPLATE = (
    "{% for m in messages %}<|{{ m['role'] }}|>\n{{ m['content'] }}\n{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>\n{% endif %}"
)


def corpus(seed: int, lines: int = 2000) -> list[str]:
    """Deterministic training text: seeded word salad plus digits and punctuation."""
    rng = random.Random(seed)
    out = []
    for i in range(lines):
        words = [rng.choice(_WORDS) for _ in range(rng.randint(4, 16))]
        out.append(f"{i} " + " ".join(words) + rng.choice([".", ",", "?", "!", ":", ";"]))
    return out


def train_tokenizer(seed: int):
    """A byte-level BPE trained on `corpus(seed)`: any UTF-8 text encodes, vocab fixed."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB_SIZE,
        special_tokens=[EOS],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(corpus(seed), trainer=trainer)
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token=EOS, pad_token=EOS)
    fast.chat_template = _CHAT_TEMPLATE
    return fast


def mtp_tensors(weights: dict, config, seed: int) -> dict:
    """Qwen3-Next's MTP weights, seeded: names and shapes as vLLM's Qwen3NextMTP loads them.

    The MTP decoder layer is a full-attention MoE layer: its tensors have the names and
    shapes of the main model's first full-attention layer, under `mtp.layers.0.`. Norm
    weights start at zero, as Qwen3-Next's zero-centred RMSNorm initialises them
    (scale 1 + w); every matrix is normal(0, initializer_range) from its own generator, so
    adding the layer leaves the main model's weights as they were.
    """
    import torch

    layer = config.layer_types.index("full_attention")
    source = f"model.layers.{layer}."
    hidden = config.hidden_size
    shapes = {
        f"{MTP_PREFIX}layers.0.{name[len(source) :]}": tuple(t.shape)
        for name, t in weights.items()
        if name.startswith(source)
    }
    shapes[f"{MTP_PREFIX}fc.weight"] = (hidden, 2 * hidden)
    for norm in ("norm", "pre_fc_norm_hidden", "pre_fc_norm_embedding"):
        shapes[f"{MTP_PREFIX}{norm}.weight"] = (hidden,)
    generator = torch.Generator().manual_seed(seed + 1)
    out = {}
    for name in sorted(shapes):
        if name.endswith("norm.weight"):
            out[name] = torch.zeros(shapes[name], dtype=torch.bfloat16)
        else:
            values = torch.randn(shapes[name], generator=generator) * config.initializer_range
            out[name] = values.to(torch.bfloat16)
    # fc maps [embedding of the next token; hidden state] to the layer's input. Passing
    # the (normed) embedding straight through makes the layer draft what follows that
    # token on its own, which is often what the main model decodes too: some drafts are
    # accepted, so the accepted-draft path of align mode runs, not only the rejections.
    fc = torch.zeros(shapes[f"{MTP_PREFIX}fc.weight"])
    fc[:, :hidden] = torch.eye(hidden)
    out[f"{MTP_PREFIX}fc.weight"] = fc.to(torch.bfloat16)
    return out


def add_mtp_layer(weights_file: Path, config, seed: int) -> int:
    """Add the MTP layer to the saved weights; its parameter count."""
    from safetensors.torch import load_file, save_file

    weights = load_file(weights_file)
    mtp = mtp_tensors(weights, config, seed)
    save_file({**weights, **mtp}, weights_file, metadata={"format": "pt"})
    return sum(t.numel() for t in mtp.values())


def give_state_weight(model) -> None:
    """Make the output depend on the recurrent state, as a trained model's does.

    With transformers' initialisation the Gated DeltaNet layers forget at once (A_log
    around 2 with dt_bias 1 decays the state by ~1e-4 per token) and every layer's output
    is small next to the embedding, so a state lost at a block boundary changed almost
    no token, and a check of the output could not tell a spoiled state from a right one.
    Here the heads of each GDN layer keep their state for ~1 to ~60 tokens (A_log -4.5 to
    -1, decay per token 0.98 to 0.6), and the GDN output projections and the LM head are
    5x: a spoiled state moves the logits by nats, not hundredths.
    """
    import torch

    with torch.no_grad():
        for layer in model.model.layers:
            gdn = getattr(layer, "linear_attn", None)
            if gdn is None:
                continue
            heads = gdn.A_log.shape[0]
            gdn.A_log.copy_(torch.linspace(-4.5, -1.0, heads, dtype=gdn.A_log.dtype))
            gdn.out_proj.weight.mul_(STATE_GAIN)
        model.lm_head.weight.mul_(STATE_GAIN)


def build(out_dir: Path, seed: int = 0, mtp: bool = True) -> Path:
    """Write config, bf16 safetensors and tokenizer to OUT_DIR (created, must be empty).

    Without MTP the weights lack the `mtp.*` layer while config.json still declares it
    (`num_nextn_predict_layers: 1`), as a quantized export that dropped it does: what
    `arcvllm model check` must refuse for the MTP preset."""
    out_dir = Path(out_dir)
    if out_dir.exists() and any(out_dir.iterdir()):
        raise UsageError(f"{out_dir} exists and is not empty")
    import torch
    from transformers import Qwen3NextConfig, Qwen3NextForCausalLM

    tokenizer = train_tokenizer(seed)
    eos_id = tokenizer.convert_tokens_to_ids(EOS)
    config = Qwen3NextConfig(
        **CONFIG,
        architectures=["Qwen3NextForCausalLM"],
        bos_token_id=eos_id,
        eos_token_id=eos_id,
        pad_token_id=eos_id,
        dtype="bfloat16",
    )
    torch.manual_seed(seed)
    model = Qwen3NextForCausalLM(config).to(torch.bfloat16).eval()
    give_state_weight(model)
    out_dir.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out_dir, safe_serialization=True)
    mtp_parameters = add_mtp_layer(out_dir / "model.safetensors", config, seed) if mtp else 0
    tokenizer.save_pretrained(out_dir)
    # Generation defaults in the model folder would change vLLM's sampling defaults.
    (out_dir / "generation_config.json").unlink(missing_ok=True)
    (out_dir / "arcvllm-tinymodel.json").write_text(
        json.dumps(
            {
                "seed": seed,
                "served_model_name": SERVED_NAME,
                "parameters": model.num_parameters(),
                "mtp_parameters": mtp_parameters,
            },
            indent=2,
        )
        + "\n"
    )
    # save_pretrained writes the weights 0600; an image built as root serves as another user.
    for path in out_dir.iterdir():
        path.chmod(0o644)
    return out_dir


def build_here(out_dir: Path, seed: int = 0, mtp: bool = True) -> Path:
    """`build`, where torch and transformers are (the vLLM environment); Unavailable in one
    line where they are not."""
    try:
        import torch  # noqa: F401
        import transformers  # noqa: F401
    except ModuleNotFoundError as exc:
        raise Unavailable(
            f"`tinymodel build` needs the vLLM environment ({exc.name} is missing)"
        ) from exc
    return build(out_dir, seed=seed, mtp=mtp)


def summary(path: Path) -> dict:
    """The folder of a model `build` wrote, with its summary (seed, served name, size)."""
    return {"dir": str(path), **json.loads((path / "arcvllm-tinymodel.json").read_text())}
