"""Pieces every sampling probe shares: the probe Protocol, the experiment's probe settings, the queue
plumbing, a periodic ticker, and the report policy. (A probe's registry entry is in labctl/probes.)

A probe samples fast (1 kHz Rx power, a ping every 1 ms) but writes an event only when the signal
changes, plus a heartbeat at `report_interval`. Transitions keep the sampling resolution; the stream
stays small enough to keep for every run.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import deque
from collections.abc import AsyncGenerator, AsyncIterator, Callable, Iterable, Iterator, Mapping
from types import TracebackType
from typing import Annotated, Any, Literal, Protocol, Self, runtime_checkable

import numpy as np
from pydantic import BaseModel, ConfigDict, Field

from labctl.core.clock import now_ns
from labctl.core.events import Event, EventQueue
from labctl.linux.looplag import sampler_behind, slice_deadline
from labctl.linux.schedstat import STALL_CAUSES, StallCause, ThreadSchedstat, stall_cause
from labctl.linux.schedstat import parse as parse_schedstat
from labctl.linux.timerfd import Alarm

__all__ = [  # the public surface (docs/architecture.md, "Public surface"); the rest is internal
    "CircuitProbe",
    "ModelSchedule",
    "Probe",
    "ProbeSettings",
    "QueueProbe",
    "RdmaSettings",
    "ReportGate",
    "TickCount",
    "run_ticks",
    "staggered_heartbeats",
    "ticks",
]


@runtime_checkable
class Probe(Protocol):
    """An async source of events: `async with probe: async for event in probe.events(): ...`."""

    name: str

    async def __aenter__(self) -> Self: ...

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None: ...

    def events(self) -> AsyncIterator[Event]: ...

    @property
    def dropped(self) -> int:
        """Events lost to a full queue (never silent: the controller records them)."""
        ...


@runtime_checkable
class CircuitProbe(Probe, Protocol):
    """A probe that must know which peer each port should reach (traffic probes)."""

    def set_circuits(self, peers: dict[str, str | None]) -> None:
        """Port source → the source of the port it should exchange traffic with (None: stop)."""
        ...


class RdmaSettings(BaseModel):
    """The RC queue pair attributes that shape recovery (ibv_qp_attr names and ranges) and what to do
    when a QP errors. Part of what is measured: recorded with the run."""

    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)

    timeout: int = Field(
        default=14, ge=0, le=31, description="local ACK timeout: 4.096 us x 2^timeout (0: none)"
    )
    retry_cnt: int = Field(default=7, ge=0, le=7, description="retries after an ACK timeout or sequence NAK")
    rnr_retry: int = Field(default=7, ge=0, le=7, description="receiver-not-ready retries (7: unlimited)")
    min_rnr_timer: int = Field(default=12, ge=0, le=31, description="RNR NAK timer code (12: 0.64 ms)")
    policy: Literal["survive", "reconnect"] = Field(
        default="survive",
        description="survive: a QP error fails the port's recovery; reconnect: reset the QP with fresh PSNs",
    )


class ProbeSettings(BaseModel):
    """The experiment's `probes:` section: rates and reporting of every probe of a run."""

    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)

    rx_power_hz: float = Field(
        default=1000.0, ge=0.1, le=100_000, description="Rx power (DOM) samples a second per port"
    )
    traffic_interval_us: int = Field(
        default=1000, ge=10, le=1_000_000, description="one ping-pong per circuit this often"
    )
    traffic_timeout_us: int | None = Field(
        default=None, ge=10, le=60_000_000, description="default: 2x the interval"
    )
    report_interval_ms: float = Field(
        default=100.0,
        ge=0.1,
        le=60_000,
        description="steady-state samples are written at most this often per port",
    )
    rx_power_deadband_db: float = Field(
        default=0.5,
        ge=0,
        le=30,
        description="a lit port's Rx power is reported when it moves at least this far (dB) from the last "
        "reported value; smaller changes wait for the heartbeat (threshold crossings and light lost or "
        "back are always reported)",
    )
    link_state_hz: float = Field(
        default=100.0,
        ge=0.1,
        le=1000,
        description="ethtool link-state polls per port while a reconfiguration holds it (each is a firmware "
        "register read on mlx5)",
    )
    rx_power_threshold_dbm: float | None = Field(
        default=None,
        ge=-60,
        le=30,
        description="set from the experiment's analysis.rx_power_threshold_dbm: crossing it is always "
        "reported",
    )
    transport: Literal["udp", "rdma"] = Field(
        default="udp",
        description="what carries the ping-pong that marks t5: UDP datagrams, or RDMA RC queue pairs",
    )
    rdma: RdmaSettings = Field(
        default=RdmaSettings(), description="RC queue pair attributes, with transport: rdma"
    )
    switch_power_hz: float = Field(
        default=0.0,
        ge=0,
        le=1000,
        description="poll the OCS's own power monitor on the rails' ports (0: off)",
    )
    extra: list[Annotated[str, Field(min_length=1, max_length=64)]] = Field(
        default=[],
        max_length=32,
        description="more registered probes to run beside the lab's own, by name "
        "(labctl.core.registry.PROBES), "
        "each built on the lab's ports and model like its own (in-process lab kinds: simulated, kernel)",
    )


