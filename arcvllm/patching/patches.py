"""Apply the vLLM patch series to a target, verified by behaviour, all or nothing.

For each patch the series selects for the target's version: a probe that already passes
on the unpatched code means upstream carries the fix (the file is left alone); otherwise
the patch must dry-run cleanly (GNU patch, no fuzz). Only when every selected patch is
clean are they applied, and then every probe must pass; anything else restores every file
it touched and fails with one line. Where the series has no variant and says the release
carries the bug (`unpatched`), the probe must fail: a pass means the series is wrong.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from arcvllm import __version__
from arcvllm.errors import ArcvllmError, CheckFailed, Unavailable, UsageError
from arcvllm.patching import probe, series
from arcvllm.patching.target import Target, find
from arcvllm.paths import patches_dir
from arcvllm.text import columns

# States a patch can be in on a target.
APPLIED = "applied"  # our patch is in the tree
UPSTREAM = "upstream"  # the release carries the fix; the tree is untouched
UNPATCHED = "unpatched"  # the release carries the bug and the series has no variant for it
NOT_APPLICABLE = "not-applicable"  # the release does not carry the bug
PENDING = "pending"  # needed, applies cleanly, not applied yet (status/verify only)
DRIFT = "drift"  # needed, but the patch no longer fits the tree

MANIFEST_NAME = "arcvllm-patches.json"


@dataclass
class PatchStatus:
    entry: series.SeriesEntry
    state: str = ""
    probe: str = "-"  # pass / fail / error / - (not run)
    detail: str = ""
    action: str = ""  # what apply did: "patched", "already applied", or ""

    @property
    def name(self) -> str:
        return self.entry.patch.name


@dataclass
class PatchReport:
    target: Target
    rows: list[PatchStatus] = field(default_factory=list)

    def states(self) -> dict[str, str]:
        return {row.name: row.state for row in self.rows}

    def summary(self) -> str:
        return series.summary(self.states())

    def not_verified(self) -> list[PatchStatus]:
        """The rows `patches verify` fails: a fix not in place, or a probe that did not pass."""
        return [
            row
            for row in self.rows
            if row.state in (PENDING, DRIFT, UNPATCHED)
            or (row.state != NOT_APPLICABLE and row.probe != "pass")
        ]

    def verdict(self) -> dict:
        """`verified`, and the rows that are not, for verify's JSON."""
        bad = self.not_verified()
        return {"verified": not bad, "not_verified": [row.name for row in bad]}

    def require_verified(self) -> None:
        """CheckFailed naming every row that is not verified (each state and probe)."""
        if bad := self.not_verified():
            raise CheckFailed(
                "not verified: "
                + ", ".join(f"{row.name} is {row.state} (probe {row.probe})" for row in bad)
            )

    def applied(self) -> str:
        """What `patches apply` did, a line each: patched, and unpatched (the bug stays)."""
        changed = [row.name for row in self.rows if row.action == "patched"]
        lines = [f"patched: {', '.join(changed) if changed else 'nothing (already up to date)'}"]
        if unpatched := [row.name for row in self.rows if row.state == UNPATCHED]:
            lines.append(f"unpatched (the bug stays): {', '.join(unpatched)}")
        return "\n".join(lines)

    def manifest(self) -> dict:
        return {
            "arcvllm": __version__,
            "vllm": {
                "version": str(self.target.version),
                "distribution": self.target.distribution,
            },
            "summary": self.summary(),
            "patches": [
                {
                    "name": row.name,
                    "state": row.state,
                    "file": row.entry.variant.file.name if row.entry.variant else None,
                    "sha256": row.entry.variant.sha256 if row.entry.variant else None,
                    "versions": str(row.entry.variant.versions) if row.entry.variant else None,
                    "upstream": _upstream(row.entry.patch),
                    "probe": row.entry.patch.probe,
                    "probe_result": row.probe,
                }
                for row in self.rows
            ],
        }


def _upstream(patch: series.Patch) -> str | None:
    if patch.upstream_version is None:
        return None
    return f"fixed in {patch.upstream_version} by {patch.upstream_by}"


# --- GNU patch -------------------------------------------------------------------------


def _file(row: PatchStatus) -> Path:
    """The patch file of ROW's variant (a row that drifted or is pending has one)."""
    assert row.entry.variant is not None
    return row.entry.variant.file


