"""The CPU image's output held against an independent implementation of its model.

`arcvllm verify` judges a server by the same server (its plain prefill is the oracle of its
other paths), so a defect common to every path passes it. Here the CPU image serves the
tiny hybrid model, greedy, over natural text (the verify corpus's English prose, Python and
German), and transformers' own Qwen3-Next code, run by the same image's Python as a
separate process (tests/support/reference_model.py), scores every token the server chose.
Healthy, every token is the reference's choice or a near-tie; with the MoE output doubled in
prefill and decode alike (the sabotage plugin's `moe-scale:2`, which no verify row can
see: every path shares it, so every path agrees with every other), the reference catches
it. The sweep of the factor is a measurement (marker bench), not part of make test;
docs/verify.md has its figures.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from support import ROOT
from support.docker import docker
from support.measured import measured
from support.processes import free_port
from support.reference import judge, score_in_image

from arcvllm.client.api import Client, WaitTimeout
from arcvllm.verify.prompts import passages

pytestmark = [pytest.mark.docker, pytest.mark.server]

MODEL = "tiny-hybrid"
MODEL_DIR = "/opt/arcvllm/models/tiny-hybrid"
# The corpus's passages the prompts come from: English prose, Python, German prose.
PASSAGES = ("01-harbour.txt", "02-median.py.txt", "04-werkstatt.txt")
PROMPT_CHARS = 400
DECODE = 160  # tokens after each prompt: past the first block boundary of a 128-token block


class Served:
    def __init__(self, image: str, folder: Path) -> None:
        folder.chmod(0o755)  # the image's user (UID 1000) reads the defect file
        self.defect = folder / "defect"
        self.defect.write_text("")
        self.defect.chmod(0o644)
        port = free_port()
        sabotage = ROOT / "tests" / "support" / "sabotage"
        self.cid = docker(
            *("run", "-d", "-p", f"127.0.0.1:{port}:8000", "--shm-size", "1g"),
            *("-v", f"{sabotage}:/opt/arcvllm-sabotage:ro", "-v", f"{folder}:/opt/defect:ro"),
            *("-e", "PYTHONPATH=/opt/arcvllm-sabotage"),
            *("-e", "ARCVLLM_SABOTAGE_FILE=/opt/defect/defect"),
            image,
        ).stdout.strip()
        self.image = image
        self.client = Client(f"http://127.0.0.1:{port}", None, timeout=600)

    def sequences(self, defect: str = "") -> tuple[list[dict], list[list[float]]]:
        """Greedy continuations of the prompts under DEFECT: (prompt + tokens, logprobs)."""
        self.defect.write_text(defect)
        try:
            seqs, lps = [], []
            texts = {p.name: p.text for p in passages()}
            for name in PASSAGES:
                prompt = self.client.tokenize(MODEL, texts[name][:PROMPT_CHARS])
                body = {
                    "model": MODEL, "prompt": prompt, "max_tokens": DECODE, "temperature": 0,
                    "ignore_eos": True, "logprobs": 1, "return_tokens_as_token_ids": True,
                }  # fmt: skip
                choice = self.client.completion(body)["choices"][0]
                tokens = [int(t.split(":")[1]) for t in choice["logprobs"]["tokens"]]
                assert len(tokens) == DECODE, choice
                seqs.append({"ids": prompt + tokens, "prompt_len": len(prompt)})
                lps.append(choice["logprobs"]["token_logprobs"])
            return seqs, lps
        finally:
            self.defect.write_text("")

    def judged(self, defect: str = ""):
        seqs, lps = self.sequences(defect)
        return judge(lps, score_in_image(self.image, MODEL_DIR, seqs))

    def logs(self) -> str:
        done = docker("logs", self.cid, check=False, timeout=60)
        return done.stdout + done.stderr


@pytest.fixture(scope="module")
def served(cpu_image, tmp_path_factory):
    server = Served(cpu_image, tmp_path_factory.mktemp("reference"))
    try:
        try:
            server.client.wait_healthy(600, 2)
        except WaitTimeout as exc:
            pytest.fail(f"{exc}\n{server.logs()[-4000:]}")
        yield server
    finally:
        docker("rm", "-f", "-v", server.cid, check=False)


def test_the_images_tokens_are_the_references_on_natural_text(served):
    verdict = served.judged()
    measured(f"reference, healthy: {verdict.line()}")
    assert verdict.ok, verdict.line()


def test_a_defect_common_to_prefill_and_decode_is_caught_by_the_reference(served):
    verdict = served.judged("moe-scale:2")
    measured(f"reference, moe-scale:2: {verdict.line()}")
    assert "arcvllm sabotage: moe-scale" in served.logs()
    assert not verdict.ok, verdict.line()


@pytest.mark.bench
def test_the_smallest_moe_scale_the_reference_catches_is_measured(served):
    """Measured, not asserted beyond the largest: the factor each judge first catches
    (`pytest -m bench` on this module; its figures are in docs/verify.md)."""
    lines = []
    for factor in (1.1, 1.25, 1.5):
        verdict = served.judged(f"moe-scale:{factor}")
        lines.append(f"moe-scale:{factor}: {'caught' if not verdict.ok else 'passed'}: "
                     f"{verdict.line()}")  # fmt: skip
    measured("reference sweep\n  " + "\n  ".join(lines))
    assert "caught" in lines[-1], lines
