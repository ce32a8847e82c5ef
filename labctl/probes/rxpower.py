"""Optical Rx power from transceiver DOM, polled per port and lane.

`RxPowerProbe` polls any number of ports in one ticker: for each it opens the module EEPROM once
(`ModulePort.open_eeprom`: a live module through ethtool netlink or the ioctl, labctl.linux.ethtool; an
emulated one driven by a behaviour model, labctl.models.module_eeprom), identifies it, then at `hz`
reads only the Rx power words its ModuleInfo names (QSFP28: lower page 0 bytes 34–41; SFP: A2h 104–105;
CMIS: page 11h 186–201 per bank) and emits `rx_power` events per lane (source `nic:<host>/<ifname>`,
value dBm or None for no light, meta lane and mw) on change (deadband, threshold crossings) and as a
staggered heartbeat, decided with array operations over every lane. The same code path reads a real NIC
and the simulated lab.

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

import functools
import math
from collections.abc import Callable, Collection, Iterator, Sequence
from dataclasses import dataclass
from itertools import repeat
from types import TracebackType
from typing import Self

import numpy as np

from labctl.core.clock import now_ns
from labctl.core.events import Event, Kind
from labctl.linux.ethtool import ModuleEepromError, open_module_eeprom
from labctl.probes.base import ProbeContext, ProbeKind, RxPowerBatch
from labctl.probes.sampling import (
    ModelSchedule,
    Probe,
    QueueProbe,
    TickCount,
    run_ticks,
    staggered_heartbeats,
)
from labctl.probes.transceiver import (
    A0H,
    A2H,
    DomDecodeError,
    EepromRead,
    ModuleEeprom,
    ModuleInfo,
    ModuleKind,
    module_info,
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
    streak: int = 0
    read_errors: int = 0
    failed: str | None = None
    """Why this port is no longer sampled (too many consecutive failed reads)."""
    batched: bool = False
    """Sampled through its model's batch read, not its EEPROM."""
    los_now: list[bool] | None = None
    """The latched LOS bits of the reported lanes, as last read (consume_latched_flags)."""


def _close(mem: ModuleEeprom) -> None:
    close = getattr(mem, "close", None)
    if close is not None:
        close()


UPDATE_REPORT_NS = 1_000_000_000  # how often module update-interval estimates are revisited
UPDATE_MIN_CHANGES = 20  # value changes a module must show before its update interval is estimated


SCALAR_LANES = 16
"""Up to this many lanes a tick decides lane by lane in Python (`_report_lanes`); above, with arrays."""


