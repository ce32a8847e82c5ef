"""Model transitions at their model times, delivered through the event loop by one timer per model.

A reconfiguration of a 512-port switch schedules ~2,500 transitions (light lost and back per egress, then
firmware, carrier and transport per NIC port). One asyncio timer each costs a TimerHandle, a heap push on
the loop and a callback dispatch: milliseconds of loop time in one burst, during which every sampler of the
run waits. A `Timeline` keeps its own heap and holds a single loop timer for its earliest entry; when it
fires, the due entries run in model-time order, a time slice per loop turn (labctl.linux.looplag.SLICE_NS: a
wake-up or a sampler's tick gets in between). A reader that must see the model exactly at a time catches
it up first (`run_due`).
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
from collections.abc import Callable
from typing import Any

from labctl.core.clock import now_ns
from labctl.linux.looplag import slice_deadline


class Scheduled:
    """One entry of a timeline; `cancel()` keeps it from running."""

    __slots__ = ("args", "callback", "cancelled", "t_ns")

    def __init__(self, t_ns: int, callback: Callable[..., None], args: tuple[Any, ...]) -> None:
        self.t_ns = t_ns
        self.callback = callback
        self.args = args
        self.cancelled = False

    def cancel(self) -> None:
        self.cancelled = True


class Timeline:
    """`pull=True`: no loop timer; entries run only when a reader catches the timeline up (`run_due`), so
    the model stands at the time its readers last read it (an agent's mirror, decision 0046)."""

    def __init__(self, *, pull: bool = False) -> None:
        self.pull = pull
        self._heap: list[tuple[int, int, Scheduled]] = []
        self._seq = itertools.count()
        self._timer: asyncio.TimerHandle | asyncio.Handle | None = None
        self._timer_t: int | None = None
        self.horizon_ns = 0
        """The model time the timeline is being run to (an entry may apply everything of its own due by
        then: a batch of changes at their own times)."""
        self._deferred: dict[int, tuple[int, Callable[[], None]]] = {}
        self._deferred_ids = itertools.count()
        self.slice_end_ns: int | None = None
        """When the run in progress must give the loop back (its own timer's slice; None: a reader catching
        the model up, which needs everything due). An entry that works through a batch stops there too."""

    def __len__(self) -> int:
        return len(self._heap)

    def at(self, t_ns: int, callback: Callable[..., None], *args: Any) -> Scheduled:
        """Run `callback(*args)` at model time t_ns (CLOCK_MONOTONIC ns, the loop's clock)."""
        entry = Scheduled(t_ns, callback, args)
        heapq.heappush(self._heap, (t_ns, next(self._seq), entry))
        if not self.pull and (self._timer_t is None or t_ns < self._timer_t):
            self._arm(t_ns)
        return entry

    def defer(self, t_ns: int, callback: Callable[[], None]) -> int:
        """`callback` will put entries of model time t_ns on the timeline, on a loop turn of its own (a
        switch's light, a turn after its acknowledgement). Until it has, a reader catching the model up to
        t_ns or later calls it first: a reading at a time must see every change due by then, however late
        the loop runs that turn. Returns a key for `undefer`, which the callback calls when it runs."""
        key = next(self._deferred_ids)
        self._deferred[key] = (t_ns, callback)
        return key

    def undefer(self, key: int) -> None:
        self._deferred.pop(key, None)

    def _arm(self, t_ns: int) -> None:
        if self._timer is not None:
            self._timer.cancel()
        self._timer_t = t_ns
        # loop.time() is CLOCK_MONOTONIC, the run timebase, so model times map directly onto it.
        self._timer = asyncio.get_running_loop().call_at(t_ns / 1e9, self._fire)

    def _fire(self) -> None:
        armed = self._timer_t or 0
        self._timer = self._timer_t = None
        # The loop runs a timer up to its clock resolution early: whatever it was armed for is due.
        now = max(round(asyncio.get_running_loop().time() * 1e9), armed)
        late = now - self._heap[0][0] if self._heap else 0
        self.run_due(now, deadline_ns=slice_deadline(late))
        if self._timer is not None:  # armed by an entry scheduled meanwhile: re-armed below for the earliest
            self._timer.cancel()
            self._timer = self._timer_t = None
        if not self._heap:
            return
        if self._heap[0][0] <= now:  # more is due: the rest after what else is ready (a wake-up, a tick)
            self._timer_t = self._heap[0][0]
            self._timer = asyncio.get_running_loop().call_soon(self._fire)
        else:
            self._arm(self._heap[0][0])

    def run_due(self, t_ns: int, deadline_ns: int | None = None) -> None:
        """Run the entries due at or before t_ns now, in order (until the clock passes `deadline_ns`, if
        given): a reader that must see the model as it is at t_ns catches it up first."""
        if deadline_ns is None and self._deferred:  # a reader: what is due by t_ns, deferred or not
            for due_ns, callback in list(self._deferred.values()):
                if due_ns <= t_ns:
                    callback()
        heap = self._heap
        self.horizon_ns = t_ns
        outer, self.slice_end_ns = self.slice_end_ns, deadline_ns
        try:
            while heap and heap[0][0] <= t_ns:
                entry = heapq.heappop(heap)[2]
                if not entry.cancelled:
                    entry.callback(*entry.args)
                    if deadline_ns is not None and now_ns() >= deadline_ns:
                        break
        finally:
            self.slice_end_ns = outer
        while heap and heap[0][2].cancelled:
            heapq.heappop(heap)

    def earliest_ns(self) -> int | None:
        """The model time of the earliest change still to come: an entry waiting, or a deferred callback's
        (None: nothing is). Every change before it has been made."""
        due = [t for t, _ in self._deferred.values()]
        waiting = self.next_due_ns()
        if waiting is not None:
            due.append(waiting)
        return min(due, default=None)

    def next_due_ns(self) -> int | None:
        """The model time of the earliest entry still waiting (None: nothing is)."""
        heap = self._heap
        while heap and heap[0][2].cancelled:
            heapq.heappop(heap)
        return heap[0][0] if heap else None

    def cancel_all(self) -> None:
        self._deferred.clear()
        for _t, _seq, entry in self._heap:
            entry.cancel()
        self._heap.clear()
        if self._timer is not None:
            self._timer.cancel()
        self._timer = self._timer_t = None