INLINE_REPORTS = 32
"""Reports a tick puts on the queue itself; a larger burst (every port at once) is built in time slices."""


class QueueProbe:
    """Shared plumbing: a bounded queue and one background task running `_run()`.

    A tick that reports hundreds of ports at once (light lost on all of them) would hold the loop for
    milliseconds building events, and every sampler's next tick would wait for it. `report()` takes the
    tick's reports as an iterator built from what the tick observed (stamps and values fixed then): a few
    are put at once, a burst is put a time slice per loop turn (labctl.linux.looplag.SLICE_NS), in order, and
    whatever is left when the probe stops is put before its stream ends."""

    name = "probe"

    counters: tuple[str, ...] = ()
    """Attributes counting the probe's work (samples, pings); `stats()` reports them and their rates."""

    def __init__(self, queue_size: int = 65536) -> None:
        self.queue = EventQueue(queue_size)
        self._task: asyncio.Task[None] | None = None
        self._started_ns: int | None = None
        self._stopped_ns: int | None = None
        self._backlog: deque[Iterator[Event]] = deque()
        self._backlog_handle: asyncio.Handle | None = None

    def report(self, events: Iterator[Event], count: int) -> None:
        """Put these `count` events on the queue: now if few and nothing is waiting, else in slices."""
        if not self._backlog and count <= INLINE_REPORTS:
            for event in events:
                self.queue.put(event)
            return
        self._backlog.append(events)
        if self._backlog_handle is None:
            try:
                loop = asyncio.get_running_loop()
            except RuntimeError:  # called outside a loop (a tick driven by hand): nothing to wait for
                self._put_backlog(deadline_ns=1 << 62)
                return
            self._backlog_handle = loop.call_soon(self._put_backlog)

    def _put_backlog(self, deadline_ns: int | None = None) -> None:
        self._backlog_handle = None
        deadline = slice_deadline() if deadline_ns is None else deadline_ns
        backlog, put = self._backlog, self.queue.put
        while backlog:
            for n, event in enumerate(backlog[0], 1):
                put(event)
                if n % 16 == 0 and now_ns() >= deadline:
                    break
            else:
                backlog.popleft()
                continue
            self._backlog_handle = asyncio.get_running_loop().call_soon(self._put_backlog)
            return

    def _close_stream(self) -> None:
        """End the stream after putting what is still waiting (a stopped probe loses no report)."""
        if self._backlog_handle is not None:
            self._backlog_handle.cancel()
        self._put_backlog(deadline_ns=1 << 62)
        self._backlog_handle = None
        self.queue.close()

    def stats(self) -> dict[str, float | int]:
        """What the probe did, for run.json: events dropped, time running, each counter and its rate, so a
        sampler that could not keep its configured rate on a busy machine says so."""
        out: dict[str, float | int] = {"dropped": self.dropped}
        if self._started_ns is None:
            return out
        running_s = ((self._stopped_ns or now_ns()) - self._started_ns) / 1e9
        out["running_s"] = round(running_s, 3)
        for name in self.counters:
            count = getattr(self, name)
            out[name] = count
            out[f"{name}_per_s"] = round(count / running_s, 1) if running_s > 0 else 0.0
        return out

    @property
    def dropped(self) -> int:
        return self.queue.dropped

    def failure(self) -> BaseException | None:
        """Why the sampler ended by itself while running (its exception), else None: the controller fails
        the run with it instead of going on without the probe's data."""
        task = self._task
        if task is None or not task.done() or task.cancelled():
            return None
        return task.exception()

    async def _run(self) -> None:
        raise NotImplementedError

    def _check_startable(self) -> None:
        """A probe runs once: its stream ends when it stops, so a second run would sample into nothing."""
        if self._task is not None:
            raise RuntimeError(f"probe {self.name} is already running")
        if self._stopped_ns is not None:
            raise RuntimeError(f"probe {self.name} has run and stopped; build a new one")

    async def __aenter__(self) -> Self:
        self._check_startable()
        self._task = asyncio.create_task(self._run(), name=f"probe:{self.name}")
        # A sampler that dies ends its stream at once: whoever reads events() stops waiting, and the error
        # is raised when the probe is exited.
        self._task.add_done_callback(lambda _task: self._close_stream())
        self._started_ns = now_ns()
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        task, self._task = self._task, None
        try:
            if task is not None:
                task.cancel()
                try:
                    await task
                except asyncio.CancelledError:
                    # Re-raise only if *we* are being cancelled, not because we cancelled the sampler.
                    current = asyncio.current_task()
                    if current is not None and current.cancelling():
                        raise
        finally:
            self._stopped_ns = now_ns()
            self._close_stream()

    def events(self) -> AsyncIterator[Event]:
        return aiter(self.queue)