class RxPowerProbe(QueueProbe):
    """Polls every port's module at `hz` and emits `rx_power` per lane on change and as a heartbeat.

    One tick reads every port (a model's ports in one vectorized read, live modules one read each) and
    decides what to report with array operations over every lane, so the cost of a tick grows with the
    number of reads, not with Python work per lane. Each report carries the time of the lane's previous
    sample (`meta.prev_ns`): a change is known to have happened in (prev_ns, t_ns], the mark's bracket.
    Crossing `threshold_dbm` always counts as a change, so the first report at or above it is the first
    sample that saw it.

    Each lane's module update interval is estimated from how often its value changes while lit (a module
    refreshes its DOM every few to ~100 ms; between refreshes every read returns the same words) and
    written as `rx_power.update` events: the breakdown widens the optical mark's bracket by it.
    """

    name = "rx-power"
    counters = ("samples", "read_errors")

    def __init__(
        self,
        ports: Sequence[ModulePort],
        *,
        hz: float = 1000.0,
        deadband_db: float = 0.5,
        report_interval_ns: int = 100_000_000,
        threshold_dbm: float | None = None,
        consume_latched_flags: bool = False,
        max_error_streak_s: float = 1.0,
        queue_size: int = 65536,
        schedule: ModelSchedule | None = None,
    ) -> None:
        super().__init__(queue_size)
        self.ports = list(ports)
        self.schedule = schedule
        """A model's shared schedule: each tick reads the model batches at the tick's own instant."""
        self.period_ns = round(1e9 / hz)
        self.deadband_db = deadband_db
        self.report_interval_ns = report_interval_ns
        self.window_interval_ns = max(2 * self.period_ns, 1_000_000)
        self.window_max_ns = 1_000_000_000
        self.threshold_dbm = -math.inf if threshold_dbm is None else threshold_dbm
        self.consume_latched_flags = consume_latched_flags
        self.max_error_streak = max(1, round(max_error_streak_s * hz))
        self.polled: list[_Polled] = []
        self.unsampled: dict[str, str] = {}
        """Ports whose module could not be opened at start, and why."""
        self.samples = 0  # port samples: one read of one port's power words
        self.read_errors = 0
        self._lanes: _Lanes | None = None
        self.dense_window = True
        self.ticks = 0
        self.tick_count = TickCount()
        self._first_tick_ns = self._last_tick_ns = 0
        """Report densely while light moves (`open_window`), unless told of switch acknowledgements."""

    def stats(self) -> dict[str, float | int]:
        out = super().stats()
        sampled = len(self.ports) - len(self.unsampled)
        out["ports_sampled"] = sampled
        out["ports_without_module"] = len(self.unsampled)
        if self.ticks > 1 and sampled:
            # Over the sampling itself (first tick to last, plus one period): not the set-up before it.
            span_s = (self._last_tick_ns - self._first_tick_ns + self.period_ns) / 1e9
            out["sampling_s"] = round(span_s, 3)
            out["ticks_per_s"] = round(self.ticks / span_s, 1)
            # Ticks the schedule gave up after a stall of the loop (longer than the catch-up budget), and
            # whose each stall was (the loop busy, waiting for a core, or asleep).
            out.update(self.tick_count.stats())
            if self.schedule is not None:  # ticks the host ran late, each at its own instant
                out["ticks_caught_up"] = self.tick_count.caught_up
            out["samples_per_s_per_port"] = round(self.samples / span_s / sampled, 1)
        if self._lanes is not None:
            estimates = self._lanes.update_estimates()
            known = estimates[estimates > 0]
            out["module_update_estimated"] = int(known.size)
            if known.size:
                out["module_update_ns_median"] = int(np.median(known))
                out["module_update_ns_max"] = int(known.max())
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
        polled = _Polled(
            port, mem, info, lanes, _reads(info.rx_power_reads), los, _reads(los.reads) if los else []
        )
        # A batch models an SFF-8636 module reporting one lane; anything else reads its EEPROM each sample.
        polled.batched = (
            port.batch is not None and los is None and len(lanes) == 1 and info.module is ModuleKind.SFF8636
        )
        return polled

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
        self._lanes = _Lanes(self.polled)
        self._lanes.heartbeat_ns = staggered_heartbeats(self.report_interval_ns, self._lanes.n)
        return await super().__aenter__()

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        failures = self.failures
        if self._lanes is not None:  # the estimates as they stand at the end (a short run may have had none)
            self._report_update_intervals(self._lanes, now_ns())
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
        """A reconfiguration moves these ports' light: report densely until it is seen back (dark, then at
        or above the threshold) or for `window_max_ns`."""
        if self._lanes is not None:
            self._lanes.open_window(sources, now_ns() + self.window_max_ns, dense=self.dense_window)

    def close_window(self) -> None:
        if self._lanes is not None:
            self._lanes.window_until[:] = 0

    def expect_switch_acks(self) -> None:
        """The controller will call `switched` at each acknowledgement (an in-process probe): no dense
        window is needed, which at hundreds of ports would be hundreds of events every 2 ms."""
        self.dense_window = False

    def switched(self, sources: Collection[str]) -> None:
        """The switch acknowledged moving these ports' light: report each one's next sample (the first
        after t1) and end its dense window, which only stood in for not knowing when that was."""
        if self._lanes is not None:
            # Told a broker hop after t1 (an agent), the light may have been seen back, and reported,
            # before t1 (a mirror of a model a little ahead of it): report once more after t1.
            after = self.threshold_dbm if self.dense_window else None
            self._lanes.switched(sources, reported_back_above=after)

    def _read(self, p: _Polled, lanes: _Lanes, t_ns: np.ndarray, mw: np.ndarray) -> None:
        """One live (or unbatched) module's read into the tick's arrays; NaN where it failed."""
        at = lanes.by_port[id(p)]
        try:
            chunks = [p.mem.read(*r) for r in p.reads]
            t = now_ns()  # observed: the words existed by the time the read returned
            los = p.los.decode(p.info, [p.mem.read(*r) for r in p.los_reads]) if p.los else None
            mws = p.info.decode_rx_power_mw(chunks)
        except (ModuleEepromError, DomDecodeError) as e:
            mw[at] = math.nan
            self.read_errors += 1
            p.read_errors += 1
            p.streak += 1
            if p.streak >= self.max_error_streak:
                # This module is gone (pulled, dead, a firmware that stopped answering): stop reading it,
                # say so in the stream, and keep sampling the other ports. Exiting the probe raises it.
                p.failed = f"{p.port.source}: {p.streak} consecutive failed reads, last: {e}"
                lanes.live[at] = False
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
        t_ns[at] = t
        mw[at] = [mws[i] for i in p.lanes]
        if los is not None:
            p.los_now = [los[i] for i in p.lanes]

    def _tick(self, lanes: _Lanes, at_ns: int | None = None) -> bool:
        """Sample every live port once and report what changed; False when none is left to sample.
        `at_ns`: the instant a model is read at (a `ModelSchedule`'s tick); else each read's own time."""
        if lanes.n <= SCALAR_LANES and not lanes.unbatched:
            return self._tick_lanes(lanes, at_ns)
        n = lanes.n
        t_ns = np.zeros(n, np.int64)
        mw = np.full(n, math.nan)
        any_live = False
        for batch, slots, at in lanes.batches:
            live = int(np.count_nonzero(lanes.live[at]))
            if live:
                any_live = True
                t = now_ns() if at_ns is None else at_ns
                mw[at] = batch.rx_power_mw(slots, t)
                t_ns[at] = t
                self.samples += live
        for p in lanes.unbatched:
            if p.failed is None:
                any_live = True
                self._read(p, lanes, t_ns, mw)
        if not any_live:
            return False
        self._report(lanes, t_ns, mw)
        return True

    def _tick_lanes(self, lanes: _Lanes, at_ns: int | None) -> bool:
        """`_tick` in Python lists, for a few lanes all read in model batches (an agent's host, a small
        simulated lab): the same reads and reports without the tick's arrays (tests/unit/
        test_rxpower_lanes.py holds the two equal)."""
        n = lanes.n
        t_ns = [0] * n
        mw = [math.nan] * n
        live = lanes.take_lists().live
        every_live = False not in live
        any_live = False
        for (batch, slots, _), rows in zip(lanes.batches, lanes.batch_rows, strict=True):
            count = len(rows) if every_live else sum(live[k] for k in rows)
            if count:
                any_live = True
                t = now_ns() if at_ns is None else at_ns
                values = batch.rx_power_mw(slots, t).tolist()
                if lanes.one_batch:  # every lane, in row order: the read is the tick's column
                    t_ns, mw = [t] * n, values
                else:
                    for k, value in zip(rows, values, strict=True):
                        t_ns[k] = t
                        mw[k] = value
                self.samples += count
        if not any_live:
            return False
        self._report_lanes(lanes, t_ns, mw)
        return True

    def _report(self, lanes: _Lanes, t_ns: np.ndarray, mw: np.ndarray) -> None:
        if lanes.n <= SCALAR_LANES:
            self._report_lanes(lanes, t_ns.tolist(), mw.tolist())
            return
        read = ~np.isnan(mw) & lanes.live
        lit = read & (mw > 0)
        with np.errstate(divide="ignore", invalid="ignore"):
            dbm = np.where(lit, 10.0 * np.log10(np.where(lit, mw, 1.0)), -math.inf)
        above = lit & (dbm >= self.threshold_dbm)  # with no threshold (-inf): lit
        last = lanes.last_dbm
        was_lit = last > -math.inf
        # -inf >= -inf: without a threshold a dark lane's last value would count as "above" and differ
        # from its (dark) reading every tick, a report per tick of an unchanged dark lane
        moved = (lit != was_lit) | (above != (was_lit & (last >= self.threshold_dbm)))
        moved |= lit & (np.abs(dbm - np.where(last > -math.inf, last, 0.0)) >= self.deadband_db)
        # What no lane has (no report forced, no window open, no light moving: most ticks) is skipped: a
        # tick of hundreds of lanes is a few dozen array operations, each a microsecond or two.
        if not lanes.all_reported:
            moved |= ~lanes.reported
        if lanes.any_force:
            moved |= lanes.force
            lanes.force &= ~read
            lanes.any_force = bool(lanes.force.any())
        changed = read & moved
        if lanes.any_window:
            # The dense window: while a port's light is being moved, report every window interval.
            windowed = read & (lanes.window_until > 0)
            done = windowed & ((t_ns >= lanes.window_until) | (above & lanes.seen_dark))
            lanes.window_until[done] = 0
            lanes.seen_dark[done] = False
            windowed &= ~done
            lanes.seen_dark |= windowed & ~above
            interval = np.where(windowed, self.window_interval_ns, lanes.heartbeat_ns)
            lanes.any_window = bool(lanes.window_until.any())
        else:
            interval = lanes.heartbeat_ns
        if lanes.any_moving:
            lanes.dark_seen |= lanes.moving & read & ~above
        due = changed | (read & (t_ns - lanes.reported_t >= interval))
        # Module update interval: how often the value changes while the light is steady.
        steady = read & lit & (lanes.last_mw > 0) & (lanes.sampled_t > 0)
        lanes.steady_ns[steady] += t_ns[steady] - lanes.sampled_t[steady]
        lanes.value_changes[steady & (mw != lanes.last_mw)] += 1
        prev_t = lanes.sampled_t.copy()
        lanes.sampled_t[read] = t_ns[read]
        lanes.last_mw[read] = mw[read]
        rows = np.flatnonzero(due)
        if rows.size:
            events = self._events(
                lanes,
                rows.tolist(),
                t_ns[rows].tolist(),
                mw[rows].tolist(),
                dbm[rows].tolist(),
                prev_t[rows].tolist(),
            )
            self.report(events, rows.size)
        lanes.reported[due] = True
        lanes.reported_t[due] = t_ns[due]
        last[due] = dbm[due]
        if not lanes.all_reported:
            lanes.all_reported = bool(lanes.reported.all())
        t = int(t_ns.max())
        if t - lanes.update_checked_t >= UPDATE_REPORT_NS:
            lanes.update_checked_t = t
            self._report_update_intervals(lanes, t)

    def _report_lanes(self, lanes: _Lanes, t_ns: list[int], mw: list[float]) -> None:
        """`_report` one lane at a time, for a few lanes (an agent's host): the same decisions as the array
        code, which costs a numpy call per step whatever the number of lanes (~150 µs a tick for 4 lanes
        where this takes ~10 µs). tests/unit/test_rxpower_lanes.py holds the two to the same reports.
        It works on the lane state as lists, kept from tick to tick (`_Lanes.take_lists`), and looks at
        nothing no lane has (a forced report, an open window, light moving: the `any_` flags, as the
        array code reads them)."""
        threshold, deadband, window_interval = self.threshold_dbm, self.deadband_db, self.window_interval_ns
        log10, dark = math.log10, -math.inf
        state = lanes.take_lists()
        live, last_dbm, reported, reported_t = state.live, state.last_dbm, state.reported, state.reported_t
        heartbeat, last_mw, sampled_t = state.heartbeat_ns, state.last_mw, state.sampled_t
        steady_ns, value_changes = state.steady_ns, state.value_changes
        force, window_until, seen_dark = state.force, state.window_until, state.seen_dark
        moving, dark_seen = state.moving, state.dark_seen
        any_force, any_window, any_moving = lanes.any_force, lanes.any_window, lanes.any_moving
        rows: list[int] = []
        row_dbm: list[float] = []
        prevs: list[int] = []
        for k, m in enumerate(mw):
            if not live[k] or m != m:  # not sampled this tick (NaN: failed, or a dead module)
                continue
            t = t_ns[k]
            lit = m > 0
            dbm = 10.0 * log10(m) if lit else dark
            above = lit and dbm >= threshold
            last = last_dbm[k]
            was_lit = last > dark
            changed = (
                not reported[k]
                or lit != was_lit
                or above != (was_lit and last >= threshold)
                or (lit and abs(dbm - (last if was_lit else 0.0)) >= deadband)
            )
            if any_force and force[k]:
                changed = True
                force[k] = False
            interval = heartbeat[k]
            if any_window and window_until[k] > 0:
                if t >= window_until[k] or (above and seen_dark[k]):
                    window_until[k] = 0
                    seen_dark[k] = False
                else:
                    interval = window_interval
                    if not above:
                        seen_dark[k] = True
            if any_moving and moving[k] and not above:
                dark_seen[k] = True
            prev = sampled_t[k]
            if lit and last_mw[k] > 0 and prev > 0:
                steady_ns[k] += t - prev
                if m != last_mw[k]:
                    value_changes[k] += 1
            sampled_t[k] = t
            last_mw[k] = m
            if changed or t - reported_t[k] >= interval:
                rows.append(k)
                row_dbm.append(dbm)
                prevs.append(prev)
                reported[k] = True
                reported_t[k] = t
                last_dbm[k] = dbm
        if any_force:
            lanes.any_force = True in force
        if any_window:
            lanes.any_window = any(window_until)
        if rows:
            events = self._events(lanes, rows, [t_ns[k] for k in rows], [mw[k] for k in rows], row_dbm, prevs)
            self.report(events, len(rows))
        t = max(t_ns)
        if t - lanes.update_checked_t >= UPDATE_REPORT_NS:
            lanes.update_checked_t = t
            self._report_update_intervals(lanes, t)

    def _events(
        self,
        lanes: _Lanes,
        rows: list[int],
        t_ns: list[int],
        mw: list[float],
        dbm: list[float],
        prev: list[int],
    ) -> Iterator[Event]:
        """The tick's reports of these lane rows, as observed by the tick (built when put: `report`)."""
        owners = [lanes.owner[k] for k in rows]
        # What the module said beside the power (loss-of-signal, read errors): as it was at this tick.
        extras = [(p.los_now[lane] if p.los_now is not None else None, p.read_errors) for p, lane in owners]
        values = zip(owners, extras, t_ns, mw, dbm, prev, strict=True)
        for (p, lane), (los, read_errors), t, mw_k, dbm_k, prev_t in values:
            meta: dict[str, object] = {"lane": p.info.lanes[p.lanes[lane]], "mw": round(mw_k, 6)}
            if prev_t > 0:
                meta["prev_ns"] = prev_t
            if los is not None:
                meta["los"] = los
            if read_errors:
                meta["read_errors"] = read_errors
            yield Event(
                t_ns=t,
                kind=Kind.RX_POWER,
                source=p.port.source,
                host=p.port.host,
                value=None if dbm_k == -math.inf else round(dbm_k, 3),
                meta=meta,
            )

    def _report_update_intervals(self, lanes: _Lanes, t: int) -> None:
        """An `rx_power.update` event per lane whose update-interval estimate is new or moved by > 25%.

        The first revisit finds every lane new at once (512 events): they go through `report()`, a time
        slice per loop turn, like any burst; values are fixed now, as observed."""
        estimates = lanes.update_estimates()
        moved = np.abs(estimates - lanes.update_reported) > 0.25 * lanes.update_reported
        rows = np.flatnonzero((estimates > 0) & ((lanes.update_reported == 0) | moved))
        if not rows.size:
            return
        lanes.update_reported[rows] = estimates[rows]
        values = zip(
            rows.tolist(),
            estimates[rows].tolist(),
            lanes.value_changes[rows].tolist(),
            lanes.steady_ns[rows].tolist(),
            strict=True,
        )

        def events() -> Iterator[Event]:
            for k, estimate, changes, steady_ns in values:
                p, lane = lanes.owner[k]
                yield Event(
                    t_ns=t,
                    kind=Kind.RX_UPDATE,
                    source=p.port.source,
                    host=p.port.host,
                    value=int(estimate),
                    meta={
                        "lane": p.info.lanes[p.lanes[lane]],
                        "changes": int(changes),
                        "steady_ns": int(steady_ns),
                        "sampling_period_ns": self.period_ns,
                    },
                )

        self.report(events(), int(rows.size))

    async def _run(self) -> None:
        lanes = self._lanes
        assert lanes is not None

        def tick(t: int) -> bool:
            if not self.ticks:
                self._first_tick_ns = t
            self.ticks += 1
            self._last_tick_ns = t
            # False: every module failed, nothing left to sample (each said why in the stream)
            return self._tick(lanes, t if self.schedule is not None else None)

        if self.schedule is not None:
            await self.schedule.run(self.period_ns, tick, self.tick_count)
        else:
            await run_ticks(self.period_ns, tick, count=self.tick_count)

    @property
    def failures(self) -> list[str]:
        return [p.failed for p in self.polled if p.failed is not None]


