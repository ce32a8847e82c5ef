"""Transceiver digital optical monitoring (DOM): a pure decoder from module EEPROM bytes.

Everything here works on bytes fetched through one read interface, `ModuleEeprom.read(i2c_address, page,
bank, offset, length)`, shaped like the kernel's ETHTOOL_MSG_MODULE_EEPROM_GET request. A live module
(labctl.probes.rxpower), the emulated module (labctl.models.module_eeprom) and an image file (`FlatImage`,
`PagedImage`) all provide it, so one decoder serves them all.

Supported management interfaces, chosen by the SFF-8024 identifier byte (byte 0):
- SFF-8472 (SFP/SFP+/SFP28): A0h (I2C 0x50) identity, A2h (0x51) monitors, internal or external
  calibration (slope/offset, and the float polynomial for Rx power). 1 lane.
- SFF-8636 / SFF-8436 (QSFP+/QSFP28): lower page 0 monitors, upper page 00h byte 220 for the Rx power
  type. 4 lanes.
- CMIS (QSFP-DD, OSFP, DSFP, QSFP+/SFP-DD/SFP+ with CMIS): lower page temperature/Vcc, page 01h
  advertisements, page 11h per-lane monitors; bank 0 = lanes 1–8, bank 1 = lanes 9–16, ...

Units: power words are u16 in 0.1 µW, bias u16 in 2 µA (CMIS: times the advertised multiplier),
temperature s16 in 1/256 °C, supply u16 in 100 µV, all big-endian. No light is 0 mW and dBm None, never a
made-up floor. A calibrated SFF-8472 Rx power below zero (offset error with no light) is clamped to 0 mW.

Latched flags (SFF-8636 bytes 3/5, CMIS page 11h 0x93/0x94) clear when read, so reading them steals them
from any other owner (the NIC driver, a monitoring daemon). `read_dom()` reads them only with
`latched=True`; the fast Rx power plan (`ModuleInfo.rx_power_reads`) never touches them. The SFF-8472
Rx_LOS bit (A2h byte 110) is a live state bit and is always read.

Files: `FlatImage` takes the usual flat dumps: SFF-8472 = A0h then A2h (512 bytes, as `ethtool -m IF raw
on`); SFF-8636 and CMIS = the linear page layout of the optoe driver (page p's upper half at p*128+128,
so 256 bytes = lower page + page 00h, 640 = pages 00h–03h); CMIS banks b > 0 continue the same formula
with page index b*256 + p.
"""

from __future__ import annotations

import dataclasses
import math
import struct
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any, Protocol

from labctl.core.errors import InputError

# -- the read interface ----------------------------------------------------------------------------------

A0H = 0x50  # I2C address of the base page (SFF-8472 A0h, SFF-8636 and CMIS everything)
A2H = 0x51  # SFF-8472 diagnostics page
HALF_PAGE = 128


class ModuleEeprom(Protocol):
    """Reads `length` bytes at `offset` of one page of a module's EEPROM (netlink request semantics)."""

    def read(self, i2c_address: int, page: int, bank: int, offset: int, length: int) -> bytes: ...


@dataclass(frozen=True, slots=True)
class EepromRead:
    """One request within the kernel's limits: 1–128 bytes inside one half page; pages != 0 upper only."""

    i2c_address: int
    page: int
    bank: int
    offset: int
    length: int

    def __post_init__(self) -> None:
        check_request(self.i2c_address, self.page, self.bank, self.offset, self.length)

    @property
    def end(self) -> int:
        return self.offset + self.length

    def read(self, mem: ModuleEeprom) -> bytes:
        return mem.read(self.i2c_address, self.page, self.bank, self.offset, self.length)


def check_request(i2c_address: int, page: int, bank: int, offset: int, length: int) -> None:
    """Reject what ETHTOOL_MSG_MODULE_EEPROM_GET rejects (net/ethtool/eeprom.c policy and checks)."""
    if not 0 <= i2c_address <= 0x7F:
        raise ValueError(f"I2C address {i2c_address:#x} out of range 0..0x7f")
    if not (0 <= page <= 0xFF and 0 <= bank <= 0xFF):
        raise ValueError(f"page {page} / bank {bank} out of range 0..255")
    if not 0 <= offset <= 0xFF or not 1 <= length <= HALF_PAGE:
        raise ValueError(f"offset {offset} / length {length}: need offset 0..255 and length 1..128")
    if offset // HALF_PAGE != (offset + length - 1) // HALF_PAGE:
        raise ValueError(f"read {offset}..{offset + length - 1} crosses a half-page boundary")
    if page != 0 and offset < HALF_PAGE:
        raise ValueError(f"page {page:#x}: only the upper half (offset 128..255) is addressable")


