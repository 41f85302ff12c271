"""`arcvllm model fetch [PRESET]`: a preset's checkpoint from the Hugging Face hub into
MODELS_DIR, where compose mounts it for the server (/models, read-only).

The preset names the checkpoint (`checkpoint.repo`), the commit (`checkpoint.revision`)
and the files (`checkpoint.allow_patterns`, else configs, tokenizer files and
safetensors). The download is huggingface_hub's snapshot_download into the model's own
folder: resumable (a file cut short is continued with a Range request, files already
there are not fetched again), with its progress bar, from HF_ENDPOINT (a mirror) or
`--endpoint`, with a token from `--token-file` (else HF_TOKEN or the hub client's token
file). A record beside the weights (.arcvllm-fetch.json) says what was fetched and
whether it finished: a folder that holds every file of the pinned commit is complete and
nothing is asked of the hub. `make up` refuses a model folder that is missing, unfinished,
without config and weights (`problem`) or fetched from another checkpoint (`mismatch`)
before anything starts, CPU or XPU. Runs on the operator's host (the `weights` extra).
"""

from __future__ import annotations

import json
import re
import stat
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Any

from arcvllm.errors import ArcvllmError, Unavailable, UsageError
from arcvllm.operate.host import effective
from arcvllm.presets import Preset
from arcvllm.text import Shown

# Where compose mounts MODELS_DIR in the server (docker/compose.yaml), and its default.
MOUNT = PurePosixPath("/models")
DEFAULT_MODELS_DIR = "/models"
# What a checkpoint needs to be served: configs (model, generation, tokenizer, processor),
# tokenizer files, chat template and the weights. No remote code, no other formats.
DEFAULT_PATTERNS = ("*.json", "*.safetensors", "*.txt", "*.jinja", "*.model", "*.tiktoken")
RECORD = ".arcvllm-fetch.json"
COMMIT = re.compile(r"[0-9a-f]{40}")
# The hub client's own bookkeeping in a local folder (resume metadata, partial files).
CLIENT_DIR = Path(".cache") / "huggingface"


@dataclass(frozen=True)
class Source:
    """The checkpoint of a preset: repository, revision (a commit, or None), files."""

    repo: str
    revision: str | None
    patterns: tuple[str, ...]


def source_of(preset: Preset, revision: str | None = None) -> Source:
    """The preset's checkpoint; REVISION (--revision) instead of the preset's pin."""
    checkpoint = preset.checkpoint
    repo = checkpoint.get("repo")
    if not repo:
        raise UsageError(
            f"preset {preset.name} names no checkpoint repository (checkpoint.repo): "
            f"put its weights in MODELS_DIR/{model_subdir(preset) or '...'} yourself"
        )
    patterns = checkpoint.get("allow_patterns") or DEFAULT_PATTERNS
    return Source(str(repo), revision or checkpoint.get("revision"), tuple(map(str, patterns)))


def model_subdir(preset: Preset) -> PurePosixPath | None:
    """The model's folder under /models (the compose mount), None for a model that is not
    there (the model inside the CPU image, of every CPU preset but tiny-hybrid-cpu-models)."""
    model = PurePosixPath(preset.model)
    return model.relative_to(MOUNT) if model.is_relative_to(MOUNT) and model != MOUNT else None


def models_dir(settings: Mapping[str, str], environ: Mapping[str, str]) -> Path:
    """MODELS_DIR as compose resolves it: the shell's, the settings file's, /models."""
    return Path(effective("MODELS_DIR", settings, environ, DEFAULT_MODELS_DIR))


def host_dir(preset: Preset, folder: Path) -> Path:
    """Where PRESET's model lives on the host: FOLDER (MODELS_DIR) / its folder."""
    sub = model_subdir(preset)
    if sub is None:
        raise UsageError(
            f"preset {preset.name} serves {preset.model}, inside the image: nothing to fetch"
        )
    return folder / sub


def read_record(folder: Path) -> dict[str, Any] | None:
    try:
        record = json.loads((folder / RECORD).read_text())
    except (OSError, ValueError):
        return None
    return record if isinstance(record, dict) else None


def problem(folder: Path) -> str | None:
    """Why FOLDER cannot be served as a model, in words (None: it can, as far as files
    go): missing, a fetch that did not finish, no config.json, no weights, or a shard its
    index names that is not there."""
    if not folder.is_dir():
        return f"no folder {folder}"
    record = read_record(folder)
    if record is not None and not record.get("complete"):
        return f"the fetch into {folder} did not finish"
    if not (folder / "config.json").is_file():
        return f"{folder} has no config.json"
    index = folder / "model.safetensors.index.json"
    if index.is_file():
        try:
            shards = set(json.loads(index.read_text())["weight_map"].values())
        except (OSError, ValueError, KeyError, AttributeError):
            return f"{index} is not a safetensors index"
        missing = sorted(s for s in shards if not (folder / s).is_file())
        if missing:
            return f"{folder} lacks {len(missing)} shard(s) its index names ({missing[0]}, ...)"
    elif not any(folder.glob("*.safetensors")) and not any(folder.glob("*.bin")):
        return f"{folder} has no weights (*.safetensors)"
    return None


