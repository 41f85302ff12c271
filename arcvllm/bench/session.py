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
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Any

from arcvllm.bench.measurements import (
    bulk_note,
    bulk_share,
    compare_speculation,
    in_bulk,
    measure_boundaries,
    measure_prefix,
    speculation_summary,
    token_steps,
)
from arcvllm.bench.plot import plot_report
from arcvllm.bench.reference import load_reference, ratio_rows, summary_metrics
from arcvllm.bench.runner import VLLM_BENCH_KEYS, run_vllm_bench, vllm_bench_args
from arcvllm.client.api import Client, Stream
from arcvllm.client.discovery import Served, discover, served_model
from arcvllm.client.server import ServerOptions
from arcvllm.errors import ArcvllmError, Unavailable, UsageError

REPORT_JSON = "bench.json"
REPORT_PNG = "bench.png"


def resolve_tokenizer(tokenizer: str | None, preset_model: str | None, model: str) -> str:
    for candidate in (tokenizer, preset_model, model):
        if candidate and Path(candidate).exists():
            return candidate
    raise UsageError(
        "vllm bench needs the model's tokenizer on this machine: pass --tokenizer PATH "
        "(the model folder)"
    )


@dataclass(frozen=True)
class BenchOptions(ServerOptions):
    """What `arcvllm bench` was asked; `from_args` is the one place it is read from argparse."""

    out: Path = Path("reports/bench")
    as_json: bool = False  # bench.json on stdout, progress on stderr
    tokenizer: str | None = None
    vllm_python: str | None = None
    block_size: int | None = None
    input_len: int = 512
    output_len: int = 128
    num_prompts: int = 8
    concurrency: int = 1
    crossings: int = 3
    runs: int = 2
    seed: int | None = None
    plain_url: str | None = None

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> BenchOptions:
        if not args.base_url:
            raise UsageError("name the server: --base-url URL")
        # the fields argparse names alike (its dest is the field's name), then the others
        same = {f.name: getattr(args, f.name) for f in fields(cls) if hasattr(args, f.name)}
        return cls(**same | cls.server_fields(args) | {"out": Path(args.out), "as_json": args.json})

    def client(self, url: str) -> Client:
        return Client(url, self.api_key, timeout=600.0, ca_cert=self.ca_cert)

    def say(self, line: str) -> None:
        """Progress: on stdout, or on stderr when stdout carries the JSON."""
        print(line, file=sys.stderr if self.as_json else sys.stdout)


def vllm_python(python: str | None) -> str:
    """PYTHON (default: this one), which must import vllm for `vllm bench serve`."""
    python = python or sys.executable
    probe = subprocess.run([python, "-c", "import vllm"], capture_output=True, timeout=300)
    if probe.returncode != 0:
        raise Unavailable(
            f"{python} cannot import vllm: run `arcvllm bench` inside the image, "
            "or pass --vllm-python PYTHON"
        )
    return python


def bench(opts: BenchOptions) -> dict[str, Any]:
    """One run against the server of OPTS: the report, also written to OPTS.out.

    What the operator named wrongly (model, preset, key, tokenizer) stops it before the
    environment is asked for vLLM, and before anything is written.
    """
    from arcvllm.presets import get_preset

    preset = get_preset(opts.preset) if opts.preset else None
    client = opts.client(opts.base_url)
    served = discover(client, opts.model, opts.preset, opts.block_size, opts.log)
    plain = plain_server(opts, client, served.model) if opts.plain_url else None
    tokenizer = resolve_tokenizer(opts.tokenizer, preset.model if preset else None, served.model)
    python = vllm_python(opts.vllm_python)
    opts.out.mkdir(parents=True, exist_ok=True)
    (opts.out / REPORT_PNG).unlink(missing_ok=True)  # never leave an older run's plot beside
    rng = random.Random(opts.seed if opts.seed is not None else time.time_ns())
    report: dict[str, Any] = {
        "model": served.model,
        "preset": preset.name if preset else None,
        "base_url": client.root,
        "block_size": served.block_size,
        "max_model_len": served.max_model_len,
        **measure(opts, client, served, python, tokenizer, rng, plain),
    }
    report["summary"] = summary_metrics(report)
    reference = load_reference(preset.reference) if preset and preset.reference else None
    if reference:
        report["reference"] = {
            "name": reference.get("name"),
            "source": reference.get("source"),
            "rows": ratio_rows(report["summary"], reference.get("metrics", {})),
        }
    write_report(report, opts.out)
    return report


