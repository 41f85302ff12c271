"""`arcvllm settings check`: the settings file compose reads twice is refused in one line
when it holds a key nothing reads, a preset that does not exist, or syntax the two compose
versions read differently."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from support import ROOT

from arcvllm import cli
from arcvllm.errors import ArcvllmError
from arcvllm.operate import settings

TEMPLATE = ROOT / "docker" / "arcvllm.env"
COMPOSE_FILE = ROOT / "docker" / "compose.yaml"


def check_file(tmp_path: Path, text: str, capsys) -> tuple[int, str]:
    path = tmp_path / "mine.env"
    path.write_text(text)
    rc = cli.main(["settings", "check", str(path)])
    return rc, capsys.readouterr().err


def test_the_shipped_settings_file_passes(capsys):
    assert cli.main(["settings", "check", str(TEMPLATE)]) == 0
    assert "settings ok" in capsys.readouterr().out


def test_a_misspelt_key_is_one_line_naming_the_line_and_the_likely_key(tmp_path, capsys):
    rc, err = check_file(tmp_path, TEMPLATE.read_text() + "VLLM_API_KYE=secret\n", capsys)
    assert rc == 1
    assert err.count("\n") == 1
    assert "unknown setting VLLM_API_KYE" in err and "did you mean VLLM_API_KEY?" in err
    assert f"mine.env:{len(TEMPLATE.read_text().splitlines()) + 1}:" in err


def test_an_unknown_preset_is_refused(tmp_path, capsys):
    rc, err = check_file(tmp_path, "ARCVLLM_PRESET=qwen9-1xb70\n", capsys)
    assert rc == 1 and err.count("\n") == 1 and "unknown preset 'qwen9-1xb70'" in err


@pytest.mark.parametrize(
    ("line", "words"),
    [
        ('VLLM_API_KEY="abc"', "quoted value"),
        ("ZE_AFFINITY_MASK=0   # first GPU", "inline comment"),
        ("just words", "not a KEY=VALUE line"),
        ("PORT=1\nPORT=2", "set twice"),
    ],
)
def test_lines_the_two_compose_versions_read_differently_are_refused(tmp_path, capsys, line, words):
    rc, err = check_file(tmp_path, line + "\n", capsys)
    assert rc == 1 and err.count("\n") == 1 and words in err


def test_a_missing_file_is_one_line_and_a_usage_error(tmp_path, capsys):
    with pytest.raises(SystemExit) as done:
        cli.main(["settings", "check", str(tmp_path / "absent.env")])
    err = capsys.readouterr().err
    assert done.value.code == 2 and err.count("\n") == 1
    assert f"no such file: {tmp_path / 'absent.env'}" in err
    with pytest.raises(ArcvllmError, match="cannot read settings file") as raised:
        settings.load(tmp_path / "absent.env")
    assert raised.value.exit_code == 2


def test_json_gives_the_verdict_and_the_keys_never_the_values(tmp_path, capsys):
    path = tmp_path / "mine.env"
    path.write_text("VLLM_API_KEY=sk-do-not-print\nPORT=8001\n")
    assert cli.main(["settings", "check", str(path), "--json"]) == 0
    out = capsys.readouterr().out
    assert json.loads(out) == {"file": str(path), "ok": True, "keys": ["PORT", "VLLM_API_KEY"]}
    assert "sk-do-not-print" not in out
    path.write_text("VLLM_API_KYE=x\n")
    assert cli.main(["settings", "check", str(path), "--json"]) == 1
    captured = capsys.readouterr()
    doc = json.loads(captured.out)
    assert doc["ok"] is False and "unknown setting VLLM_API_KYE" in doc["problem"]
    assert captured.err.count("\n") == 1


def test_every_preset_env_key_may_be_overridden_on_purpose():
    known = settings.known_keys()
    assert {"CCL_WORKER_COUNT", "VLLM_CPU_KVCACHE_SPACE", "ZE_AFFINITY_MASK"} <= known


@pytest.mark.parametrize("compose_file", ["compose.yaml", "compose.scale.yaml"])
def test_every_compose_variable_is_a_known_host_setting(compose_file):
    """A ${VAR} in a compose file that the check refused would make the file unusable."""
    text = (COMPOSE_FILE.parent / compose_file).read_text()
    used = set(re.findall(r"\$\{([A-Z_0-9]+)", text))
    used -= {"ENV_FILE", "ARCVLLM_PRESET", "COMPOSE_PROJECT_NAME"}  # compose's own: -p
    assert used, f"no ${{...}} found in {compose_file}"
    assert used <= set(settings.HOST_KEYS), used - set(settings.HOST_KEYS)


def test_every_key_the_template_names_is_known():
    """Keys set or offered commented-out (`# KEY=`) in the template all pass the check."""
    keys = re.findall(r"^#?\s*([A-Z][A-Z0-9_]+)=", TEMPLATE.read_text(), flags=re.M)
    assert "VLLM_API_KEY" in keys
    assert set(keys) <= settings.known_keys()


def test_load_returns_the_values_the_container_gets(tmp_path):
    path = tmp_path / "mine.env"
    path.write_text("# comment\n\nVLLM_API_KEY=s3cr=t\nZE_AFFINITY_MASK=\n")
    assert settings.load(path) == {"VLLM_API_KEY": "s3cr=t", "ZE_AFFINITY_MASK": ""}
    path.write_text("NOPE=1\n")
    with pytest.raises(ArcvllmError):
        settings.load(path)


def test_the_entrypoint_drops_an_empty_gpu_mask_and_keeps_a_chosen_one(fake_image):
    show = ["bash", "-c", "echo ${ZE_AFFINITY_MASK-unset}"]
    assert fake_image(*show, ZE_AFFINITY_MASK="") == "unset"
    assert fake_image(*show, ZE_AFFINITY_MASK="2,3") == "2,3"


# ---- RENDER_GID: the group of this host's render nodes, never a built-in number ----


def render_dir(tmp_path: Path) -> tuple[Path, int]:
    """A stand-in /dev/dri with one render node, and that node's GID."""
    dri = tmp_path / "dri"
    dri.mkdir()
    (dri / "renderD128").write_text("")
    return dri, (dri / "renderD128").stat().st_gid