async def ticks(period_ns: int, max_lag_ns: int | None = None) -> AsyncGenerator[int, None]:
    """Yield tick times on an absolute schedule. Iterate it inside `contextlib.aclosing(...)`, so that a
    sampler cancelled mid-tick closes the generator itself instead of leaving asyncio a clean-up task.

    Each tick wakes on a timerfd armed at its absolute time (labctl.linux.timerfd.Alarm): asyncio's own
    sleeps wake up to ~1 ms late (epoll's timeout is whole milliseconds, rounded up), which at 1 kHz would
    spend the whole lag budget before the loop did any work. A tick late by at most `max_lag_ns` (default:
    two periods, and at least 2 ms) is caught up at once; after a longer stall the missed ticks are skipped
    and the schedule realigns instead of bursting.
    """
    max_lag = max_lag_ns if max_lag_ns is not None else max(2 * period_ns, 2_000_000)
    alarm = _alarm()
    try:
        next_t = now_ns()
        while True:
            # Catching up (no wait due) still lets the loop run between ticks; either way, stamp after waking.
            if next_t > now_ns() and alarm is not None:
                await alarm.at(next_t)
            else:
                await asyncio.sleep(max(next_t - now_ns(), 0) / 1e9)
            t = now_ns()
            yield t
            next_t += period_ns
            if t - next_t > max_lag:  # stalled: skip what was missed
                next_t = t + period_ns
    finally:
        if alarm is not None:
            alarm.close()


class TickCount:
    """What a schedule did: ticks skipped after stalls (each one a missed sample), and ticks run late at
    their own instant (a model's samplers, `ModelSchedule`). `run_ticks` also says whose each stall was
    (labctl.linux.schedstat: the loop's thread busy, runnable but off a core, or asleep) and how long the
    longest was, from the thread's schedstat over the gap between the ticks either side of it."""

    __slots__ = ("caught_up", "causes", "longest_stall_ns", "skipped", "stalls")

    def __init__(self) -> None:
        self.skipped = 0
        self.stalls = 0
        self.caught_up = 0
        self.causes: dict[StallCause, int] = dict.fromkeys(STALL_CAUSES, 0)
        self.longest_stall_ns = 0

    def stalled(self, gap_ns: int, skipped: int, cause: StallCause | None) -> None:
        """One stall: `gap_ns` between two ticks that should have been a period apart, `skipped` ticks
        given up in it; `cause` None where the thread's schedstat cannot be read."""
        self.stalls += 1
        self.skipped += skipped
        self.longest_stall_ns = max(self.longest_stall_ns, gap_ns)
        if cause is not None:
            self.causes[cause] += 1

    def stats(self) -> dict[str, int]:
        """For a probe's run.json stats: skipped ticks, stalls, the longest, and as many `stalls_<cause>`
        as were attributed (busy, runnable, asleep: labctl.linux.schedstat.STALL_CAUSES)."""
        out = {"ticks_skipped": self.skipped, "stalls": self.stalls}
        if self.stalls:
            out["stall_longest_ns"] = self.longest_stall_ns
            if any(self.causes.values()):
                out.update({f"stalls_{cause}": n for cause, n in self.causes.items()})
        return out


