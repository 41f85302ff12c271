"""A fake GPU host under a test's tmp_path: sysfs, /dev/dri and its by-path links."""

from __future__ import annotations

import os
import stat
from pathlib import Path

from arcvllm.operate.host import Host

B70, IGPU, B580 = 0xE223, 0x7D67, 0xE20B


def fake_host(tmp_path: Path, gpus: list[tuple[str, int, str]], gid: int = 992) -> Host:
    """GPUS: (PCI slot, device ID, render node); an Intel display device each, its drm/
    folder, /dev/dri/NODE and the by-path links udev makes (render and card)."""
    root = tmp_path / "host"
    pci, dri = root / "sys/bus/pci/devices", root / "dev/dri"
    (dri / "by-path").mkdir(parents=True)
    for card, (slot, device, node) in enumerate(gpus):
        dev = pci / slot
        (dev / "drm" / node).mkdir(parents=True)
        (dev / "drm" / f"card{card}").mkdir()
        (dev / "vendor").write_text("0x8086\n")
        (dev / "device").write_text(f"0x{device:04x}\n")
        (dev / "class").write_text("0x030000\n")
        (dri / node).write_text("")
        (dri / f"card{card}").write_text("")
        (dri / "by-path" / f"pci-{slot}-render").symlink_to(f"../{node}")
        (dri / "by-path" / f"pci-{slot}-card").symlink_to(f"../card{card}")

    def fake_stat(path: Path) -> os.stat_result:
        return os.stat_result((stat.S_IFCHR | 0o660, 0, 0, 1, 0, gid, 0, 0, 0, 0))

    return Host(root=root, stat=fake_stat)


FOUR = [(f"0000:0{i + 3}:00.0", B70, f"renderD{128 + i}") for i in range(4)]