def _gnu_patch() -> str:
    exe = shutil.which("patch")
    if exe is None:
        raise CheckFailed("GNU patch is not installed (Debian/Ubuntu: apt-get install patch)")
    return exe


def _patch(target: Target, file: Path, *, dry_run: bool, reverse: bool = False):
    # --force: do exactly what is asked, never guess that a patch is reversed (which
    # --batch would do, turning a reverse check of an unapplied patch into an apply).
    args = [_gnu_patch(), "-p1", "--fuzz=0", "--force", "--no-backup-if-mismatch"]
    args += ["--reject-file=-", "-d", str(target.root), "-i", str(file)]
    if reverse:
        args.append("--reverse")
    if dry_run:
        args.append("--dry-run")
    return subprocess.run(args, capture_output=True, text=True, stdin=subprocess.DEVNULL)


def _failed_hunk(file: Path, output: str) -> str:
    """'path hunk #N (@@ ... @@) at line L' for the first failed hunk in PATCH's output."""
    headers: list[tuple[str, list[str]]] = []
    for line in file.read_text().splitlines():
        if line.startswith("+++ "):
            headers.append((series.touched_files(file)[len(headers)], []))
        elif line.startswith("@@") and headers:
            headers[-1][1].append(line.split("@@")[1].strip())
    current = 0
    for line in output.splitlines():
        if line.startswith("checking file ") or line.startswith("patching file "):
            name = line.split(" file ", 1)[1].strip()
            current = next((i for i, (p, _) in enumerate(headers) if p == name), current)
        match = re.match(r"Hunk #(\d+) FAILED at (\d+)", line)
        if match and headers:
            path, hunks = headers[current]
            n = int(match.group(1))
            hunk = hunks[n - 1] if n <= len(hunks) else "?"
            return f"{path} hunk #{n} (@@ {hunk} @@) failed at line {match.group(2)}"
        if "can't find file" in line or "No file to patch" in line:
            return f"{headers[current][0] if headers else '?'} not found in the tree"
    return output.strip().splitlines()[-1] if output.strip() else "patch failed"


# --- probes ----------------------------------------------------------------------------


def run_probes(target: Target, names: list[str], python: str) -> dict[str, dict[str, str]]:
    """Run the named probes in a fresh PYTHON process that imports TARGET's vllm."""
    if not names:
        return {}
    # The probe file runs by path, so the target's Python needs no arcvllm installed;
    # the target root goes on sys.path after site set-up (a PYTHONPATH entry equal to
    # site-packages would stop its .pth files from being read).
    bootstrap = (
        "import runpy, sys; root = sys.argv[1]; "
        "root in sys.path or sys.path.insert(0, root); "
        f"sys.argv = ['arcvllm-probe', *sys.argv[2:]]; runpy.run_path({probe.__file__!r}, "
        "run_name='__main__')"
    )
    # The probe runs in a scratch directory: a relative interpreter path is the caller's.
    interpreter = shutil.which(python) if os.sep not in python else os.path.abspath(python)
    if interpreter is None or not os.access(interpreter, os.X_OK):
        raise UsageError(f"--python {python}: no interpreter there")
    with tempfile.TemporaryDirectory(prefix="arcvllm-probe-") as scratch:
        env = dict(os.environ, VLLM_NO_USAGE_STATS="1", VLLM_CACHE_ROOT=scratch, TMPDIR=scratch)
        proc = subprocess.run(
            [interpreter, "-c", bootstrap, str(target.root), *names],
            capture_output=True,
            text=True,
            cwd=scratch,
            env=env,
        )
    results = {}
    for line in proc.stdout.splitlines():
        if line.startswith("ARCVLLM-PROBE "):
            result = json.loads(line.removeprefix("ARCVLLM-PROBE "))
            results[result["probe"]] = result
    missing = [n for n in names if n not in results]
    if missing:
        tail = (proc.stderr or proc.stdout).strip().splitlines()[-1:] or ["no output"]
        raise CheckFailed(
            f"probes {', '.join(missing)} did not run against vLLM {target.version} "
            f"with {python}: {tail[0]}"
        )
    return results


# --- the three commands ----------------------------------------------------------------


def check_supported(target: Target, the_series: series.Series, allow_unsupported: bool):
    if not the_series.supports(target.version) and not allow_unsupported:
        raise Unavailable(
            f"vLLM {target.version} is outside the supported range {the_series.supported} "
            "(--allow-unsupported to try anyway)"
        )


