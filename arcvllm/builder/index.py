"""The package index this machine's pip is configured with, and files fetched from it.

Pinned sources (vLLM's release sdists) are named in configs/stacks.yaml by file name and
sha256 only. Where to download them is asked of the index pip uses here (its config, the
PIP_INDEX_URL environment, or pip's own default), so a mirror or an air-gapped index works
without editing the project.
"""

from __future__ import annotations

import functools
import hashlib
import os
import ssl
import subprocess
import sys
import time
from pathlib import Path

from arcvllm.errors import ArcvllmError, Unavailable, UsageError
from arcvllm.stack import Stack


@functools.cache
def _pip_config_list() -> str:
    """`pip config list`, asked once a process (index_url, uv_sources and every fetch's
    ca_bundle read it)."""
    try:
        return subprocess.run(
            [sys.executable, "-m", "pip", "config", "list"],
            capture_output=True,
            text=True,
            timeout=60,
        ).stdout
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise Unavailable(f"cannot ask pip for its index: {exc}") from None


def pip_config() -> dict[str, list[str]]:
    """What pip installs from here: its index-url, extra-index-url, find-links and the CA
    file it verifies them with (cert), from the PIP_* environment, else pip's config
    (global, then install), as pip reads them."""
    out = _pip_config_list()
    found: dict[str, list[str]] = {}
    for line in out.splitlines():
        key, _, value = line.partition("=")
        section, _, name = key.strip().partition(".")
        if section in ("global", "install") and name in PIP_KEYS:
            found[name] = value.strip().strip("'\"").split()
    for name in PIP_KEYS:
        if env := os.environ.get("PIP_" + name.upper().replace("-", "_")):
            found[name] = env.split()
    return found


PIP_KEYS = ("index-url", "extra-index-url", "find-links", "cert")


def ca_bundle() -> str | None:
    """The CA file to verify the index with, as pip does: its `cert` (PIP_CERT, pip's
    config), else the platform's store where OpenSSL finds it (SSL_CERT_FILE, else its
    default file). The HTTP clients' own bundles (certifi) refuse a mirror or proxy signed
    by a local CA that pip and the platform trust. None: the client's own."""
    if cert := pip_config().get("cert"):
        return cert[0]
    paths = ssl.get_default_verify_paths()
    for candidate in (paths.cafile, paths.openssl_cafile):
        if candidate and Path(candidate).is_file():
            return candidate
    return None


def tls_verify() -> ssl.SSLContext | bool:
    """httpx's `verify` for ca_bundle(): a context of that file, else httpx's default."""
    bundle = ca_bundle()
    return ssl.create_default_context(cafile=bundle) if bundle else True


def index_url() -> str:
    """The simple-API root pip installs from: PIP_INDEX_URL, pip's config, or pip's default."""
    if urls := pip_config().get("index-url"):
        return urls[0]
    from pip._internal.models.index import PyPI  # pip's own default, not a copy of it

    return PyPI.simple_url


def uv_sources() -> list[str]:
    """`uv pip install` options for the sources pip uses here (uv reads no pip config),
    and pip's trust: the platform's certificate store (uv's own bundled roots refuse a
    mirror or proxy signed by a local CA, where pip, the rest of the build's installer,
    succeeds).

    pip weighs every candidate of every index alike and takes the file whose sha256 a lock
    lists; uv takes the first index that has the project. So pip's index comes first, then
    the extra indexes that exist (pip skips a missing file:// one with a warning, uv would
    stop), in pip's order, and the find-links folders beside them: a mirror of other builds
    of a wheel (another manylinux tag, another sha256) never shadows the locked file.
    """
    config = pip_config()
    primary = index_url()
    args = ["--index", primary]
    for url in config.get("extra-index-url", []):
        if not url.startswith("file://") or Path(url.removeprefix("file://")).is_dir():
            args += ["--index", url]
    for where in config.get("find-links", []):
        args += ["--find-links", where]
    return [*args, "--default-index", primary, "--system-certs"]


def _packages(project: str, index: str) -> list:
    """The files PROJECT's page on INDEX lists (pypi-simple's DistributionPackage)."""
    import requests
    from pypi_simple import PyPISimple

    session = requests.Session()
    if bundle := ca_bundle():
        session.verify = bundle
    try:
        with PyPISimple(endpoint=index.rstrip("/") + "/", session=session) as client:
            return list(client.get_project_page(project).packages)
    except Exception as exc:
        raise Unavailable(f"index {index}: cannot read project {project}: {exc}") from None


def project_files(project: str, index: str | None = None) -> list[tuple[str, str | None]]:
    """(filename, listed sha256) of every file on PROJECT's page of the index."""
    packages = _packages(project, index or index_url())
    return [(p.filename, (p.digests or {}).get("sha256")) for p in packages]