def flat_probe_stats(probes: Mapping[str, Any]) -> list[tuple[str, Mapping[str, Any]]]:
    """run.json `probes` (or one probe's `stats()` under its name) as (name, stats) rows, one per sampler:
    an agent's entry (`agent:<host>`) holds its own probes by name (`agent:<host>/<probe>`, each a row) and
    its own counters (a row under its name, where it has any)."""
    rows: list[tuple[str, Mapping[str, Any]]] = []
    for name, stats in probes.items():
        nested = {k: v for k, v in stats.items() if isinstance(v, Mapping)}
        if not nested:
            rows.append((name, stats))
            continue
        rows += [(f"{name}/{sub}", sub_stats) for sub, sub_stats in nested.items()]
        own = {k: v for k, v in stats.items() if k not in nested}
        if own:
            rows.append((name, own))
    return rows


def tick_counts(name: str, stats: Mapping[str, Any]) -> dict[str, dict[str, int]]:
    """From a probe's `stats()`, per sampler that counts its ticks: `ticks_skipped`, `stalls` and
    `stall_longest_ns`, named as `flat_probe_stats` names them."""
    return {
        part: {
            "ticks_skipped": counts["ticks_skipped"],
            "stalls": int(counts.get("stalls") or 0),
            "stall_longest_ns": int(counts.get("stall_longest_ns") or 0),
        }
        for part, counts in flat_probe_stats({name: stats})
        if isinstance(counts.get("ticks_skipped"), int)
    }


class _Sampler:
    __slots__ = ("count", "finished", "next_t", "on_tick", "period_ns")

    def __init__(
        self,
        period_ns: int,
        on_tick: Callable[[int], bool | None],
        count: TickCount | None,
        finished: asyncio.Future[None],
        next_t: int,
    ) -> None:
        self.period_ns = period_ns
        self.on_tick = on_tick
        self.count = count
        self.finished = finished
        self.next_t = next_t


