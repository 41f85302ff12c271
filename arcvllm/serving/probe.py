"""The XPU devices as the image's PyTorch sees them, and a computation on each.

Through torch.xpu (PyTorch's XPU backend over Level Zero, the runtime vLLM uses): each
device's name, memory (total, and free where this torch can say), driver version and
compute units, then a small computation on the device whose result is checked, as the
community B70 diagnostics do. `arcvllm gpus --probe` prints it in the XPU image (no
sycl-ls or xpu-smi there); doctor's `XPU probe` row runs it in a process of its own
(`python -m arcvllm.serving.probe --json`), so a hung driver costs a timeout, not doctor.
Without torch, or with a torch that sees no XPU, the probe says so in one line.
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import asdict, dataclass, field
from types import ModuleType
from typing import Any

from arcvllm.errors import CheckFailed, Unavailable

GIB = 1024**3
# The computation: the sum of 2 x (0 .. 7) on the device, 56 when the device computes.
EXPECTED = 56.0


@dataclass(frozen=True)
class Device:
    """One XPU device: what its properties say and whether it computed right."""

    index: int
    name: str
    total_gib: float
    free_gib: float | None
    driver: str
    compute_units: int | None
    computes: bool
    error: str | None = None
    pci_id: str | None = None  # e.g. 0xe223, the Arc Pro B70
    integrated: bool | None = None  # an iGPU (never what the presets are sized for)


@dataclass(frozen=True)
class Probe:
    """What this Python's torch sees: its version, the devices, or why there are none."""

    torch: str | None
    devices: tuple[Device, ...] = field(default_factory=tuple)
    problem: str | None = None

    @property
    def ok(self) -> bool:
        return self.problem is None and bool(self.devices) and all(d.computes for d in self.devices)


def _compute(torch: Any, index: int) -> tuple[bool, str | None]:
    try:
        values = torch.arange(8, dtype=torch.float32, device=f"xpu:{index}") * 2
        got = float(values.sum().item())
    except Exception as exc:  # a driver or runtime error is the finding, not a crash
        return False, f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
    if got != EXPECTED:
        return False, f"computed {got}, not {EXPECTED}"
    return True, None


def _device(torch: Any, index: int) -> Device:
    props = torch.xpu.get_device_properties(index)
    free = None
    mem_get_info = getattr(torch.xpu, "mem_get_info", None)
    if mem_get_info is not None:
        try:
            free = mem_get_info(index)[0] / GIB
        except Exception:
            free = None
    computes, error = _compute(torch, index)
    units = getattr(props, "max_compute_units", None)
    pci = getattr(props, "device_id", None)
    integrated = getattr(props, "is_integrated_gpu", None)
    return Device(
        index=index,
        name=str(getattr(props, "name", "?")),
        total_gib=float(getattr(props, "total_memory", 0)) / GIB,
        free_gib=free,
        driver=str(getattr(props, "driver_version", "?")),
        compute_units=int(units) if units is not None else None,
        computes=computes,
        error=error,
        pci_id=f"0x{int(pci):04x}" if pci is not None else None,
        integrated=bool(integrated) if integrated is not None else None,
    )


def probe(torch: ModuleType | None = None) -> Probe:
    """The devices TORCH (default: `import torch`) sees through torch.xpu."""
    if torch is None:
        try:
            import torch as imported
        except ImportError:
            return Probe(None, problem="no torch in this Python: run the probe in the XPU image")
        torch = imported
    version = str(getattr(torch, "__version__", "?"))
    xpu = getattr(torch, "xpu", None)
    if xpu is None:
        return Probe(version, problem=f"torch {version} has no XPU backend (not a +xpu build)")
    try:
        available, count = bool(xpu.is_available()), int(xpu.device_count())
    except Exception as exc:
        return Probe(version, problem=f"torch.xpu failed: {type(exc).__name__}: {exc}")
    if not available or count == 0:
        return Probe(
            version,
            problem=f"torch {version} sees no XPU device: no render node passed in, the render "
            "group not joined, or no driver (arcvllm doctor says which)",
        )
    return Probe(version, tuple(_device(torch, i) for i in range(count)))


def table(result: Probe) -> str:
    from arcvllm.text import columns

    rows = [("XPU", "NAME", "PCI ID", "MEMORY", "FREE", "DRIVER", "CUS", "COMPUTES")]
    for d in result.devices:
        free = "-" if d.free_gib is None else f"{d.free_gib:.1f} GiB"
        units = "-" if d.compute_units is None else str(d.compute_units)
        verdict = "yes" if d.computes else f"no: {d.error}"
        name = f"{d.name} (integrated)" if d.integrated else d.name
        rows.append((f"xpu:{d.index}", name, d.pci_id or "-", f"{d.total_gib:.1f} GiB", free,
                     d.driver, units, verdict))  # fmt: skip
    return columns(rows)


def show(result: Probe, as_json: bool) -> int:
    """Print RESULT; the exit status: 0 every device computes, 1 one does not (a check
    failed), 3 no torch or no device (the environment)."""
    if as_json:
        doc: dict[str, Any] = {"torch": result.torch, "ok": result.ok, "problem": result.problem}
        doc["devices"] = [asdict(d) for d in result.devices]
        print(json.dumps(doc))
    elif result.devices:
        print(f"torch {result.torch}: {len(result.devices)} XPU device(s)")
        print(table(result))
    if result.problem is not None:
        print(f"arcvllm: {result.problem}", file=sys.stderr)
        return Unavailable.exit_code
    if not result.ok:
        failed = ", ".join(f"xpu:{d.index}" for d in result.devices if not d.computes)
        print(f"arcvllm: {failed} did not compute right", file=sys.stderr)
        return CheckFailed.exit_code
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m arcvllm.serving.probe", description=__doc__)
    parser.add_argument("--json", action="store_true", help="the result as one JSON document")
    args = parser.parse_args(argv)
    return show(probe(), args.json)


if __name__ == "__main__":
    raise SystemExit(main())
