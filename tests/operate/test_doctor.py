"""doctor: every row's ok / warn / fail on fake /dev, /sys, /proc trees; one real run here."""

from __future__ import annotations

import dataclasses
import json
import os
import re
import shlex
import stat
import subprocess
import sys
from pathlib import Path

import pytest
from support import ROOT
from support.models import put_model

from arcvllm.operate import doctor as D
from arcvllm.operate import host as H
from arcvllm.presets import get_preset

XPU1 = get_preset("qwen3.6-35b-a3b-w4a16-1xb70")
XPU2 = get_preset("qwen3.6-35b-a3b-w4a16-2xb70")
CPU = get_preset("tiny-hybrid-cpu")
GIB = D.GIB
RENDER_GID = 993


def fake_stat(mode: int, uid: int = 0, gid: int = RENDER_GID) -> os.stat_result:
    return os.stat_result((stat.S_IFCHR | mode, 0, 0, 1, uid, gid, 0, 0, 0, 0))


def build(
    tmp_path: Path,
    *,
    nodes: tuple[str, ...] = ("renderD128",),
    gpus: tuple[tuple[str, int, str | None], ...] = (("0000:03:00.0", 0xE223, "xe"),),
    node_mode: int = 0o660,
    uid: int = 1000,
    gids: frozenset[int] = frozenset({RENDER_GID}),
    mem_total_gib: float = 64,
    mem_avail_gib: float = 48,
    packages: dict[str, str] | None = None,
    container: bool = True,
    tools: dict[str, str] | None = None,
    shm_gib: float = 32,
    disk_free_gib: float = 500,
    environ: dict[str, str] | None = None,
    kernel: str = "6.17.0-13-generic",
    xe_ids: frozenset[int] | None = H.BATTLEMAGE,
    firmware: tuple[str, ...] = ("xe/bmg_guc_70.bin.zst", "xe/bmg_huc.bin.zst"),
    bar_gib: float = 32,
    model: bool = True,
    os_release: str | None = None,
) -> H.Host:
    """A fake machine under tmp_path/root: the files doctor reads, and nothing else; MODEL:
    XPU1's checkpoint at /models (MODELS_DIR's default, and the container's mount)."""
    root = tmp_path / "root"
    (root / "dev/dri").mkdir(parents=True)
    (root / "dev/shm").mkdir()
    for node in nodes:
        (root / "dev/dri" / node).write_text("")
    pci = root / "sys/bus/pci/devices"
    pci.mkdir(parents=True)
    (root / "sys/bus/pci/drivers/xe").mkdir(parents=True)
    (root / "sys/bus/pci/drivers/i915").mkdir(parents=True)
    for i, (slot, device, driver) in enumerate(gpus):
        dev = pci / slot
        dev.mkdir()
        if driver:  # the node the bound driver made: renderD128 for the first GPU, ...
            (dev / "drm" / f"renderD{128 + i}").mkdir(parents=True)
        (dev / "vendor").write_text("0x8086\n")
        (dev / "device").write_text(f"0x{device:04x}\n")
        (dev / "class").write_text("0x030000\n")
        base = 0x4000000000
        bars = [(0x81000000, 0x81FFFFFF), (0, 0), (base, base + int(bar_gib * GIB) - 1)]
        (dev / "resource").write_text(
            "".join(f"0x{a:016x} 0x{b:016x} 0x0000000000140204\n" for a, b in bars)
            + "0x0000000000000000 0x0000000000000000 0x0000000000000000\n" * 10
        )
        if driver:
            (dev / "driver").symlink_to(root / "sys/bus/pci/drivers" / driver)
    # A non-GPU Intel device and a foreign GPU must be ignored.
    for slot, vendor, klass in (
        ("0000:00:1f.0", "0x8086", "0x060100"),
        ("0000:05:00.0", "0x10de", "0x030000"),
    ):
        (pci / slot).mkdir()
        (pci / slot / "vendor").write_text(vendor)
        (pci / slot / "device").write_text("0x1234")
        (pci / slot / "class").write_text(klass)
    (root / "etc").mkdir()
    (root / "etc/group").write_text(f"root:x:0:\nvideo:x:44:\nrender:x:{RENDER_GID}:\n")
    if os_release is not None:
        (root / "etc/os-release").write_text(os_release)
    (root / "proc").mkdir()
    (root / "proc/meminfo").write_text(
        f"MemTotal:       {int(mem_total_gib * 1024 * 1024)} kB\n"
        f"MemFree:        1000 kB\n"
        f"MemAvailable:   {int(mem_avail_gib * 1024 * 1024)} kB\n"
    )
    if packages is None:
        packages = {"libze-intel-gpu1": "25.48.36300.8-0", "level-zero": "1.26.0+u24.04"}
    (root / "var/lib/dpkg").mkdir(parents=True)
    (root / "var/lib/dpkg/status").write_text(
        "\n\n".join(
            f"Package: {p}\nStatus: install ok installed\nVersion: {v}\nDescription: x\n two"
            for p, v in packages.items()
        )
    )
    if container:
        (root / ".dockerenv").write_text("")
        (root / "opt/arcvllm").mkdir(parents=True)
        (root / "opt/arcvllm/patches.json").write_text("{}")
    (root / "proc/sys/kernel").mkdir(parents=True)
    (root / "proc/sys/kernel/osrelease").write_text(kernel + "\n")
    if xe_ids is not None:
        (root / "lib/modules" / kernel).mkdir(parents=True)
        (root / "lib/modules" / kernel / "modules.alias").write_text(
            "alias pci:v00008086d00005690sv*sd*bc03sc*i* i915\n"
            + "".join(f"alias pci:v00008086d0000{i:04X}sv*sd*bc03sc*i* xe\n" for i in xe_ids)
        )
    for name in firmware:
        (root / "lib/firmware" / name).parent.mkdir(parents=True, exist_ok=True)
        (root / "lib/firmware" / name).write_bytes(b"fw")
    if model:
        put_model(root / XPU1.model.lstrip("/"))
    # Tools live under the root: doctor looks for them on $PATH under --root.
    bindir = root / "usr/bin"
    bindir.mkdir(parents=True)
    for name, script in (tools or {}).items():
        path = bindir / name
        path.write_text(f"#!/bin/sh\n{script}\n")
        path.chmod(0o755)

    def disk_usage(path: Path) -> tuple[int, int, int]:
        if path.name == "shm":
            return int(shm_gib * GIB), 0, int(shm_gib * GIB)
        return int(disk_free_gib * GIB), 0, int(disk_free_gib * GIB)

    return H.Host(
        root=root,
        environ={"PATH": "/usr/bin", "HOME": "/home/vllm", **(environ or {})},
        uid=uid,
        gids=gids,
        stat=lambda p: fake_stat(node_mode),
        disk_usage=disk_usage,
    )