def test_a_render_gid_that_is_not_the_nodes_group_is_one_line_naming_both(tmp_path, capsys):
    dri, gid = render_dir(tmp_path)
    path = tmp_path / "mine.env"
    path.write_text(f"PORT=8000\nRENDER_GID={gid + 1}\n")
    rc = cli.main(["settings", "check", str(path), "--dri-dir", str(dri)])
    err = capsys.readouterr().err
    assert rc == 1 and err.count("\n") == 1
    assert f"mine.env:2: RENDER_GID={gid + 1} but {dri}/renderD128 belongs to GID {gid}" in err
    assert f"set RENDER_GID={gid} " in err


def test_the_nodes_own_gid_an_empty_one_and_a_host_without_nodes_pass(tmp_path, capsys):
    dri, gid = render_dir(tmp_path)
    path = tmp_path / "mine.env"
    for text, where in (
        (f"RENDER_GID={gid}\n", dri),
        ("RENDER_GID=\n", dri),
        (f"RENDER_GID={gid + 1}\n", tmp_path / "empty"),  # a CPU host: nothing to open
    ):
        where.mkdir(exist_ok=True)
        path.write_text(text)
        assert cli.main(["settings", "check", str(path), "--dri-dir", str(where)]) == 0, text
    assert capsys.readouterr().err == ""


def test_a_dri_dir_that_does_not_exist_is_a_usage_error(tmp_path, capsys):
    with pytest.raises(SystemExit) as done:
        cli.main(["settings", "check", str(TEMPLATE), "--dri-dir", str(tmp_path / "absent")])
    assert done.value.code == 2 and "no such directory" in capsys.readouterr().err


