"""The CLI's shared conventions: exit status table, --json, URL and extra checks, one line."""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from support import ROOT

from arcvllm import cli, options
from arcvllm.errors import ArcvllmError


def _walk(parser: argparse.ArgumentParser, path: tuple[str, ...] = ()):
    """Every (command path, parser) under `parser`, and whether it is a leaf."""
    subs = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    yield path, parser, not subs
    for action in subs:
        for name, child in action.choices.items():
            yield from _walk(child, (*path, name))


TREE = [(path, leaf) for path, _, leaf in _walk(cli.build_parser())]
EVERY = [path for path, _ in TREE]
LEAVES = [path for path, leaf in TREE if leaf]


def _parser(path: tuple[str, ...]) -> argparse.ArgumentParser:
    return next(p for q, p, _ in _walk(cli.build_parser()) if q == path)


def test_every_command_module_is_in_the_tree():
    assert len([path for path in EVERY if len(path) == 1]) == len(cli.COMMANDS)


def test_help_groups_the_commands_for_operators_and_hides_ci(capsys):
    with pytest.raises(SystemExit) as done:
        cli.main(["--help"])
    assert done.value.code == 0
    out = capsys.readouterr().out
    assert "Serve and operate:\n  serve " in out and "\nBuild and release:\n  image " in out
    assert out.index("Serve and operate:") < out.index("Build and release:")
    assert "standins" not in out and "{" not in out  # no flat list of every choice
    listing = out[out.index("Serve and operate:") : out.index(options.EXIT_STATUS)]
    listed = re.findall(r"^  ([a-z-]+)  ", listing, re.MULTILINE)
    assert sorted(listed) == sorted({p[0] for p in EVERY if len(p) == 1} - {"standins"})


def test_a_ci_command_still_runs_in_a_checkout(capsys):
    with pytest.raises(SystemExit) as done:
        cli.main(["standins", "--help"])
    assert done.value.code == 0
    assert "stand-ins" in capsys.readouterr().out


@pytest.mark.parametrize("path", EVERY, ids=lambda p: " ".join(("arcvllm", *p)))
def test_help_shows_the_exit_status_table(path, capsys):
    with pytest.raises(SystemExit) as done:
        cli.main([*path, "--help"])
    assert done.value.code == 0
    out = capsys.readouterr().out
    assert options.EXIT_STATUS in out, out[-600:]


@pytest.mark.parametrize("path", LEAVES, ids=lambda p: " ".join(("arcvllm", *p)))
def test_every_command_accepts_json(path):
    options = {s for a in _parser(path)._actions for s in a.option_strings}
    assert "--json" in options, f"arcvllm {' '.join(path)} has no --json"


@pytest.mark.parametrize(
    "value",
    ["127.0.0.1:8000", "ftp://host/", "http://", "http:///v1", "localhost", "http://h:port/"],
)
def test_url_refuses_what_is_not_http_with_a_host(value):
    with pytest.raises(argparse.ArgumentTypeError, match="not an http"):
        options.url(value)


def test_url_keeps_a_good_one_without_its_trailing_slash():
    assert options.url("http://127.0.0.1:8000/") == "http://127.0.0.1:8000"
    assert options.url("https://vllm.example/v1/") == "https://vllm.example/v1"