def measure(
    opts: BenchOptions,
    client: Client,
    served: Served,
    python: str,
    tokenizer: str,
    rng: random.Random,
    plain: Client | None = None,
) -> dict[str, Any]:
    """Every measurement of one run, in bench.json's order: vLLM's bench, the block
    crossings, the prefix cache, the server's speculation counters, the PLAIN server's
    decode of the same prompts."""
    from arcvllm.client import metrics as m

    root, model = client.root, served.model
    opts.say(
        f"arcvllm bench: {model} at {root}, block {served.block_size}, "
        f"max-model-len {served.max_model_len}"
    )
    spec_before = m.spec_decode(client.metrics(), model)
    vb = run_vllm_bench_of(opts, python, root, served, tokenizer, rng.randrange(1 << 30))
    opts.say(f"  block crossings: {opts.runs} streams x {opts.crossings} boundaries")
    streams, boundary = measure_boundaries(
        client, model, served.block_size, served.max_model_len, opts.crossings, opts.runs, rng
    )
    boundary["streams"] = [
        {
            "prompt_len": s.prompt_len,
            "tokens": s.tokens,
            "ttft_ms": s.ttft * 1000,
            "decode_tok_s": s.decode_tok_s(),
            "bulk_share": bulk_share(s),
        }
        for s in streams
    ]
    opts.say(f"  prefix cache: {opts.runs} cold/warm pairs")
    prefix = measure_prefix(
        client, model, served.block_size, served.max_model_len, opts.runs, rng,
        speculative=spec_before is not None,
    )  # fmt: skip
    spec_after = m.spec_decode(client.metrics(), model) if spec_before else None
    compare = compare_plain(opts, client, plain, served, rng) if plain else None
    return {
        "vllm_bench": {k: vb.get(k) for k in VLLM_BENCH_KEYS},
        "boundary": boundary,
        "prefix_cache": prefix,
        # The server's own counters over the whole bench (None: it does not speculate).
        "speculation": speculation_summary(
            spec_after - spec_before if spec_before and spec_after else None
        ),
        "compare": compare,
        "runs": [[asdict(s) for s in token_steps(st, served.block_size)] for st in streams],
        "bulk_delivery": delivery(streams, compare),
    }


def delivery(streams: list[Stream], compare: Mapping[str, Any] | None) -> dict[str, Any]:
    """How many of the streams bench timed itself (block crossings, and both sides of the
    comparison) arrived in bulk; `bulk` says whether any did."""
    total, bulk = len(streams), sum(in_bulk(s) for s in streams)
    for side in ("plain", "speculative") if compare else ():
        assert compare is not None
        total += compare[side]["streams"]
        bulk += compare[side]["bulk_streams"]
    return {"bulk": bulk > 0, "bulk_streams": bulk, "streams": total}


def run_vllm_bench_of(
    opts: BenchOptions, python: str, root: str, served: Served, tokenizer: str, seed: int
) -> dict[str, Any]:
    """vLLM's `vllm bench serve` against ROOT, its prompts as long as the context allows."""
    input_len = min(opts.input_len, served.max_model_len - opts.output_len - 1)
    env = dict(os.environ)
    if opts.api_key:
        env["OPENAI_API_KEY"] = opts.api_key
    opts.say(
        f"  vllm bench serve: {opts.num_prompts} prompts, {input_len} in / {opts.output_len} out"
    )
    args = vllm_bench_args(
        root,
        served.model,
        tokenizer,
        opts.out,
        input_len,
        opts.output_len,
        opts.num_prompts,
        opts.concurrency,
        seed=seed,
    )
    return run_vllm_bench(python, args, opts.out, env)


def plain_server(opts: BenchOptions, client: Client, model: str) -> Client:
    """--plain-url's server: it serves MODEL and does not speculate, and CLIENT's does."""
    from arcvllm.client import metrics as m

    plain = opts.client(str(opts.plain_url))
    served_model(plain, model)
    if m.spec_decode(plain.metrics(), model) is not None:
        raise UsageError(f"--plain-url {opts.plain_url} speculates: name its plain twin's server")
    if m.spec_decode(client.metrics(), model) is None:
        raise UsageError(
            f"--base-url {client.root} does not speculate: --plain-url compares a speculative "
            "server with its plain twin"
        )
    return plain


def compare_plain(
    opts: BenchOptions, client: Client, plain: Client, served: Served, rng: random.Random
) -> dict[str, Any]:
    """The same prompts on PLAIN (--plain-url) and on CLIENT."""
    opts.say(f"  speculative vs plain ({opts.plain_url}): {opts.runs} streams each, same prompts")
    return compare_speculation(
        client, plain, served.model, served.block_size, served.max_model_len,
        opts.crossings, opts.runs, rng,
    )  # fmt: skip


def write_report(report: dict[str, Any], out: Path) -> None:
    """bench.json, and bench.png where matplotlib is (else a warning: replot elsewhere)."""
    (out / REPORT_JSON).write_text(json.dumps(report, indent=2))
    try:
        plot_report(report, out / REPORT_PNG)
    except ArcvllmError as exc:  # no matplotlib here: the JSON is enough to draw it elsewhere
        print(
            f"arcvllm: warning: no plot ({exc}); draw it elsewhere with "
            f"`arcvllm bench replot {out / REPORT_JSON}`",
            file=sys.stderr,
        )


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
    bulk = report.get("bulk_delivery") or {}
    note = bulk_note(bulk.get("streams", 0), bulk.get("bulk_streams", 0))
    if note:
        lines.append(note)
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


def replot(source: Path) -> Path:
    """bench.png drawn from a bench.json (here, where matplotlib is): its path."""
    try:
        report = json.loads(source.read_text())
        missing = [k for k in ("runs", "model", "block_size") if k not in report]
    except (OSError, ValueError, TypeError) as exc:
        raise UsageError(f"cannot read {source} as a bench.json: {exc}") from exc
    if missing:
        raise UsageError(f"cannot read {source} as a bench.json: no {', '.join(missing)}")
    png = source.with_suffix(".png")
    plot_report(report, png)
    return png