def finding(host: H.Host, check, preset=XPU1) -> D.Finding:
    return check(host, preset)


SYCL_OK = (
    'echo "[level_zero:gpu][level_zero:0] Intel(R) oneAPI Unified Runtime over Level-Zero,'
    ' Intel(R) Arc(TM) Pro B70 Graphics 20.1.0 [1.6.35096]"'
)
SYCL_NOGPU = 'echo "[opencl:cpu][opencl:0] Intel(R) OpenCL, CPU"'
XPU_SMI_OK = 'echo "| 0 | Device Name: Intel(R) Arc(TM) Pro B70 Graphics |"'


def test_the_model_row_checks_the_presets_folder_against_the_preset(tmp_path):
    host = build(tmp_path)
    mtp = get_preset("tiny-hybrid-cpu-mtp")
    absent = D.check_model(host, mtp)
    assert absent.status == D.FAIL and mtp.model in absent.seen
    put_model(host.path(mtp.model), mtp)
    refused = D.check_model(host, mtp)
    assert refused.status == D.FAIL and "no mtp.* tensors" in refused.seen
    assert refused.fix == f"arcvllm model check {mtp.name} {mtp.model}"
    assert D.check_model(host, CPU).status == D.OK  # the same folder serves the plain preset


def probe_tool(*devices: dict, torch: str | None = "2.11.0+xpu", problem=None) -> str:
    """An `arcvllm` on the fake PATH whose `gpus --probe --json` says DEVICES (as
    arcvllm/serving/probe.py prints them)."""
    doc = {"torch": torch, "problem": problem, "devices": list(devices)}
    doc["ok"] = problem is None and bool(devices) and all(d["computes"] for d in devices)
    return f"echo {shlex.quote(json.dumps(doc))}; exit {0 if doc['ok'] else 3}"


def probed(index: int = 0, **changes) -> dict:
    device = {"index": index, "name": "Intel(R) Arc(TM) Pro B70 Graphics", "total_gib": 31.9}
    device |= {"free_gib": 31.5, "driver": "1.6.35096+9", "compute_units": 256}
    device |= {"computes": True, "error": None, "pci_id": "0xe223", "integrated": False}
    return device | changes


PROBE_OK = probe_tool(probed())
READY_TOOLS = {"sycl-ls": SYCL_OK, "xpu-smi": XPU_SMI_OK, "arcvllm": PROBE_OK}


def test_a_ready_b70_host_is_all_ok(tmp_path):
    host = build(tmp_path, container=False, tools=READY_TOOLS)
    rows = D.diagnose(host, XPU1)
    assert [r.status for r in rows] == [D.OK] * len(D.CHECKS), rows


def test_a_ready_b70_container_only_leaves_the_firmware_to_the_host(tmp_path):
    host = build(tmp_path, tools=READY_TOOLS)
    rows = {r.check: r.status for r in D.diagnose(host, XPU1)}
    assert {k for k, v in rows.items() if v != D.OK} == {"GPU firmware"}
    assert rows["GPU firmware"] == D.WARN


# ---- render node ----


def test_render_node_ok_fail_and_warn_for_cpu(tmp_path):
    assert finding(build(tmp_path / "a"), D.check_render_nodes).status == D.OK
    fail = finding(build(tmp_path / "b", nodes=()), D.check_render_nodes)
    assert fail.status == D.FAIL and "arcvllm gpus --compose" in fail.fix
    assert not re.search(
        r"--device /dev/dri(?!/)", fail.fix
    )  # never all of it: an iGPU is device 0
    on_host = finding(build(tmp_path / "c", nodes=(), container=False), D.check_render_nodes)
    assert on_host.status == D.FAIL and "xe driver" in on_host.fix
    assert finding(build(tmp_path / "d", nodes=()), D.check_render_nodes, CPU).status == D.WARN


# ---- render group ----


def test_render_group_ok_when_the_user_is_in_the_nodes_group(tmp_path):
    r = finding(build(tmp_path), D.check_render_access)
    assert r.status == D.OK and f"gid {RENDER_GID} (render)" in r.seen


def test_render_group_fail_names_the_gid_to_add(tmp_path):
    r = finding(build(tmp_path, gids=frozenset({1000})), D.check_render_access)
    assert r.status == D.FAIL
    assert f"--group-add {RENDER_GID}" in r.fix and "usermod -aG render" in r.fix


def test_render_group_world_accessible_node_is_ok(tmp_path):
    host = build(tmp_path, gids=frozenset({1000}), node_mode=0o666)
    assert finding(host, D.check_render_access).status == D.OK


def test_render_group_warns_as_root_and_without_nodes(tmp_path):
    root = finding(build(tmp_path / "a", uid=0, gids=frozenset({0})), D.check_render_access)
    assert root.status == D.WARN and f"--group-add {RENDER_GID}" in root.fix
    assert finding(build(tmp_path / "b", nodes=()), D.check_render_access).status == D.WARN


# ---- RENDER_GID: the group compose adds, against the nodes' ----


def test_a_render_gid_setting_that_is_not_the_nodes_group_fails_naming_both(tmp_path):
    r = finding(build(tmp_path, environ={"RENDER_GID": str(RENDER_GID + 1)}), D.check_render_gid)
    assert r.status == D.FAIL
    assert (
        r.seen == f"RENDER_GID={RENDER_GID + 1} but /dev/dri/renderD128 belongs to GID {RENDER_GID}"
    )
    assert f"set RENDER_GID={RENDER_GID} " in r.fix


