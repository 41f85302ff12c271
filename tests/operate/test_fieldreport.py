"""field-report: secrets never reach the tarball; the summary reads the collected files.

The end-to-end run against the CPU service is in tests/operate/test_deploy.py."""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import tarfile

import pytest
from support import ROOT

from arcvllm.commands import fieldreport as field_report_command
from arcvllm.operate import canary
from arcvllm.operate import fieldreport as F

KEY = "k-5e1f0c3b9d7a"


def test_redact_removes_the_literal_secret_and_token_shapes():
    text = (
        f"key {KEY} in a line\n"
        "curl -H 'Authorization: Bearer sk-live-123' url\n"
        "vllm serve --api-key abc123 --port 8000\n"
        "non-default args: {'api_key': ['zzz-999'], 'port': 8000}\n"
        "HF_TOKEN=hf_abcdefghijklmnopqrstuvwxyz12\n"
    )
    out = F.redact(text, {KEY})
    for secret in (KEY, "sk-live-123", "abc123", "zzz-999", "hf_abcdefghijklmnopqrstuvwxyz12"):
        assert secret not in out, secret
    assert out.count(F.REDACTED) == 5
    assert "--port 8000" in out and "'port': 8000" in out


def test_a_bare_key_is_only_caught_because_the_settings_name_it():
    """The sibling: without the settings file's value, a key in free text would leak."""
    assert KEY in F.redact(f"oops {KEY}", set())
    assert KEY not in F.redact(f"oops {KEY}", F.secrets_from({"VLLM_API_KEY": KEY}))
    assert F.secrets_from({"VLLM_API_KEY": "", "HF_TOKEN": "t"}) == {"t"}


def test_the_tarball_holds_every_step_redacted_and_a_summary(tmp_path):
    c = F.Collector("compose", "svc", {KEY})
    doctor = {"preset": "p", "ok": False, "rows": [{"check": "render node", "status": "fail"}]}
    c.add("host/doctor.json", "arcvllm doctor --json", json.dumps(doctor))
    c.add("server.log", "compose logs", f"api_key: {KEY}\nstarted\n")
    c.shell("container/sycl-ls.txt", f"echo {KEY}; exit 3")
    summary = F.summary(c, "now")
    assert "doctor host: preset p, FAIL; not ok: render node (fail)" in summary
    assert "failed steps: container/sycl-ls.txt" in summary
    out = tmp_path / "field-report.tar.gz"
    names = F.write(out, c, summary)
    assert names == [
        "host/doctor.json",
        "server.log",
        "container/sycl-ls.txt",
        "commands.txt",
        "summary.txt",
    ]
    with tarfile.open(out) as tar:
        blobs = {m.name: tar.extractfile(m).read() for m in tar.getmembers()}
    assert set(blobs) == {f"field-report/{n}" for n in names}
    assert all(KEY.encode() not in b for b in blobs.values())
    assert b"started" in blobs["field-report/server.log"]
    assert b"rc=3" in blobs["field-report/commands.txt"]


def test_a_json_member_stays_json_when_its_command_also_writes_to_stderr(tmp_path):
    """A failing doctor prints its JSON, then one line on stderr: the member must parse."""
    c = F.Collector("compose", "svc", {KEY})
    doctor = f"""echo '{{"preset": "p"}}'; echo 'arcvllm: no {KEY}' >&2; exit 1"""
    c.shell("host/doctor.json", doctor)
    c.shell("server.log", "echo out; echo err >&2")
    out = tmp_path / "field-report.tar.gz"
    names = F.write(out, c, F.summary(c, "now"))
    assert names[:3] == ["host/doctor.json", "host/doctor.stderr.txt", "server.log"]
    with tarfile.open(out) as tar:
        blobs = {m.name.split("/", 1)[1]: tar.extractfile(m).read() for m in tar.getmembers()}
    assert json.loads(blobs["host/doctor.json"]) == {"preset": "p"}
    assert blobs["host/doctor.stderr.txt"] == f"arcvllm: no {F.REDACTED}\n".encode()
    assert blobs["server.log"] == b"out\n\nerr\n"


def test_the_api_key_given_on_the_command_line_is_redacted_and_json_lists_the_steps(
    tmp_path, monkeypatch, capsys
):
    """A deployment whose every exec prints the key, which only --api-key names."""
    from arcvllm import cli

    monkeypatch.delenv("VLLM_API_KEY", raising=False)
    monkeypatch.setenv("ARCVLLM_TEST_LEAK", KEY)
    out = tmp_path / "r.tar.gz"
    argv = [
        "field-report", "--compose", "sh -c 'echo leaked $ARCVLLM_TEST_LEAK' compose",
        "--service", "svc", "--image", "none", "--docker", "false",
        "--api-key", KEY, "--preset", "tiny-hybrid-cpu",
        "--no-smoke", "--no-bench", "--out", str(out), "--json",
    ]  # fmt: skip
    assert cli.main(argv) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["out"] == str(out)
    names = [s["name"] for s in doc["steps"]]
    assert "container/doctor.json" in names and "image/labels.json" in doc["failed"]
    with tarfile.open(out) as tar:
        blobs = {m.name: tar.extractfile(m).read() for m in tar.getmembers()}
    assert b"leaked <redacted>" in blobs["r/container/doctor.json"]
    assert all(KEY.encode() not in b for b in blobs.values())