def find_file(
    project: str, wanted, index: str | None = None, what: str = "such file"
) -> tuple[str, str, str | None]:
    """(filename, URL, listed sha256) of the first file of PROJECT for which WANTED(name);
    none is "has no WHAT" (an index that does not answer says so itself, in _packages)."""
    index = index or index_url()
    for package in _packages(project, index):
        if wanted(package.filename):
            listed = (package.digests or {}).get("sha256")
            return package.filename, package.url.split("#", 1)[0], listed
    raise Unavailable(f"index {index} has no {what} for project {project}")


def upload_time(project: str, filename: str, index: str | None = None) -> str:
    """When FILENAME was uploaded to PROJECT's page on the index (RFC 3339, UTC)."""
    index = index or index_url()
    for package in _packages(project, index):
        if package.filename == filename and package.upload_time is not None:
            return package.upload_time.strftime("%Y-%m-%dT%H:%M:%SZ")
    raise Unavailable(f"index {index} lists no upload time of {filename} ({project})")


def file_url(project: str, filename: str, sha256: str, index: str | None = None) -> str:
    """The download URL of FILENAME in PROJECT's index page; its listed sha256 must match."""
    index = index or index_url()
    _, url, listed = find_file(project, lambda name: name == filename, index, what=filename)
    if listed and listed != sha256:
        raise ArcvllmError(f"index {index}: {filename} has sha256 {listed}, the pin says {sha256}")
    return url


ATTEMPTS = 3  # a download cut off mid-body (seen from PyPI's CDN in CI) is asked for again
RETRY_DELAY = 2.0  # seconds, times the attempt


def fetch(url: str, sha256: str, dest: Path) -> Path:
    """Download URL into the folder DEST (kept if it already verifies) and check its sha256.
    A connection that breaks (or a 5xx) is tried again, up to ATTEMPTS in all, saying so."""
    import httpx

    dest.mkdir(parents=True, exist_ok=True)
    target = dest / url.rsplit("/", 1)[-1].split("#", 1)[0]
    if target.exists() and sha256_of(target) == sha256:
        return target
    part = target.with_name(target.name + ".part")
    verify = tls_verify()
    for attempt in range(1, ATTEMPTS + 1):
        try:
            with httpx.stream(
                "GET", url, follow_redirects=True, timeout=120, verify=verify
            ) as response:
                response.raise_for_status()
                with part.open("wb") as out:
                    for chunk in response.iter_bytes(1 << 20):
                        out.write(chunk)
            break
        except httpx.HTTPError as exc:
            part.unlink(missing_ok=True)
            # Broken mid-answer, or the server's own failure: worth asking again. Nothing
            # listening, a name that does not resolve, a 404: the answer, said once.
            transient = isinstance(exc, (httpx.RemoteProtocolError, httpx.ReadError)) or (
                isinstance(exc, httpx.HTTPStatusError) and exc.response.status_code >= 500
            )
            if not transient or attempt == ATTEMPTS:
                raise Unavailable(f"cannot download {url}: {exc}") from None
            print(
                f"arcvllm: {target.name}: {exc}; trying again ({attempt + 1}/{ATTEMPTS})",
                file=sys.stderr,
            )
            time.sleep(RETRY_DELAY * attempt)
    got = sha256_of(part)
    if got != sha256:
        part.unlink()
        raise ArcvllmError(f"{target.name}: sha256 {got}, the pin says {sha256}")
    part.replace(target)
    return target


def fetch_file(project: str, filename: str, sha256: str, dest: Path) -> Path:
    """FILENAME of PROJECT from the configured index into DEST, verified."""
    cached = dest / filename
    if cached.exists() and sha256_of(cached) == sha256:
        return cached
    return fetch(file_url(project, filename, sha256), sha256, dest)


def sha256_of(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def _main(argv: list[str]) -> int:
    """`python -m arcvllm.builder.index PROJECT FILENAME SHA256 [DEST]`: print the URL, or
    fetch; `... --uv-sources`: uv_sources(), one argument a line."""
    if argv == ["--uv-sources"]:
        print("\n".join(uv_sources()))
        return 0
    project, filename, sha256, *dest = argv
    if dest:
        print(fetch_file(project, filename, sha256, Path(dest[0])))
    else:
        print(file_url(project, filename, sha256))
    return 0


if __name__ == "__main__":
    try:
        sys.exit(_main(sys.argv[1:]))
    except ArcvllmError as exc:
        print(f"arcvllm: {exc}", file=sys.stderr)
        sys.exit(exc.exit_code)
    except ValueError:
        print(
            "usage: python -m arcvllm.builder.index PROJECT FILENAME SHA256 [DEST]", file=sys.stderr
        )
        sys.exit(UsageError.exit_code)


def build_args(stack: Stack) -> dict[str, str]:
    """STACK's build args plus VLLM_SDIST_URL, asked of the package index pip is configured
    with (the stack pins the sdist by VLLM_SDIST_SHA256)."""
    values = stack.build_args()
    if sha256 := values.get("VLLM_SDIST_SHA256"):
        values["VLLM_SDIST_URL"] = file_url("vllm", stack.sdist, sha256)
    return values