def test_the_settings_file_is_read_before_the_environment(tmp_path):
    host = build(tmp_path, environ={"RENDER_GID": str(RENDER_GID)})
    wrong = dataclasses.replace(host, settings={"RENDER_GID": str(RENDER_GID + 1)})
    assert finding(wrong, D.check_render_gid).status == D.FAIL
    right = dataclasses.replace(host, settings={"RENDER_GID": str(RENDER_GID)})
    assert finding(right, D.check_render_gid).status == D.OK


def test_render_gid_unset_is_ok_and_without_nodes_warns_for_xpu_only(tmp_path):
    assert finding(build(tmp_path / "a"), D.check_render_gid).status == D.OK
    bare = build(tmp_path / "b", nodes=(), environ={"RENDER_GID": "5"})
    assert finding(bare, D.check_render_gid).status == D.WARN
    assert finding(bare, D.check_render_gid, CPU).status == D.OK


def test_cli_checks_the_env_files_render_gid_against_the_nodes(tmp_path):
    host = build(tmp_path)
    gid = (host.root / "dev/dri/renderD128").stat().st_gid
    settings = tmp_path / "mine.env"
    settings.write_text(f"RENDER_GID={gid + 1}\n")
    done = run_cli("--root", str(host.root), "--env-file", str(settings), "--json")
    rows = {r["check"]: r for r in json.loads(done.stdout)["rows"]}
    assert done.returncode == 1 and rows["RENDER_GID"]["status"] == D.FAIL
    assert f"belongs to GID {gid}" in rows["RENDER_GID"]["seen"]
    settings.write_text(f"RENDER_GID={gid}\n")
    done = run_cli("--root", str(host.root), "--env-file", str(settings), "--json")
    rows = {r["check"]: r for r in json.loads(done.stdout)["rows"]}
    assert rows["RENDER_GID"]["status"] == D.OK


# ---- GPU identity ----


def test_gpu_identity_ok_for_enough_b70(tmp_path):
    gpus = (("0000:03:00.0", 0xE223, "xe"), ("0000:04:00.0", 0xE223, "xe"))
    r = finding(build(tmp_path, gpus=gpus), D.check_gpu_identity, XPU2)
    assert r.status == D.OK and "2x Arc Pro B70" in r.seen


def test_gpu_identity_warns_for_another_intel_gpu(tmp_path):
    r = finding(build(tmp_path, gpus=(("0000:03:00.0", 0xE20B, "xe"),)), D.check_gpu_identity)
    assert r.status == D.WARN and "8086:e20b" in r.seen


def test_gpu_identity_fails_without_gpu_or_with_too_few(tmp_path):
    none = finding(build(tmp_path / "a", gpus=()), D.check_gpu_identity)
    assert none.status == D.FAIL and "no XPU" in none.seen
    few = finding(build(tmp_path / "b"), D.check_gpu_identity, XPU2)
    assert few.status == D.FAIL and "needs 2" in few.seen


def test_gpu_identity_only_warns_for_a_cpu_preset(tmp_path):
    assert finding(build(tmp_path, gpus=()), D.check_gpu_identity, CPU).status == D.WARN


# ---- kernel driver ----


def test_driver_ok_on_xe(tmp_path):
    r = finding(build(tmp_path), D.check_driver)
    assert r.status == D.OK and "xe" in r.seen


def test_driver_fails_for_b70_on_i915_or_unbound(tmp_path):
    i915 = finding(build(tmp_path / "a", gpus=(("0000:03:00.0", 0xE223, "i915"),)), D.check_driver)
    assert i915.status == D.FAIL and "xe only" in i915.fix
    unbound = finding(build(tmp_path / "b", gpus=(("0000:03:00.0", 0xE223, None),)), D.check_driver)
    assert unbound.status == D.FAIL and "modprobe xe" in unbound.fix


def test_driver_warns_for_an_older_gpu_on_i915_and_without_gpu(tmp_path):
    old = finding(build(tmp_path / "a", gpus=(("0000:03:00.0", 0x56A0, "i915"),)), D.check_driver)
    assert old.status == D.WARN
    assert finding(build(tmp_path / "b", gpus=()), D.check_driver).status == D.WARN


# ---- GPU user-space (compute runtime, Level Zero) ----


def test_runtime_ok_reports_both_versions(tmp_path):
    r = finding(build(tmp_path), D.check_runtime)
    assert r.status == D.OK and "25.48.36300.8" in r.seen and "1.26.0" in r.seen


def test_runtime_fails_in_a_container_without_it_and_is_not_needed_on_the_host(tmp_path):
    """The XPU image carries compute-runtime and Level Zero (docs/host.md): on the host their
    absence, or an old one, is no finding."""
    assert finding(build(tmp_path / "a", packages={}), D.check_runtime).status == D.FAIL
    host = finding(build(tmp_path / "b", packages={}, container=False), D.check_runtime)
    assert host.status == D.OK and "not needed on the host" in host.seen
    old = {"libze-intel-gpu1": "25.18.33578.6-0", "level-zero": "1.21.9"}
    on_host = finding(build(tmp_path / "c", packages=old, container=False), D.check_runtime)
    assert on_host.status == D.OK


# ---- sycl-ls and xpu-smi (real processes from a fake PATH) ----


def test_sycl_ls_ok_fail_warn(tmp_path):
    ok = finding(build(tmp_path / "a", tools={"sycl-ls": SYCL_OK}), D.check_sycl_ls)
    assert ok.status == D.OK and "Arc(TM) Pro B70" in ok.seen
    blind = finding(build(tmp_path / "b", tools={"sycl-ls": SYCL_NOGPU}), D.check_sycl_ls)
    assert blind.status == D.FAIL and "render group" in blind.fix
    image = finding(build(tmp_path / "c"), D.check_sycl_ls)  # the XPU image has none
    assert image.status == D.OK and "the XPU probe row checks the devices" in image.seen
    host = finding(build(tmp_path / "d", container=False), D.check_sycl_ls)
    assert host.status == D.WARN and "arcvllm gpus --probe" in host.fix


def test_xpu_smi_ok_fail_warn(tmp_path):
    ok = finding(build(tmp_path / "a", tools={"xpu-smi": XPU_SMI_OK}), D.check_xpu_smi)
    assert ok.status == D.OK and "B70" in ok.seen
    broken = finding(
        build(tmp_path / "b", tools={"xpu-smi": "echo 'Level Zero init failed' >&2; exit 1"}),
        D.check_xpu_smi,
    )
    assert broken.status == D.FAIL and "init failed" in broken.seen
    assert finding(build(tmp_path / "c"), D.check_xpu_smi).status == D.OK
    assert finding(build(tmp_path / "d", container=False), D.check_xpu_smi).status == D.WARN


