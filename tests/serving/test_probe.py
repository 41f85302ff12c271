"""The XPU device probe (arcvllm/serving/probe.py, `arcvllm gpus --probe`): without torch,
with a torch that sees no XPU (the real CPU build), and devices as torch.xpu reports them
(a stand-in torch: no XPU here), one of which does not compute."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from types import SimpleNamespace

import pytest
from support import ROOT
from support.venvs import vllm_env

from arcvllm.serving import probe as P

GIB = 1024**3


class Values:
    """What torch.arange(...) * 2 and .sum().item() need: a list of numbers."""

    def __init__(self, values: list[float]) -> None:
        self.values = values

    def __mul__(self, factor: float) -> Values:
        return Values([v * factor for v in self.values])

    def sum(self) -> Values:
        return Values([sum(self.values)])

    def item(self) -> float:
        return self.values[0]


def standin_torch(devices: list[dict], broken: frozenset[int] = frozenset(), wrong=()) -> object:
    """A stand-in of the torch API the probe calls, its devices' properties as given."""

    def arange(n: int, dtype: str, device: str) -> Values:
        index = int(device.split(":")[1])
        if index in broken:
            raise RuntimeError("UR_RESULT_ERROR_DEVICE_LOST\nmore")
        return Values([float(i) + (1 if index in wrong else 0) for i in range(n)])

    xpu = SimpleNamespace(
        is_available=lambda: bool(devices),
        device_count=lambda: len(devices),
        get_device_properties=lambda i: SimpleNamespace(**devices[i]),
        mem_get_info=lambda i: (devices[i]["total_memory"] // 2, devices[i]["total_memory"]),
    )
    return SimpleNamespace(__version__="2.11.0+xpu", float32="float32", arange=arange, xpu=xpu)


B70 = {
    "name": "Intel(R) Arc(TM) Pro B70 Graphics",
    "total_memory": 32 * GIB,
    "driver_version": "1.6.35096+9",
    "max_compute_units": 256,
    "device_id": 0xE223,
    "is_integrated_gpu": False,
}
IGPU = B70 | {"name": "Intel(R) Graphics", "total_memory": 8 * GIB, "device_id": 0x7D67}
IGPU |= {"is_integrated_gpu": True}


def test_two_b70s_are_named_with_memory_driver_and_a_computation(capsys):
    result = P.probe(standin_torch([B70, B70]))
    assert result.ok and [d.index for d in result.devices] == [0, 1]
    first = result.devices[0]
    assert (first.name, first.pci_id, first.driver) == (B70["name"], "0xe223", "1.6.35096+9")
    assert (first.total_gib, first.free_gib, first.computes) == (32.0, 16.0, True)
    assert P.show(result, as_json=False) == 0
    out = capsys.readouterr().out
    assert "torch 2.11.0+xpu: 2 XPU device(s)" in out and "xpu:1" in out and "0xe223" in out


def test_a_device_that_fails_or_miscomputes_is_a_failed_check(capsys):
    result = P.probe(standin_torch([B70, B70, B70], broken=frozenset({1}), wrong=(2,)))
    assert not result.ok
    assert result.devices[1].error == "RuntimeError: UR_RESULT_ERROR_DEVICE_LOST"
    assert result.devices[2].error == "computed 72.0, not 56.0"
    assert P.show(result, as_json=True) == 1
    out, err = capsys.readouterr()
    assert json.loads(out)["ok"] is False
    assert err == "arcvllm: xpu:1, xpu:2 did not compute right\n"


def test_an_igpu_is_said_to_be_integrated(capsys):
    result = P.probe(standin_torch([IGPU, B70]))
    assert result.devices[0].integrated is True
    P.show(result, as_json=False)
    assert "Intel(R) Graphics (integrated)" in capsys.readouterr().out


def test_no_device_and_no_torch_are_one_line_and_exit_3(capsys, monkeypatch):
    assert P.show(P.probe(standin_torch([])), as_json=False) == 3
    assert "sees no XPU device" in capsys.readouterr().err
    no_backend = SimpleNamespace(__version__="2.1.0")
    assert "has no XPU backend" in P.probe(no_backend).problem
    monkeypatch.setitem(sys.modules, "torch", None)  # `import torch` raises ImportError
    result = P.probe()
    assert result.torch is None and result.problem.startswith("no torch in this Python")


def test_gpus_probe_without_torch_is_one_line_exit_3():
    """`arcvllm gpus --probe` from the tooling venv, which has no torch."""
    done = subprocess.run(
        [sys.executable, "-m", "arcvllm", "gpus", "--probe"],
        capture_output=True, text=True, timeout=120, cwd=ROOT,
    )  # fmt: skip
    assert done.returncode == 3
    assert done.stderr == ("arcvllm: no torch in this Python: run the probe in the XPU image\n"), (
        done.stderr
    )


@pytest.mark.vllm
def test_the_real_cpu_torch_sees_no_xpu_and_says_so():
    """PyTorch's CPU build has torch.xpu and no device: the probe runs its real API."""
    env = vllm_env("0.32.0")
    done = subprocess.run(
        [str(env.python), "-m", "arcvllm.serving.probe", "--json"],
        capture_output=True, text=True, timeout=300,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )  # fmt: skip
    assert done.returncode == 3, done.stderr[-2000:]
    doc = json.loads(done.stdout)
    assert doc["torch"].startswith("2.") and doc["devices"] == [] and doc["ok"] is False
    assert "sees no XPU device" in doc["problem"]


def test_the_troubleshooting_and_upgrade_pages_cover_what_operators_meet():
    page = (ROOT / "docs" / "troubleshooting.md").read_text()
    for words in (
        *("render group", "iGPU", "Out of memory", "first request", "`!!!!"),
        *("arcvllm gpus --probe", "arcvllm verify", "Automatically detected platform"),
    ):
        assert words in page, words
    upgrade = (ROOT / "docs" / "upgrade.md").read_text()
    for words in ("sha256:NEW", "cosign verify", "Canary", "Roll back", "sha256:OLD"):
        assert words in upgrade, words
    readme = (ROOT / "README.md").read_text()
    assert "docs/troubleshooting.md" in readme and "docs/upgrade.md" in readme


@pytest.mark.xpu_ci
@pytest.mark.docker
@pytest.mark.usefixtures("engine")
@pytest.mark.parametrize("stack", ["xpu-0.23"])
def test_the_xpu_rehearsal_image_carries_the_probe(stack):
    """The probe ships in the package, so CI's rehearsal of the XPU image has it; with no
    device there (and PyTorch's XPU build a stand-in) it reports one JSON line and exit 3."""
    from support.docker import docker, xpu_ci_image

    image = xpu_ci_image(stack, "-user")
    done = docker("run", "--rm", image, "arcvllm", "gpus", "--probe", "--json", check=False)
    assert done.returncode == 3, done.stdout + done.stderr
    doc = json.loads(done.stdout)
    assert doc["devices"] == [] and doc["ok"] is False and doc["problem"]


@pytest.mark.docker
def test_doctor_in_the_image_runs_the_probe_on_the_images_torch(cpu_image):
    """In an image (here the CPU one, whose PyTorch has torch.xpu and no device) the probe
    runs as `arcvllm gpus --probe`, and doctor's XPU probe row reports what it said."""
    from support.docker import docker

    done = docker("run", "--rm", cpu_image, "arcvllm", "gpus", "--probe", "--json", check=False)
    assert done.returncode == 3, done.stdout + done.stderr
    assert "sees no XPU device" in json.loads(done.stdout)["problem"]
    doctor = docker("run", "--rm", cpu_image, "arcvllm", "doctor", "--json", "--preset",
                    "qwen3.6-35b-a3b-w4a16-1xb70", check=False)  # fmt: skip
    rows = {r["check"]: r for r in json.loads(doctor.stdout)["rows"]}
    probe = rows["XPU probe"]
    assert probe["status"] == "fail" and "sees no XPU device" in probe["seen"]
    assert rows["sycl-ls"]["status"] == "ok"  # not in the image, and not needed there
