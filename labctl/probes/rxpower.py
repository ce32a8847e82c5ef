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

import math
from collections.abc import Collection, Iterator, Sequence
from types import TracebackType
from typing import Self

import numpy as np

from labctl.core.clock import now_ns
from labctl.core.events import Event, Kind
from labctl.linux.ethtool import ModuleEepromError
from labctl.linux.transceiver import DomDecodeError, ModuleKind, module_info
from labctl.probes.base import ProbeContext, ProbeKind
from labctl.probes.rxpower_lanes import Lanes
from labctl.probes.rxpower_ports import LosPlan, ModulePort, PolledModule, close_module, eeprom_reads
from labctl.probes.sampling import (
    ModelSchedule,
    Probe,
    QueueProbe,
    TickCount,
    run_ticks,
    staggered_heartbeats,
)

UPDATE_REPORT_NS = 1_000_000_000  # how often module update-interval estimates are revisited


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
        self.polled: list[PolledModule] = []
        self.unsampled: dict[str, str] = {}
        """Ports whose module could not be opened at start, and why."""
        self.samples = 0  # port samples: one read of one port's power words
        self.read_errors = 0
        self._lanes: Lanes | None = None
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

    def _open(self, port: ModulePort) -> PolledModule:
        mem = port.open_eeprom()
        try:
            info = module_info(mem)
            if not info.rx_power_reads:
                raise DomDecodeError(f"{port.source}: {info.identifier_name} module has no Rx power monitor")
        except BaseException:
            close_module(mem)
            raise
        lanes = [i for i, lane in enumerate(info.lanes) if port.lanes is None or lane in port.lanes]
        los = LosPlan.for_module(info) if self.consume_latched_flags else None
        polled = PolledModule(
            port,
            mem,
            info,
            lanes,
            eeprom_reads(info.rx_power_reads),
            los,
            eeprom_reads(los.reads) if los else [],
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
        self._lanes = Lanes(self.polled)
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
            close_module(p.mem)
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

    def _read(self, p: PolledModule, lanes: Lanes, t_ns: np.ndarray, mw: np.ndarray) -> None:
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

    def _tick(self, lanes: Lanes, at_ns: int | None = None) -> bool:
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

    def _tick_lanes(self, lanes: Lanes, at_ns: int | None) -> bool:
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

    def _report(self, lanes: Lanes, t_ns: np.ndarray, mw: np.ndarray) -> None:
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

    def _report_lanes(self, lanes: Lanes, t_ns: list[int], mw: list[float]) -> None:
        """`_report` one lane at a time, for a few lanes (an agent's host): the same decisions as the array
        code, which costs a numpy call per step whatever the number of lanes (~150 µs a tick for 4 lanes
        where this takes ~10 µs). tests/unit/test_rxpower_lanes.py holds the two to the same reports.
        It works on the lane state as lists, kept from tick to tick (`Lanes.take_lists`), and looks at
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
        lanes: Lanes,
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

    def _report_update_intervals(self, lanes: Lanes, t: int) -> None:
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