# ---- the XPU probe: `arcvllm gpus --probe` on $PATH under the root ----


def test_the_probe_names_each_device_and_passes_when_each_computes(tmp_path):
    row = finding(build(tmp_path, tools={"arcvllm": PROBE_OK}), D.check_xpu_probe)
    assert row.check == "XPU probe" and row.status == D.OK, row
    assert row.seen == (
        "xpu:0 Intel(R) Arc(TM) Pro B70 Graphics (0xe223) 31.9 GiB, driver 1.6.35096+9 (computes)"
    )


def test_the_probe_fails_a_device_that_does_not_compute_or_is_not_there(tmp_path):
    lost = probe_tool(probed(computes=False, error="RuntimeError: UR_RESULT_ERROR_DEVICE_LOST"))
    row = finding(build(tmp_path / "a", tools={"arcvllm": lost}), D.check_xpu_probe)
    assert row.status == D.FAIL and "DEVICE_LOST" in row.seen and "dmesg" in row.fix
    one = finding(build(tmp_path / "b", tools={"arcvllm": PROBE_OK}), D.check_xpu_probe, XPU2)
    assert one.status == D.FAIL and "needs 2" in one.seen
    blind = probe_tool(problem="torch 2.11.0+xpu sees no XPU device: ...")
    row = finding(build(tmp_path / "c", tools={"arcvllm": blind}), D.check_xpu_probe)
    assert row.status == D.FAIL and "sees no XPU device" in row.seen


def test_the_probe_warns_when_the_servers_first_device_is_an_igpu(tmp_path):
    igpu = probed(name="Intel(R) Graphics", pci_id="0x7d67", integrated=True)
    tool = probe_tool(igpu, probed(1))
    row = finding(build(tmp_path, tools={"arcvllm": tool}), D.check_xpu_probe)
    assert row.status == D.WARN and "xpu:0 is Intel(R) Graphics, not an Arc Pro B70" in row.seen
    assert "arcvllm gpus --compose" in row.fix


def test_without_torch_the_probe_points_at_the_image_and_in_the_image_fails(tmp_path):
    none = probe_tool(torch=None, problem="no torch in this Python: run the probe in the XPU image")
    host = finding(build(tmp_path / "a", container=False, tools={"arcvllm": none}),
                   D.check_xpu_probe)  # fmt: skip
    assert host.status == D.WARN and "docker run --rm --device /dev/dri/renderD<B70>" in host.fix
    inside = finding(build(tmp_path / "b", tools={"arcvllm": none}), D.check_xpu_probe)
    assert inside.status == D.FAIL
    assert finding(build(tmp_path / "c"), D.check_xpu_probe).status == D.WARN  # no arcvllm
    assert finding(build(tmp_path / "d"), D.check_xpu_probe, CPU).status == D.OK


# ---- /dev/shm ----


def test_shm_ok_warn_fail(tmp_path):
    assert finding(build(tmp_path / "a", shm_gib=16), D.check_shm, XPU2).status == D.OK
    small = finding(build(tmp_path / "b", shm_gib=4), D.check_shm, XPU2)
    assert small.status == D.WARN and "--shm-size 16g" in small.fix
    docker_default = finding(build(tmp_path / "c", shm_gib=64 / 1024), D.check_shm, XPU2)
    assert docker_default.status == D.FAIL
    single = finding(build(tmp_path / "d", shm_gib=64 / 1024), D.check_shm, CPU)
    assert single.status == D.FAIL and "--shm-size 1g" in single.fix
    assert finding(build(tmp_path / "e", shm_gib=0.5), D.check_shm, XPU1).status == D.WARN


def test_shm_missing_fails(tmp_path):
    host = build(tmp_path)
    (host.root / "dev/shm").rmdir()
    assert finding(host, D.check_shm).status == D.FAIL


# ---- host RAM ----


def test_ram_ok_warn_fail_against_what_the_preset_needs(tmp_path):
    assert finding(build(tmp_path / "a"), D.check_ram).status == D.OK
    busy = finding(build(tmp_path / "b", mem_total_gib=64, mem_avail_gib=8), D.check_ram)
    assert busy.status == D.WARN and f"needs {XPU1.host_ram_gib:.1f} GiB" in busy.seen
    small = finding(build(tmp_path / "c", mem_total_gib=8, mem_avail_gib=7), D.check_ram)
    assert small.status == D.FAIL


# ---- the model: where `arcvllm model fetch` puts it, what the server mounts ----


def test_the_model_row_says_where_the_weights_go_and_how_they_get_there(tmp_path):
    """It read like a download into the HF cache: it is MODELS_DIR, filled by `arcvllm
    model fetch`, with room for the checkpoint or not."""
    host = build(tmp_path / "a", container=False, environ={"MODELS_DIR": "/srv/models"})
    assert (host.root / "models/Qwen3.6-35B-A3B-W4A16").is_dir()  # not MODELS_DIR's
    row = finding(host, D.check_model)
    assert row.check == "model" and row.status == D.WARN
    assert row.seen.startswith("no folder /srv/models/Qwen3.6-35B-A3B-W4A16")
    assert f"500.0 GiB free at /, the checkpoint needs {XPU1.disk_gib:.1f} GiB" in row.seen
    assert row.fix == f"arcvllm model fetch {XPU1.name} (make model) puts it in MODELS_DIR"
    full = build(tmp_path / "b", container=False, disk_free_gib=XPU1.disk_gib / 2, model=False)
    row = finding(full, D.check_model)
    assert row.status == D.FAIL and "set MODELS_DIR to a larger volume" in row.fix
    put_model(host.root / "srv/models/Qwen3.6-35B-A3B-W4A16")
    row = finding(host, D.check_model)
    assert (row.status, row.seen) == (
        D.OK,
        "/srv/models/Qwen3.6-35B-A3B-W4A16: config, tensors, size, tokenizer, template",
    )


