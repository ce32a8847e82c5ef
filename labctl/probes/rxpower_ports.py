"""The transceivers an Rx power poller reads: each NIC port's module, how it is opened and identified,
and which EEPROM words hold its Rx power and loss-of-signal bits (`labctl.probes.rxpower` polls them)."""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from labctl.linux.ethtool import open_module_eeprom
from labctl.linux.transceiver import A0H, A2H, EepromRead, ModuleEeprom, ModuleInfo, ModuleKind
from labctl.probes.base import RxPowerBatch

Read = tuple[int, int, int, int, int]  # i2c address, page, bank, offset, length


@dataclass(frozen=True)
class ModulePort:
    """One NIC port's transceiver: its event source, its host, how to open its EEPROM, and which lanes to
    report (None: every lane the module has; a behaviour model that lights all lanes of a port alike
    reports one of them rather than four copies)."""

    source: str
    host: str
    open_eeprom: Callable[[], ModuleEeprom]
    lanes: tuple[int, ...] | None = None
    batch: tuple[RxPowerBatch, int] | None = None
    """A model that reads this port's power with others' in one call (identification still reads the
    EEPROM); None: each sample reads the module."""

    @classmethod
    def of_interface(
        cls,
        host: str,
        ifname: str,
        *,
        netns: str | None = None,
        timeout_s: float = 1.0,
        lanes: tuple[int, ...] | None = None,
    ) -> ModulePort:
        """A live port `nic:<host>/<ifname>`, read through ethtool netlink (or the legacy ioctl)."""
        opener = functools.partial(open_module_eeprom, ifname, netns, timeout_s)
        return cls(f"nic:{host}/{ifname}", host, opener, lanes)


@dataclass(frozen=True)
class LosPlan:
    """Where the per-lane LOS bits are: SFF-8472 live status, SFF-8636/CMIS latched (clear on read)."""

    reads: tuple[EepromRead, ...]

    @staticmethod
    def for_module(info: ModuleInfo) -> LosPlan:
        if info.module is ModuleKind.SFF8472:
            return LosPlan((EepromRead(A2H, 0, 0, 110, 1),))
        if info.module is ModuleKind.SFF8636:
            return LosPlan((EepromRead(A0H, 0, 0, 3, 1),))
        return LosPlan(tuple(EepromRead(A0H, 0x11, bank, 147, 1) for bank in info.banks))

    def decode(self, info: ModuleInfo, chunks: Sequence[bytes]) -> list[bool]:
        if info.module is ModuleKind.SFF8472:
            return [bool(chunks[0][0] & 0x02)]
        if info.module is ModuleKind.SFF8636:
            return [bool(chunks[0][0] >> i & 1) for i in range(4)]
        return [bool(c[0] >> i & 1) for c in chunks for i in range(8)]


def eeprom_reads(plan: Sequence[EepromRead]) -> list[Read]:
    return [(r.i2c_address, r.page, r.bank, r.offset, r.length) for r in plan]


@dataclass
class PolledModule:
    """One open module and what the poller remembers about it."""

    port: ModulePort
    mem: ModuleEeprom
    info: ModuleInfo
    lanes: list[int]  # indices into info.lanes that are reported
    reads: list[Read]
    los: LosPlan | None
    los_reads: list[Read]
    streak: int = 0
    read_errors: int = 0
    failed: str | None = None
    """Why this port is no longer sampled (too many consecutive failed reads)."""
    batched: bool = False
    """Sampled through its model's batch read, not its EEPROM."""
    los_now: list[bool] | None = None
    """The latched LOS bits of the reported lanes, as last read (consume_latched_flags)."""


def close_module(mem: ModuleEeprom) -> None:
    close = getattr(mem, "close", None)
    if close is not None:
        close()
