"""`arcvllm bench`: one run against a server (JSON, PNG, table), and `bench replot`."""

from __future__ import annotations

import argparse
import json
import os
import random
import subprocess
import sys
import time
from collections.abc import Mapping
from dataclasses import asdict
from pathlib import Path
from typing import Any

from arcvllm.bench.measurements import (
    compare_speculation,
    measure_boundaries,
    measure_prefix,
    speculation_summary,
    token_steps,
)
from arcvllm.bench.plot import plot_report
from arcvllm.bench.reference import load_reference, ratio_rows, summary_metrics
from arcvllm.bench.runner import VLLM_BENCH_KEYS, run_vllm_bench, vllm_bench_args
from arcvllm.errors import ArcvllmError
from arcvllm.options import add_json, add_server, url
from arcvllm.server.client import Client

REPORT_JSON = "bench.json"
REPORT_PNG = "bench.png"
DESCRIPTION = """\
vLLM's own `vllm bench serve`, plus what it does not measure for hybrids: inter-token
latency on the decode steps that cross a mamba block boundary against all other steps,
and the prefix cache on a long shared prefix (TTFT cold vs warm, hit rate from the
server's counters). Writes bench.json, bench.png (latency over position, boundaries
marked) and vLLM's own result into --out, with ratios against the preset's reference
figures (configs/reference/)."""


def resolve_tokenizer(tokenizer: str | None, preset_model: str | None, model: str) -> str:
    for candidate in (tokenizer, preset_model, model):
        if candidate and Path(candidate).exists():
            return candidate
    raise ArcvllmError(
        "vllm bench needs the model's tokenizer on this machine: pass --tokenizer PATH "
        "(the model folder)",
        2,
    )