def inspect_target(target: Target, the_series: series.Series, python: str) -> PatchReport:
    """The state of every patch on TARGET, without changing anything."""
    entries = series.entries_for(the_series, target.version)
    report = PatchReport(target, [PatchStatus(entry) for entry in entries])
    to_probe = []
    for row in report.rows:
        if row.entry.expect == series.NOT_APPLICABLE:
            row.state = NOT_APPLICABLE
            patch = row.entry.patch
            if patch.removed(target.version):
                row.detail = f"removed in {patch.removed_version}: {patch.removed_what}"
            continue
        if row.entry.expect == series.UNPATCHED:
            row.state = UNPATCHED
            row.detail = f"vLLM {target.version} carries the bug; no variant of the series fits it"
        elif row.entry.expect == series.APPLY:
            assert row.entry.variant is not None
            if _patch(target, row.entry.variant.file, dry_run=True, reverse=True).returncode == 0:
                row.state = APPLIED
            elif (out := _patch(target, row.entry.variant.file, dry_run=True)).returncode == 0:
                row.state = PENDING
            else:
                row.state = DRIFT
                row.detail = _failed_hunk(row.entry.variant.file, out.stdout + out.stderr)
        else:
            row.state = UPSTREAM
        to_probe.append(row)
    results = run_probes(target, [row.entry.patch.probe for row in to_probe], python)
    for row in to_probe:
        result = results[row.entry.patch.probe]
        row.probe = result["result"]
        if row.state in (PENDING, DRIFT) and row.probe == "pass":
            row.state, row.detail = UPSTREAM, "probe passes on the unpatched code"
        elif row.state == UNPATCHED and row.probe == "pass":
            row.detail = (
                f"the series says vLLM {target.version} carries the bug, but probe "
                f"{row.entry.patch.probe} passes on its code: its `affected` or `upstream` is wrong"
            )
        elif result["detail"] and not row.detail:
            row.detail = result["detail"]
    return report


def apply(
    target: Target,
    the_series: series.Series,
    python: str,
    *,
    allow_unsupported: bool = False,
    expect: str | None = None,
) -> PatchReport:
    """Bring TARGET to the series, or leave it byte-identical and raise."""
    check_supported(target, the_series, allow_unsupported)
    report = inspect_target(target, the_series, python)
    version = target.version
    for row in report.rows:
        patch = row.entry.patch
        if row.state == UNPATCHED:
            if row.probe == "pass":
                raise CheckFailed(f"{patch.name}: {row.detail}")
            continue  # the bug stays, as the series says (a probe error leaves it unconfirmed)
        if row.probe == "error":
            raise CheckFailed(f"probe {patch.probe} cannot run on vLLM {version}: {row.detail}")
        if row.state == UPSTREAM and row.probe != "pass":
            raise CheckFailed(
                f"{patch.name}: vLLM {version} should carry upstream's fix "
                f"({_upstream(patch)}) but probe {patch.probe} fails: {row.detail}"
            )
        if row.state == DRIFT:
            raise CheckFailed(
                f"{patch.name} ({_file(row).name}) does not apply to vLLM {version}: "
                f"{row.detail}; no file was changed"
            )
    pending = [row for row in report.rows if row.state == PENDING]
    backups = {
        rel: (target.root / rel).read_bytes()
        for row in pending
        for rel in series.touched_files(_file(row))
    }
    try:
        for row in pending:
            out = _patch(target, _file(row), dry_run=False)
            if out.returncode != 0:
                raise CheckFailed(
                    f"{row.name}: applying failed on vLLM {version}: "
                    f"{_failed_hunk(_file(row), out.stdout + out.stderr)}"
                )
            row.state, row.action = APPLIED, "patched"
        applied = [row for row in report.rows if row.state == APPLIED]
        if pending:  # probed again once a file changed (an unchanged tree's were, above)
            results = run_probes(target, [row.entry.patch.probe for row in applied], python)
            for row in applied:
                result = results[row.entry.patch.probe]
                row.probe, row.detail = result["result"], result["detail"]
        for row in applied:
            if row.probe != "pass":
                raise CheckFailed(
                    f"{row.name}: applied to vLLM {version}, but probe {row.entry.patch.probe} "
                    f"fails: {row.detail}; every file restored"
                )
            row.action = row.action or "already applied"
        if expect is not None and report.summary() != expect:
            raise CheckFailed(
                f"vLLM {version}: the series gave {report.summary()}, expected {expect}"
            )
    except BaseException:
        _restore(target.root, backups)
        raise
    _compile(python, [target.root / rel for rel in backups])
    return report


