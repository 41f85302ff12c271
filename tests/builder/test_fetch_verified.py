"""docker/fetch-verified.sh: every download checked by sha256, or refused."""

from __future__ import annotations

import hashlib
import subprocess
from pathlib import Path

from support import ROOT

SCRIPT = ROOT / "docker" / "fetch-verified.sh"


def fetch(tmp_path: Path, sums: str, *urls: str, **env: str) -> subprocess.CompletedProcess:
    out = tmp_path / "out"
    out.mkdir(exist_ok=True)
    return subprocess.run(
        ["bash", str(SCRIPT), str(out), sums, *urls],
        capture_output=True,
        text=True,
        env={"PATH": "/usr/bin:/bin", **env},
        timeout=60,
    )


def artifact(tmp_path: Path, name: str = "a.deb", body: bytes = b"payload") -> tuple[str, str]:
    path = tmp_path / name
    path.write_bytes(body)
    return path.as_uri(), hashlib.sha256(body).hexdigest()


def test_a_pinned_download_passes(tmp_path):
    url, digest = artifact(tmp_path)
    result = fetch(tmp_path, f"{digest}  a.deb", url)
    assert result.returncode == 0, result.stderr
    assert (tmp_path / "out" / "a.deb").read_bytes() == b"payload"


def test_a_wrong_sum_fails(tmp_path):
    url, _ = artifact(tmp_path)
    result = fetch(tmp_path, f"{'0' * 64}  a.deb", url)
    assert result.returncode != 0
    assert "FAILED" in result.stdout + result.stderr


def test_an_empty_pin_is_refused_and_names_the_file(tmp_path):
    url, digest = artifact(tmp_path)
    result = fetch(tmp_path, "", url)
    assert result.returncode == 1
    assert "no sha256 pinned for: a.deb" in result.stderr
    assert digest in result.stderr  # the sum seen, to compare with the publisher's
    assert "refusing unverified downloads" in result.stderr


def test_one_unpinned_file_among_pinned_ones_is_refused(tmp_path):
    url_a, digest_a = artifact(tmp_path, "a.deb", b"a")
    url_b, _ = artifact(tmp_path, "b.deb", b"b")
    result = fetch(tmp_path, f"{digest_a}  a.deb", url_a, url_b)
    assert result.returncode == 1
    assert "no sha256 pinned for: b.deb;" in result.stderr


def test_the_operator_can_take_unverified_downloads_on_purpose(tmp_path):
    url_a, digest_a = artifact(tmp_path, "a.deb", b"a")
    url_b, _ = artifact(tmp_path, "b.deb", b"b")
    result = fetch(tmp_path, f"{digest_a}  a.deb", url_a, url_b, ALLOW_UNVERIFIED="1")
    assert result.returncode == 0, result.stderr
    assert "ALLOW_UNVERIFIED=1: taking them unverified" in result.stderr