def test_the_settings_files_models_dir_is_the_one_checked(tmp_path):
    host = build(tmp_path, container=False, model=False)
    host.settings = {"MODELS_DIR": "/data/llm"}
    assert finding(host, D.check_model).status == D.WARN
    put_model(host.root / "data/llm/Qwen3.6-35B-A3B-W4A16")
    assert finding(host, D.check_model).status == D.OK


def test_in_the_container_a_missing_model_fails_and_the_image_model_is_there(tmp_path):
    host = build(tmp_path, disk_free_gib=XPU1.disk_gib / 2, model=False)
    row = finding(host, D.check_model)
    assert row.status == D.FAIL and "mount MODELS_DIR" in row.fix
    put_model(host.root / XPU1.model.lstrip("/"))
    assert finding(host, D.check_model).status == D.OK
    cpu = finding(host, D.check_model, CPU)
    assert cpu.status == D.FAIL and "/opt/arcvllm/models/tiny-hybrid" in cpu.seen
    put_model(host.root / CPU.model.lstrip("/"))
    assert finding(host, D.check_model, CPU).status == D.OK
    outside = build(tmp_path / "h", container=False)
    assert finding(outside, D.check_model, CPU).seen == f"{CPU.model} inside the image"


def test_a_container_that_is_not_the_image_judges_the_model_as_a_host(tmp_path):
    """A CI runner or a development container has /.dockerenv but not the image's files:
    the CPU preset's model is the image's, the XPU preset's is MODELS_DIR's (it failed as
    "this image should carry /opt/arcvllm/models/tiny-hybrid" on such a runner)."""
    host = build(tmp_path, model=False)
    (host.root / "opt/arcvllm/patches.json").unlink()
    assert host.in_container() and not host.in_image()
    assert finding(host, D.check_model, CPU).status == D.OK
    row = finding(host, D.check_model)
    assert row.status == D.WARN and row.fix.endswith("puts it in MODELS_DIR")


# ---- the command ----


def test_cli_on_a_fake_root_prints_one_table_and_exits_non_zero_on_fail(tmp_path):
    host = build(tmp_path, nodes=())
    done = subprocess.run(
        [sys.executable, "-m", "arcvllm", "doctor", "--root", str(host.root)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 1
    assert done.stdout.splitlines()[1].split()[:2] == ["CHECK", "STATUS"]
    assert "cannot serve" in done.stderr and "render node" in done.stderr


def run_cli(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "arcvllm", "doctor", *args],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, **(env or {})},
    )


def test_real_run_on_this_machine_reports_no_xpu():
    """This machine has no Intel GPU: doctor must say so and fail for the XPU preset."""
    done = run_cli("--json", "--preset", XPU1.name)
    report = json.loads(done.stdout)
    rows = {r["check"]: r for r in report["rows"]}
    assert done.returncode == 1 and report["ok"] is False
    assert report["preset"] == XPU1.name and report["root"] == "/"
    assert rows["render node"]["status"] == D.FAIL
    assert rows["GPU (sysfs)"]["status"] == D.FAIL
    assert "no XPU" in rows["GPU (sysfs)"]["seen"]


def test_default_preset_is_the_one_arcvllm_preset_names(tmp_path):
    host = build(tmp_path)
    done = run_cli("--root", str(host.root), "--json", env={"ARCVLLM_PRESET": CPU.name})
    assert json.loads(done.stdout)["preset"] == CPU.name
    done = run_cli("--root", str(host.root), env={"ARCVLLM_PRESET": ""})
    assert f"preset {D.DEFAULT_PRESET}" in done.stdout.splitlines()[0]


def test_a_root_that_does_not_exist_is_a_usage_error_not_this_machine():
    done = run_cli("--root", "/nonexistent")
    assert done.returncode == 2 and done.stdout == ""
    assert done.stderr.count("\n") == 1 and "no such directory" in done.stderr


def test_root_hides_the_tools_and_files_of_the_machine_doctor_runs_on(tmp_path):
    """A sycl-ls on the real PATH that would report a B70 must not be seen under --root."""
    outside = tmp_path / "outside-bin"
    outside.mkdir()
    (outside / "sycl-ls").write_text(f"#!/bin/sh\n{SYCL_OK}\n")
    (outside / "sycl-ls").chmod(0o755)
    host = build(tmp_path, nodes=(), gpus=())
    env = {"PATH": f"{outside}:{os.environ['PATH']}", "HF_HOME": "/data/hf"}
    done = run_cli("--root", str(host.root), "--json", env=env)
    report = json.loads(done.stdout)
    rows = {r["check"]: r for r in report["rows"]}
    assert rows["sycl-ls"]["seen"] == "not in this image (the XPU probe row checks the devices)"
    assert rows["kernel"]["seen"].startswith("Linux 6.17.0-13-generic")
    assert report["kernel"] == "6.17.0-13-generic" != os.uname().release
    assert (
        rows["model"]["seen"]
        == "/models/Qwen3.6-35B-A3B-W4A16: config, tensors, size, tokenizer, template"
    )


def test_json_is_one_report_with_every_row(tmp_path):
    host = build(tmp_path, tools={"sycl-ls": SYCL_OK, "xpu-smi": XPU_SMI_OK})
    done = run_cli("--root", str(host.root), "--json", "--preset", XPU1.name)
    report = json.loads(done.stdout)
    assert done.returncode == 0 and report["ok"] is True and report["where"] == "container"
    assert [r["check"] for r in report["rows"]] == [c(host, XPU1).check for c in D.CHECKS]
    assert set(report["rows"][0]) == {"check", "status", "seen", "fix"}


# ---- Battlemage IDs, kernel, firmware, BAR, compute-runtime version ----


def test_battlemage_ids_are_the_kernels_lists():
    assert {0xE20B, 0xE212, 0xE216} <= H.BMG_G21
    assert {0xE220, 0xE221, 0xE222, 0xE223} == H.BMG_G31
    assert H.B70 in H.BATTLEMAGE and 0x56A0 not in H.BATTLEMAGE  # Alchemist A770