def mismatch(folder: Path, preset: Preset) -> str | None:
    """Why FOLDER, fetched by `model fetch` (its record), is not PRESET's checkpoint: another
    repository, or another commit than the one the preset pins (None: it is, or a folder
    without a record, put there by hand, which the model check judges by its files)."""
    record = read_record(folder)
    repo, pin = preset.checkpoint.get("repo"), preset.checkpoint.get("revision")
    if record is None or not repo:
        return None
    held = f"{record.get('repo')}@{record.get('commit')}"
    if record.get("repo") != repo:
        return f"{folder} holds {held}, not {repo}"
    if pin and record.get("commit") != pin:
        return f"{folder} holds {held}, not the pinned {repo}@{pin}"
    return None


def files_of(folder: Path) -> dict[str, int]:
    """The checkpoint's files in FOLDER with their sizes (not the client's bookkeeping)."""
    found = {}
    for path in sorted(folder.rglob("*")):
        relative = path.relative_to(folder)
        if path.is_file() and relative.parts[:2] != CLIENT_DIR.parts and path.name != RECORD:
            found[relative.as_posix()] = path.stat().st_size
    return found


def complete(folder: Path, source: Source) -> dict[str, Any] | None:
    """The record of a finished fetch of SOURCE's pinned commit into FOLDER whose every
    file is there at its size (None: the hub must be asked)."""
    record = read_record(folder)
    if (
        record is None
        or not record.get("complete")
        or record.get("repo") != source.repo
        or source.revision is None
        or source.revision != record.get("commit")
        or list(record.get("patterns", [])) != list(source.patterns)
    ):
        return None
    have = files_of(folder)
    wanted = record.get("files") or {}
    return record if all(have.get(name) == size for name, size in wanted.items()) else None


def readable_by_all(folder: Path) -> None:
    """The weights are read in the container by UID 1000 through a read-only mount: every
    file readable by all, every folder enterable (whatever the fetching user's umask)."""
    for path in [folder, *folder.rglob("*")]:
        mode = path.stat().st_mode
        extra = stat.S_IRUSR | stat.S_IRGRP | stat.S_IROTH
        if path.is_dir():
            extra |= stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH
        if mode & extra != extra:
            path.chmod(stat.S_IMODE(mode) | extra)


def hub_error(exc: Exception, source: Source, revision: str, endpoint: str) -> ArcvllmError:
    """One line for what the hub client raised."""
    from huggingface_hub import errors

    where = f"{endpoint} ({source.repo})"
    first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
    if isinstance(exc, errors.RevisionNotFoundError):
        return UsageError(f"{where} has no revision {revision}")
    if isinstance(exc, errors.GatedRepoError) or (
        isinstance(exc, errors.HfHubHTTPError)
        and exc.response is not None
        and exc.response.status_code in (401, 403)
    ):
        return Unavailable(
            f"{where} refuses the download without a token it accepts: --token-file FILE "
            "(or HF_TOKEN)"
        )
    if isinstance(exc, errors.RepositoryNotFoundError):
        return Unavailable(f"{where}: no such repository, or it needs a token (--token-file)")
    if isinstance(exc, errors.OfflineModeIsEnabled | errors.LocalEntryNotFoundError):
        return Unavailable(f"{where}: cannot download ({first}); HF_HUB_OFFLINE=1 forbids it")
    return Unavailable(f"{where}: the download stopped: {first} (run it again to resume)")


def write_record(folder: Path, doc: dict[str, Any]) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    scratch = folder / f"{RECORD}.new"
    scratch.write_text(json.dumps(doc, indent=2) + "\n")
    scratch.replace(folder / RECORD)


