"""An emulated QSFP28 (SFF-8636) transceiver: its EEPROM bytes, built from the optical state of a port.

The emulated and simulated labs give each NIC port one of these (`ModelDrivenQsfp28` refreshes the Rx
power from a model of the port on every read); probes read it through the same
`read(i2c_address, page, bank, offset, length)` interface as a live module (ETHTOOL_MSG_MODULE_EEPROM_GET
semantics, same request limits) and decode it with the same decoder (labctl.linux.transceiver).

Memory map (SFF-8636 rev 2.10, flat memory: lower page 0 + upper page 00h only):
- lower page: 0 identifier 0x11, 1 revision, 2 status (flat_mem), 3 latched Rx/Tx LOS, 5 latched CDR LOL,
  22–23 temperature, 26–27 Vcc, 34–41 Rx power, 42–49 Tx bias, 50–57 Tx power (lanes 1–4).
- upper page 00h: identity (vendor, part number, wavelength), 220 diagnostic monitoring type (Rx power
  type bit 3 = average, Tx power supported bit 2), check codes at 191 and 223.

Latched flags behave as on a real module: set when LOS/LOL asserts, cleared by a read that covers them
and immediately re-latched if the condition persists. Updates are a few struct.pack_into calls, and a read
is one slice, so 16 ports × 1 kHz costs well under a millisecond of CPU per second.
"""

from __future__ import annotations

import struct
from collections.abc import Callable

from labctl.core.clock import now_ns
from labctl.core.errors import HardwareError

IDENTIFIER_QSFP28 = 0x11
REVISION_SFF8636_2_10 = 0x08
LANES = 4

_LANES_U16 = struct.Struct(">4H")
_U16 = struct.Struct(">H")
_S16 = struct.Struct(">h")


class ModuleEepromReadError(HardwareError):
    """A request the module (or the kernel in front of it) would refuse."""


def _power_word(mw: float | None) -> int:
    """mW → u16 in 0.1 µW, saturating like a module ADC; None (no light) and ≤ 0 → 0."""
    if mw is None or mw <= 0.0:
        return 0
    return min(round(mw * 1e4), 0xFFFF)


def dbm_to_mw(dbm: float | None) -> float | None:
    return None if dbm is None else 10.0 ** (dbm / 10.0)


