"""The reference: transformers' own implementation of a checkpoint, run on the CPU, scoring
token sequences a vLLM server produced. Independent of the server: other code for every
layer (transformers' Qwen3-Next modelling, its GatedDeltaNet in plain torch, its MoE), one
forward over each whole sequence (no blocks, no chunks, no carried state, no cache).

Run by the Python of the image under test (its transformers and torch are the CPU lock's
pins): `python3 reference_model.py MODEL_DIR < sequences.json`. Input: a JSON list of
{"ids": [...], "prompt_len": N}; output: one JSON line, per sequence the score of each
token after the prompt: {"lp": the reference's log-probability of that token, "rank": how
many tokens it puts above it, "top_lp": its best log-probability}.
"""

from __future__ import annotations

import json
import sys


def main() -> None:
    import torch
    import transformers

    model = transformers.AutoModelForCausalLM.from_pretrained(sys.argv[1], dtype="auto")
    model.eval()
    scored = []
    with torch.no_grad():
        for seq in json.load(sys.stdin):
            ids = seq["ids"]
            logprobs = torch.log_softmax(model(torch.tensor([ids])).logits[0].float(), dim=-1)
            rows = []
            for i in range(seq["prompt_len"], len(ids)):
                row = logprobs[i - 1]
                lp = row[ids[i]]
                rows.append(
                    {
                        "lp": lp.item(),
                        "rank": int((row > lp).sum()),
                        "top_lp": row.max().item(),
                    }
                )
            scored.append(rows)
    print(json.dumps(scored))


if __name__ == "__main__":
    main()
