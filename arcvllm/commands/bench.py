"""`arcvllm bench` and `bench replot`: the benchmark of a running server (arcvllm.bench)."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from arcvllm.bench import session
from arcvllm.options import add_json, add_server, url

DESCRIPTION = """\
vLLM's own `vllm bench serve`, plus what it does not measure for hybrids: inter-token
latency on the decode steps that cross a mamba block boundary against all other steps,
and the prefix cache on a long shared prefix (TTFT cold vs warm, hit rate from the
server's counters). Writes bench.json, bench.png (latency over position, boundaries
marked) and vLLM's own result into --out, with ratios against the preset's reference
figures (configs/reference/)."""


def _cmd_bench(args: argparse.Namespace) -> int:
    opts = session.BenchOptions.from_args(args)
    report = session.bench(opts)
    png = opts.out / session.REPORT_PNG
    if opts.as_json:
        print(json.dumps(report, indent=2))
        return 0
    print(session.format_report(report))
    print(f"wrote {opts.out / session.REPORT_JSON}" + (f" and {png}" if png.exists() else ""))
    return 0


def _cmd_replot(args: argparse.Namespace) -> int:
    png = session.replot(Path(args.path))
    print(json.dumps({"png": str(png)}) if args.json else f"wrote {png}")
    return 0


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "bench",
        help="benchmark a running server: vllm bench serve + block crossings + prefix cache",
        description=DESCRIPTION,
    )
    add_server(p, required=False)
    p.add_argument("--model", help="served model name (default: the preset's, else the only one)")
    p.add_argument("--preset", help="preset the server runs: compares with its reference")
    p.add_argument("--out", default="reports/bench", help="folder for JSON, PNG and logs")
    add_json(p, help="print bench.json on stdout instead of the table (progress on stderr)")
    p.add_argument("--tokenizer", help="model folder for vllm bench (default: the preset's)")
    p.add_argument(
        "--vllm-python", help="Python that carries vLLM for `vllm bench serve` (default: this one)"
    )
    p.add_argument(
        "--block-size",
        type=int,
        help="override the block size read from the server (its /metrics, else its log)",
    )
    logs = p.add_mutually_exclusive_group()
    logs.add_argument(
        "--log-file", help="the server's log file (its block size, if not on /metrics)"
    )
    logs.add_argument("--log-cmd", help="command printing the server log, e.g. 'docker logs X'")
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
