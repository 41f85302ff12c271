"""Where the series and configs live: inside the wheel, or in the source checkout."""

from __future__ import annotations

from pathlib import Path

_PACKAGE = Path(__file__).resolve().parent


def data_root() -> Path:
    """Root that holds `patches/` and `configs/`.

    An installed wheel carries them under `arcvllm/_data`; an editable install or a
    checkout finds them next to the package.
    """
    bundled = _PACKAGE / "_data"
    if (bundled / "patches").is_dir():
        return bundled
    return _PACKAGE.parent


def checkout_root() -> Path:
    """The folder arcvllm is imported from: the source checkout (the Dockerfile, docker/,
    the build context) in a checkout or editable install."""
    return _PACKAGE.parent


def patches_dir() -> Path:
    return data_root() / "patches" / "vllm"


def configs_dir() -> Path:
    return data_root() / "configs"
