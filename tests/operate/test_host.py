"""arcvllm/operate/host.py: the operator's host as arcvllm reads it (under a fake root)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from arcvllm.errors import Unavailable, UsageError
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


@pytest.mark.skipif(os.geteuid() != 0, reason="giving a file to other users needs root")
def test_a_key_file_the_containers_user_cannot_read_is_one_line_whoever_calls(tmp_path):
    """The containers run as UID 1000: a key only its owner reads (umask 077) passes for
    root or its maker and fails in the containers; the check is UID 1000's, not the caller's."""
    key = tmp_path / "key"
    key.write_text("k-1\n")
    key.chmod(0o600)
    os.chown(key, 4321, 4321)  # neither the caller nor the containers' user
    with pytest.raises(Unavailable, match=r"is not readable by UID 1000, the containers' user"):
        host.check_api_key_file(key)
    os.chown(key, 1000, 4321)  # the containers' user owns it
    host.check_api_key_file(key)
    os.chown(key, 4321, 1000)
    key.chmod(0o640)  # its group is the containers' user's
    host.check_api_key_file(key)
    os.chown(key, 4321, 4321)
    key.chmod(0o644)
    host.check_api_key_file(key)


def test_a_new_key_file_is_readable_by_the_containers_user_and_no_other_host_user(tmp_path):
    path = tmp_path / "secrets" / "api-key"
    key = host.new_api_key_file(path)
    assert len(key) == 64 and path.read_text() == f"{key}\n"
    assert path.parent.stat().st_mode & 0o777 == 0o700  # no other user of the host enters
    assert path.stat().st_mode & 0o777 == 0o644  # UID 1000 reads the bind-mounted file
    host.check_api_key_file(path)
    with pytest.raises(UsageError, match="already exists"):
        host.new_api_key_file(path)
    assert host.new_api_key_file(path, replace=True) != key