def test_an_out_that_is_no_tarball_is_a_usage_error(tmp_path, capsys):
    from arcvllm import cli

    argv = ["field-report", "--compose", "true", "--service", "s", "--image", "i"]
    argv += ["--out", str(tmp_path / "report.zip")]
    assert cli.main(argv) == 2
    assert (
        capsys.readouterr().err
        == f"arcvllm: --out {tmp_path / 'report.zip'}: name the tarball *.tar.gz\n"
    )


def test_the_hosts_doctor_checks_the_deployments_settings_file(tmp_path, capsys):
    """doctor compares the file's RENDER_GID with the host's render nodes."""
    from arcvllm import cli

    settings = tmp_path / "mine.env"
    settings.write_text("RENDER_GID=4242\n")
    out = tmp_path / "r.tar.gz"
    argv = [
        "field-report", "--compose", "true", "--service", "svc", "--image", "none",
        "--docker", "false", "--preset", "tiny-hybrid-cpu",
        "--env-file", str(settings), "--no-smoke", "--no-bench",
        "--out", str(out), "--json",
    ]  # fmt: skip
    assert cli.main(argv) == 0
    capsys.readouterr()
    with tarfile.open(out) as tar:
        # (doctor's one-line verdict on stderr follows the JSON when a row fails)
        doctor = json.JSONDecoder().raw_decode(
            tar.extractfile("r/host/doctor.json").read().decode()
        )[0]
        commands = tar.extractfile("r/commands.txt").read().decode()
    assert f"doctor --json --preset tiny-hybrid-cpu --env-file {settings}" in commands
    assert "RENDER_GID" in {row["check"] for row in doctor["rows"]}


def sh(command: str, env: dict[str, str]) -> subprocess.CompletedProcess:
    return subprocess.run(
        ["sh", "-c", command], capture_output=True, text=True, timeout=60,
        env={"PATH": os.environ["PATH"], **env},
    )  # fmt: skip


def test_the_libfabric_step_lists_the_tree_the_image_really_has(tmp_path):
    """What a B70 build holds (docs/images.md): the variables that pick libfabric, every
    libfabric / provider / fi_info file, and fi_info's tcp provider; exit 0 either way."""
    lib = tmp_path / "opt/venv/lib"
    lib.mkdir(parents=True)
    for name in ("libfabric.so.1", "libtcp-fi.so", "libshm-fi.so", "libmpi.so.12"):
        (lib / name).write_text("")
    tool = tmp_path / "opt/venv/bin/libfabric/fi_info"
    tool.parent.mkdir(parents=True)
    tool.write_text('#!/bin/sh\necho "provider: tcp ($*)"\n')
    tool.chmod(0o755)
    env = {"CCL_OFI_LIBRARY_PATH": "/opt/venv/lib/libfabric.so.1", "FI_PROVIDER_PATH": "/x"}
    done = sh(F.libfabric_command((str(tmp_path / "opt"),), str(tool)), env)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert "CCL_OFI_LIBRARY_PATH=/opt/venv/lib/libfabric.so.1" in lines
    assert "I_MPI_ROOT=" in lines
    assert [ln for ln in lines if ln.startswith(str(tmp_path))] == [
        str(tool), str(lib / "libfabric.so.1"), str(lib / "libshm-fi.so"), str(lib / "libtcp-fi.so")
    ]  # fmt: skip
    assert lines[-1] == "provider: tcp (-p tcp)"
    tool.unlink()
    done = sh(F.libfabric_command((str(tmp_path / "opt"),), str(tool)), {})
    assert done.returncode == 0 and done.stdout.splitlines()[-1] == "fi_info: not in this image"


def test_the_caches_step_counts_what_each_compile_cache_holds(tmp_path):
    neo = tmp_path / "neo"
    neo.mkdir()
    (neo / "a.l0_cache").write_text("x" * 2048)
    (neo / "b.l0_cache").write_text("y")
    done = sh(F.caches_command(("NEO_CACHE_DIR", "SYCL_CACHE_DIR")), {"NEO_CACHE_DIR": str(neo)})
    assert done.returncode == 0, done.stderr
    first, second = done.stdout.splitlines()
    assert first.startswith(f"NEO_CACHE_DIR={neo}: 2 files, ")
    assert second == "SYCL_CACHE_DIR=unset: no folder"


