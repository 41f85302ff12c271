"""The series file and the plan it gives per vLLM release (pure, no vLLM needed)."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from arcvllm.errors import CheckFailed
from arcvllm.patching import series
from arcvllm.paths import patches_dir


def states(version: str) -> dict[str, str]:
    the_series = series.load()
    entries = series.entries_for(the_series, series.parse_version(version))
    return {
        s.patch.name: s.expect + (f":{s.variant.file.name}" if s.variant else "") for s in entries
    }


@pytest.mark.parametrize(
    ("version", "copy", "fused", "warning"),
    [
        ("0.17.0", "apply", "not-applicable", "unpatched"),
        ("0.19.1", "apply", "not-applicable", "unpatched"),
        ("0.20.1rc1.dev105+g83fec0428", "apply", "not-applicable", "apply"),  # the report's
        ("0.20.2", "apply", "not-applicable", "apply"),
        ("0.20.2+xpu", "apply", "not-applicable", "apply"),
        ("0.21.0", "apply", "not-applicable", "apply"),
        ("0.22.0", "apply", "apply", "apply"),
        ("0.23.0", "apply", "apply", "apply"),
        ("0.24.0", "upstream", "apply", "apply"),
        ("0.28.0", "upstream", "apply", "apply"),
        ("0.29.0", "upstream", "upstream", "apply"),
        ("0.32.0", "upstream", "upstream", "apply"),
        ("0.33.0+xpu", "upstream", "upstream", "apply"),
    ],
)
def test_plan_selects_each_patch_by_release(version, copy, fused, warning):
    got = {name: state.split(":")[0] for name, state in states(version).items()}
    assert got == {
        "mamba-copy-uint64": copy,
        "mamba-fused-u64": fused,
        "mamba-block-size-align-warning": warning,
    }


def test_a_release_with_the_bug_and_no_variant_is_unpatched_never_not_applicable(series_copy):
    # Narrow the copy patch's only variant: 0.21-0.23 still carry the bug (below 0.24.0).
    series_copy.write_text(
        series_copy.read_text().replace('versions: ">=0.17.0,<0.24.0"', 'versions: "<0.21.0"')
    )
    the_series = series.load(series_copy)
    expect = {
        v: {s.patch.name: s.expect for s in series.entries_for(the_series, series.parse_version(v))}
        for v in ("0.20.2", "0.21.0", "0.23.0", "0.24.0", "0.33.0", "0.34.0", "0.35.0")
    }
    assert {v: e["mamba-copy-uint64"] for v, e in expect.items()} == {
        "0.20.2": series.APPLY,
        "0.21.0": series.UNPATCHED,
        "0.23.0": series.UNPATCHED,
        "0.24.0": series.UPSTREAM,
        "0.33.0": series.UPSTREAM,
        "0.34.0": series.NOT_APPLICABLE,  # the code it patches is removed
        "0.35.0": series.NOT_APPLICABLE,
    }
    # Outside the supported range nothing is claimed about a bug upstream has not fixed.
    assert expect["0.35.0"]["mamba-block-size-align-warning"] == series.NOT_APPLICABLE
    assert expect["0.34.0"]["mamba-block-size-align-warning"] == series.APPLY
    assert expect["0.23.0"]["mamba-block-size-align-warning"] == series.APPLY


def test_a_patch_whose_code_is_removed_is_not_applicable_from_that_release():
    the_series = series.load()
    copy = next(p for p in the_series.patches if p.name == "mamba-copy-uint64")
    assert (copy.removed_version, copy.removed(series.parse_version("0.33.0"))) == (
        series.parse_version("0.34.0"),
        False,
    )
    states = {
        v: {s.patch.name: s.expect for s in series.entries_for(the_series, series.parse_version(v))}
        for v in ("0.33.0", "0.34.0")
    }
    assert states["0.33.0"]["mamba-copy-uint64"] == series.UPSTREAM
    assert states["0.34.0"]["mamba-copy-uint64"] == series.NOT_APPLICABLE
    assert states["0.34.0"]["mamba-fused-u64"] == series.UPSTREAM


@pytest.mark.parametrize(
    "removed, says",
    [
        ("0.20.0", r"mamba-copy-uint64\.patch claims 0\.20\.0, where the code"),
        # a range that never holds the removed release itself: the removal would always win
        ("0.10.0", r"mamba-copy-uint64\.patch claims releases from 0\.17\.0 on, after"),
    ],
)
def test_a_variant_that_claims_a_release_without_its_code_is_refused(series_copy, removed, says):
    text = series_copy.read_text()
    series_copy.write_text(
        text.replace('version: "0.34.0"\n      what:', f'version: "{removed}"\n      what:')
    )
    with pytest.raises(CheckFailed, match=says):
        series.load(series_copy)


@pytest.mark.parametrize(
    "versions, floor",
    [(">=0.17.0,<0.24.0", "0.17.0"), ("<0.24.0", None), ("==0.20.*", "0.20"),
     (">0.19,>=0.18", "0.19"), ("~=0.22.1", "0.22.1")],
)  # fmt: skip
def test_the_lower_bound_of_a_range(versions, floor):
    from packaging.specifiers import SpecifierSet

    found = series.lower_bound(SpecifierSet(versions))
    assert found == (series.parse_version(floor) if floor else None)


def test_a_removal_names_what_became_of_the_code(series_copy):
    text = series_copy.read_text()
    start = text.index("      what: >-\n        MambaCopyBuffers")
    end = text.index("\n\n", start)
    series_copy.write_text(text[:start] + text[end:])
    with pytest.raises(CheckFailed, match="removed needs version and what"):
        series.load(series_copy)


def test_plan_prints_unpatched_for_a_release_with_the_bug_and_no_variant():
    out = subprocess.run(
        [sys.executable, "-m", "arcvllm", "patches", "plan", "--vllm-version", "0.18.1"],
        capture_output=True,
        text=True,
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == (
        "mamba-block-size-align-warning=unpatched,mamba-copy-uint64=applied,"
        "mamba-fused-u64=not-applicable"
    )


@pytest.mark.parametrize(
    ("version", "variant"),
    [
        ("0.20.2", "mamba-block-size-align-warning-0.20.patch"),
        ("0.29.0", "mamba-block-size-align-warning-0.20.patch"),
        ("0.30.0", "mamba-block-size-align-warning-0.30.patch"),
        ("0.31.0", "mamba-block-size-align-warning-0.30.patch"),
        ("0.32.0", "mamba-block-size-align-warning-0.32.patch"),
        ("0.33.0", "mamba-block-size-align-warning-0.32.patch"),
    ],
)
def test_the_variant_follows_the_code_that_moved(version, variant):
    assert states(version)["mamba-block-size-align-warning"] == f"apply:{variant}"


@pytest.mark.parametrize(
    ("version", "supported"),
    [
        ("0.16.0", False),
        ("0.17.0", True),
        ("0.33.0", True),
        ("0.33.0+xpu", True),
        ("0.34.0", True),
        ("0.34.1", False),
        ("0.35.0", False),
    ],
)
def test_supported_range(version, supported):
    assert series.load().supports(series.parse_version(version)) is supported


def test_every_patch_carries_a_dep3_header_with_its_upstream_status():
    for patch in series.load().patches:
        for variant in patch.variants:
            fields = series.header(variant.file)
            assert fields["Description"] and fields["Bug"].startswith("https://")
            if patch.upstream_version is not None:
                assert str(patch.upstream_version) in fields["Applied-Upstream"]


def test_summary_is_sorted_and_stable():
    assert series.summary({"b": "upstream", "a": "applied"}) == "a=applied,b=upstream"


@pytest.fixture
def series_copy(tmp_path: Path) -> Path:
    copy = tmp_path / "patches"
    shutil.copytree(patches_dir(), copy)
    return copy / "series.yaml"


def test_a_patch_file_that_differs_from_its_sha256_is_refused(series_copy):
    patch = series_copy.parent / "mamba-copy-uint64.patch"
    patch.write_text(patch.read_text().replace("np.uint64", "np.int64"))
    with pytest.raises(CheckFailed, match=r"mamba-copy-uint64\.patch has sha256"):
        series.load(series_copy)


def test_a_patch_without_its_dep3_bug_field_is_refused(series_copy):
    import hashlib

    patch = series_copy.parent / "mamba-fused-u64.patch"
    old = hashlib.sha256(patch.read_bytes()).hexdigest()
    lines = [line for line in patch.read_text().splitlines(True) if not line.startswith("Bug:")]
    patch.write_text("".join(lines))
    new = hashlib.sha256(patch.read_bytes()).hexdigest()
    series_copy.write_text(series_copy.read_text().replace(old, new))
    with pytest.raises(CheckFailed, match="DEP-3 header lacks Bug"):
        series.load(series_copy)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("patches: [", "not valid YAML"),
        ("supported: '>=0.17'\n", "needs a `supported` specifier and a `patches` list"),
        ("supported: 'banana'\npatches: []\n", "not a PEP 440 specifier"),
        ("supported: '>=0.17'\npatches:\n  - name: x\n", "needs name, probe and variants"),
    ],
)
def test_a_malformed_series_is_refused_with_one_line(series_copy, text, message):
    series_copy.write_text(text)
    with pytest.raises(CheckFailed, match=message) as err:
        series.load(series_copy)
    assert "\n" not in str(err.value)