# -- errors ----------------------------------------------------------------------------------------------


class DomDecodeError(InputError):
    """The bytes are not a decodable module EEPROM image."""


class UnknownModuleError(DomDecodeError):
    """The identifier byte names no management interface this decoder knows."""


class TruncatedImageError(DomDecodeError):
    """The image ends (or lacks a page) before a field the decoder needs."""


# -- identification --------------------------------------------------------------------------------------


class ModuleKind(StrEnum):
    SFF8472 = "sff8472"
    SFF8636 = "sff8636"
    CMIS = "cmis"


# SFF-8024 Table 4-1 (identifier values), the subset that has DOM we decode, plus common others for errors.
IDENTIFIERS: dict[int, tuple[str, ModuleKind | None]] = {
    0x00: ("unknown or unspecified", None),
    0x01: ("GBIC", None),
    0x02: ("module soldered to motherboard (SFF-8472)", ModuleKind.SFF8472),
    0x03: ("SFP/SFP+/SFP28", ModuleKind.SFF8472),
    0x06: ("XFP", None),
    0x0C: ("QSFP", ModuleKind.SFF8636),
    0x0D: ("QSFP+", ModuleKind.SFF8636),
    0x0E: ("CXP", None),
    0x11: ("QSFP28", ModuleKind.SFF8636),
    0x18: ("QSFP-DD", ModuleKind.CMIS),
    0x19: ("OSFP", ModuleKind.CMIS),
    0x1A: ("SFP-DD", None),
    0x1B: ("DSFP", ModuleKind.CMIS),
    0x1E: ("QSFP+ or later with CMIS", ModuleKind.CMIS),
    0x1F: ("SFP-DD with CMIS", ModuleKind.CMIS),
    0x20: ("SFP+ and later with CMIS", ModuleKind.CMIS),
}


def identify(identifier: int) -> tuple[str, ModuleKind]:
    """Identifier byte → (name, management interface); UnknownModuleError for anything else."""
    name, kind = IDENTIFIERS.get(identifier, (None, None))
    if kind is None:
        what = f" ({name})" if name else ""
        raise UnknownModuleError(
            f"identifier byte {identifier:#04x}{what} is not an SFP (SFF-8472), QSFP (SFF-8636) "
            "or CMIS module"
        )
    assert name is not None
    return name, kind


# -- results ---------------------------------------------------------------------------------------------


def mw_to_dbm(mw: float | None) -> float | None:
    """dBm of a power in mW; None for no light (0 mW) or no reading, never a made-up floor."""
    if mw is None or mw <= 0.0:
        return None
    return 10.0 * math.log10(mw)


@dataclass(frozen=True)
class LaneDom:
    lane: int
    rx_power_mw: float | None  # None: not monitored; 0.0: no light
    tx_power_mw: float | None = None
    tx_bias_ma: float | None = None
    rx_los: bool | None = None  # None: not read (latched and not requested) or not present
    rx_lol: bool | None = None

    @property
    def rx_power_dbm(self) -> float | None:
        return mw_to_dbm(self.rx_power_mw)

    @property
    def tx_power_dbm(self) -> float | None:
        return mw_to_dbm(self.tx_power_mw)

    def to_dict(self) -> dict[str, Any]:
        return {
            "lane": self.lane,
            "rx_power_mw": _r(self.rx_power_mw, 4),
            "rx_power_dbm": _r(self.rx_power_dbm, 3),
            "tx_power_mw": _r(self.tx_power_mw, 4),
            "tx_power_dbm": _r(self.tx_power_dbm, 3),
            "tx_bias_ma": _r(self.tx_bias_ma, 3),
            "rx_los": self.rx_los,
            "rx_lol": self.rx_lol,
        }


@dataclass(frozen=True)
class ModuleIdentity:
    """Who made the module and which one it is: what a lab records beside every measurement through it."""

    vendor_name: str
    vendor_oui: str  # "00:02:c9"
    part_number: str
    revision: str
    serial_number: str
    date_code: str  # as written: YYMMDD plus an optional vendor lot code

    def to_dict(self) -> dict[str, str]:
        return dataclasses.asdict(self)