LANE_FIELDS = (
    "live", "reported", "reported_t", "last_dbm", "last_mw", "sampled_t", "window_until", "seen_dark",
    "force", "moving", "dark_seen", "steady_ns", "value_changes", "heartbeat_ns",
)  # fmt: skip
"""The per-lane arrays of `_Lanes` that a tick of a few lanes works on as lists (`_LaneLists`)."""


class _LaneField:
    """One of `_Lanes`' per-lane arrays (LANE_FIELDS). While a lane-by-lane tick holds them as lists
    between its ticks (`_Lanes.lists`), getting or setting the attribute writes the lists back first
    (`_Lanes.flush`): whatever reads or writes the array (the array tick, windows, switch notices, stats,
    tests) finds it current, and the next lane-by-lane tick takes the lists again. (A reference to the
    array kept across a lane-by-lane tick would miss it: take the attribute each time.)"""

    def __set_name__(self, owner: type, name: str) -> None:
        self.key = f"_{name}"

    def __get__(self, lanes: _Lanes, owner: type | None = None) -> np.ndarray:
        if lanes.lists is not None:
            lanes.flush()
        array: np.ndarray = lanes.__dict__[self.key]
        return array

    def __set__(self, lanes: _Lanes, array: np.ndarray) -> None:
        if lanes.lists is not None:
            lanes.flush()
        lanes.__dict__[self.key] = array