def test_another_battlemage_warns_and_needs_xe(tmp_path):
    b580 = finding(
        build(tmp_path / "a", gpus=(("0000:03:00.0", 0xE20B, "xe"),)), D.check_gpu_identity
    )
    assert b580.status == D.WARN and "another Battlemage" in b580.seen
    i915 = finding(build(tmp_path / "b", gpus=(("0000:03:00.0", 0xE20B, "i915"),)), D.check_driver)
    assert i915.status == D.FAIL and "xe.force_probe=e20b" in i915.fix


def test_kernel_too_old_fails(tmp_path):
    r = finding(build(tmp_path, kernel="6.8.0-51-generic"), D.check_kernel)
    assert r.status == D.FAIL and "6.12" in r.seen and r.fix == D.GENERIC.kernel


def test_kernel_whose_xe_does_not_list_the_b70_fails(tmp_path):
    host = build(
        tmp_path, kernel="6.12.25", xe_ids=H.BMG_G21, gpus=(("0000:03:00.0", H.B70, None),)
    )
    r = finding(host, D.check_kernel)
    assert r.status == D.FAIL and "8086:e223" in r.seen


def test_kernel_ok_when_xe_is_bound_even_without_modules_alias(tmp_path):
    r = finding(build(tmp_path, xe_ids=None), D.check_kernel)
    assert r.status == D.OK and "6.17.0" in r.seen


def test_firmware_missing_huc_fails_on_the_host(tmp_path):
    host = build(tmp_path, container=False, firmware=("xe/bmg_guc_70.bin",))
    r = finding(host, D.check_firmware)
    assert r.status == D.FAIL and "HuC (xe/bmg_huc.bin)" in r.fix and "GuC: /lib" in r.seen


def test_small_bar_fails_for_xpu_and_warns_for_cpu(tmp_path):
    host = build(tmp_path, bar_gib=0.25)
    r = finding(host, D.check_bar)
    assert r.status == D.FAIL and "0.2 GiB" in r.seen and "Re-Size BAR" in r.fix
    assert finding(host, D.check_bar, CPU).status == D.WARN
    assert finding(build(tmp_path / "b"), D.check_bar).seen.endswith("32.0 GiB")


def test_compute_runtime_older_than_b70_support_fails(tmp_path):
    old = {"libze-intel-gpu1": "25.18.33578.6-0", "level-zero": "1.21.9"}
    r = finding(build(tmp_path, packages=old), D.check_runtime)
    assert r.status == D.FAIL and "25.27.34303.5" in r.fix
    assert D.version_tuple("25.48.36300.8-0") > D.MIN_COMPUTE_RUNTIME_G31


def test_xpu_smi_that_lists_no_device_is_not_ok(tmp_path):
    empty = build(tmp_path, tools={"xpu-smi": "echo 'No device discovered'"})
    r = finding(empty, D.check_xpu_smi)
    assert r.status == D.FAIL and "no device" in r.seen
    assert finding(empty, D.check_xpu_smi, CPU).status == D.WARN


IGPU_AND_B70 = (("0000:00:02.0", 0x7D67, "xe"), ("0000:03:00.0", 0xE223, "xe"))


def test_level_zero_warns_when_an_igpu_is_device_0_and_the_preset_says_mask_0(tmp_path):
    """All of /dev/dri on a host with an enabled iGPU: Level Zero's device 0 is the iGPU
    (first by PCI address) and the 1xb70 preset's ZE_AFFINITY_MASK=0 would serve on it."""
    host = build(tmp_path, nodes=("renderD128", "renderD129"), gpus=IGPU_AND_B70)
    row = finding(host, D.check_level_zero)
    assert row.status == D.WARN
    assert row.seen == (
        "0: 0000:00:02.0 Intel GPU (renderD128), 1: 0000:03:00.0 Arc Pro B70 (renderD129); "
        "ZE_AFFINITY_MASK=0 (preset): device 0 is 0000:00:02.0 (Intel GPU), not an Arc Pro B70"
    )
    assert "arcvllm gpus --compose" in row.fix


def test_level_zero_is_ok_when_the_container_has_the_b70s_node_only(tmp_path):
    """sysfs still lists the host's iGPU in the container; its node is not there, so
    Level Zero's device 0 is the B70."""
    host = build(tmp_path, nodes=("renderD129",), gpus=IGPU_AND_B70)
    row = finding(host, D.check_level_zero)
    assert row.status == D.OK
    assert row.seen == "0: 0000:03:00.0 Arc Pro B70 (renderD129); ZE_AFFINITY_MASK=0 (preset)"


def test_level_zero_takes_the_operators_mask_over_the_presets(tmp_path):
    host = build(
        tmp_path, nodes=("renderD128", "renderD129"), gpus=IGPU_AND_B70,
        environ={"ZE_AFFINITY_MASK": "1"},
    )  # fmt: skip
    row = finding(host, D.check_level_zero)
    assert row.status == D.OK and row.seen.endswith("ZE_AFFINITY_MASK=1 (environment)")
    host.environ["ZE_AFFINITY_MASK"] = ""  # the settings file's empty line: the preset's
    host.settings = {"ZE_AFFINITY_MASK": "0"}
    assert "ZE_AFFINITY_MASK=0 (settings)" in finding(host, D.check_level_zero).seen


def test_level_zero_warns_for_a_mask_naming_a_device_that_is_not_there(tmp_path):
    host = build(tmp_path, environ={"ZE_AFFINITY_MASK": "0,1"})
    row = finding(host, D.check_level_zero)
    assert row.status == D.WARN and row.seen.endswith("no device 1 here")
    assert finding(host, D.check_level_zero, CPU).status == D.OK


# ---- host preparation (docs/host.md): each item, and the fix line for the distribution ----