def _compile(python: str, files: list[Path]) -> None:
    """The patched files' bytecode, checked by hash as pip writes it in a reproducible
    build: the .pyc of the unpatched file would be stale, and one stamped with the time
    would differ in each build (and be stale again once a release's timestamps are set)."""
    sources = [str(f) for f in files if f.suffix == ".py"]
    if sources:
        subprocess.run(
            [
                python,
                "-m",
                "compileall",
                "-q",
                "-f",
                "--invalidation-mode",
                "checked-hash",
                *sources,
            ],
            check=True,
            capture_output=True,
        )


def _restore(root: Path, backups: dict[str, bytes]) -> None:
    """Put back every file that changed, each by an atomic rename of a fresh file."""
    for rel, content in backups.items():
        path = root / rel
        if path.read_bytes() != content:
            fresh = path.with_name(path.name + ".arcvllm-restore")
            fresh.write_bytes(content)
            os.replace(fresh, path)


# --- output ----------------------------------------------------------------------------


def table(report: PatchReport) -> str:
    rows = [("patch", "state", "probe", "file", "upstream")]
    for row in report.rows:
        variant = row.entry.variant.file.name if row.entry.variant else "-"
        rows.append((row.name, row.state, row.probe, variant, _upstream(row.entry.patch) or "-"))
    target = report.target
    lines = [f"vLLM {target.version} ({target.distribution}) at {target.package}", columns(rows)]
    lines += [f"  {row.name}: {row.detail}" for row in report.rows if row.detail]
    return "\n".join(lines)


def write_manifest(report: PatchReport, path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(report.manifest(), indent=2, sort_keys=True) + "\n")


def series_file(build: bool, path: Path | None) -> Path | None:
    """The series file: the build series (BUILD), else PATH, else None (the bundled one)."""
    return patches_dir() / "build" / "series.yaml" if build else path


def inspect_tree(
    tree: Path | None, series_path: Path | None, python: str, allow_unsupported: bool
) -> PatchReport:
    """`patches status|verify`: each patch's state on the vLLM TREE (None: the installed
    one) (Unavailable: a release outside the series' range, unless ALLOW_UNSUPPORTED)."""
    target, the_series = find(tree), series.load(series_path)
    check_supported(target, the_series, allow_unsupported)
    return inspect_target(target, the_series, python)


def apply_tree(
    tree: Path | None,
    series_path: Path | None,
    python: str,
    allow_unsupported: bool,
    expect: str | None,
    out: Path | None,
) -> PatchReport:
    """`patches apply`: the series applied to the vLLM TREE (None: the installed one), the
    manifest written to OUT (None: beside the tree)."""
    target, the_series = find(tree), series.load(series_path)
    report = apply(target, the_series, python, allow_unsupported=allow_unsupported, expect=expect)
    write_manifest(report, out or target.root / MANIFEST_NAME)
    return report


def plan_states(the_series, version) -> dict[str, str]:
    """What the series expects for a vLLM version: patch name -> applied/upstream/..."""
    names = {
        series.APPLY: APPLIED,
        series.UPSTREAM: UPSTREAM,
        series.UNPATCHED: UNPATCHED,
        series.NOT_APPLICABLE: NOT_APPLICABLE,
    }
    return {s.patch.name: names[s.expect] for s in series.entries_for(the_series, version)}


def plan_summary(vllm_version: str) -> str:
    """The bundled series' summary for a vLLM version (the image's org.arcvllm.patches)."""
    return series.summary(plan_states(series.load(), series.parse_version(vllm_version)))


def plan(series_path: Path | None, vllm_version: str) -> dict:
    """`patches plan`: what the series expects for VLLM_VERSION (UsageError: not a version,
    or one outside the supported range): the version, the summary, each state."""
    the_series = series.load(series_path)
    try:
        version = series.parse_version(vllm_version)
    except ArcvllmError as exc:
        raise UsageError(f"--vllm-version: {exc}") from None
    if not the_series.supports(version):
        raise UsageError(f"vLLM {version} is outside the supported range {the_series.supported}")
    states = plan_states(the_series, version)
    return {"vllm": str(version), "summary": series.summary(states), "patches": states}