class ModelSchedule:
    """One schedule for the samplers of a behaviour model that is read at an instant and advanced only by
    its readers (an agent's mirror of the controller's model, decision 0046): each sampler ticks at its own
    schedule's instants, every sampler's in time order, from one timer. A tick the host ran late (this
    machine busy) reads the model at its own instant, since nothing has advanced the model past it: a
    stall of the host delays the samples, it does not thin them. Instants more than `catch_up_ns` behind
    are skipped and counted, as a sampler of real hardware skips what it missed (`run_ticks`).

    `on_tick(t)` gets the instant it samples; samplers read the model at it, in that order, so two of them
    never see the model at different times for one instant. `wake_ns`: the host wakes this much after the
    earliest instant due and samples every instant due by then in one go (a model read later than its
    instants is read as at them), a wake-up per `wake_ns` instead of per period: on a host running many
    agents the wake-ups, not the reads, are most of the cost."""

    def __init__(self, catch_up_ns: int = 200_000_000, wake_ns: int = 0) -> None:
        self.catch_up_ns = catch_up_ns
        self.wake_ns = wake_ns
        self._samplers: list[_Sampler] = []
        self._alarm: Alarm | None = None
        self._alarm_tried = False
        self._handle: asyncio.Handle | None = None
        self.ceiling_ns: int | None = None
        """No instant after this is read (None: no ceiling): where the model is known complete only so far
        (a mirror fed over a network: decision 0086). Instants held by it are read once it moves on, at
        their own times, never skipped as missed; `hold_max_ns` after it last moved it is given up."""
        self.hold_max_ns = 2_000_000_000
        self._ceiling_moved_ns = 0
        self._held_through_ns = -1  # instants up to this waited for the ceiling: read, never skipped
        self.holds = 0
        """How many times the samplers waited for the ceiling to move on."""
        self.held_longest_ns = 0
        self.ceilings_given_up = 0
        self._hold_since: int | None = None

    def raise_ceiling(self, t_ns: int) -> None:
        """The model is complete through `t_ns` (this host's clock): instants up to it may be read."""
        if self.ceiling_ns is not None and t_ns <= self.ceiling_ns:
            return
        self.ceiling_ns = t_ns
        self._ceiling_moved_ns = now_ns()
        if self._hold_since is not None and self._samplers:
            with contextlib.suppress(RuntimeError):  # no running loop: the next tick reads it
                self._wake(asyncio.get_running_loop())

    async def run(
        self, period_ns: int, on_tick: Callable[[int], bool | None], count: TickCount | None = None
    ) -> None:
        """Call `on_tick(t)` at t = now, now + period, ... until it returns False or the caller is
        cancelled; its exceptions are raised here."""
        loop = asyncio.get_running_loop()
        sampler = _Sampler(period_ns, on_tick, count, loop.create_future(), now_ns())
        self._samplers.append(sampler)
        self._wake(loop)
        try:
            await sampler.finished
        finally:
            self._samplers.remove(sampler)
            if not sampler.finished.done():
                sampler.finished.cancel()
            if not self._samplers:
                self._close()

    def _wake(self, loop: asyncio.AbstractEventLoop) -> None:
        if self._handle is not None:
            self._handle.cancel()
        self._handle = loop.call_soon(self._fire)

    def _close(self) -> None:
        if self._handle is not None:
            self._handle.cancel()
            self._handle = None
        if self._alarm is not None:
            self._alarm.close()
            self._alarm = None
        self._alarm_tried = False

    def _limit(self, now: int) -> int:
        """The latest instant that may be read now: now, or the ceiling where one holds it back (given up
        `hold_max_ns` after it last moved: a feed that stopped must not stop the samplers)."""
        ceiling = self.ceiling_ns
        if ceiling is None or ceiling >= now:
            return now
        if now - self._ceiling_moved_ns > self.hold_max_ns:
            self.ceiling_ns = None
            self.ceilings_given_up += 1
            return now
        return ceiling

    def _fire(self) -> None:
        self._handle = None
        now = now_ns()
        limit = self._limit(now)
        deadline = slice_deadline()
        while True:
            live = [s for s in self._samplers if not s.finished.done()]
            if not live:
                return
            sampler = min(live, key=lambda s: s.next_t)  # ties: the first started goes first
            t = sampler.next_t
            if t > limit:
                if t <= now:  # due, but the model is not known complete that far: wait for the ceiling
                    if self._hold_since is None:
                        self._hold_since = now
                    self._held_through_ns = max(self._held_through_ns, now)
                    # raise_ceiling wakes it; this timer only gives a stopped feed up (`_limit`)
                    self._arm(self._ceiling_moved_ns + self.hold_max_ns + 1)
                    return
                break
            if self._hold_since is not None:  # the ceiling moved on: what waited is read now, at its instants
                self.holds += 1  # (one still waiting when the samplers stop, at a run's end, is not counted)
                self.held_longest_ns = max(self.held_longest_ns, now - self._hold_since)
                self._held_through_ns = max(self._held_through_ns, now)
                self._hold_since = None
            behind = now - t
            if behind > self.catch_up_ns and t > self._held_through_ns:  # too far behind: skip to now
                if sampler.count is not None:
                    sampler.count.stalled(behind, behind // sampler.period_ns, None)
                sampler.next_t = t + (behind // sampler.period_ns) * sampler.period_ns
                continue
            late = behind - self.wake_ns  # later than the schedule meant to read it
            if late > sampler.period_ns // 4:
                sampler_behind(now + 2 * sampler.period_ns)
                if late >= sampler.period_ns and sampler.count is not None:
                    sampler.count.caught_up += 1
            try:
                keep = sampler.on_tick(t)
            except Exception as e:  # handed to the sampler's task, which raises it
                sampler.finished.set_exception(e)
                continue
            if keep is False:
                sampler.finished.set_result(None)
                continue
            sampler.next_t = t + sampler.period_ns
            if now_ns() >= deadline:  # a long catch-up: the rest after what else is ready
                self._handle = asyncio.get_running_loop().call_soon(self._fire)
                return
        self._arm(sampler.next_t + self.wake_ns)

    def _arm(self, t_ns: int) -> None:
        if not self._alarm_tried:
            self._alarm_tried = True
            self._alarm = _alarm(self._fire)
        if self._alarm is not None:
            self._alarm.arm(t_ns)
        else:  # no timerfd: the loop's own timers (whole milliseconds)
            self._handle = asyncio.get_running_loop().call_at(t_ns / 1e9, self._fire)


async def run_ticks(
    period_ns: int,
    on_tick: Callable[[int], bool | None],
    max_lag_ns: int | None = None,
    count: TickCount | None = None,
) -> None:
    """Call `on_tick(t)` on the same absolute schedule as `ticks()` until it returns False (or the caller
    is cancelled); its exceptions are raised here.

    For samplers whose tick is synchronous (a vectorized read, reports deferred through `report()`): the
    tick runs in the timerfd's reader callback, in the loop turn that sees the timer expire, instead of
    one turn later when a task awaiting the alarm would be woken. In a burst (a 512-port reconfiguration)
    a loop turn holds a slice of every busy source, so that turn is most of a tick's lateness. Catching up
    after a short stall runs the next tick right after what else is ready, as `ticks()` does.

    With `count`, each tick also reads the loop thread's schedstat (one pread), so that a stall can say
    whose it was: `TickCount.stalled`."""
    max_lag = max_lag_ns if max_lag_ns is not None else max(2 * period_ns, 2_000_000)
    behind_ns = period_ns // 4
    loop = asyncio.get_running_loop()
    finished: asyncio.Future[None] = loop.create_future()
    next_t = now_ns()
    soon: asyncio.Handle | None = None
    sched = ThreadSchedstat() if count is not None else None
    # Read raw every tick, parsed only across a stall (the only place the numbers are used)
    read_sched = sched.read_raw if sched is not None and sched.available else None
    last_t, last_sched = next_t, read_sched() if read_sched is not None else None

    def fire() -> None:
        nonlocal next_t, soon, last_t, last_sched
        soon = None
        if finished.done():
            return
        t = now_ns()
        if t < next_t:  # a timer runs a hair early on some kernels: wait for the instant itself
            arm(next_t)
            return
        prev_t, prev_sched = last_t, last_sched
        last_t, last_sched = t, read_sched() if read_sched is not None else None
        if t - next_t > behind_ns:  # late: burst work yields sooner until this schedule has caught up
            sampler_behind(t + 2 * period_ns)
        try:
            keep = on_tick(t)
        except Exception as e:  # handed to the awaiting task, which raises it
            finished.set_exception(e)
            return
        if keep is False:
            finished.set_result(None)
            return
        next_t += period_ns
        if t - next_t > max_lag:  # stalled: skip what was missed
            if count is not None:
                gap = t - prev_t
                cause = None
                before, after = parse_schedstat(prev_sched), parse_schedstat(last_sched)
                if before is not None and after is not None:
                    cause = stall_cause(gap, after[0] - before[0], after[1] - before[1])
                count.stalled(gap, (t - next_t) // period_ns + 1, cause)
            next_t = t + period_ns
        if next_t <= now_ns():
            soon = loop.call_soon(fire)  # catching up: the loop runs in between
        else:
            arm(next_t)

    alarm = _alarm(fire)
    if alarm is None:  # no timerfd: the loop's own timers (whole milliseconds)

        def arm(t_ns: int) -> None:
            nonlocal soon
            soon = loop.call_at(t_ns / 1e9, fire)

    else:
        arm = alarm.arm
    try:
        soon = loop.call_soon(fire)
        await finished
    finally:
        if soon is not None:
            soon.cancel()
        if alarm is not None:
            alarm.close()
        if sched is not None:
            sched.close()
        if not finished.done():
            finished.cancel()


def _alarm(on_fire: Callable[[], None] | None = None) -> Alarm | None:
    """A timerfd alarm where the platform has one (Linux); elsewhere ticks fall back to asyncio's sleep."""
    try:
        return Alarm(on_fire)
    except (OSError, AttributeError):
        return None


class ReportGate:
    """Decides which samples become events: every change the caller reports, and a heartbeat while steady."""

    def __init__(self, interval_ns: int) -> None:
        self.interval_ns = interval_ns
        self._last_t: dict[str, int] = {}

    def due(self, key: str, changed: bool, t_ns: int, interval_ns: int | None = None) -> bool:
        last = self._last_t.get(key)
        interval = self.interval_ns if interval_ns is None else interval_ns
        if changed or last is None or t_ns - last >= interval:
            self._last_t[key] = t_ns
            return True
        return False

    def forget(self, keys: Iterable[str]) -> None:
        for key in keys:
            self._last_t.pop(key, None)


HEARTBEAT_SPREAD = 0.25


def staggered_heartbeats(interval_ns: int, n: int) -> np.ndarray:
    """Per-signal heartbeat intervals from `interval_ns` to 25% longer, spread evenly over n signals.

    Signals reported together (every port right after a reconfiguration) would otherwise keep beating
    together: 512 ports × 2 probes in one tick every 100 ms is a 3 ms stall of the loop, ten times a
    second. Never shorter than asked: `report_interval_ms` stays "at most this often"."""
    return np.rint(interval_ns * (1 + HEARTBEAT_SPREAD * np.arange(n) / max(n, 1))).astype(np.int64)
