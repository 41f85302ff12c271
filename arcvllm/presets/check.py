"""A preset checked: with the installed vLLM's own argument parser (where vLLM is), against
the stacks' vLLM versions and against the defect ledger.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import io
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from arcvllm.errors import ArcvllmError, status
from arcvllm.modelconfig import moe_shape, text_config
from arcvllm.presets.load import DEFAULT_XPU_PRESET, SERVER_MODULE, Preset
from arcvllm.presets.render import (
    flag_values,
    server_command,
    speculative_config,
    stack_problems,
)
from arcvllm.text import columns

if TYPE_CHECKING:
    from arcvllm import defects
    from arcvllm.presets import triggers


# (preset, stack) -> what the stack's release makes of the preset, and notes on what was
# assumed: arcvllm.builder.triggers.engines, where the build side runs it.
EnginesOf = Callable[
    [Iterable[Preset]], "tuple[Mapping[tuple[str, str], triggers.Engine], list[str]]"
]


# ---- stacks: which vLLM versions a preset is known to work with ----


def stack_vllm_versions(path: Path | None = None) -> dict[str, str]:
    """Stack name -> vLLM version, from the stacks file (configs/stacks.yaml)."""
    from arcvllm import stack

    return {name: s.vllm_version for name, s in stack.load(path)[0].items()}


def covers(preset: Preset, version: str, stack_versions: Mapping[str, str]) -> bool:
    """Whether VERSION lies between the oldest and newest vLLM of the preset's stacks.

    A preset is parsed only by the vLLM releases its stacks span: an XPU preset named for
    xpu-0.20 and xpu-0.33 must parse with every release from 0.20.2 to 0.33.0, while a
    preset for a single stack may use a flag that other releases lack.
    """
    from packaging.version import Version

    known = [Version(stack_versions[s]) for s in preset.stacks if s in stack_versions]
    if not known:
        return False
    return min(known) <= Version(Version(version).base_version) <= max(known)


# ---- checking with the installed vLLM's own parser (runs where vLLM is) ----


def installed_vllm_version() -> str:
    import vllm

    return str(vllm.__version__).split("+")[0]


def vllm_server_parser() -> tuple[argparse.ArgumentParser, Callable[[argparse.Namespace], Any]]:
    """The OpenAI server's parser and its validation, exactly as the installed vLLM has them."""
    try:
        from vllm.utils.argparse_utils import FlexibleArgumentParser
    except ImportError:  # releases before the utils split
        from vllm.utils import FlexibleArgumentParser  # type: ignore[attr-defined,no-redef]
    for module in ("vllm.entrypoints.openai.cli_args", "vllm.entrypoints.launchers.cli_args"):
        try:
            cli_args = importlib.import_module(module)
            break
        except ModuleNotFoundError as exc:
            if exc.name is None or not module.startswith(exc.name):
                raise ArcvllmError(
                    f"vLLM's server arguments ({module}) need the missing module {exc.name}"
                ) from exc
    else:
        raise ArcvllmError("this vLLM has no OpenAI server argument parser arcvllm knows")
    parser = cli_args.make_arg_parser(FlexibleArgumentParser(prog=SERVER_MODULE))
    return parser, cli_args.validate_parsed_serve_args


def parse_with_vllm(
    args: Sequence[str],
    parser: argparse.ArgumentParser,
    validate: Callable[[argparse.Namespace], Any] = lambda _: None,
) -> str | None:
    """None when vLLM accepts ARGS, else vLLM's own error text."""
    stderr = io.StringIO()
    try:
        with contextlib.redirect_stderr(stderr):
            validate(parser.parse_args(list(args)))
    except SystemExit:
        lines = [line for line in stderr.getvalue().splitlines() if line.strip()]
        return lines[-1] if lines else "rejected by vLLM's parser"
    except Exception as exc:  # validate_parsed_serve_args raises TypeError/ValueError
        return f"{type(exc).__name__}: {exc}"
    return None


