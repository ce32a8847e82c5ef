"""How late the event loop runs: the bound on how late any mark observed on it can be.

Every sampled mark (a switch acknowledgement, an Rx-power sample, a pong) is stamped when our code gets to
run, so a stalled loop (a busy 2-core machine, a slow synchronous call) delays it by the stall. The monitor
sleeps one period at a time and records how late each wake-up was; the controller reports the worst lag of
every reconfiguration window (`loop.lag` events) and the run's distribution (run.json `loop_lag_ns`), so a
reader can tell a slow phase from a slow loop. The monitor wakes on a timerfd (as the samplers do), not an
asyncio timer, whose epoll timeout rounds up to whole milliseconds: what it reads is the loop's own lag.

Work that comes in bursts (a reconfiguration of hundreds of ports: thousands of transitions and events)
runs in time slices of `SLICE_NS` and lets whatever is ready in between (`slice_deadline`): a 1 kHz
sampler's tick waits for at most the slices that are ready before it, not for the whole burst.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
from array import array
from collections.abc import Iterator
from types import TracebackType
from typing import Self

from labctl.core.clock import now_ns
from labctl.linux.timerfd import Alarm

MAX_KEPT = 1 << 20  # ~17 min of lags at 1 kHz; later ones only feed max and count

SLICE_NS = 100_000
"""How long one piece of a burst holds the loop. A sampler's tick catches up when at most 2 ms late, and a
loop turn may hold a slice from each of the controller's pump, the model timeline, the fabric's link
reactions and the traffic model, and a slice overshoots by the item that crossed its deadline. At 250 µs
a 512-port reconfiguration's loop turns still added up past 2 ms (~1% of ticks skipped); at 100 µs they
do not, for a few more loop turns per burst."""


BEHIND_SLICE_NS = 20_000
"""The slice while a sampler is behind its schedule: a piece or two of each burst, then the loop back."""

LATE_NS = 5_000_000
LATE_SLICE_NS = 400_000
"""The slice of work that is itself this late (`slice_deadline(late_ns)`): a behaviour model's timeline whose
transitions are due LATE_NS ago or more. A loop turn holds a slice of every burst at once (the event pumps,
the probes' reports, the model), so a model given the same slice as each of them fell tens of ms behind in
a 512-port link-up burst. Its transitions keep their model time, but what waits on them is late by as much:
the agents' mirrors (0046) hear of each transport change that much closer to, or past, their lag. Events
that wait longer to be recorded keep the stamp of their observation, so the model goes first; a sampler
behind its schedule still gets the loop back sooner."""

_behind_until_ns = 0


def sampler_behind(until_ns: int) -> None:
    """A sampler's tick ran late: until `until_ns`, burst work yields after `BEHIND_SLICE_NS`, so loop turns
    stay shorter than a tick period and the sampler catches up instead of falling further behind (a burst
    of events drains a little later; every event keeps the stamp of its observation)."""
    global _behind_until_ns
    _behind_until_ns = max(_behind_until_ns, until_ns)


def slice_deadline(late_ns: int = 0) -> int:
    """When a slice of burst work begun now must give the loop back (compare `now_ns()` against it);
    `late_ns`: how late the work itself is (`LATE_SLICE_NS`)."""
    now = now_ns()
    if now < _behind_until_ns:
        return now + BEHIND_SLICE_NS
    return now + (LATE_SLICE_NS if late_ns >= LATE_NS else SLICE_NS)


class LoopLagMonitor:
    """Wakes every `period_ns` on a timerfd and records how late the wake-up ran, measured where a task
    woken by the timer would run: after the timer's reader callback, at the end of that loop turn's ready
    callbacks (a `call_soon` from the reader callback; the same place as a task's step, without a future
    and a coroutine to resume a thousand times a second)."""

    def __init__(self, period_ns: int = 1_000_000) -> None:
        self.period_ns = period_ns
        self.lags_ns = array("q")
        self.count = 0
        self.max_ns = 0
        self.window_max_ns = 0
        self._alarm: Alarm | None = None
        self._handle: asyncio.Handle | None = None
        self._due_ns = 0

    async def __aenter__(self) -> Self:
        self._alarm = Alarm(self._fired)
        self._due_ns = now_ns() + self.period_ns
        self._alarm.arm(self._due_ns)
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        if self._handle is not None:
            self._handle.cancel()
            self._handle = None
        if self._alarm is not None:
            self._alarm.close()
            self._alarm = None

    def _fired(self) -> None:
        self._handle = asyncio.get_running_loop().call_soon(self._woken)

    def _woken(self) -> None:
        self._handle = None
        if self._alarm is None:
            return
        self.record(max(now_ns() - self._due_ns, 0))
        self._due_ns = now_ns() + self.period_ns
        self._alarm.arm(self._due_ns)

    def record(self, lag_ns: int) -> None:
        self.count += 1
        if len(self.lags_ns) < MAX_KEPT:
            self.lags_ns.append(lag_ns)
        self.max_ns = max(self.max_ns, lag_ns)
        self.window_max_ns = max(self.window_max_ns, lag_ns)

    def open_window(self) -> None:
        self.window_max_ns = 0

    def stats(self) -> dict[str, int]:
        """Median, p99 (nearest rank) and max lag in ns over the run, and how many wake-ups they cover."""
        kept = sorted(self.lags_ns)
        if not kept:
            return {"n": 0}
        return {
            "n": self.count,
            "period_ns": self.period_ns,
            "median": kept[len(kept) // 2],
            "p99": kept[min(len(kept) - 1, -(-99 * len(kept) // 100) - 1)],
            "max": self.max_ns,
        }


_frozen = 0


@contextlib.contextmanager
def frozen_heap() -> Iterator[None]:
    """Keep full garbage collections from stalling the loop for tens of milliseconds.

    A generation-2 collection walks every tracked object of the process; once set-up has built a lab of
    hundreds of ports, that is a 40-60 ms stop in the middle of a reconfiguration, long after the first
    samples were due. What exists when a run starts lives as long as the run, so it is frozen (`gc.freeze`:
    never scanned again) and the collector only walks what the run itself allocates. Nestable."""
    global _frozen
    if _frozen == 0:
        gc.collect()
        gc.freeze()
    _frozen += 1
    try:
        yield
    finally:
        _frozen -= 1
        if _frozen == 0:
            gc.unfreeze()


BURST_GEN1_THRESHOLD = 200
"""Generation-0 collections between generation-1 collections while a burst is under way (CPython's
default is 10)."""


@contextlib.contextmanager
def middle_generation_deferred() -> Iterator[None]:
    """Keep generation-1 collections out of a reconfiguration's burst; collect it when the burst is over.

    While light and links change, the model timelines hold thousands of scheduled transitions (entries,
    heap tuples, bound methods) that outlive a generation-0 pass; each generation-1 collection walks them
    all: ~1 ms of loop time, every 10 generation-0 passes, landing in the burst where the samplers have the
    least slack. Inside this block it runs at most every `BURST_GEN1_THRESHOLD` passes (a bound on what
    waits uncollected); on leaving, one generation-1 collection runs at once, when the loop is quiet and a
    millisecond is absorbed by the samplers' catch-up. Nestable: the outermost block decides."""
    global _deferred, _saved_threshold
    if _deferred == 0:
        _saved_threshold = gc.get_threshold()
        t0, t1, t2 = _saved_threshold
        gc.set_threshold(t0, max(t1, BURST_GEN1_THRESHOLD), t2)
    _deferred += 1
    try:
        yield
    finally:
        _deferred -= 1
        if _deferred == 0:
            gc.set_threshold(*_saved_threshold)
            if gc.isenabled():
                gc.collect(1)


_deferred = 0
_saved_threshold: tuple[int, int, int] = gc.get_threshold()
