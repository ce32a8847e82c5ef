"""Shared by tests/unit/test_dom.py and tests/integration/test_dom.py."""

from __future__ import annotations

from labctl.linux.ethtool import ModuleEepromError
from labctl.models.module_eeprom import EmulatedQsfp28
from labctl.probes.rxpower import RxPowerProbe


def put(buf: bytearray, offset: int, hex_bytes: str) -> None:
    """Write literal bytes (hex, as in the spec tables) at an offset."""
    raw = bytes.fromhex(hex_bytes)
    buf[offset : offset + len(raw)] = raw


def qsfp28() -> bytearray:
    img = bytearray(256)  # lower page + upper page 00h
    put(img, 0, "11 08 04")  # QSFP28, SFF-8636 rev 2.8+, flat_mem
    put(img, 3, "04")  # latched: L-Rx3 LOS
    put(img, 5, "04")  # latched: L-Rx3 CDR LOL
    put(img, 22, "23 00")  # 35.0 °C
    put(img, 26, "7E F4")  # 32500 → 3.25 V
    # Rx power lanes 1-4: 8000 (0.8 mW), 1000 (0.1 mW = -10 dBm), 0 (no light), 10000 (1 mW = 0 dBm)
    put(img, 34, "1F 40 03 E8 00 00 27 10")
    put(img, 42, "17 70 17 70 17 70 0B B8")  # bias 12, 12, 12, 6 mA
    put(img, 50, "13 88 13 88 13 88 00 00")  # Tx power 0.5, 0.5, 0.5, 0 mW
    put(img, 128, "11")
    put(img, 220, "3C")  # temp + Vcc monitored, Rx power average (bit 3), Tx power supported (bit 2)
    return img


async def _collect(probe: RxPowerProbe, n: int) -> list:  # type: ignore[type-arg]
    out = []
    async for event in probe.events():
        out.append(event)
        if len(out) >= n:
            return out
    return out


class _Flaky:
    def __init__(self, inner: EmulatedQsfp28, failures: int) -> None:
        self.inner = inner
        self.failures = failures

    def read(self, i2c_address: int, page: int, bank: int, offset: int, length: int) -> bytes:
        if offset == 34 and self.failures > 0:
            self.failures -= 1
            raise ModuleEepromError("I2C NAK")
        return self.inner.read(i2c_address, page, bank, offset, length)