# Where each memory map keeps the identity (start of the vendor name ... end of the date code), and each
# field's (offset, length) within that span. SFF-8472 A0h 20-91; SFF-8636 upper page 00h 148-219; CMIS
# upper page 00h 129-189 (ethtool's sfpid.c, qsfp.h and cmis.h name the same offsets).
_IDENTITY_LAYOUT: dict[str, tuple[int, int, dict[str, tuple[int, int]]]] = {
    "sff8472": (
        20,
        72,
        {"name": (20, 16), "oui": (37, 3), "pn": (40, 16), "rev": (56, 4), "sn": (68, 16), "date": (84, 8)},
    ),
    "sff8636": (
        148,
        72,
        {
            "name": (148, 16),
            "oui": (165, 3),
            "pn": (168, 16),
            "rev": (184, 2),
            "sn": (196, 16),
            "date": (212, 8),
        },
    ),
    "cmis": (
        129,
        61,
        {
            "name": (129, 16),
            "oui": (145, 3),
            "pn": (148, 16),
            "rev": (164, 2),
            "sn": (166, 16),
            "date": (182, 8),
        },
    ),
}


def read_identity(mem: ModuleEeprom, kind: ModuleKind) -> ModuleIdentity | None:
    """Vendor name, OUI, part number, revision, serial number and date code; None if the bytes cannot be
    read (a truncated image, a module that NAKs its upper page)."""
    start, length, fields = _IDENTITY_LAYOUT[kind.value]
    try:
        data = mem.read(A0H, 0, 0, start, length)
    except (OSError, DomDecodeError):
        return None
    if len(data) < length:
        return None

    def text(name: str) -> str:
        at, width = fields[name]
        raw = data[at - start : at - start + width]
        return raw.decode("ascii", errors="replace").replace("\x00", " ").strip()

    at, _ = fields["oui"]
    oui = ":".join(f"{b:02x}" for b in data[at - start : at - start + 3])
    return ModuleIdentity(text("name"), oui, text("pn"), text("rev"), text("sn"), text("date"))


@dataclass(frozen=True)
class DomReading:
    module: ModuleKind
    identifier: int
    identifier_name: str
    temperature_c: float | None
    supply_v: float | None
    rx_power_type: str | None  # "average" | "oma"
    calibration: str | None  # SFF-8472: "internal" | "external"
    lanes: tuple[LaneDom, ...]
    latched_flags_read: bool = False
    identity: ModuleIdentity | None = None

    def to_dict(self) -> dict[str, Any]:
        return {
            "module": self.module.value,
            "identifier": f"{self.identifier:#04x}",
            "identifier_name": self.identifier_name,
            "identity": self.identity.to_dict() if self.identity is not None else None,
            "temperature_c": _r(self.temperature_c, 3),
            "supply_v": _r(self.supply_v, 4),
            "rx_power_type": self.rx_power_type,
            "calibration": self.calibration,
            "latched_flags_read": self.latched_flags_read,
            "lanes": [lane.to_dict() for lane in self.lanes],
        }


def _r(v: float | None, digits: int) -> float | None:
    return None if v is None else round(v, digits)


# -- static module facts and the fast Rx power plan ------------------------------------------------------

_U16 = struct.Struct(">H")
_S16 = struct.Struct(">h")
_F32 = struct.Struct(">f")
POWER_MW = 1e-4  # one unit of a power word (0.1 µW) in mW
BIAS_MA = 2e-3  # one unit of a bias word (2 µA) in mA


@dataclass(frozen=True)
class Sff8472Calibration:
    """External calibration constants from A2h 56–91 (SFF-8472 Table 9-6)."""

    rx_pwr: tuple[float, float, float, float, float]  # coefficients of raw^0..raw^4
    tx_i: tuple[float, int]  # slope (8.8 fixed point as float), offset (s16)
    tx_pwr: tuple[float, int]
    t: tuple[float, int]
    v: tuple[float, int]

    @classmethod
    def parse(cls, a2_56_91: bytes) -> Sff8472Calibration:
        b = a2_56_91
        # Rx_PWR(4) at 56 down to Rx_PWR(0) at 72: store in ascending power order.
        rx = tuple(_F32.unpack_from(b, 16 - 4 * i)[0] for i in range(5))

        def slope_offset(at: int) -> tuple[float, int]:
            return _U16.unpack_from(b, at)[0] / 256.0, _S16.unpack_from(b, at + 2)[0]

        return cls(
            rx_pwr=(rx[0], rx[1], rx[2], rx[3], rx[4]),
            tx_i=slope_offset(20),
            tx_pwr=slope_offset(24),
            t=slope_offset(28),
            v=slope_offset(32),
        )

    def rx_units(self, raw: int) -> float:
        c = self.rx_pwr
        return c[0] + raw * (c[1] + raw * (c[2] + raw * (c[3] + raw * c[4])))


