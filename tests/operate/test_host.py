"""arcvllm/operate/host.py: the operator's host as arcvllm reads it (under a fake root)."""

from __future__ import annotations

from pathlib import Path

import pytest

from arcvllm.errors import Unavailable
from arcvllm.operate import host


def dri(tmp_path: Path, *nodes: str) -> Path:
    folder = tmp_path / "dri"
    folder.mkdir()
    for node in nodes:
        (folder / node).write_text("")
    return folder


def test_the_flavour_is_xpu_only_where_a_render_node_is(tmp_path):
    assert host.default_flavor(dri(tmp_path, "card0")) == "cpu"
    assert host.default_flavor(tmp_path / "no-such-folder") == "cpu"
    (tmp_path / "dri" / "renderD128").write_text("")
    assert host.default_flavor(tmp_path / "dri") == "xpu"


def test_the_render_gid_is_the_first_nodes_group_and_empty_without_one(tmp_path):
    assert host.render_gid(dri(tmp_path)) == ""
    node = tmp_path / "dri" / "renderD128"
    node.write_text("")
    assert host.render_gid(tmp_path / "dri") == str(node.stat().st_gid)


def test_a_setting_is_the_shells_then_the_files_then_the_default():
    assert host.effective("PORT", {"PORT": "9443"}, {}, host.DEFAULT_PORT) == "9443"
    assert host.effective("PORT", {"PORT": "9443"}, {"PORT": "7443"}, "8443") == "7443"
    assert host.effective("PORT", {"PORT": ""}, {"PORT": ""}, "8443") == "8443"


def test_a_key_file_that_compose_could_not_hand_out_is_one_line(tmp_path):
    with pytest.raises(Unavailable, match="is not a readable file"):
        host.check_api_key_file(tmp_path / "none")
    (tmp_path / "key").write_text("k-1\n")
    host.check_api_key_file(tmp_path / "key")