def bench(args: argparse.Namespace) -> dict[str, Any]:
    python = args.vllm_python or sys.executable
    probe = subprocess.run([python, "-c", "import vllm"], capture_output=True, timeout=300)
    if probe.returncode != 0:
        raise ArcvllmError(
            f"{python} cannot import vllm: run `arcvllm bench` inside the image, "
            "or pass --vllm-python PYTHON",
            3,
        )
    preset = None
    if args.preset:
        from arcvllm.presets import get_preset

        preset = get_preset(args.preset)
    model = args.model or (preset.served_model_name if preset else None)
    if not model:
        raise ArcvllmError("name the served model: --model NAME or --preset NAME", 2)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / REPORT_PNG).unlink(missing_ok=True)  # never leave an older run's plot beside
    import httpx

    client = Client(
        args.base_url, args.api_key, timeout=600.0, ca_cert=str(args.ca_cert or "") or None
    )
    root = client.root
    try:
        max_len = client.max_model_len(model)
    except httpx.HTTPError as exc:
        raise ArcvllmError(f"cannot reach {root}/v1/models: {exc}", 3) from exc
    block = args.block_size
    if block is None:
        from arcvllm.server.metrics import block_size

        block = block_size(client.metrics())
    if not block:
        raise ArcvllmError(
            f"cannot determine the block size from {root}/metrics; pass --block-size N "
            "(the server logs 'Setting attention block size to N tokens')",
            3,
        )
    tokenizer = resolve_tokenizer(args.tokenizer, preset.model if preset else None, model)
    from arcvllm.server import metrics as m

    spec_before = m.spec_decode(client.metrics(), model)
    rng = random.Random(args.seed if args.seed is not None else time.time_ns())

    input_len = min(args.input_len, max_len - args.output_len - 1)
    env = dict(os.environ)
    if args.api_key:
        env["OPENAI_API_KEY"] = args.api_key
    say = (lambda *a: print(*a, file=sys.stderr)) if args.json else print
    say(f"arcvllm bench: {model} at {root}, block {block}, max-model-len {max_len}")
    say(f"  vllm bench serve: {args.num_prompts} prompts, {input_len} in / {args.output_len} out")
    vb = run_vllm_bench(
        python,
        vllm_bench_args(
            root,
            model,
            tokenizer,
            out,
            input_len,
            args.output_len,
            args.num_prompts,
            args.concurrency,
            seed=rng.randrange(1 << 30),
        ),
        out,
        env,
    )
    say(f"  block crossings: {args.runs} streams x {args.crossings} boundaries")
    streams, boundary = measure_boundaries(
        client, model, block, max_len, args.crossings, args.runs, rng
    )
    boundary["streams"] = [
        {
            "prompt_len": s.prompt_len,
            "tokens": s.tokens,
            "ttft_ms": s.ttft * 1000,
            "decode_tok_s": s.decode_tok_s(),
        }
        for s in streams
    ]
    say(f"  prefix cache: {args.runs} cold/warm pairs")
    prefix = measure_prefix(
        client, model, block, max_len, args.runs, rng, speculative=spec_before is not None
    )
    spec_after = m.spec_decode(client.metrics(), model) if spec_before else None
    compare = None
    if args.plain_url:
        say(f"  speculative vs plain ({args.plain_url}): {args.runs} streams each, same prompts")
        plain = Client(
            args.plain_url, args.api_key, timeout=600.0, ca_cert=str(args.ca_cert or "") or None
        )
        try:
            plain.max_model_len(model)
        except httpx.HTTPError as exc:
            raise ArcvllmError(f"cannot reach {plain.root}/v1/models: {exc}", 3) from exc
        compare = compare_speculation(
            client, plain, model, block, max_len, args.crossings, args.runs, rng
        )
    report: dict[str, Any] = {
        "model": model,
        "preset": preset.name if preset else None,
        "base_url": root,
        "block_size": block,
        "max_model_len": max_len,
        "vllm_bench": {k: vb.get(k) for k in VLLM_BENCH_KEYS},
        "boundary": boundary,
        "prefix_cache": prefix,
        # The server's own counters over the whole bench (None: it does not speculate).
        "speculation": speculation_summary(
            spec_after - spec_before if spec_before and spec_after else None
        ),
        "compare": compare,
        "runs": [[asdict(s) for s in token_steps(st, block)] for st in streams],
    }
    report["summary"] = summary_metrics(report)
    reference = load_reference(preset.reference) if preset and preset.reference else None
    if reference:
        report["reference"] = {
            "name": reference.get("name"),
            "source": reference.get("source"),
            "rows": ratio_rows(report["summary"], reference.get("metrics", {})),
        }
    (out / REPORT_JSON).write_text(json.dumps(report, indent=2))
    try:
        plot_report(report, out / REPORT_PNG)
    except ArcvllmError as exc:  # no matplotlib here: the JSON is enough to draw it elsewhere
        print(
            f"arcvllm: warning: no plot ({exc}); draw it elsewhere with "
            f"`arcvllm bench replot {out / REPORT_JSON}`",
            file=sys.stderr,
        )
    return report


def format_report(report: Mapping[str, Any]) -> str:
    from arcvllm.text import columns

    def fmt(v):
        return "-" if v is None else (f"{v:.3g}" if isinstance(v, float) else str(v))

    lines = [columns([("METRIC", "VALUE"), *((k, fmt(v)) for k, v in report["summary"].items())])]
    b = report["boundary"]
    lines.append(
        f"block-boundary steps: {b['boundary_steps']} (p50 {fmt(b['itl_ms_boundary_p50'])} ms) "
        f"vs other steps: {b['other_steps']} (p50 {fmt(b['itl_ms_other_p50'])} ms)"
    )
    spec = report.get("speculation")
    if spec:
        lines.append(
            f"speculation (server counters, whole bench): {fmt(spec['accepted_tokens'])} of "
            f"{fmt(spec['draft_tokens'])} drafted tokens accepted "
            f"({fmt(spec['acceptance_rate'])}), mean accepted length "
            f"{fmt(spec['mean_accepted_length'])}"
        )
    compare = report.get("compare")
    if compare:
        rows = [("SERVER", "DECODE TOK/S", "ITL P50 MS", "ITL P90 MS", "ITL P99 MS")]
        for name in ("plain", "speculative"):
            d = compare[name]
            rows.append(
                (name, fmt(d["decode_tok_s"]), fmt(d["itl_ms_p50"]), fmt(d["itl_ms_p90"]),
                 fmt(d["itl_ms_p99"]))
            )  # fmt: skip
        acc = compare.get("acceptance") or {}
        lines.append(
            f"\nspeculative vs plain, same {compare['runs']} prompts x "
            f"{compare['decode_tokens']} tokens (one stream at a time):"
        )
        lines.append(columns(rows))
        lines.append(
            f"speedup {fmt(compare['speedup'])}; acceptance {fmt(acc.get('acceptance_rate'))}, "
            f"mean accepted length {fmt(acc.get('mean_accepted_length'))}; identical outputs "
            f"{compare['same_tokens']} of {compare['runs']}"
        )
    ref = report.get("reference")
    if ref:
        lines.append(f"\nagainst {ref['name']} ({ref['source']}):")
        lines.append(
            columns(
                [
                    ("METRIC", "MEASURED", "REFERENCE", "RATIO"),
                    *(
                        (r["metric"], fmt(r["measured"]), r["reference"], r["ratio"])
                        for r in ref["rows"]
                    ),
                ]
            )
        )
    return "\n".join(lines)