def test_a_bad_url_is_one_line_and_exit_2():
    """Through the installed entry point, as an operator runs it: no usage block."""
    done = subprocess.run(
        [sys.executable, "-m", "arcvllm", "smoke", "--base-url", "localhost:8000"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 2
    assert done.stdout == ""
    lines = done.stderr.splitlines()
    assert len(lines) == 1, done.stderr
    assert lines[0].startswith("arcvllm: smoke: ") and "not an http(s) URL" in lines[0]


def test_add_server_takes_the_api_key_from_the_environment(monkeypatch):
    monkeypatch.setenv("VLLM_API_KEY", "sk-env")
    parser = options.Parser(prog="arcvllm x")
    options.add_server(parser)
    args = parser.parse_args(["--base-url", "http://127.0.0.1:1/"])
    assert (args.base_url, args.api_key) == ("http://127.0.0.1:1", "sk-env")
    assert parser.parse_args(["--base-url", "http://h", "--api-key", "k"]).api_key == "k"
    assert "sk-env" not in parser.format_help()
    monkeypatch.delenv("VLLM_API_KEY")
    parser = options.Parser(prog="arcvllm x")
    options.add_server(parser, required=False)
    assert parser.parse_args([]).api_key is None


def test_the_key_comes_from_a_file_named_on_the_command_line_or_in_the_environment(
    tmp_path, monkeypatch
):
    key = tmp_path / "api-key"
    key.write_text("sk-file\n")
    monkeypatch.delenv("VLLM_API_KEY_FILE", raising=False)
    monkeypatch.setenv("VLLM_API_KEY", "sk-env")
    parser = options.Parser(prog="arcvllm x")
    options.add_server(parser)
    given = parser.parse_args(["--base-url", "http://h", "--api-key-file", str(key)])
    assert given.api_key == "sk-file"
    monkeypatch.setenv("VLLM_API_KEY_FILE", str(key))
    assert parser.parse_args(["--base-url", "http://h"]).api_key == "sk-file"  # file first
    assert parser.parse_args(["--base-url", "http://h", "--api-key", "k"]).api_key == "k"
    assert parser.parse_args(["--base-url", "https://h", "--ca-cert", str(key)]).ca_cert == key


@pytest.mark.parametrize(
    "args, env, code, says",
    [
        (["--api-key-file", "/nonexistent/key"], {}, 2, "--api-key-file: cannot read"),
        ([], {"VLLM_API_KEY_FILE": "/nonexistent/key"}, 3, "VLLM_API_KEY_FILE: cannot read"),
        (["--ca-cert", "/nonexistent/ca.pem"], {}, 2, "--ca-cert: no such file"),
    ],
)
def test_a_key_or_certificate_file_that_is_not_there_is_one_line(args, env, code, says):
    done = subprocess.run(
        [sys.executable, "-m", "arcvllm", "smoke", "--base-url", "https://127.0.0.1:1", *args],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, **env},
    )
    assert done.returncode == code, done.stderr
    (line,) = done.stderr.splitlines()
    assert line.startswith("arcvllm: ") and says in line, line


def test_a_missing_extra_names_it():
    with pytest.raises(ArcvllmError) as raised:
        options.require("arcvllm_no_such_module", "bench", "arcvllm bench")
    assert raised.value.exit_code == 3
    assert str(raised.value) == (
        "arcvllm bench needs the 'bench' extra: pip install 'arcvllm[bench]' "
        "(no module named arcvllm_no_such_module)"
    )
    assert options.require("json", "none").dumps([]) == "[]"


def test_a_missing_extra_is_one_line_and_exit_3(monkeypatch, capsys):
    """A command that needs an absent module: main prints one line, no traceback."""
    from arcvllm import options
    from arcvllm.commands import toolchain

    monkeypatch.setattr(toolchain, "_cmd", lambda args: options.require("arcvllm_no_such", "bench"))
    assert cli.main(["toolchain"]) == 3
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err == (
        "arcvllm: arcvllm toolchain needs the 'bench' extra: pip install 'arcvllm[bench]' "
        "(no module named arcvllm_no_such)\n"
    )


def test_an_error_carries_its_exit_status():
    assert ArcvllmError("x").exit_code == 1
    with pytest.raises(TypeError):  # the kinds fix it: no raise spells one as a number
        ArcvllmError("x", 3)


def test_a_missing_override_file_or_dir_is_a_usage_error(tmp_path):
    (tmp_path / "f").write_text("")
    assert options.existing_file(str(tmp_path / "f")) == tmp_path / "f"
    assert options.existing_dir(str(tmp_path)) == tmp_path
    with pytest.raises(argparse.ArgumentTypeError, match="no such file"):
        options.existing_file(str(tmp_path / "nope"))
    with pytest.raises(argparse.ArgumentTypeError, match="no such directory"):
        options.existing_dir(str(tmp_path / "f"))


def test_serve_dry_run_json_is_the_environment_and_the_argv(capsys, monkeypatch):
    monkeypatch.delenv("VLLM_CPU_KVCACHE_SPACE", raising=False)
    argv = ["serve", "--preset", "tiny-hybrid-cpu", "--dry-run", "--json"]
    assert cli.main([*argv, "--", "--max-model-len", "512"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["env"]["VLLM_CPU_KVCACHE_SPACE"] == "1"
    assert doc["argv"][1:3] == ["-m", "vllm.entrypoints.openai.api_server"]
    assert doc["argv"][doc["argv"].index("--max-model-len") + 1] == "512"
    assert cli.main(["serve", "--preset", "tiny-hybrid-cpu", "--json"]) == 2
    assert "give both" in capsys.readouterr().err


def test_stack_json_is_the_same_data_as_the_text(capsys):
    assert cli.main(["stack", "get", "cpu", "VLLM_VERSION"]) == 0
    version = capsys.readouterr().out.strip()
    assert cli.main(["stack", "get", "cpu", "VLLM_VERSION", "--json"]) == 0
    assert json.loads(capsys.readouterr().out) == {
        "stack": "cpu",
        "key": "VLLM_VERSION",
        "value": version,
    }
    assert cli.main(["stack", "list", "--json"]) == 0
    listed = json.loads(capsys.readouterr().out)
    assert {s["name"]: s["vllm"] for s in listed}["cpu"] == version
    assert [s["name"] for s in listed if s["default"] and s["flavor"] == "cpu"] == ["cpu"]
    assert cli.main(["stack", "show", "cpu", "--json"]) == 0
    shown = json.loads(capsys.readouterr().out)
    assert shown["vllm"] == version and shown["args"]["PRESET"]["value"] == "tiny-hybrid-cpu"


def test_a_key_named_on_the_command_line_that_does_not_exist_is_2(capsys):
    assert cli.main(["stack", "get", "cpu", "NO_SUCH_KEY"]) == 2
    assert capsys.readouterr().err.count("\n") == 1


def test_a_stacks_file_that_does_not_exist_is_2(capsys):
    with pytest.raises(SystemExit) as done:
        cli.main(["stack", "--stacks-file", "/nonexistent.yaml", "list"])
    assert done.value.code == 2
    assert "no such file: /nonexistent.yaml" in capsys.readouterr().err


def test_every_optional_module_belongs_to_its_extra_in_pyproject():
    text = (ROOT / "pyproject.toml").read_text()
    section = text.split("[project.optional-dependencies]")[1].split("\n[")[0]
    extras = {
        name: {re.split(r"[<>=!~\[ ;]", req)[0].replace("-", "_") for req in reqs}
        for name, reqs in (
            (m.group(1), re.findall(r'"([^"]+)"', m.group(2)))
            for m in re.finditer(r"^(\w+) = \[(.*?)\]", section, re.M | re.S)
        )
    }
    assert extras["bench"] == {"matplotlib"}
    for module, extra in options.EXTRAS.items():
        assert module in extras[extra], (module, extra, extras)


def test_an_extra_missing_deep_inside_a_command_is_one_line_and_exit_3(monkeypatch, capsys):
    """stack build-args of an XPU stack asks the package index (pypi-simple, the `stack`
    extra) for the sdist's URL; without the module: one line naming the extra."""
    monkeypatch.setitem(sys.modules, "pypi_simple", None)  # `import pypi_simple` fails
    assert cli.main(["stack", "build-args", "xpu-0.23"]) == 3
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err == (
        "arcvllm: arcvllm stack needs the 'stack' extra: pip install 'arcvllm[stack]' "
        "(no module named pypi_simple)\n"
    )


# ---- the one key rule: every reader of a key file, the same inputs, the same words ------

BAD_KEY_FILES = {
    "empty": b"",
    "a newline alone": b"\n",
    "two lines": b"k-first-line\nk-second-line\n",
    "a bad character": b"k-with a space\n",
    "a carriage return": b"k-windows\r\n",
    "too long": b"k" * 257 + b"\n",
    "a NUL byte": b"k-before\x00after\n",
    "a leading space": b" k-spaced\n",
    "a trailing space": b"k-spaced \n",
    "a tab": b"k-tabbed\t\n",
    "not ASCII": "k-clé\n".encode(),
    "two newlines": b"k-blank-after\n\n",
}


def key_readers(key: Path, tmp_path: Path) -> dict[str, subprocess.CompletedProcess]:
    """Each reader of a key file on KEY: arcvllm (named on the command line and from the
    environment), the server's entrypoint and the gateway's."""
    from support import ROOT

    home = {"PATH": "/usr/bin:/bin", "HOME": str(tmp_path), "TMPDIR": str(tmp_path)}
    smoke = [sys.executable, "-m", "arcvllm", "smoke", "--base-url", "https://127.0.0.1:1"]

    def run(argv: list[str], **env: str) -> subprocess.CompletedProcess:
        return subprocess.run(argv, capture_output=True, text=True, timeout=60, env=env)

    return {
        "arcvllm --api-key-file": run([*smoke, "--api-key-file", str(key)], **os.environ),
        "arcvllm $VLLM_API_KEY_FILE": run(smoke, **{**os.environ, "VLLM_API_KEY_FILE": str(key)}),
        "server": run(
            ["bash", str(ROOT / "docker" / "entrypoint.sh"), "echo", "served"],
            **home,
            VLLM_API_KEY_FILE=str(key),
        ),
        "gateway": run(
            ["bash", str(ROOT / "docker" / "gateway-entrypoint.sh"), "--render-only"],
            **home,
            GATEWAY_TEMPLATE=str(ROOT / "deploy" / "gateway" / "nginx.conf.template"),
            GATEWAY_RUN_DIR=str(tmp_path / "run"),
            GATEWAY_TLS_DIR=str(tmp_path / "tls"),  # not the image's /var/lib/...: the host's
            GATEWAY_RESOLVER="127.0.0.11",
            VLLM_API_KEY_FILE=str(key),
        ),
    }


@pytest.mark.parametrize("content", BAD_KEY_FILES.values(), ids=BAD_KEY_FILES.keys())
def test_every_key_reader_refuses_the_same_files_with_the_same_words(tmp_path, content):
    key = tmp_path / "api-key"
    key.write_bytes(content)
    codes = {}
    for reader, done in key_readers(key, tmp_path).items():
        (line,) = done.stderr.splitlines()
        assert f"{key}: {options.KEY_RULE}" in line, (reader, line)
        codes[reader] = done.returncode
    # a file named on the command line is a usage error; the environment's is the host's
    assert codes == {
        "arcvllm --api-key-file": 2,
        "arcvllm $VLLM_API_KEY_FILE": 3,
        "server": 3,
        "gateway": 3,
    }
    assert not (tmp_path / "run").exists()  # the gateway wrote nothing


@pytest.mark.parametrize("content", [b"k-Mixed.Case_~+/=-9\n", b"k-Mixed.Case_~+/=-9", b"k" * 256])
def test_every_key_reader_takes_the_same_key_from_a_good_file(tmp_path, content):
    key = tmp_path / "api-key"
    key.write_bytes(content)
    want = content.removesuffix(b"\n").decode()
    assert options.read_key(key) == want
    from support import ROOT

    server = subprocess.run(
        ["bash", str(ROOT / "docker" / "entrypoint.sh"), "printenv", "VLLM_API_KEY"],
        capture_output=True,
        text=True,
        timeout=60,
        env={"PATH": "/usr/bin:/bin", "HOME": str(tmp_path), "VLLM_API_KEY_FILE": str(key)},
    )
    assert server.stdout == f"{want}\n", server.stderr
    gateway = key_readers(key, tmp_path)["gateway"]
    assert gateway.returncode == 0, gateway.stderr
    assert (tmp_path / "run" / "key.map").read_text() == f'"~^Bearer \\Q{want}\\E$" 1;\n'


def test_the_key_rule_is_written_out_in_each_shell_reader():
    """The entrypoints say KEY_RULE's words and check its characters spelled out (a range
    such as A-Z depends on the shell's locale)."""
    from support import ROOT

    chars = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789._~+/=-"
    for script in ("entrypoint.sh", "gateway-entrypoint.sh"):
        text = (ROOT / "docker" / script).read_text()
        assert options.KEY_RULE in text, script
        assert f"key_chars={chars}" in text and "{1,256}$" in text, script
