"""Read what a vLLM server says about itself on `/metrics`.

The Prometheus text format is parsed with prometheus_client's own parser, never with
regular expressions. The parse is pure (text in, values out) so the smoke test and the
bench share it and unit tests feed it recorded text; the scrape itself is
arcvllm.client.api.Client.metrics.
"""

from __future__ import annotations

from dataclasses import dataclass

PREFIX_HITS = "vllm:prefix_cache_hits"
PREFIX_QUERIES = "vllm:prefix_cache_queries"
CACHE_CONFIG = "vllm:cache_config_info"


@dataclass(frozen=True)
class Sample:
    name: str
    labels: dict[str, str]
    value: float


@dataclass(frozen=True)
class Metrics:
    """One scrape of `/metrics`: every sample, flat."""

    samples: tuple[Sample, ...]

    @classmethod
    def parse(cls, text: str) -> Metrics:
        from prometheus_client.parser import text_string_to_metric_families

        return cls(
            tuple(
                Sample(s.name, dict(s.labels), float(s.value))
                for family in text_string_to_metric_families(text)
                for s in family.samples
            )
        )

    def select(self, name: str, **labels: str) -> list[Sample]:
        """Samples called NAME (a counter also matches as NAME_total) with these labels."""
        names = {name, f"{name}_total"}
        return [
            s
            for s in self.samples
            if s.name in names and all(s.labels.get(k) == v for k, v in labels.items())
        ]

    def has(self, name: str) -> bool:
        return bool(self.select(name))

    def total(self, name: str, **labels: str) -> float:
        """Sum over all matching samples (e.g. over engines); 0.0 when there are none."""
        return sum(s.value for s in self.select(name, **labels))

    def info(self, name: str) -> dict[str, str] | None:
        """Labels of an info-style gauge (value 1, data in labels), or None if absent."""
        found = self.select(name)
        return dict(found[0].labels) if found else None


@dataclass(frozen=True)
class PrefixCache:
    hits: float
    queries: float

    def __sub__(self, other: PrefixCache) -> PrefixCache:
        return PrefixCache(self.hits - other.hits, self.queries - other.queries)


def prefix_cache(metrics: Metrics, model: str | None = None) -> PrefixCache:
    """Cumulative prefix-cache hits and queries, in tokens (diff two scrapes for one request)."""
    labels = {"model_name": model} if model else {}
    return PrefixCache(
        metrics.total(PREFIX_HITS, **labels), metrics.total(PREFIX_QUERIES, **labels)
    )


def block_size(metrics: Metrics) -> int | None:
    """The block size the server really uses for its KV and mamba pages, if it says so.

    `effective_attention_block_size` is the value after hybrid-model alignment; the
    `mamba_block_size` label is not reliable (it read 16 while every group used 128).
    """
    labels = metrics.info(CACHE_CONFIG) or {}
    value = labels.get("effective_attention_block_size") or ""
    return int(value) if value.isdigit() and int(value) > 0 else None


def kv_tokens(metrics: Metrics) -> int | None:
    """How many tokens the server's KV cache holds (`kv_cache_size_tokens`), if it says."""
    value = (metrics.info(CACHE_CONFIG) or {}).get("kv_cache_size_tokens") or ""
    return int(value) if value.isdigit() and int(value) > 0 else None


SPEC_DRAFTS = "vllm:spec_decode_num_drafts"
SPEC_DRAFT_TOKENS = "vllm:spec_decode_num_draft_tokens"
SPEC_ACCEPTED = "vllm:spec_decode_num_accepted_tokens"


@dataclass(frozen=True)
class SpecDecode:
    """Cumulative speculative-decoding counters: verification steps that had drafts,
    tokens drafted, drafted tokens accepted (diff two scrapes for one run)."""

    drafts: float
    draft_tokens: float
    accepted: float

    def __sub__(self, other: SpecDecode) -> SpecDecode:
        return SpecDecode(
            self.drafts - other.drafts,
            self.draft_tokens - other.draft_tokens,
            self.accepted - other.accepted,
        )

    @property
    def acceptance_rate(self) -> float | None:
        """Accepted / drafted tokens (vLLM's "Avg Draft acceptance rate")."""
        return self.accepted / self.draft_tokens if self.draft_tokens else None

    @property
    def mean_accepted_length(self) -> float | None:
        """Tokens a verification step yields: 1 + accepted drafts per step (vLLM's
        "Mean acceptance length", vllm/v1/spec_decode/metrics.py)."""
        return 1 + self.accepted / self.drafts if self.drafts else None


def spec_decode(metrics: Metrics, model: str | None = None) -> SpecDecode | None:
    """The server's speculative-decoding counters; None when it does not speculate (vLLM
    registers them only with a speculative config)."""
    if not metrics.has(SPEC_DRAFTS):
        return None
    labels = {"model_name": model} if model else {}
    return SpecDecode(
        metrics.total(SPEC_DRAFTS, **labels),
        metrics.total(SPEC_DRAFT_TOKENS, **labels),
        metrics.total(SPEC_ACCEPTED, **labels),
    )