def check_all(
    presets: Iterable[Preset], version: str, stack_versions: Mapping[str, str]
) -> list[tuple[str, str]]:
    """(preset, result) for every preset: 'ok', 'skipped: ...' or the parser's complaint."""
    server = None
    results = []
    for preset in presets:
        if not covers(preset, version, stack_versions):
            spans = ", ".join(f"{s}={stack_versions.get(s, '?')}" for s in preset.stacks)
            results.append((preset.name, f"skipped: stacks {spans} do not span vLLM {version}"))
            continue
        try:
            args = server_command(preset, vllm_version=version).args
        except ArcvllmError as exc:  # refused before vLLM's parser is needed
            results.append((preset.name, f"FAIL: {exc}"))
            continue
        server = server or vllm_server_parser()
        try:
            error = parse_with_vllm(args, *server)
        except ArcvllmError as exc:
            error = str(exc)
        results.append((preset.name, "ok" if error is None else f"FAIL: {error}"))
    return results


def check_arguments(
    presets: Mapping[str, Preset], doc: dict[str, Any], text: list[str]
) -> int | None:
    """The argument check with this Python's vLLM, its table into TEXT; None when this
    Python has no vLLM."""
    try:
        version = installed_vllm_version()
    except ImportError:
        return None
    results = check_all(presets.values(), version, stack_vllm_versions())
    doc["vllm"] = version
    doc["arguments"] = [{"preset": name, "result": result} for name, result in results]
    text.append(f"vLLM {version}: presets parsed with its own argument parser")
    text.append(columns([("PRESET", "RESULT"), *results]))
    if not any(r == "ok" for _, r in results):
        doc["problems"].append("no preset covers this vLLM version")
        return status(True)
    return status(any(r.startswith("FAIL") for _, r in results))