class _LaneLists:
    """`_Lanes`' per-lane arrays (LANE_FIELDS) as Python lists: a tick of a few lanes reads and writes an
    element of a list per lane where a numpy element read or write costs several times more, and keeps
    them from tick to tick instead of a `tolist()` and a write back per array per tick."""

    __slots__ = LANE_FIELDS
    live: list[bool]
    reported: list[bool]
    reported_t: list[int]
    last_dbm: list[float]
    last_mw: list[float]
    sampled_t: list[int]
    window_until: list[int]
    seen_dark: list[bool]
    force: list[bool]
    moving: list[bool]
    dark_seen: list[bool]
    steady_ns: list[int]
    value_changes: list[int]
    heartbeat_ns: list[int]

    def __init__(self, arrays: dict[str, np.ndarray]) -> None:
        for name in LANE_FIELDS:
            setattr(self, name, arrays[f"_{name}"].tolist())


class _Lanes:
    """Every reported lane of every polled port as rows of arrays (what the last sample and report were,
    the dense window), and how each row is read: in a model's batch, or by its own module read."""

    live = _LaneField()
    reported = _LaneField()
    reported_t = _LaneField()
    last_dbm = _LaneField()
    last_mw = _LaneField()
    sampled_t = _LaneField()
    window_until = _LaneField()
    seen_dark = _LaneField()
    force = _LaneField()  # report the next sample whatever it shows
    moving = _LaneField()  # a reconfiguration is moving this lane's light (open_window)
    dark_seen = _LaneField()  # ...and a sample has seen it below the threshold since
    steady_ns = _LaneField()
    value_changes = _LaneField()
    heartbeat_ns = _LaneField()

    def __init__(self, polled: Sequence[_Polled]) -> None:
        self.lists: _LaneLists | None = None
        """The per-lane arrays as lists, the current copy while ticks of a few lanes run one after another
        (`take_lists`); None: the arrays are."""
        self.owner: list[tuple[_Polled, int]] = [(p, i) for p in polled for i in range(len(p.lanes))]
        self.n = n = len(self.owner)
        self.by_port: dict[int, np.ndarray] = {}
        self.by_source: dict[str, np.ndarray] = {}
        k = 0
        for p in polled:
            self.by_port[id(p)] = self.by_source[p.port.source] = np.arange(k, k + len(p.lanes))
            k += len(p.lanes)
        self.one_lane: dict[str, int] | None = None
        """Each port's row, where every port reports one lane (`rows_of` without an array a port)."""
        if all(len(p.lanes) == 1 for p in polled):
            self.one_lane = {source: int(rows[0]) for source, rows in self.by_source.items()}
        groups: dict[int, tuple[RxPowerBatch, list[int], list[int]]] = {}
        self.unbatched = [p for p in polled if not p.batched]
        for p in polled:
            if p.batched and p.port.batch is not None:
                batch, slot = p.port.batch
                entry = groups.setdefault(id(batch), (batch, [], []))
                entry[1].append(slot)
                entry[2].append(int(self.by_port[id(p)][0]))
        self.batches = [
            (batch, np.array(slots, np.int64), np.array(at, np.int64)) for batch, slots, at in groups.values()
        ]
        self.batch_rows = [at for _, _, at in groups.values()]
        """Each batch's lane rows as a list (`RxPowerProbe._tick_lanes`)."""
        self.one_batch = self.batch_rows == [list(range(n))]
        """One batch reads every lane, in row order (a model's ports, nothing else)."""
        self.live = np.ones(n, bool)
        self.reported = np.zeros(n, bool)
        self.reported_t = np.zeros(n, np.int64)
        self.last_dbm = np.full(n, -math.inf)
        self.last_mw = np.full(n, -1.0)
        self.sampled_t = np.zeros(n, np.int64)
        self.window_until = np.zeros(n, np.int64)
        self.seen_dark = np.zeros(n, bool)
        self.force = np.zeros(n, bool)
        self.moving = np.zeros(n, bool)
        # False only where the array is known to hold no True (no window open: window_until all 0; every
        # lane reported once): what a tick can skip. Only `open_window` and `switched` set them.
        self.any_force = False
        self.any_window = False
        self.any_moving = False
        self.all_reported = False
        self.dark_seen = np.zeros(n, bool)
        self.steady_ns = np.zeros(n, np.int64)
        self.value_changes = np.zeros(n, np.int64)
        self.update_reported = np.zeros(n)
        self.update_checked_t = 0
        self.heartbeat_ns = np.full(n, 100_000_000, np.int64)

    def take_lists(self) -> _LaneLists:
        """The per-lane state as lists, current from now on until an array is got or set (`flush`)."""
        if self.lists is None:
            self.lists = _LaneLists(self.__dict__)
        return self.lists

    def flush(self) -> None:
        """The arrays current again: the lists written back and let go."""
        lists, self.lists = self.lists, None
        if lists is not None:
            for name in LANE_FIELDS:
                self.__dict__[f"_{name}"][:] = getattr(lists, name)

    def rows_of(self, sources: Collection[str] | None) -> np.ndarray:
        """The lane rows of these port sources (None: every row)."""
        if sources is None:
            return np.arange(self.n)
        if self.one_lane is not None:  # a lane a port (a model's modules): one look-up a port, in C
            rows = np.fromiter(map(self.one_lane.get, sources, repeat(-1)), np.int64, len(sources))
            return rows[rows >= 0]
        found = [self.by_source[s] for s in sources if s in self.by_source]
        return np.concatenate(found) if found else np.zeros(0, np.int64)

    def open_window(self, sources: Collection[str] | None, until_ns: int, *, dense: bool = True) -> None:
        at = self.rows_of(sources)
        self.moving[at] = True
        self.dark_seen[at] = False
        self.any_moving = True
        if dense:
            self.window_until[at] = until_ns
            self.seen_dark[at] = False
            self.any_window = True

    def switched(self, sources: Collection[str], *, reported_back_above: float | None = None) -> None:
        """Force the next sample of the moved lanes whose dark gap no sample saw (it fell between two):
        for the others, the light coming back is a change and gets reported anyway, unless it was reported
        already (its last report at or above `reported_back_above`, when given): those again too."""
        at = self.rows_of(sources)
        self.force[at] |= ~self.dark_seen[at]
        if reported_back_above is not None:
            self.force[at] |= self.last_dbm[at] >= reported_back_above
        self.any_force = True
        self.moving[at] = False
        self.any_moving = bool(self.moving.any())
        self.window_until[at] = 0
        self.seen_dark[at] = False

    def update_estimates(self) -> np.ndarray:
        """Each lane's module update interval (ns): steady lit time per value change; 0 where too few
        changes were seen to say (a constant value, or not lit long enough)."""
        enough = self.value_changes >= UPDATE_MIN_CHANGES
        return np.where(enough, self.steady_ns / np.maximum(self.value_changes, 1), 0.0)


def _build(ctx: ProbeContext) -> Probe:
    ports = [
        ModulePort(site.port.source, site.port.host, site.open_eeprom, site.rx_lanes, site.rx_batch)
        if site.open_eeprom is not None
        else ModulePort.of_interface(site.port.host, site.port.ifname, netns=site.netns, lanes=site.rx_lanes)
        for site in ctx.ports
        if site.port.module  # declared without a module (`module: false`): no DOM to read
    ]
    return RxPowerProbe(
        ports,
        hz=ctx.settings.rx_power_hz,
        threshold_dbm=ctx.settings.rx_power_threshold_dbm,
        deadband_db=ctx.settings.rx_power_deadband_db,
        report_interval_ns=ctx.report_interval_ns,
        schedule=ctx.schedule,
    )


PROBE = ProbeKind(
    "rx-power",
    (Kind.RX_POWER, Kind.RX_UPDATE),
    "optical Rx power per lane from each port's transceiver DOM (ethtool netlink, or a modeled module)",
    _build,
)
