"""Recovery: when every port a change moved carries traffic to its new peer again, judged in event time.

The engine subscribes a `RecoveryTracker` to the event log before it writes the rails, so nothing recorded
during the write is missed; a replay's `ready: link` write waits on the same tracker (`LinkWatch`).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from labctl.core.clock import now_ns
from labctl.core.events import Event, EventLog, Kind


class RecoveryTracker:
    """Watches the event stream for the ports of one reconfiguration until each carries traffic again.

    `expected` maps each port to the peer it must reach. A port counts as recovered at the first
    `traffic.ok` after t0 that names that peer (traffic probes put their target in `meta.peer`, and are
    re-targeted only once the switch acknowledged), so traffic still flowing on the old circuit, even after
    a spurious loss, never counts. For a probe that names no peer, the ok must follow a carrier-up or a
    traffic loss seen after t0.

    The recovery timeout is judged in event time: an ok stamped after `deadline_ns` is too late even if a
    busy loop delivers it before the timeout's timer fires, so whether a port timed out never depends on
    how late the controller itself got to run.
    """

    def __init__(
        self,
        expected: dict[str, str],
        t0_ns: int,
        on_progress: Callable[[int], None],
        deadline_ns: int | None = None,
    ) -> None:
        self.expected = dict(expected)
        self.pending = set(expected)
        self.total = len(expected)
        self.t0_ns = t0_ns
        self.deadline_ns = deadline_ns
        self._armed: set[str] = set()
        self._on_progress = on_progress
        self.done = asyncio.Event()
        if not self.pending:
            self.done.set()

    def __call__(self, e: Event) -> None:
        if e.source not in self.pending or e.t_ns < self.t0_ns:
            return
        if (e.kind == Kind.CARRIER and e.value == 1) or e.kind == Kind.TRAFFIC_LOST:
            self._armed.add(e.source)
        elif e.kind == Kind.TRAFFIC_OK:
            if self.deadline_ns is not None and e.t_ns > self.deadline_ns:
                return
            if "peer" in e.meta:
                recovered = e.meta["peer"] == self.expected[e.source]
            else:
                recovered = e.source in self._armed
            if recovered:
                self.pending.discard(e.source)
                self._on_progress(self.total - len(self.pending))
                if not self.pending:
                    self.done.set()


class LinkWatch:
    """A replay's `ready: link` for one write: a RecoveryTracker subscribed from before the write."""

    def __init__(
        self,
        tracker: RecoveryTracker,
        unsubscribe: Callable[[], None],
        deadline_ns: int,
        events: EventLog,
        timeout_s: float,
    ) -> None:
        self.tracker = tracker
        self._unsubscribe: Callable[[], None] | None = unsubscribe
        self.deadline_ns = deadline_ns
        self.events = events
        self.timeout_s = timeout_s

    async def wait(self) -> None:
        try:
            await asyncio.wait_for(self.tracker.done.wait(), max(self.deadline_ns - now_ns(), 0) / 1e9)
        except TimeoutError:
            pending = sorted(self.tracker.pending)
            self.events.emit(
                now_ns(),
                Kind.RUN_TIMEOUT,
                "controller",
                len(pending),
                meta={"pending": pending, "timeout_s": self.timeout_s},
            )

    def close(self) -> None:
        if self._unsubscribe is not None:
            self._unsubscribe()
            self._unsubscribe = None