@dataclass(frozen=True)
class ModuleInfo:
    """What a module is and how to read its Rx power fast; read once per module (static bytes)."""

    module: ModuleKind
    identifier: int
    identifier_name: str
    revision: int = 0
    rx_power_type: str | None = None
    calibration: str | None = None
    sff8472_cal: Sff8472Calibration | None = None
    lanes: tuple[int, ...] = ()  # lane numbers with a per-lane monitor block
    banks: tuple[int, ...] = (0,)
    rx_power_monitored: bool = True
    tx_power_monitored: bool = True
    tx_bias_monitored: bool = True
    bias_multiplier: int = 1
    # The fast poller's plan: the reads it issues each sample, and the decoder of those bytes.
    rx_power_reads: tuple[EepromRead, ...] = ()
    _rx_decoder: Callable[[Sequence[bytes]], list[float]] | None = field(default=None, repr=False)

    def decode_rx_power_mw(self, chunks: Sequence[bytes]) -> list[float]:
        """Rx power in mW per lane (order of `lanes`) from the bytes of `rx_power_reads`, in order."""
        if self._rx_decoder is None:
            raise DomDecodeError(f"{self.identifier_name} module has no Rx power monitor")
        return self._rx_decoder(chunks)


def _read(mem: ModuleEeprom, i2c: int, page: int, bank: int, offset: int, length: int, what: str) -> bytes:
    data = mem.read(i2c, page, bank, offset, length)
    if len(data) < length:
        raise TruncatedImageError(
            f"{what}: got {len(data)} of {length} bytes at I2C {i2c:#x} page {page:#x} bank {bank} "
            f"offset {offset}"
        )
    return data


def module_info(mem: ModuleEeprom) -> ModuleInfo:
    """Identify the module and read its static facts (calibration, Rx power type, banks)."""
    lower = _read(mem, A0H, 0, 0, 0, 3, "identifier")
    name, kind = identify(lower[0])
    if kind is ModuleKind.SFF8472:
        return _info_sff8472(mem, lower[0], name)
    if kind is ModuleKind.SFF8636:
        return _info_sff8636(mem, lower, name)
    return _info_cmis(mem, lower, name)


def _power_words(count: int, scale: float = POWER_MW) -> Callable[[Sequence[bytes]], list[float]]:
    words = struct.Struct(f">{count}H")

    def decode(chunks: Sequence[bytes]) -> list[float]:
        return [raw * scale for raw in words.unpack_from(chunks[0])]

    return decode


def _info_sff8472(mem: ModuleEeprom, identifier: int, name: str) -> ModuleInfo:
    diag = _read(mem, A0H, 0, 0, 92, 1, "SFF-8472 A0h byte 92 (diagnostic monitoring type)")[0]
    rx_type = "average" if diag & 0x08 else "oma"
    if not diag & 0x40:  # digital diagnostics not implemented: identity only
        return ModuleInfo(
            ModuleKind.SFF8472,
            identifier,
            name,
            rx_power_type=rx_type,
            lanes=(),
            rx_power_monitored=False,
            tx_power_monitored=False,
            tx_bias_monitored=False,
        )
    external = bool(diag & 0x10)
    cal = None
    decoder: Callable[[Sequence[bytes]], list[float]]
    if external:
        cal = Sff8472Calibration.parse(_read(mem, A2H, 0, 0, 56, 36, "SFF-8472 A2h 56–91 (calibration)"))
        ext = cal

        def decoder(chunks: Sequence[bytes]) -> list[float]:
            units = ext.rx_units(_U16.unpack_from(chunks[0])[0])
            return [units * POWER_MW if units > 0.0 else 0.0]

    else:
        decoder = _power_words(1)
    return ModuleInfo(
        ModuleKind.SFF8472,
        identifier,
        name,
        rx_power_type=rx_type,
        calibration="external" if external else "internal",
        sff8472_cal=cal,
        lanes=(1,),
        rx_power_reads=(EepromRead(A2H, 0, 0, 104, 2),),
        _rx_decoder=decoder,
    )