# What each distribution's /etc/os-release says (the fields doctor reads, as they ship them).
OS_RELEASE = {
    "Ubuntu 24.04": 'PRETTY_NAME="Ubuntu 24.04.3 LTS"\nNAME="Ubuntu"\nVERSION_ID="24.04"\n'
    'VERSION="24.04.3 LTS (Noble Numbat)"\nVERSION_CODENAME=noble\nID=ubuntu\nID_LIKE=debian\n',
    "Ubuntu 25.10": 'PRETTY_NAME="Ubuntu 25.10"\nNAME="Ubuntu"\nVERSION_ID="25.10"\n'
    "VERSION_CODENAME=questing\nID=ubuntu\nID_LIKE=debian\n",
    "Ubuntu 26.04": 'PRETTY_NAME="Ubuntu 26.04 LTS"\nNAME="Ubuntu"\nVERSION_ID="26.04"\n'
    "VERSION_CODENAME=resolute\nID=ubuntu\nID_LIKE=debian\n",
    "Debian 13": 'PRETTY_NAME="Debian GNU/Linux 13 (trixie)"\nNAME="Debian GNU/Linux"\n'
    'VERSION_ID="13"\nVERSION="13 (trixie)"\nVERSION_CODENAME=trixie\nID=debian\n',
}
FEDORA = 'NAME="Fedora Linux"\nVERSION_ID=43\nID=fedora\nPRETTY_NAME="Fedora Linux 43"\n'
DISTROS = sorted(OS_RELEASE)
# A B70 that no driver took, on a kernel whose xe knows only BMG-G21: trixie's own 6.12.
NO_B70_KERNEL = {
    "kernel": "6.12.117+deb13-amd64",
    "xe_ids": frozenset({0xE202, 0xE20B, 0xE20C, 0xE20D, 0xE212}),
    "gpus": (("0000:03:00.0", H.B70, None),),
}


def distro(name: str) -> D.Distribution:
    return next(d for d in D.DISTRIBUTIONS.values() if d.name == name)


def test_every_distribution_of_docs_host_md_has_its_os_release_here():
    assert sorted(d.name for d in D.DISTRIBUTIONS.values()) == DISTROS


def test_os_release_is_read_as_a_shell_reads_it(tmp_path):
    text = '# comment\nID=ubuntu\nVERSION_ID="24.04"\nNAME=\'Ubuntu\'\nBROKEN\nX="unclosed\n'
    assert H.parse_os_release(text) == {"ID": "ubuntu", "VERSION_ID": "24.04", "NAME": "Ubuntu"}
    host = build(tmp_path, container=False)  # no /etc/os-release: os-release(5)'s fallback
    (host.root / "usr/lib").mkdir(parents=True, exist_ok=True)
    (host.root / "usr/lib/os-release").write_text(OS_RELEASE["Debian 13"])
    assert D.distribution(host) == distro("Debian 13")


@pytest.mark.parametrize("name", DISTROS)
def test_a_prepared_host_of_each_distribution_passes_kernel_driver_and_firmware(tmp_path, name):
    host = build(tmp_path, container=False, os_release=OS_RELEASE[name])
    assert D.distribution(host) == distro(name)
    for check in (D.check_kernel, D.check_driver, D.check_firmware, D.check_bar):
        row = finding(host, check)
        assert row.status == D.OK, row


@pytest.mark.parametrize("name", DISTROS)
def test_a_kernel_that_does_not_know_the_b70_fails_with_the_distributions_line(tmp_path, name):
    host = build(tmp_path, container=False, os_release=OS_RELEASE[name], **NO_B70_KERNEL)
    row = finding(host, D.check_kernel)
    assert row.status == D.FAIL and row.seen.endswith("its xe does not list 8086:e223")
    assert row.fix == distro(name).kernel and "reboot" in row.fix
    unbound = finding(host, D.check_driver)
    assert unbound.status == D.FAIL and distro(name).kernel in unbound.fix


@pytest.mark.parametrize("name", DISTROS)
def test_missing_firmware_fails_with_the_distributions_line(tmp_path, name):
    host = build(tmp_path, container=False, os_release=OS_RELEASE[name], firmware=())
    row = finding(host, D.check_firmware)
    assert row.status == D.FAIL and row.seen == "GuC: missing; HuC: missing"
    assert row.fix.endswith(distro(name).firmware) and "reboot" in row.fix


def test_the_lines_name_each_distributions_own_packages():
    """Not one line for all: the HWE kernel on 24.04, backports on Debian 13, Debian's
    non-free-firmware package name."""
    assert "linux-generic-hwe-24.04" in distro("Ubuntu 24.04").kernel
    assert "-t trixie-backports linux-image-amd64" in distro("Debian 13").kernel
    assert "firmware-intel-graphics" in distro("Debian 13").firmware
    assert "linux-firmware" in distro("Ubuntu 26.04").firmware
    assert len({d.kernel for d in D.DISTRIBUTIONS.values()}) == len(D.DISTRIBUTIONS)


def test_docs_host_md_carries_every_command_doctor_prints():
    """One home for the steps: each `sudo apt ...` of a fix line is written in docs/host.md."""
    text = (ROOT / "docs/host.md").read_text()
    for line in [d.kernel for d in D.DISTRIBUTIONS.values()] + [
        d.firmware for d in D.DISTRIBUTIONS.values()
    ]:
        for command in re.findall(r"sudo apt [^,(;]+", line):
            assert command.strip() in text, command
    for heading in ("## Firmware", "## Debian 13", "## Resizable BAR"):  # the lines' anchors
        assert f"\n{heading}\n" in text


@pytest.mark.parametrize("os_release", [FEDORA, None], ids=["fedora", "no-os-release"])
def test_an_unknown_distribution_gets_the_generic_line_pointing_at_docs_host_md(
    tmp_path, os_release
):
    host = build(tmp_path, container=False, os_release=os_release, firmware=(), **NO_B70_KERNEL)
    assert D.distribution(host) is None
    kernel = finding(host, D.check_kernel)
    assert kernel.status == D.FAIL and kernel.fix == D.GENERIC.kernel
    assert "docs/host.md" in kernel.fix and "6.17" in kernel.fix
    firmware = finding(host, D.check_firmware)
    assert firmware.status == D.FAIL and firmware.fix.endswith(D.GENERIC.firmware)


def test_in_a_container_the_images_os_release_names_no_host_distribution(tmp_path):
    """The XPU image is Ubuntu 24.04; the kernel is the host's, whatever it runs."""
    host = build(tmp_path, os_release=OS_RELEASE["Ubuntu 24.04"], **NO_B70_KERNEL)
    assert D.distribution(host) is None
    assert finding(host, D.check_kernel).fix == D.GENERIC.kernel