@pytest.mark.parametrize("name", ["arcvllm.env", "compose.yaml", "compose.scale.yaml"])
def test_no_render_gid_is_built_into_the_template_or_compose(name):
    """A built-in GID (it was 992) is right on some hosts only: elsewhere the container
    cannot open the GPU and vLLM fails with an unclear platform error. (compose.scale.yaml's
    replicas get each node's own GID from `arcvllm scale`: tests/operate/test_replicas.py.)"""
    text = (TEMPLATE.parent / name).read_text()
    assert "RENDER_GID" in text or name == "compose.scale.yaml"
    assert not re.search(r"^\s*RENDER_GID=\s*\d", text, flags=re.M)
    assert not re.search(r"\$\{RENDER_GID:?-\s*\d", text)
    assert not re.search(r"group_add:.*\d{3}", text)


def test_the_published_port_is_the_settings_files_unless_the_shell_sets_one(tmp_path):
    """`scale up` printed the gateway's port from the shell only: a settings file with
    PORT=9443 printed 8443 (compose publishes the file's)."""
    from arcvllm.operate.host import effective
    from arcvllm.operate.settings import load

    mine = tmp_path / "mine.env"
    mine.write_text("PORT=9443\n")
    assert effective("PORT", load(mine), {}, "8443") == "9443"
    assert effective("PORT", load(mine), {"PORT": "7443"}, "8443") == "7443"
    (tmp_path / "none.env").write_text("")
    assert effective("PORT", load(tmp_path / "none.env"), {}, "8443") == "8443"


# ---- VLLM_EXTRA_ARGS: the server's extra arguments under `make up` ----


def test_extra_vllm_arguments_are_a_known_setting_of_the_template(capsys, tmp_path):
    assert "VLLM_EXTRA_ARGS" in settings.load(TEMPLATE)
    good = "VLLM_EXTRA_ARGS=--max-model-len 16384 --max-num-seqs 4 --enable-chunked-prefill\n"
    rc, err = check_file(tmp_path, good, capsys)
    assert rc == 0, err


@pytest.mark.parametrize(
    ("value", "words"),
    [
        ("max-model-len 4096", "starts with 'max-model-len', not a --flag"),
        ("--max-model-len '4096", "No closing quotation"),
        ("--model /models/other", "--model is the deployment's"),
        ("--port 9000", "--port is the deployment's"),
        ("--api-key k-1", "--api-key is the deployment's"),
        ("--Max-Model-Len 1", "'--Max-Model-Len' is not a vLLM flag"),
    ],
)
def test_extra_vllm_arguments_of_the_wrong_shape_are_one_line(tmp_path, capsys, value, words):
    rc, err = check_file(tmp_path, f"PORT=1\nVLLM_EXTRA_ARGS={value}\n", capsys)
    assert rc == 1 and err.count("\n") == 1, err
    assert "mine.env:2: VLLM_EXTRA_ARGS: " in err and words in err, err


# ---- IMAGE: the line docs/upgrade.md edits to upgrade and roll back ----


def test_the_settings_file_has_the_image_line_upgrade_edits_empty_for_each_flavours_default(
    tmp_path,
):
    """docs/upgrade.md upgrades with `sed -i 's|^IMAGE=.*|IMAGE=NEW|'` and reads the line
    with `grep '^IMAGE='`: without the line the sed changes nothing and `make up` keeps the
    old image. Empty, each flavour runs its default image (one file for both)."""
    import subprocess

    from arcvllm.operate import single
    from arcvllm.stack import load

    (line,) = [s for s in settings.read(TEMPLATE) if s.key == "IMAGE"]
    assert line.value == "", "IMAGE= empty: each flavour's default image"
    defaults = load()[1]
    for flavor in ("xpu", "cpu"):
        names = single.Names(env_file=TEMPLATE, flavor=flavor)
        named = single.resolve(names, environ={}, dri_dir=tmp_path)
        assert named.image == f"arcvllm:{defaults[flavor]}"
    mine = tmp_path / "mine.env"
    mine.write_text(TEMPLATE.read_text())
    new = "registry.example.org/arcvllm@sha256:" + "1" * 64
    subprocess.run(["sed", "-i", f"s|^IMAGE=.*|IMAGE={new}|", str(mine)], check=True)
    names = single.Names(env_file=mine, flavor="cpu")
    assert single.resolve(names, environ={}, dri_dir=tmp_path).image == new