def test_the_restart_step_times_the_service_to_healthy_and_the_summary_says_it(tmp_path):
    """A compose that restarts and answers /health from its second try: the step waits
    for it; one that never answers is cut at the timeout (exit 124)."""
    compose = tmp_path / "compose"
    tries = tmp_path / "tries"
    compose.write_text(
        "#!/bin/sh\n"
        f'echo "$*" >> {tries}\n'
        '[ "$3" = restart ] && exit 0\n'
        f'[ "$(grep -c exec {tries})" -ge 2 ]\n'
    )
    compose.chmod(0o755)
    done = sh(F.restart_command(f"{compose} -p x", "vllm", 60), {})
    assert done.returncode == 0, done.stderr
    assert re.fullmatch(r"healthy after \d+ s\n", done.stdout)
    assert tries.read_text().splitlines()[0] == "-p x restart vllm"
    c = F.Collector("compose", "svc")
    c.add("restart/restart.txt", "restart", done.stdout)
    assert f"warm restart: {done.stdout.strip()}" in F.summary(c, "now")
    compose.write_text('#!/bin/sh\n[ "$3" = restart ]\n')
    done = sh(F.restart_command(f"{compose} -p x", "vllm", 1), {})
    assert done.returncode == 124 and done.stdout.strip() == "not healthy after 1 s"


def test_the_summary_carries_decode_and_the_speculative_acceptance_of_the_bench():
    from arcvllm.operate.fieldreport import bench_line

    spec = {
        "summary": {"decode_tok_s": 61.26},
        "speculation": {"acceptance_rate": 0.374, "mean_accepted_length": 1.75},
    }
    assert bench_line(spec) == (
        ", decode 61.3 tok/s, speculative: acceptance 37.4%, mean accepted length 1.75"
    )
    assert bench_line({"summary": {"decode_tok_s": 60.0}, "speculation": None}) == (
        ", decode 60.0 tok/s"
    )
    assert bench_line({}) == ""


def test_field_report_takes_no_option_it_never_reads():
    """It required --base-url and read neither it nor --ca-cert nor --scratch: smoke and
    bench run inside the container against the server itself."""
    from arcvllm.cli import main

    for unused in ("--base-url", "--ca-cert", "--scratch"):
        argv = ["field-report", "--compose", "c", "--service", "s", "--image", "i"]
        with pytest.raises(SystemExit) as exit_:
            main([*argv, unused, "x"])
        assert exit_.value.code == 2, unused
    root = ROOT
    dry = subprocess.run(["make", "-n", "field-report"], cwd=root, capture_output=True, text=True)
    assert "--base-url" not in dry.stdout and "--scratch" not in dry.stdout


def test_the_key_compose_hands_out_is_redacted_whoever_names_it(tmp_path, monkeypatch):
    """The key file as operate.host finds it: the shell's VLLM_API_KEY_FILE over the
    settings file's; an unreadable one redacts nothing (and stops nothing)."""
    from arcvllm.operate.fieldreport import key_file_secret

    mine, theirs = tmp_path / "mine", tmp_path / "theirs"
    mine.write_text("k-mine\n")
    theirs.write_text("k-theirs\n")
    monkeypatch.delenv("VLLM_API_KEY_FILE", raising=False)
    assert key_file_secret({"VLLM_API_KEY_FILE": str(mine)}) == {"k-mine"}
    monkeypatch.setenv("VLLM_API_KEY_FILE", str(theirs))
    assert key_file_secret({"VLLM_API_KEY_FILE": str(mine)}) == {"k-theirs"}
    monkeypatch.setenv("VLLM_API_KEY_FILE", str(tmp_path / "none"))
    assert key_file_secret({}) == set()


def test_the_summary_says_the_verify_verdict_and_its_failed_rows():
    c = F.Collector("compose", "svc", set())
    report = {"verdict": "fail", "failed": ["boundary decode", "degeneration"]}
    c.add("verify/verify.json", "arcvllm verify", json.dumps(report))
    c.add("smoke/smoke.json", "arcvllm smoke", json.dumps({"verdict": "pass", "failed": []}))
    summary = F.summary(c, "now")
    assert "verify: fail (boundary decode, degeneration)" in summary
    assert "smoke: pass\n" in summary + "\n"


def test_the_verify_step_runs_the_canarys_rows_inside_the_container():
    parser = argparse.ArgumentParser()
    field_report_command.add_options(parser)
    opts = parser.parse_args([])
    assert opts.verify_rows.split(",") == list(canary.ROWS)