def _info_sff8636(mem: ModuleEeprom, lower: bytes, name: str) -> ModuleInfo:
    diag = _read(mem, A0H, 0, 0, 220, 1, "SFF-8636 page 00h byte 220 (diagnostic monitoring type)")[0]
    return ModuleInfo(
        ModuleKind.SFF8636,
        lower[0],
        name,
        revision=lower[1],
        rx_power_type="average" if diag & 0x08 else "oma",
        lanes=(1, 2, 3, 4),
        tx_power_monitored=bool(diag & 0x04),
        rx_power_reads=(EepromRead(A0H, 0, 0, 34, 8),),
        _rx_decoder=_power_words(4),
    )


CMIS_LANES_PER_BANK = 8


def _info_cmis(mem: ModuleEeprom, lower: bytes, name: str) -> ModuleInfo:
    if lower[2] & 0x80:  # flat memory: no page 01h/11h, so no per-lane monitors
        return ModuleInfo(
            ModuleKind.CMIS,
            lower[0],
            name,
            revision=lower[1],
            lanes=(),
            rx_power_monitored=False,
            tx_power_monitored=False,
            tx_bias_monitored=False,
        )
    adv = _read(mem, A0H, 1, 0, 142, 19, "CMIS page 01h 142–160 (advertisements)")
    banks = {0: 1, 1: 2, 2: 4}.get(adv[0] & 0x03, 1)  # byte 142 bits 1-0
    rx_type = "average" if adv[151 - 142] & 0x10 else "oma"
    mon = adv[160 - 142]  # byte 160: per-lane monitors supported, bias multiplier
    rx_mon = bool(mon & 0x04)
    reads = tuple(EepromRead(A0H, 0x11, bank, 186, 16) for bank in range(banks)) if rx_mon else ()
    words = struct.Struct(">8H")

    def decoder(chunks: Sequence[bytes]) -> list[float]:
        return [raw * POWER_MW for chunk in chunks for raw in words.unpack_from(chunk)]

    return ModuleInfo(
        ModuleKind.CMIS,
        lower[0],
        name,
        revision=lower[1],
        rx_power_type=rx_type,
        lanes=tuple(range(1, CMIS_LANES_PER_BANK * banks + 1)),
        banks=tuple(range(banks)),
        rx_power_monitored=rx_mon,
        tx_power_monitored=bool(mon & 0x02),
        tx_bias_monitored=bool(mon & 0x01),
        bias_multiplier={0: 1, 1: 2, 2: 4}.get((mon >> 3) & 0x03, 1),
        rx_power_reads=reads,
        _rx_decoder=decoder if rx_mon else None,
    )


# -- full decode -----------------------------------------------------------------------------------------


def read_dom(mem: ModuleEeprom, info: ModuleInfo | None = None, *, latched: bool = False) -> DomReading:
    """Every monitor the module has. `latched=True` also reads (and so clears) latched LOS/LOL flags."""
    info = info or module_info(mem)
    if info.module is ModuleKind.SFF8472:
        reading = _dom_sff8472(mem, info)
    elif info.module is ModuleKind.SFF8636:
        reading = _dom_sff8636(mem, info, latched)
    else:
        reading = _dom_cmis(mem, info, latched)
    return dataclasses.replace(reading, identity=read_identity(mem, info.module))


def _dom_sff8472(mem: ModuleEeprom, info: ModuleInfo) -> DomReading:
    if not info.lanes:
        return DomReading(info.module, info.identifier, info.identifier_name, None, None,
                          info.rx_power_type, None, ())  # fmt: skip
    a2 = _read(mem, A2H, 0, 0, 96, 16, "SFF-8472 A2h 96–111 (monitors, status)")
    temp_raw = _S16.unpack_from(a2, 0)[0]
    vcc_raw, bias_raw, tx_raw, _rx_raw = struct.unpack_from(">4H", a2, 2)
    cal = info.sff8472_cal
    if cal is not None:
        temp_units = cal.t[0] * temp_raw + cal.t[1]
        vcc_units = _cal_u16(cal.v, vcc_raw)
        bias_units = _cal_u16(cal.tx_i, bias_raw)
        tx_units = _cal_u16(cal.tx_pwr, tx_raw)
    else:
        temp_units, vcc_units, bias_units, tx_units = temp_raw, vcc_raw, bias_raw, tx_raw
    rx_mw = info.decode_rx_power_mw([a2[8:10]])[0]
    lane = LaneDom(
        1,
        rx_power_mw=rx_mw,
        tx_power_mw=tx_units * POWER_MW,
        tx_bias_ma=bias_units * BIAS_MA,
        rx_los=bool(a2[110 - 96] & 0x02),  # live Rx_LOS state, not a latched flag
    )
    return DomReading(
        info.module,
        info.identifier,
        info.identifier_name,
        temperature_c=temp_units / 256.0,
        supply_v=vcc_units * 1e-4,
        rx_power_type=info.rx_power_type,
        calibration=info.calibration,
        lanes=(lane,),
    )


