"""What every `arcvllm` command's arguments share: `--json`, `--base-url` and the API key
(one key rule for every reader of a key file), URL and file argument types, one line for a
missing optional extra, and the exit status table in every `--help`. The command modules
import this, never arcvllm.cli (which imports them).
"""

from __future__ import annotations

import argparse
import importlib
import os
import re
from pathlib import Path
from types import ModuleType
from urllib.parse import urlsplit

from arcvllm.errors import ArcvllmError, Unavailable, UsageError

EXIT_STATUS = """\
exit status:
  0  success
  1  a check failed (smoke check, patch verify, audit difference, preset check, doctor FAIL)
  2  usage: bad arguments, unknown preset/stack/file given on the command line, bad URL
  3  environment: no server answers, no vLLM installed, no Docker, missing optional extra,
     missing /dev/dri, network/index unreachable"""

# The command being run ("arcvllm bench"), for messages raised deep inside it (cli.main
# sets it).
running = "arcvllm"

# The import name of each optional dependency and the extra (pyproject.toml) that brings
# it: a command that imports one lazily and finds it missing gets one line, not a traceback.
EXTRAS = {
    "httpx": "client",
    "openai": "client",
    "prometheus_client": "client",
    "matplotlib": "bench",
    "pypi_simple": "stack",
    "huggingface_hub": "weights",
}


class _Formatter(argparse.HelpFormatter):
    """Fills descriptions as argparse does, but prints the exit status table as written."""

    def _fill_text(self, text: str, width: int, indent: str) -> str:
        head, sep, rows = text.partition(EXIT_STATUS)
        filled = super()._fill_text(head, width, indent) if head.strip() else ""
        if not sep:
            return filled
        raw = "\n".join(indent + line for line in (EXIT_STATUS + rows).splitlines())
        return f"{filled}\n\n{raw}" if filled else raw


class Parser(argparse.ArgumentParser):
    """An ArgumentParser whose --help ends with the exit status table and whose usage errors
    are one line and exit 2. Sub-parsers inherit the class (add_subparsers uses it)."""

    def __init__(self, *args, exit_rows: str = "", **kwargs) -> None:
        # EXIT_ROWS: a command's own statuses beyond 0-3 ("  4  degraded: ..."), one a line.
        epilog = kwargs.get("epilog")
        table = EXIT_STATUS + (f"\n{exit_rows.rstrip()}" if exit_rows else "")
        kwargs["epilog"] = f"{epilog}\n\n{table}" if epilog else table
        kwargs.setdefault("formatter_class", _Formatter)
        super().__init__(*args, **kwargs)

    def parse_known_args(self, args=None, namespace=None):  # type: ignore[override]
        """As argparse's, and then the environment's API key where add_server's options
        were not given (an unreadable $VLLM_API_KEY_FILE: one line, exit 3)."""
        namespace, rest = super().parse_known_args(args, namespace)
        if getattr(namespace, "api_key", None) is ENV_KEY:
            try:
                namespace.api_key = env_api_key()
            except ArcvllmError as exc:
                self.exit(exc.exit_code, f"arcvllm: {exc}\n")
        return namespace, rest

    def error(self, message: str):  # type: ignore[override]
        where = self.prog.removeprefix("arcvllm").strip()
        where = f"{where}: " if where else ""
        self.exit(UsageError.exit_code, f"arcvllm: {where}{message} (see {self.prog} --help)\n")


def add_json(parser: argparse.ArgumentParser, help: str | None = None) -> None:
    """`--json`: the command's result as one JSON document on stdout instead of the table."""
    parser.add_argument(
        "--json",
        action="store_true",
        help=help or "print the result as one JSON document on stdout (same data as the table)",
    )


def url(value: str) -> str:
    """argparse type for a server URL: http(s) with a host; returned without a trailing /."""
    try:
        parts = urlsplit(value)
        ok = parts.scheme in ("http", "https") and bool(parts.hostname)
        parts.port  # noqa: B018  (raises on a port that is not a number)
    except ValueError:
        ok = False
    if not ok:
        raise argparse.ArgumentTypeError(f"not an http(s) URL with a host: {value!r}")
    return value.rstrip("/")


def add_server(parser: argparse.ArgumentParser, required: bool = True) -> None:
    """`--base-url URL` (validated), the key (`--api-key-file FILE`, `--api-key KEY`; default
    $VLLM_API_KEY_FILE, then $VLLM_API_KEY: see `env_api_key`) and `--ca-cert FILE`."""
    parser.add_argument(
        "--base-url",
        type=url,
        required=required,
        metavar="URL",
        help="the server, e.g. http://127.0.0.1:8000 or https://127.0.0.1:8443 (the gateway)",
    )
    key = parser.add_mutually_exclusive_group()
    key.add_argument(
        "--api-key-file",
        dest="api_key",
        type=key_file,
        metavar="FILE",
        help="a file holding the server's API key, which stays off the command line "
        "(default: $VLLM_API_KEY_FILE)",
    )
    key.add_argument(
        "--api-key",
        metavar="KEY",
        help="the server's API key (default: $VLLM_API_KEY); prefer --api-key-file",
    )
    parser.add_argument(
        "--ca-cert",
        type=existing_file,
        metavar="FILE",
        help="a PEM certificate to trust for https, e.g. the gateway's self-signed one",
    )
    parser.set_defaults(api_key=ENV_KEY)


