"""`arcvllm model check|fetch`: the model's weights (arcvllm.model, arcvllm.operate.weights)."""

from __future__ import annotations

import argparse
import json
import os
import sys
from dataclasses import asdict
from pathlib import Path

from arcvllm import model, options
from arcvllm.errors import CheckFailed, UsageError
from arcvllm.operate import weights
from arcvllm.operate.host import effective
from arcvllm.presets import get_preset
from arcvllm.text import columns


def _cmd_check(args: argparse.Namespace) -> int:
    preset = get_preset(args.preset, args.presets_dir)
    directory = Path(args.dir) if args.dir else model.model_dir(preset)
    if directory is None:
        raise UsageError(f"preset {preset.name} serves a hub id ({preset.model}): give DIR")
    findings = model.check(preset, directory)
    line = model.problem(preset, directory, findings)
    if args.json:
        doc = {
            "preset": preset.name,
            "dir": str(directory),
            "ok": line is None,
            "rows": [asdict(f) for f in findings],
        }
        print(json.dumps(doc, indent=2))
    else:
        rows = [("CHECK", "RESULT", "SEEN")]
        rows += [(f.check, "ok" if f.ok else "FAIL", f.seen) for f in findings]
        print(columns(rows))
    if line:
        sys.stdout.flush()
        raise CheckFailed(line)
    return 0


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "model", help="a preset's model folder: check it, or fetch it from the hub"
    )
    sub = parser.add_subparsers(dest="model_command", required=True, metavar="ACTION")
    c = sub.add_parser(
        "check",
        help="config, quantization, tensors (mtp.* for MTP presets), size, tokenizer, template",
        description=model.__doc__.splitlines()[0],
    )
    c.add_argument("preset", help="preset name (`arcvllm presets`)")
    c.add_argument("dir", nargs="?", help="the model folder (default: the preset's model)")
    options.add_presets_dir(c)
    options.add_json(c, help="the checks as one JSON document")
    c.set_defaults(func=_cmd_check)
    register_fetch(sub)


def _cmd_fetch(args: argparse.Namespace) -> int:
    from arcvllm.operate import settings

    env_file = args.env_file or (Path("docker/arcvllm.env") if Path("docker/arcvllm.env").is_file()
                                 else None)  # fmt: skip
    values = settings.load(env_file) if env_file else {}
    name = args.preset or effective("ARCVLLM_PRESET", values, os.environ, "")
    if not name:
        raise UsageError("name a preset: arcvllm model fetch PRESET (or ARCVLLM_PRESET)")
    preset = get_preset(name, args.presets_dir)
    folder = weights.host_dir(preset, Path(args.models_dir) if args.models_dir else
                      weights.models_dir(values, os.environ))  # fmt: skip
    source = weights.source_of(preset, args.revision)
    if source.revision is None:
        raise UsageError(
            f"preset {preset.name} pins no revision of {source.repo} (checkpoint.revision): "
            "name the commit you checked with --revision"
        )
    token = weights.read_token(args.token_file)
    record = weights.complete(folder, source)
    fetched = record is None
    if record is None:
        options.require("huggingface_hub", "weights", "arcvllm model fetch")
        record = weights.fetch(
            source, folder, args.endpoint or weights.default_endpoint(os.environ), token
        )
    size = sum(record["files"].values())
    doc = {"preset": preset.name, "repo": source.repo, "commit": record["commit"]}
    doc |= {"dir": str(folder), "files": len(record["files"]), "bytes": size, "fetched": fetched}
    if args.json:
        print(json.dumps(doc))
    else:
        what = "fetched" if fetched else "complete, nothing fetched:"
        print(f"{what} {source.repo}@{record['commit']} in {folder} "
              f"({len(record['files'])} files, {size / 1024**3:.2f} GiB)")  # fmt: skip
    if fetched and not weights.COMMIT.fullmatch(source.revision):
        print(f"arcvllm: note: {source.revision} is commit {record['commit']}: pin it in the "
              "preset (checkpoint.revision)", file=sys.stderr)  # fmt: skip
    return 0


def register_fetch(sub: argparse._SubParsersAction) -> None:
    """`model fetch`, under `arcvllm model`."""
    get = sub.add_parser(
        "fetch",
        help="the preset's checkpoint from the hub (or HF_ENDPOINT) into MODELS_DIR",
        description=weights.__doc__.split("\n\n")[1],
    )
    get.add_argument("preset", nargs="?", help="default: ARCVLLM_PRESET (shell, settings file)")
    get.add_argument(
        "--env-file",
        type=options.existing_file,
        help="the settings file: its MODELS_DIR and ARCVLLM_PRESET (default: docker/arcvllm.env "
        "when run from a checkout)",
    )
    get.add_argument("--models-dir", help="instead of MODELS_DIR (shell, settings file, /models)")
    get.add_argument("--revision", help="a commit (or branch) instead of the preset's pin")
    get.add_argument("--endpoint", help="the hub or a mirror (default: HF_ENDPOINT, else the hub)")
    get.add_argument(
        "--token-file",
        type=options.existing_file,
        help="a file holding the hub token (default: HF_TOKEN, else the hub client's own file)",
    )
    options.add_presets_dir(get)
    options.add_json(get, help="what was fetched (or found complete) as JSON")
    get.set_defaults(func=_cmd_fetch)