def _cal_u16(slope_offset: tuple[float, int], raw: int) -> float:
    """SFF-8472 external calibration of an unsigned word: slope·raw + offset, kept in the u16 range."""
    return min(max(slope_offset[0] * raw + slope_offset[1], 0.0), 65535.0)


def _dom_sff8636(mem: ModuleEeprom, info: ModuleInfo, latched: bool) -> DomReading:
    mon = _read(mem, A0H, 0, 0, 22, 36, "SFF-8636 lower page 22–57 (monitors)")
    temp = _S16.unpack_from(mon, 0)[0] / 256.0
    vcc = _U16.unpack_from(mon, 4)[0] * 1e-4
    rx = struct.unpack_from(">4H", mon, 34 - 22)
    bias = struct.unpack_from(">4H", mon, 42 - 22)
    tx = struct.unpack_from(">4H", mon, 50 - 22)
    los: int | None = None
    lol: int | None = None
    if latched:
        flags = _read(mem, A0H, 0, 0, 3, 3, "SFF-8636 lower page 3–5 (latched flags)")
        los = flags[0] & 0x0F  # bits 3-0: L-Rx4..1 LOS
        # CDR LOL flags (byte 5) exist from SFF-8636 (revision byte >= 0x03), not in SFF-8436.
        lol = flags[2] & 0x0F if info.revision >= 0x03 else None
    lanes = tuple(
        LaneDom(
            n,
            rx_power_mw=rx[i] * POWER_MW,
            tx_power_mw=tx[i] * POWER_MW if info.tx_power_monitored else None,
            tx_bias_ma=bias[i] * BIAS_MA,
            rx_los=None if los is None else bool(los >> i & 1),
            rx_lol=None if lol is None else bool(lol >> i & 1),
        )
        for i, n in enumerate(info.lanes)
    )
    return DomReading(info.module, info.identifier, info.identifier_name, temp, vcc, info.rx_power_type,
                      None, lanes, latched_flags_read=latched)  # fmt: skip


def _dom_cmis(mem: ModuleEeprom, info: ModuleInfo, latched: bool) -> DomReading:
    mod = _read(mem, A0H, 0, 0, 14, 4, "CMIS lower page 14–17 (temperature, Vcc)")
    temp = _S16.unpack_from(mod, 0)[0] / 256.0
    vcc = _U16.unpack_from(mod, 2)[0] * 1e-4
    lanes: list[LaneDom] = []
    for bank in info.banks if info.lanes else ():
        what = f"CMIS page 11h bank {bank}"
        mon = _read(mem, A0H, 0x11, bank, 154, 48, f"{what} 154–201 (lane monitors)")
        tx = struct.unpack_from(">8H", mon, 0)
        bias = struct.unpack_from(">8H", mon, 16)
        rx = struct.unpack_from(">8H", mon, 32)
        los = lol = None
        if latched:
            flags = _read(mem, A0H, 0x11, bank, 147, 2, f"{what} 147–148 (latched Rx LOS/LOL)")
            los, lol = flags[0], flags[1]
        for i in range(CMIS_LANES_PER_BANK):
            lanes.append(
                LaneDom(
                    bank * CMIS_LANES_PER_BANK + i + 1,
                    rx_power_mw=rx[i] * POWER_MW if info.rx_power_monitored else None,
                    tx_power_mw=tx[i] * POWER_MW if info.tx_power_monitored else None,
                    tx_bias_ma=bias[i] * BIAS_MA * info.bias_multiplier if info.tx_bias_monitored else None,
                    rx_los=None if los is None else bool(los >> i & 1),
                    rx_lol=None if lol is None else bool(lol >> i & 1),
                )
            )
    return DomReading(info.module, info.identifier, info.identifier_name, temp, vcc, info.rx_power_type,
                      None, tuple(lanes), latched_flags_read=latched and bool(lanes))  # fmt: skip