def test_the_b70_needs_6_17_where_no_modules_alias_says_otherwise(tmp_path):
    old = build(tmp_path / "a", kernel="6.14.0-37-generic", xe_ids=None,
                gpus=(("0000:03:00.0", H.B70, None),))  # fmt: skip
    row = finding(old, D.check_kernel)
    assert row.status == D.FAIL and "older than 6.17" in row.seen
    assert D.MIN_KERNEL_B70 == (6, 17) and D.version_tuple("6.17.0-35-generic")[:2] >= (6, 17)
    carried = build(tmp_path / "b", kernel="6.14.0-1006-intel", container=False,
                    gpus=(("0000:03:00.0", H.B70, None),))  # fmt: skip
    row = finding(carried, D.check_kernel)
    assert row.status == D.OK and "carried back" in row.seen  # its own xe lists the B70
    b580 = build(tmp_path / "c", kernel="6.12.117+deb13-amd64", xe_ids=None,
                 gpus=(("0000:03:00.0", 0xE20B, None),))  # fmt: skip
    assert finding(b580, D.check_kernel).status == D.WARN  # 6.12 is enough for a G21


def test_resizable_bar_and_render_group_lines_say_where_and_what_follows(tmp_path):
    bar = finding(build(tmp_path / "a", container=False, bar_gib=0.25), D.check_bar)
    assert bar.status == D.FAIL and "docs/host.md#resizable-bar" in bar.fix
    group = finding(build(tmp_path / "b", gids=frozenset({1000})), D.check_render_access)
    assert group.status == D.FAIL and "log in again" in group.fix


def tree(root: Path) -> dict[str, tuple[int, int]]:
    return {str(p): (p.lstat().st_mtime_ns, p.lstat().st_size) for p in root.rglob("*")}


def test_doctor_names_the_distribution_and_changes_nothing_on_a_broken_host(tmp_path):
    host = build(tmp_path, container=False, os_release=OS_RELEASE["Debian 13"], firmware=(),
                 **NO_B70_KERNEL)  # fmt: skip
    before = tree(host.root)
    done = run_cli("--root", str(host.root))
    assert done.returncode == 1
    assert done.stdout.splitlines()[0].startswith("arcvllm doctor: host (Debian 13), preset ")
    assert "sudo apt install -t trixie-backports linux-image-amd64" in done.stdout
    done = run_cli("--root", str(host.root), "--json")
    report = json.loads(done.stdout)
    rows = {r["check"]: r for r in report["rows"]}
    assert report["distribution"] == "Debian 13"
    assert rows["kernel"]["fix"] == distro("Debian 13").kernel
    assert rows["GPU firmware"]["fix"].endswith(distro("Debian 13").firmware)
    assert tree(host.root) == before  # prints the lines, runs none of them
    unknown = build(tmp_path / "u", container=False, os_release=FEDORA)
    first = run_cli("--root", str(unknown.root)).stdout.splitlines()[0]
    assert first.startswith("arcvllm doctor: host (Fedora Linux 43: generic fix lines")


def guc_blob(major: int, minor: int, patch: int) -> bytes:
    """The first bytes of a GuC blob as xe reads them: sw_version at byte 64 of the CSS
    header (Debian's 20250410 bmg_guc_70.bin reads 70.40.2 this way)."""
    return bytes(64) + ((major << 16) | (minor << 8) | patch).to_bytes(4, "little") + bytes(60)


def test_the_firmware_row_names_the_guc_version_where_it_can_read_it(tmp_path):
    import lzma

    host = build(tmp_path, container=False, firmware=("xe/bmg_huc.bin",))
    guc = host.root / "lib/firmware/xe/bmg_guc_70.bin"
    guc.write_bytes(guc_blob(70, 40, 2))
    row = finding(host, D.check_firmware)
    assert row.status == D.OK and row.seen.endswith("(GuC 70.40.2)")
    guc.unlink()
    guc.with_suffix(".bin.xz").write_bytes(lzma.compress(guc_blob(70, 72, 1)))
    assert finding(host, D.check_firmware).seen.endswith("(GuC 70.72.1)")
    guc.with_suffix(".bin.xz").write_bytes(b"not xz")  # unreadable: no version, still present
    row = finding(host, D.check_firmware)
    assert row.status == D.OK and "GuC " not in row.seen.split(";")[-1]
    assert D.guc_version(b"short") is None


# ---- the scale-out's replicas of K B70s (arcvllm scale up) ----


@pytest.mark.parametrize(
    ("preset", "gpus", "status", "seen"),
    [
        ("qwen3.6-35b-a3b-w4a16-2xb70", 4, D.OK,
         "2 of 2 B70s each: arcvllm scale up --replicas 2 --gpus-per-replica 2"),
        ("qwen3-next-80b-a3b-w4a16-4xb70", 4, D.OK,
         "1 of 4 B70s each: arcvllm scale up --replicas 1 --gpus-per-replica 4"),
        ("qwen3.6-35b-a3b-w4a16-1xb70", 3, D.OK,
         "3 of 1 B70 each: arcvllm scale up --replicas 3 --gpus-per-replica 1"),
        ("qwen3.6-35b-a3b-w4a16-2xb70", 3, D.WARN,
         "--gpus-per-replica 2 does not divide this host's 3 Arc Pro B70s (it can be 1, 3)"),
        ("qwen3-next-80b-a3b-w4a16-4xb70", 2, D.WARN,
         "1 replica of 4 needs 4 Arc Pro B70s; this host has 2 with a render node ("),
    ],
)  # fmt: skip
def test_the_replicas_row_checks_a_k_gpu_layout_as_scale_up_would(
    tmp_path, preset, gpus, status, seen
):
    """Replicas of K B70s, K the preset's tensor-parallel-size, on the fake host's sysfs:
    the layout `scale up` starts, or its refusal as a warning (a single server of the
    preset is another row's business)."""
    from support.hosts import FOUR, fake_host

    host = fake_host(tmp_path, FOUR[:gpus])
    row = D.check_replicas(host, get_preset(preset))
    assert (row.check, row.status) == ("replicas", status)
    assert row.seen.startswith(seen), row.seen
    assert bool(row.fix) == (status == D.WARN)


def test_the_replicas_row_is_in_the_table_and_not_needed_for_a_cpu_preset(tmp_path):
    assert D.check_replicas in D.CHECKS
    assert D.check_replicas(build(tmp_path), CPU) == D.Finding(
        "replicas", D.OK, "not needed: CPU preset"
    )
