"""field-report: secrets never reach the tarball; the summary reads the collected files.

The end-to-end run against the CPU service is in tests/test_deploy.py."""

from __future__ import annotations

import json
import tarfile

from arcvllm import fieldreport as F

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
        "--base-url", "http://127.0.0.1:9/", "--api-key", KEY, "--preset", "tiny-hybrid-cpu",
        "--no-smoke", "--no-bench", "--scratch", str(tmp_path), "--out", str(out), "--json",
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
    argv += ["--base-url", "http://127.0.0.1:9", "--out", str(tmp_path / "report.zip")]
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
        "--docker", "false", "--base-url", "http://127.0.0.1:9/", "--preset", "tiny-hybrid-cpu",
        "--env-file", str(settings), "--no-smoke", "--no-bench", "--scratch", str(tmp_path),
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
