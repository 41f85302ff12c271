"""The headline numbers of a bench run, and their ratios to the preset's reference figures
(configs/reference/NAME.yaml)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from arcvllm.client.stats import percentile
from arcvllm.paths import configs_dir


def summary_metrics(report: Mapping[str, Any]) -> dict[str, float | None]:
    """The headline numbers, under the names configs/reference/*.yaml use."""
    vb = report.get("vllm_bench", {})
    prefix = report.get("prefix_cache", {})
    rates = [s.get("decode_tok_s") for s in report.get("boundary", {}).get("streams", [])]
    rates = [r for r in rates if r]
    return {
        "decode_tok_s": percentile(rates, 50),
        "prefill_tok_s": prefix.get("prefill_tok_s"),
        "output_throughput_tok_s": vb.get("output_throughput"),
        "ttft_ms_p50": vb.get("p50_ttft_ms"),
        "ttft_ms_p99": vb.get("p99_ttft_ms"),
        "itl_ms_p50": vb.get("p50_itl_ms"),
        "itl_ms_p99": vb.get("p99_itl_ms"),
        "itl_ms_boundary_p50": report.get("boundary", {}).get("itl_ms_boundary_p50"),
        "itl_ms_other_p50": report.get("boundary", {}).get("itl_ms_other_p50"),
        "prefix_ttft_cold_ms": prefix.get("ttft_ms_cold"),
        "prefix_ttft_warm_ms": prefix.get("ttft_ms_warm"),
        "prefix_cache_hit_rate": prefix.get("warm_hit_rate"),
        "spec_acceptance_rate": (report.get("speculation") or {}).get("acceptance_rate"),
        "spec_mean_accepted_length": (report.get("speculation") or {}).get("mean_accepted_length"),
        "spec_speedup": (report.get("compare") or {}).get("speedup"),
    }


def ratio_rows(measured: Mapping[str, Any], reference: Mapping[str, Any]) -> list[dict[str, Any]]:
    """measured / reference for every metric both have; a [lo, hi] range gives two ratios."""
    rows = []
    for key, ref in reference.items():
        value = measured.get(key)
        if value is None:
            continue
        if isinstance(ref, list | tuple):
            lo, hi = float(ref[0]), float(ref[1])
            ratio = f"{value / hi:.2f}-{value / lo:.2f}" if lo and hi else "-"
            ref_text = f"{lo:g}-{hi:g}"
        else:
            ratio = f"{value / float(ref):.2f}" if ref else "-"
            ref_text = f"{float(ref):g}"
        rows.append(
            {
                "metric": key,
                "measured": round(float(value), 3),
                "reference": ref_text,
                "ratio": ratio,
            }
        )
    return rows


def load_reference(name: str) -> dict[str, Any] | None:
    import yaml

    path = configs_dir() / "reference" / f"{name}.yaml"
    return yaml.safe_load(path.read_text()) if path.exists() else None