# -- images (files, tests) -------------------------------------------------------------------------------


class PagedImage:
    """An EEPROM image as pages: {(i2c, bank, page): bytes}. Page 0 at 0x50 holds 256 bytes (lower + upper
    00h) or 128 (lower only); other pages hold their upper half (128 bytes for offsets 128–255). SFF-8472
    A0h/A2h are (0x50, 0, 0) and (0x51, 0, 0), 256 bytes each."""

    def __init__(self, pages: Mapping[tuple[int, int, int], bytes]) -> None:
        self.pages = {k: bytes(v) for k, v in pages.items()}

    def read(self, i2c_address: int, page: int, bank: int, offset: int, length: int) -> bytes:
        check_request(i2c_address, page, bank, offset, length)
        data = self.pages.get((i2c_address, bank, page))
        where = f"I2C {i2c_address:#x} bank {bank} page {page:#04x}"
        if data is None:
            raise TruncatedImageError(f"image has no {where}")
        start = offset if page == 0 else offset - HALF_PAGE
        if start + length > len(data):
            raise TruncatedImageError(
                f"image's {where} is {len(data)} bytes; need offset {offset}..{offset + length - 1}"
            )
        return data[start : start + length]


class FlatImage:
    """A flat dump (see the module docstring for the layouts), read through the same interface."""

    def __init__(self, data: bytes, what: str = "image") -> None:
        if not data:
            raise TruncatedImageError(f"{what}: empty image")
        self.data = bytes(data)
        self.what = what
        try:
            self.kind = identify(self.data[0])[1]
        except UnknownModuleError as e:
            raise UnknownModuleError(f"{what}: {e}") from None

    def read(self, i2c_address: int, page: int, bank: int, offset: int, length: int) -> bytes:
        check_request(i2c_address, page, bank, offset, length)
        if self.kind is ModuleKind.SFF8472:
            if page != 0 or bank != 0 or i2c_address not in (A0H, A2H):
                raise TruncatedImageError(f"{self.what}: SFF-8472 images hold only A0h and A2h page 0")
            base = 0 if i2c_address == A0H else 256
            where = f"{'A0h' if i2c_address == A0H else 'A2h'} {_span(offset, length)}"
        else:
            if i2c_address != A0H:
                raise TruncatedImageError(f"{self.what}: {self.kind.value} uses I2C address 0x50 only")
            base = 0 if page == 0 and bank == 0 else (bank * 256 + page) * HALF_PAGE
            where = f"page {page:#04x} bank {bank} offset {_span(offset, length)}"
        start = base + offset
        if start + length > len(self.data):
            raise TruncatedImageError(
                f"{self.what}: truncated {self.kind.value} image ({len(self.data)} bytes): {where} "
                f"is at file byte {_span(start, length)}"
            )
        return self.data[start : start + length]


def _span(start: int, length: int) -> str:
    return str(start) if length == 1 else f"{start}..{start + length - 1}"


def decode_image(data: bytes, what: str = "image") -> DomReading:
    """Decode a flat image file's bytes; latched flags are decoded too (a file has no one to steal from)."""
    mem = FlatImage(data, what)
    return read_dom(mem, latched=True)


def parse_hex(text: str, what: str = "input") -> bytes:
    """Hex text → bytes. Accepts bare hex pairs and `ethtool -m IF hex on` dumps (`0x0000: 03 04 ...`,
    header lines with "Offset" skipped)."""
    out = bytearray()
    for n, line in enumerate(text.splitlines(), 1):
        body = line.strip()
        if not body or body.lower().startswith("offset") or set(body) <= set("- \t"):
            continue
        if ":" in body:
            body = body.split(":", 1)[1]
        for token in body.replace(",", " ").split():
            token = token.removeprefix("0x").removeprefix("0X")
            if len(token) % 2:
                raise DomDecodeError(f"{what}:{n}: {token!r} is not whole hex bytes")
            try:
                out += bytes.fromhex(token)
            except ValueError:
                raise DomDecodeError(f"{what}:{n}: {token!r} is not hex") from None
    return bytes(out)
