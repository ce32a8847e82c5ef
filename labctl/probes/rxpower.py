"""Optical Rx power from transceiver DOM, polled per port and lane.

`RxPowerProbe` polls any number of ports in one ticker: for each it opens the module EEPROM once
(`ModulePort.open_eeprom`: a live module through ethtool netlink or the ioctl, labctl.linux.ethtool; an
emulated one driven by a behaviour model, labctl.models.module_eeprom), identifies it, then at `hz`
reads only the Rx power words its ModuleInfo names (QSFP28: lower page 0 bytes 34–41; SFP: A2h 104–105;
CMIS: page 11h 186–201 per bank) and emits `rx_power` events per lane (source `nic:<host>/<ifname>`,
value dBm or None for no light, meta lane and mw) on change (deadband) and as a heartbeat
(labctl.sampling.ReportGate). The same code path reads a real NIC and the simulated lab.

Latched flags: SFF-8636 and CMIS LOS/LOL flags are latched and clear on read; a 1 kHz poller would
consume them before the NIC driver or any monitoring daemon sees them. The probe therefore never reads
them unless `consume_latched_flags=True`, in which case it reads them every sample (SFF-8636 byte 3,
CMIS page 11h byte 147 per bank) and adds `meta.los`. SFP's Rx_LOS (A2h 110) is a live bit, not latched.

Reads run on the event loop: they are synchronous kernel calls (the genetlink handler runs inside
sendto). That costs microseconds on drivers that answer from a cache and on the emulated module; on
firmware-mediated NICs (mlx5: several MCIA register reads per half page) each read can take
milliseconds, which both caps the useful rate and delays other probes on the loop. Measure with
bench/dom.py on the target NIC before raising `hz` there.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass, field
from types import TracebackType
from typing import Self

from labctl.clock import now_ns
from labctl.events import Event, Kind
from labctl.linux.ethtool import ModuleEepromError, open_module_eeprom
from labctl.probes import ProbeContext, ProbeKind
from labctl.sampling import LightWindow, Probe, QueueProbe, ReportGate, power_moved, ticks
from labctl.transceiver import (
    A0H,
    A2H,
    DomDecodeError,
    EepromRead,
    ModuleEeprom,
    ModuleInfo,
    ModuleKind,
    module_info,
    mw_to_dbm,
)

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


def _reads(plan: Sequence[EepromRead]) -> list[Read]:
    return [(r.i2c_address, r.page, r.bank, r.offset, r.length) for r in plan]


@dataclass
class _Polled:
    """One open module and what the poller remembers about it."""

    port: ModulePort
    mem: ModuleEeprom
    info: ModuleInfo
    lanes: list[int]  # indices into info.lanes that are reported
    reads: list[Read]
    los: LosPlan | None
    los_reads: list[Read]
    keys: list[str] = field(init=False)
    reported: list[bool] = field(init=False)
    last: list[float | None] = field(init=False)
    streak: int = 0
    read_errors: int = 0
    failed: str | None = None
    """Why this port is no longer sampled (too many consecutive failed reads)."""

    def __post_init__(self) -> None:
        self.keys = [f"{self.port.source}#{self.info.lanes[i]}" for i in self.lanes]
        self.reported = [False] * len(self.lanes)
        self.last = [None] * len(self.lanes)


def _close(mem: ModuleEeprom) -> None:
    close = getattr(mem, "close", None)
    if close is not None:
        close()


class RxPowerProbe(QueueProbe):
    """Polls every port's module at `hz` and emits `rx_power` per lane on change and as a heartbeat."""

    name = "rx-power"
    counters = ("samples", "read_errors")

    def __init__(
        self,
        ports: Sequence[ModulePort],
        *,
        hz: float = 1000.0,
        deadband_db: float = 0.5,
        report_interval_ns: int = 100_000_000,
        consume_latched_flags: bool = False,
        max_error_streak_s: float = 1.0,
        queue_size: int = 65536,
    ) -> None:
        super().__init__(queue_size)
        self.ports = list(ports)
        self.period_ns = round(1e9 / hz)
        self.deadband_db = deadband_db
        self.gate = ReportGate(report_interval_ns)
        self.window = LightWindow(max(2 * self.period_ns, 1_000_000))
        self.consume_latched_flags = consume_latched_flags
        self.max_error_streak = max(1, round(max_error_streak_s * hz))
        self.polled: list[_Polled] = []
        self.unsampled: dict[str, str] = {}
        """Ports whose module could not be opened at start, and why."""
        self.samples = 0  # port samples: one read of one port's power words
        self.read_errors = 0

    def stats(self) -> dict[str, float | int]:
        out = super().stats()
        sampled = len(self.ports) - len(self.unsampled)
        out["ports_sampled"] = sampled
        out["ports_without_module"] = len(self.unsampled)
        if "samples_per_s" in out and sampled:
            out["samples_per_s_per_port"] = round(out["samples_per_s"] / sampled, 1)
        return out

    def _open(self, port: ModulePort) -> _Polled:
        mem = port.open_eeprom()
        try:
            info = module_info(mem)
            if not info.rx_power_reads:
                raise DomDecodeError(f"{port.source}: {info.identifier_name} module has no Rx power monitor")
        except BaseException:
            _close(mem)
            raise
        lanes = [i for i, lane in enumerate(info.lanes) if port.lanes is None or lane in port.lanes]
        los = LosPlan.for_module(info) if self.consume_latched_flags else None
        return _Polled(
            port, mem, info, lanes, _reads(info.rx_power_reads), los, _reads(los.reads) if los else []
        )

    async def __aenter__(self) -> Self:
        # Open and identify every module before the sampler starts. A port whose module cannot be read (no
        # module, a module without an Rx power monitor, a read that fails) is not sampled: a sampler.error
        # event says why and the other ports go on (its t2 stays empty; `labctl lab check` reports it too).
        # A port that does not exist is bad input and fails `async with`.
        self._check_startable()
        try:
            for port in self.ports:
                try:
                    self.polled.append(self._open(port))
                except (ModuleEepromError, DomDecodeError) as e:
                    self.unsampled[port.source] = str(e)
                    self.queue.put(
                        Event(
                            t_ns=now_ns(),
                            kind=Kind.SAMPLER_ERROR,
                            source=port.source,
                            host=port.host,
                            value=str(e),
                            meta={"probe": self.name, "at": "start"},
                        )
                    )
        except BaseException:
            self._close_all()
            raise
        return await super().__aenter__()

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        failures = self.failures
        try:
            await super().__aexit__(exc_type, exc, tb)
        finally:
            self._close_all()
        if failures:
            more = f" (and {len(failures) - 1} more port(s))" if len(failures) > 1 else ""
            raise ModuleEepromError(failures[0] + more)

    def _close_all(self) -> None:
        for p in self.polled:
            _close(p.mem)
        self.polled = []

    def open_window(self, sources: Collection[str] | None = None) -> None:
        """A reconfiguration moves these ports' light: report densely until it is seen back (LightWindow)."""
        t = now_ns()
        for p in self.polled:
            if sources is None or p.port.source in sources:
                self.window.open(p.keys, t)

    def close_window(self) -> None:
        self.window.close()

    def _sample(self, p: _Polled) -> None:
        try:
            chunks = [p.mem.read(*r) for r in p.reads]
            t = now_ns()  # observed: the words existed by the time the read returned
            los = p.los.decode(p.info, [p.mem.read(*r) for r in p.los_reads]) if p.los else None
            mws = p.info.decode_rx_power_mw(chunks)
        except (ModuleEepromError, DomDecodeError) as e:
            self.read_errors += 1
            p.read_errors += 1
            p.streak += 1
            if p.streak >= self.max_error_streak:
                # This module is gone (pulled, dead, a firmware that stopped answering): stop reading it,
                # say so in the stream, and keep sampling the other ports. Exiting the probe raises it.
                p.failed = f"{p.port.source}: {p.streak} consecutive failed reads, last: {e}"
                self.queue.put(
                    Event(
                        t_ns=now_ns(),
                        kind=Kind.SAMPLER_ERROR,
                        source=p.port.source,
                        host=p.port.host,
                        value=p.failed,
                        meta={"probe": self.name, "read_errors": p.read_errors},
                    )
                )
            return
        p.streak = 0
        self.samples += 1
        for k, i in enumerate(p.lanes):
            mw = mws[i]
            dbm = mw_to_dbm(mw)
            changed = not p.reported[k] or power_moved(p.last[k], dbm, self.deadband_db)
            interval = self.window.interval(p.keys[k], dbm is not None, t)
            if not self.gate.due(p.keys[k], changed, t, interval):
                continue
            p.reported[k] = True
            p.last[k] = dbm
            meta: dict[str, object] = {"lane": p.info.lanes[i], "mw": round(mw, 6)}
            if los is not None:
                meta["los"] = los[i]
            if p.read_errors:
                meta["read_errors"] = p.read_errors
            self.queue.put(
                Event(
                    t_ns=t,
                    kind=Kind.RX_POWER,
                    source=p.port.source,
                    host=p.port.host,
                    value=None if dbm is None else round(dbm, 3),
                    meta=meta,
                )
            )

    async def _run(self) -> None:
        async with contextlib.aclosing(ticks(self.period_ns)) as schedule:
            async for _tick in schedule:
                live = [p for p in self.polled if p.failed is None]
                if not live:
                    return  # every module failed: nothing left to sample (each said why in the stream)
                for p in live:
                    self._sample(p)

    @property
    def failures(self) -> list[str]:
        return [p.failed for p in self.polled if p.failed is not None]


def _build(ctx: ProbeContext) -> Probe:
    ports = [
        ModulePort(site.port.source, site.port.host, site.open_eeprom, site.rx_lanes)
        if site.open_eeprom is not None
        else ModulePort.of_interface(site.port.host, site.port.ifname, netns=site.netns, lanes=site.rx_lanes)
        for site in ctx.ports
    ]
    return RxPowerProbe(
        ports,
        hz=ctx.settings.rx_power_hz,
        deadband_db=ctx.settings.rx_power_deadband_db,
        report_interval_ns=ctx.report_interval_ns,
    )


PROBE = ProbeKind(
    "rx-power",
    (Kind.RX_POWER,),
    "optical Rx power per lane from each port's transceiver DOM (ethtool netlink, or a modeled module)",
    _build,
)