class EmulatedQsfp28:
    """The EEPROM of one emulated QSFP28 module (e.g. 100GBASE-SR4: 4 lanes, average Rx power)."""

    LOS_THRESHOLD_MW = 1e-4  # below 0.1 µW per lane (a zero word) the module declares Rx LOS

    def __init__(
        self,
        *,
        rx_power_mw: float | None = None,
        tx_power_mw: float = 0.8,
        tx_bias_ma: float = 7.5,
        temperature_c: float = 38.0,
        supply_v: float = 3.3,
        rx_power_average: bool = True,
        vendor: str = "LABCTL-EMU",
        part_number: str = "QSFP28-SR4-EMU",
        serial: str = "EMU0001",
        wavelength_nm: float = 850.0,
    ) -> None:
        self.lower = bytearray(128)
        self.upper00 = bytearray(128)
        self.reads = 0
        self._live_los = 0
        self._live_lol = 0
        lo = self.lower
        lo[0] = IDENTIFIER_QSFP28
        lo[1] = REVISION_SFF8636_2_10
        lo[2] = 0x04  # flat_mem: only upper page 00h; Data_Not_Ready = 0
        up = self.upper00
        up[0] = IDENTIFIER_QSFP28  # byte 128
        up[1] = 0x10  # 129: extended identifier (power class 1, CDR in Tx/Rx not reported)
        up[2] = 0x07  # 130: connector LC
        up[3] = 0x80  # 131: 100G ethernet compliance in the extended spec (byte 192)
        _put_ascii(up, 148 - 128, 16, vendor)
        up[165 - 128 : 168 - 128] = b"\x00\x00\x00"  # vendor OUI
        _put_ascii(up, 168 - 128, 16, part_number)
        _put_ascii(up, 184 - 128, 2, "A")
        _U16.pack_into(up, 186 - 128, round(wavelength_nm * 20))  # units of 0.05 nm
        up[192 - 128] = 0x02  # extended compliance: 100GBASE-SR4
        _put_ascii(up, 196 - 128, 16, serial)
        _put_ascii(up, 212 - 128, 8, "26010100")  # date code YYMMDDlot
        # 220: temperature (bit 5) and Vcc (bit 4) monitored, Rx power type (bit 3), Tx power (bit 2).
        up[220 - 128] = 0x30 | (0x08 if rx_power_average else 0) | 0x04
        up[191 - 128] = sum(up[0 : 191 - 128]) & 0xFF  # CC_BASE
        up[223 - 128] = sum(up[192 - 128 : 223 - 128]) & 0xFF  # CC_EXT
        self.set_temperature(temperature_c)
        self.set_supply(supply_v)
        self.set_tx(tx_power_mw, tx_bias_ma)
        self.set_rx_power_mw(rx_power_mw)

    # -- the module's monitors -----------------------------------------------------------------------------
    def set_rx_power_mw(self, mw: float | None, lane: int | None = None) -> None:
        """Received power on one lane (1–4) or on all lanes (lane None); None = no light."""
        word = _power_word(mw)
        if lane is None:
            _LANES_U16.pack_into(self.lower, 34, word, word, word, word)
            los = 0 if word else 0x0F
        else:
            _U16.pack_into(self.lower, 34 + 2 * (lane - 1), word)
            bit = 1 << (lane - 1)
            los = (self._live_los & ~bit) | (0 if word else bit)
        self._set_los(los)

    def set_rx_power_dbm(self, dbm: float | None, lane: int | None = None) -> None:
        self.set_rx_power_mw(dbm_to_mw(dbm), lane)

    def set_rx_power_lanes_mw(self, lanes_mw: tuple[float | None, ...]) -> None:
        if len(lanes_mw) != LANES:
            raise ValueError(f"QSFP28 has {LANES} lanes, got {len(lanes_mw)} values")
        words = [_power_word(mw) for mw in lanes_mw]
        _LANES_U16.pack_into(self.lower, 34, *words)
        self._set_los(sum(1 << i for i, w in enumerate(words) if not w))

    def set_tx(self, tx_power_mw: float | None, tx_bias_ma: float) -> None:
        word = _power_word(tx_power_mw)
        bias = min(max(round(tx_bias_ma / 2e-3), 0), 0xFFFF)
        _LANES_U16.pack_into(self.lower, 50, word, word, word, word)
        _LANES_U16.pack_into(self.lower, 42, bias, bias, bias, bias)

    def set_temperature(self, celsius: float) -> None:
        _S16.pack_into(self.lower, 22, max(min(round(celsius * 256), 32767), -32768))

    def set_supply(self, volts: float) -> None:
        _U16.pack_into(self.lower, 26, max(min(round(volts * 1e4), 0xFFFF), 0))

    def set_cdr_lock(self, locked: bool, lane: int | None = None) -> None:
        """CDR lock per lane; loss of lock latches byte 5 bits 3–0."""
        bits = 0x0F if lane is None else 1 << (lane - 1)
        self._live_lol = (self._live_lol & ~bits) | (0 if locked else bits)
        self.lower[5] |= self._live_lol

    def _set_los(self, los: int) -> None:
        self._live_los = los
        self.lower[3] |= los  # latch: stays set until read, even if light returns

    # -- the read interface (netlink request semantics) -----------------------------------------------------
    def read(self, i2c_address: int, page: int, bank: int, offset: int, length: int) -> bytes:
        if not 1 <= length <= 128 or not 0 <= offset <= 255 or offset // 128 != (offset + length - 1) // 128:
            raise ModuleEepromReadError(
                f"invalid request offset {offset} length {length} (1..128 bytes within one half page)"
            )
        if i2c_address != 0x50 or bank != 0:
            raise ModuleEepromReadError(
                f"QSFP28 has no I2C {i2c_address:#x} bank {bank} (SFF-8636: 0x50, bank 0 only)"
            )
        self.reads += 1
        if offset >= 128:
            if page != 0:
                raise ModuleEepromReadError(f"QSFP28 (flat memory) has no page {page:#04x}")
            return bytes(self.upper00[offset - 128 : offset - 128 + length])
        if page != 0:
            raise ModuleEepromReadError(f"page {page:#04x}: only the upper half is addressable")
        data = bytes(self.lower[offset : offset + length])
        if offset <= 5 and offset + length > 3:  # clear-on-read of latched flags, re-latch if still present
            if offset <= 3:
                self.lower[3] = self._live_los
            if offset + length > 5:
                self.lower[5] = self._live_lol
        return data

    def image(self) -> bytes:
        """The flat 256-byte image (lower page + page 00h), as `ethtool -m IF raw on` dumps it."""
        return bytes(self.lower) + bytes(self.upper00)


def _put_ascii(buf: bytearray, at: int, width: int, text: str) -> None:
    raw = text.encode("ascii", "replace")[:width]
    buf[at : at + width] = raw + b" " * (width - len(raw))


class ModelDrivenQsfp28:
    """An EmulatedQsfp28 whose Rx power follows a model of the port (e.g. `SimFabric.rx_power_dbm` bound to
    one port): the power words and LOS are refreshed from `rx_power_dbm(t_ns)` whenever a read covers
    them, as a module's ADC is always current. This is what a poller on an emulated port reads."""

    def __init__(
        self, rx_power_dbm: Callable[[int], float | None], module: EmulatedQsfp28 | None = None
    ) -> None:
        self.model = rx_power_dbm
        self.module = module or EmulatedQsfp28()

    def read(self, i2c_address: int, page: int, bank: int, offset: int, length: int) -> bytes:
        if page == 0 and offset < 42 and offset + length > 3:  # covers LOS flags or Rx power words
            self.module.set_rx_power_dbm(self.model(now_ns()))
        return self.module.read(i2c_address, page, bank, offset, length)