# The default of --api-key / --api-key-file: Parser reads the environment's key after parsing,
# when neither was given (a default read here would run for every command's parser).
ENV_KEY = object()


# The one key rule, for every reader of a key file: this package, docker/entrypoint.sh (the
# server) and docker/gateway-entrypoint.sh (the gateway, which puts the key in its nginx
# configuration), each refusing with these words. One line (its newline optional) of RFC
# 6750's token characters, none of which nginx's configuration syntax reads differently.
KEY_RULE = (
    "the key file must be one line of 1 to 256 of the characters "
    "A-Z a-z 0-9 . _ ~ + / = - (make one: openssl rand -hex 32)"
)
_KEY = re.compile(rb"[A-Za-z0-9._~+/=-]{1,256}")


def key_in(data: bytes) -> str:
    """The key a key file's bytes hold under KEY_RULE (else ValueError(KEY_RULE))."""
    key = data.removesuffix(b"\n")
    if not _KEY.fullmatch(key):
        raise ValueError(KEY_RULE)
    return key.decode("ascii")


def read_key(path: Path) -> str:
    """The key in PATH, under KEY_RULE."""
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise ValueError(f"cannot read {path}: {exc.strerror or exc}") from exc
    try:
        return key_in(data)
    except ValueError:
        raise ValueError(f"{path}: {KEY_RULE}") from None


def key_file(value: str) -> str:
    """argparse type for `--api-key-file`: the key inside the file (else exit 2)."""
    try:
        return read_key(Path(value))
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from exc


def env_api_key(environ: dict[str, str] | os._Environ = os.environ) -> str | None:
    """The key from the environment: the file $VLLM_API_KEY_FILE, else $VLLM_API_KEY, else
    None. A named file that cannot be read is the environment's fault (exit 3)."""
    path = environ.get("VLLM_API_KEY_FILE")
    if path:
        try:
            return read_key(Path(path))
        except ValueError as exc:
            raise Unavailable(f"VLLM_API_KEY_FILE: {exc}") from exc
    return environ.get("VLLM_API_KEY") or None


def existing_file(value: str) -> Path:
    """argparse type for a `--<noun>-file` override: the file must exist (else exit 2)."""
    path = Path(value)
    if not path.is_file():
        raise argparse.ArgumentTypeError(f"no such file: {value}")
    return path


def existing_dir(value: str) -> Path:
    """argparse type for a `--<noun>-dir` override: the folder must exist (else exit 2)."""
    path = Path(value)
    if not path.is_dir():
        raise argparse.ArgumentTypeError(f"no such directory: {value}")
    return path


def require(module: str, extra: str, command: str | None = None) -> ModuleType:
    """Import an optional dependency, or fail with one line naming the extra (exit 3)."""
    try:
        return importlib.import_module(module)
    except ModuleNotFoundError as exc:
        raise Unavailable(
            f"{command or running} needs the '{extra}' extra: "
            f"pip install 'arcvllm[{extra}]' (no module named {exc.name or module})"
        ) from exc


def add_metrics_url(parser: argparse.ArgumentParser) -> None:
    """`--metrics-url URL` (repeatable): the server's own root for what a gateway or a router
    in front does not serve the same way: /metrics (summed over replicas) and /tokenize."""
    parser.add_argument(
        "--metrics-url",
        action="append",
        type=url,
        metavar="URL",
        help="the server's own root URL, for the /metrics and /tokenize a gateway does not "
        "serve; repeat for each replica behind a router (their counters are summed); "
        "default: --base-url",
    )


def add_log_source(parser: argparse.ArgumentParser) -> None:
    """`--log-file FILE` | `--log-cmd CMD`: where the server's log is read (a crash, the
    block size or the prefill chunk it chose, the tail of a failed run)."""
    logs = parser.add_mutually_exclusive_group()
    logs.add_argument("--log-file", help="the server's log file")
    logs.add_argument("--log-cmd", help="command printing the server log, e.g. 'docker logs X'")


def add_presets_dir(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--presets-dir",
        type=existing_dir,
        default=os.environ.get("ARCVLLM_PRESETS_DIR") or None,
        help="read presets from this folder instead of the ones arcvllm ships "
        "(default: $ARCVLLM_PRESETS_DIR)",
    )


def add_defects_file(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--defects-file",
        type=existing_file,
        default=None,
        help="read the ledger from this file instead of configs/defects.yaml",
    )