def defect_settings(preset: Preset, engine: triggers.Engine | None = None) -> defects.Settings:
    """What PRESET does that a defect's trigger asks about (arcvllm.defects), on a stack
    whose release makes ENGINE of it (arcvllm.presets.triggers); without one, the worst
    its flags allow."""
    from arcvllm import defects
    from arcvllm.presets import triggers

    engine = engine or triggers.assumed(preset, "no release read")
    values = flag_values(server_command(preset).args)
    text = text_config(preset.model_config)
    kinds = set(text.get("layer_types") or [])
    layers = set()
    if "linear_attention" in kinds:
        layers.add("gdn")
    if "mamba" in kinds:
        layers.add("mamba2")
    tp = int(values.get("tensor-parallel-size", 1))
    shape = moe_shape(text) if text else None
    widths: tuple[int, ...] = ()
    if shape is not None:
        layers.add("moe")
        shared = int(
            text.get("shared_expert_intermediate_size") or text.get("shared_intermediate_size") or 0
        )
        widths = tuple(w // tp for w in (shape["intermediate_size"], shared) if w)
    return defects.Settings(
        layers=frozenset(layers),
        max_model_len=int(values.get("max-model-len") or 0),
        speculative=speculative_config(preset) is not None,
        quantization=defects.quantization(preset.model_config),
        compiled=engine.compiled,
        xpu_graph=engine.xpu_graph,
        prefix_caching=engine.prefix_caching,
        tensor_parallel=tp,
        num_seqs=int(values.get("max-num-seqs") or 256),
        moe_widths=widths,
    )


def stack_settings(
    preset: Preset,
    stacks: Iterable[str],
    engines: Mapping[tuple[str, str], triggers.Engine],
) -> dict[str, defects.Settings]:
    """PRESET's settings on each of STACKS, from what each stack's release made of it."""
    return {name: defect_settings(preset, engines.get((preset.name, name))) for name in stacks}


def check_defects(
    presets: Mapping[str, Preset],
    ledger_path: Path | None,
    doc: dict,
    text: list[str],
    engines: Mapping[tuple[str, str], triggers.Engine] | None = None,
) -> int:
    """Each XPU preset x XPU stack against the defect ledger, and the default XPU stack
    against the one the ledger picks (exit 1 when they differ), the table into TEXT.
    ENGINES: what each stack's release makes of each preset (arcvllm.presets.triggers);
    where missing, the worst the preset's flags allow."""
    from arcvllm import defects, stack

    engines = engines or {}
    ledger = defects.load(ledger_path)
    stacks, default_names = stack.load()
    xpu_names = [name for name, s in stacks.items() if s.flavor == "xpu"]
    xpu = [p for p in presets.values() if p.flavor == "xpu" and p.model_config]
    settings = {p.name: stack_settings(p, xpu_names, engines) for p in xpu}
    found = defects.verdicts(ledger, [(p.name, settings[p.name], p.stacks) for p in xpu], stacks)
    pins = {name: defects.pinned_versions(stacks[name]) for name in xpu_names}
    doc["defects"] = [
        {
            "preset": v.preset,
            "stack": v.stack,
            "verdict": v.word.lower(),
            "affected": list(v.affected),
            "unknown": list(v.unknown),
            "patched": list(v.patched),
            "listed": v.listed,
            "triggers": _engine_doc(engines.get((v.preset, v.stack))),
        }
        for v in found
    ]
    problem = None
    if DEFAULT_XPU_PRESET in presets and "xpu" in default_names:
        default = presets[DEFAULT_XPU_PRESET]
        problem = defects.default_problem(
            ledger,
            default.name,
            stack_settings(default, xpu_names, engines),
            stacks,
            default_names["xpu"],
        )
        doc["default_xpu_stack"] = default_names["xpu"]
    if problem:
        doc["problems"].append(problem)
    if found:
        text.append("Known defects (configs/defects.yaml) on each XPU stack's pins")
        text += [f"  {defects.pins_line(name, pinned)}" for name, pinned in pins.items()]
        text.append(columns(_defect_rows(found, settings, engines)))
        if "default_xpu_stack" in doc and not problem:
            text.append(
                f"default XPU stack {default_names['xpu']}: the newest clean for "
                f"{DEFAULT_XPU_PRESET}\n"
            )
    return status(problem is not None)


def _engine_doc(engine: triggers.Engine | None) -> dict[str, Any]:
    if engine is None:
        return {"source": "assumed (no release read)"}
    return {
        "compiled": engine.compiled,
        "xpu_graph": engine.xpu_graph,
        "prefix_caching": engine.prefix_caching,
        "source": engine.source,
    }


def _defect_rows(
    found: Sequence[defects.Verdict],
    settings: Mapping[str, Mapping[str, defects.Settings]],
    engines: Mapping[tuple[str, str], triggers.Engine],
) -> list[tuple[str, ...]]:
    """The verdict table with how the release runs the preset: XPU graphs, compiled only,
    or eager; `(assumed)` where the release was not read."""
    table: list[tuple[str, ...]] = [("PRESET", "STACK", "LISTED", "RUNS", "VERDICT")]
    for v in found:
        here = settings[v.preset][v.stack]
        runs = "graphs" if here.xpu_graph else "compiled" if here.compiled else "eager"
        engine = engines.get((v.preset, v.stack))
        if engine is None or engine.source.startswith("assumed"):
            runs += " (assumed)"
        table.append((v.preset, v.stack, "yes" if v.listed else "no", runs, v.summary()))
    return table


def run_checks(
    presets: Mapping[str, Preset],
    ledger_path: Path | None,
    kernels: Callable[[dict[str, Any], list[str]], int] | None = None,
    engines_of: EnginesOf | None = None,
) -> tuple[int, dict[str, Any], str]:
    """`arcvllm presets --check`: the stacks, the defect ledger, the arguments (with this
    Python's vLLM, if any) and KERNELS (the kernel table and memory fit, where the build
    side runs it). ENGINES_OF (the build side's arcvllm.builder.triggers.engines) asks
    each XPU stack's release what it makes of each preset; without it the ledger's
    release-decided triggers are the worst the flags allow. The exit status, the document
    (its problems for stderr) and each check's table, as text."""
    doc: dict[str, Any] = {"vllm": None, "problems": []}
    text: list[str] = []
    versions = stack_vllm_versions()
    doc["problems"] += [line for p in presets.values() for line in stack_problems(p, versions)]
    engines: Mapping[tuple[str, str], triggers.Engine] = {}
    if engines_of is not None:
        engines, notes = engines_of(presets.values())
        doc["trigger_notes"] = notes
        text += [f"note: {note}" for note in notes]
    defects_status = check_defects(presets, ledger_path, doc, text, engines)
    code = check_arguments(presets, doc, text)
    if code is None:
        text.append("no vLLM in this Python: argument check left to the release's Python")
        code = 0
    code = max(code, defects_status)
    if doc["problems"]:
        code = max(code, 1)
    if kernels is not None:
        code = max(code, kernels(doc, text))
    doc["ok"] = code == 0
    return code, doc, "\n".join(text)