def fetch(source: Source, folder: Path, endpoint: str, token: str | None = None) -> dict[str, Any]:
    """SOURCE into FOLDER through the hub client; the record of the finished fetch.

    The commit's file list is asked first (so a refusal is an error here, never a folder
    the client returns as it is because it could not ask), and every listed file must be
    in FOLDER at its size at the end."""
    import httpx2
    from huggingface_hub import HfApi, errors, snapshot_download
    from huggingface_hub.hf_api import RepoFile
    from huggingface_hub.utils import filter_repo_objects

    revision = source.revision or "main"
    api = HfApi(endpoint=endpoint, token=token)
    record: dict[str, Any] = {"repo": source.repo, "revision": revision, "commit": None}
    record |= {"patterns": list(source.patterns), "complete": False, "files": {}}
    try:
        commit = revision
        if not COMMIT.fullmatch(revision):  # a branch or tag: the commit it names now
            commit = str(api.model_info(source.repo, revision=revision).sha)
        listed = {
            f.path: f.size
            for f in api.list_repo_tree(source.repo, revision=commit, recursive=True)
            if isinstance(f, RepoFile)
        }
        wanted = {
            p: listed[p] for p in filter_repo_objects(listed, allow_patterns=list(source.patterns))
        }
        if not wanted:
            raise UsageError(f"{source.repo}@{commit} has no file matching {source.patterns}")
        record["commit"] = commit
        write_record(folder, record)  # unfinished until the end: `make up` refuses it
        snapshot_download(
            source.repo,
            revision=commit,
            local_dir=folder,
            allow_patterns=list(source.patterns),
            endpoint=endpoint,
            token=token,
        )
    except (errors.HfHubHTTPError, errors.OfflineModeIsEnabled, errors.LocalEntryNotFoundError,
            httpx2.HTTPError, OSError) as exc:  # fmt: skip
        raise hub_error(exc, source, revision, endpoint) from None
    have = files_of(folder)
    short = sorted(name for name, size in wanted.items() if have.get(name) != size)
    if short:
        raise Unavailable(
            f"{endpoint} ({source.repo}): {len(short)} file(s) missing or short after the "
            f"download ({short[0]}, ...): run it again to resume"
        )
    record |= {"complete": True, "files": wanted}
    write_record(folder, record)
    readable_by_all(folder)
    return record


def default_endpoint(environ: Mapping[str, str]) -> str:
    """HF_ENDPOINT (a mirror), else the hub."""
    return (environ.get("HF_ENDPOINT") or "https://huggingface.co").rstrip("/")


def read_token(path: Path | None) -> str | None:
    """The token in PATH (one line); None leaves it to the hub client (HF_TOKEN, its file)."""
    if path is None:
        return None
    token = path.read_text().strip()
    if not token or "\n" in token:
        raise UsageError(f"--token-file {path}: one line holding the token")
    return token


def fetch_preset(
    name: str | None,
    presets_dir: Path | None,
    env_file: Path | None,
    models_root: str | None,
    revision: str | None,
    endpoint: str | None,
    token_file: Path | None,
    environ: Mapping[str, str],
) -> Shown:
    """`arcvllm model fetch [NAME]`: the preset's checkpoint into its MODELS_DIR folder,
    unless it is complete there already. What was fetched (or found), and a note when the
    revision fetched is no commit (pin the commit in the preset)."""
    from arcvllm import options
    from arcvllm.operate import settings
    from arcvllm.presets import get_preset

    if env_file is None and Path("docker/arcvllm.env").is_file():  # run from a checkout
        env_file = Path("docker/arcvllm.env")
    values = settings.load(env_file) if env_file else {}
    name = name or effective("ARCVLLM_PRESET", values, environ, "")
    if not name:
        raise UsageError("name a preset: arcvllm model fetch PRESET (or ARCVLLM_PRESET)")
    preset = get_preset(name, presets_dir)
    base = Path(models_root) if models_root else models_dir(values, environ)
    folder = host_dir(preset, base)
    source = source_of(preset, revision)
    if source.revision is None:
        raise UsageError(
            f"preset {preset.name} pins no revision of {source.repo} (checkpoint.revision): "
            "name the commit you checked with --revision"
        )
    token = read_token(token_file)
    record = complete(folder, source)
    fetched = record is None
    if record is None:
        options.require("huggingface_hub", "weights", "arcvllm model fetch")
        record = fetch(source, folder, endpoint or default_endpoint(environ), token)
    size = sum(record["files"].values())
    doc = {"preset": preset.name, "repo": source.repo, "commit": record["commit"]}
    doc |= {"dir": str(folder), "files": len(record["files"]), "bytes": size, "fetched": fetched}
    what = "fetched" if fetched else "complete, nothing fetched:"
    text = (f"{what} {source.repo}@{record['commit']} in {folder} "
            f"({len(record['files'])} files, {size / 1024**3:.2f} GiB)")  # fmt: skip
    notes: tuple[str, ...] = ()
    if fetched and not COMMIT.fullmatch(source.revision):
        notes = (f"note: {source.revision} is commit {record['commit']}: pin it in the preset "
                 "(checkpoint.revision)",)  # fmt: skip
    return Shown(doc, text, indent=None, problems=notes)