def _cmd_bench(args: argparse.Namespace) -> int:
    if not args.base_url:
        raise ArcvllmError("name the server: --base-url URL", 2)
    report = bench(args)
    png = Path(args.out) / REPORT_PNG
    if args.json:
        print(json.dumps(report, indent=2))
        return 0
    print(format_report(report))
    print(f"wrote {Path(args.out) / REPORT_JSON}" + (f" and {png}" if png.exists() else ""))
    return 0


def _cmd_replot(args: argparse.Namespace) -> int:
    source = Path(args.path)
    try:
        report = json.loads(source.read_text())
        missing = [k for k in ("runs", "model", "block_size") if k not in report]
    except (OSError, ValueError, TypeError) as exc:
        raise ArcvllmError(f"cannot read {source} as a bench.json: {exc}", 2) from exc
    if missing:
        raise ArcvllmError(f"cannot read {source} as a bench.json: no {', '.join(missing)}", 2)
    png = source.with_suffix(".png")
    plot_report(report, png)
    print(json.dumps({"png": str(png)}) if args.json else f"wrote {png}")
    return 0


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "bench",
        help="benchmark a running server: vllm bench serve + block crossings + prefix cache",
        description=DESCRIPTION,
    )
    add_server(p, required=False)
    p.add_argument("--model", help="served model name (default: the preset's)")
    p.add_argument("--preset", help="preset the server runs: compares with its reference")
    p.add_argument("--out", default="reports/bench", help="folder for JSON, PNG and logs")
    add_json(p, help="print bench.json on stdout instead of the table (progress on stderr)")
    p.add_argument("--tokenizer", help="model folder for vllm bench (default: the preset's)")
    p.add_argument(
        "--vllm-python", help="Python that carries vLLM for `vllm bench serve` (default: this one)"
    )
    p.add_argument("--block-size", type=int, help="override the block size read from /metrics")
    p.add_argument("--input-len", type=int, default=512, help="vllm bench prompt tokens")
    p.add_argument("--output-len", type=int, default=128, help="vllm bench output tokens")
    p.add_argument("--num-prompts", type=int, default=8)
    p.add_argument("--concurrency", type=int, default=1, help="vllm bench max concurrency")
    p.add_argument("--crossings", type=int, default=3, help="block boundaries per decode run")
    p.add_argument("--runs", type=int, default=2, help="decode runs and cold/warm pairs")
    p.add_argument("--seed", type=int, help="prompt seed (default: fresh, so cold is cold)")
    p.add_argument(
        "--plain-url",
        type=url,
        metavar="URL",
        help="a plain (non-speculative) server of the same model: decode the same prompts on "
        "it and on --base-url (speculative) and compare tokens/s, ITL and acceptance",
    )
    p.set_defaults(func=_cmd_bench)
    sub = p.add_subparsers(dest="bench_command", metavar="replot", title="subcommand")
    replot = sub.add_parser(
        "replot",
        help="only draw the PNG of an earlier bench.json (next to it)",
        description="Draw bench.png from a bench.json written elsewhere (e.g. in an image "
        "without matplotlib); the PNG is written next to the JSON.",
    )
    replot.add_argument("path", metavar="PATH", help="a bench.json")
    add_json(replot, help='print {"png": PATH} instead of a line')
    replot.set_defaults(func=_cmd_replot)
