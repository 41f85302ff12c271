"""`arcvllm model check|fetch`: the model's weights (arcvllm.model, arcvllm.operate.weights)."""

from __future__ import annotations

import argparse
import json
import os
import sys

from arcvllm import model, options
from arcvllm.errors import CheckFailed
from arcvllm.operate import weights


def _cmd_check(args: argparse.Namespace) -> int:
    checked = model.check_preset(args.preset, args.presets_dir, args.dir)
    print(json.dumps(checked.as_json(), indent=2) if args.json else checked.table())
    if checked.problem:
        sys.stdout.flush()
        raise CheckFailed(checked.problem)
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
    given = (args.env_file, args.models_dir, args.revision, args.endpoint, args.token_file)
    shown = weights.fetch_preset(args.preset, args.presets_dir, *given, os.environ)
    print(shown.render(args.json))
    for note in shown.problems:
        print(f"arcvllm: {note}", file=sys.stderr)
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
