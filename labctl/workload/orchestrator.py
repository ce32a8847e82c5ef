"""Per-rail orchestrators and the per-job controller that writes `topo_id` across the rails (Opus §4).

Each rail's orchestrator keeps one sub-mapping per PP stage and, for a new topo_id, applies only the stages
whose digit (owner) changed: one write of those stages' patches, scoped to their ports, through the run's
rails (labctl.run.rails.RailWriter: the one switch-apply path, which re-targets the run's probes), whose
convergence sends only the diff. Two guarantees, from one lock per (rail, stage):

- G1: no operation runs on a topology being changed: an operation takes its stages' locks shared and waits
  while a change holds one;
- G2: no change starts while an operation is in flight on an affected sub-mapping: a change takes its
  stages' locks exclusively and waits for the operations holding them.

A change that fails (a refusal, a timeout) is retried; after `retries` more failures the job falls back to
one static giant ring through every host on every rail, records a `workload.fallback` event, and every later
write is a no-op (the job is told: each operation's record says it ran on the giant ring). The ring rewires
every stage, so it is put up holding every (rail, stage) lock exclusively, taken in the global order
operations use. Writes of one job are serialised (a write lock), each diffing against what the last left.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from labctl.core.clock import now_ns
from labctl.core.errors import HardwareError
from labctl.core.events import Event, Kind
from labctl.inventory.mapping import Mapping
from labctl.run.rails import RailWrite, RailWriter
from labctl.workload.circuits import JobCircuits, TopoState, changed_stages, topo_id

EventSink = Callable[[Event], object]


class StageLock:
    """Shared (operations) / exclusive (changes) lock of one stage's sub-mapping on one rail.

    Release is synchronous (it hands the lock to the waiters it admits by resolving their futures), so a
    release in a `finally` cannot be abandoned by a second cancellation and leave later acquires waiting
    for ever."""

    def __init__(self) -> None:
        self.readers = 0
        self.writing = False
        self._waiters: list[tuple[bool, asyncio.Future[None]]] = []  # (exclusive, granted when resolved)

    def _admissible(self, exclusive: bool) -> bool:
        return not self.writing and (not exclusive or self.readers == 0)

    def _grant(self, exclusive: bool) -> None:
        if exclusive:
            self.writing = True
        else:
            self.readers += 1

    async def _acquire(self, exclusive: bool) -> bool:
        if self._admissible(exclusive) and not self._waiters:
            self._grant(exclusive)
            return False
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        entry = (exclusive, fut)
        self._waiters.append(entry)
        try:
            await fut
        except asyncio.CancelledError:
            if entry in self._waiters:
                self._waiters.remove(entry)
            elif fut.done() and not fut.cancelled():  # granted as we were cancelled: hand it on
                self._release(exclusive)
            raise
        return True

    def _release(self, exclusive: bool) -> None:
        if exclusive:
            self.writing = False
        else:
            self.readers -= 1
        # Admit waiters in arrival order; stop at the first that must still wait, so a change queued behind
        # operations is not overtaken by operations that arrive after it.
        while self._waiters:
            wants, fut = self._waiters[0]
            if fut.done():  # cancelled while queued (its acquire removes it when it runs)
                self._waiters.pop(0)
                continue
            if not self._admissible(wants):
                break
            self._waiters.pop(0)
            self._grant(wants)
            fut.set_result(None)

    async def acquire_shared(self) -> bool:
        """True when it had to wait for a change to finish."""
        return await self._acquire(False)

    def release_shared(self) -> None:
        self._release(False)

    async def acquire_exclusive(self) -> bool:
        """True when it had to wait (for an operation in flight, or another change)."""
        return await self._acquire(True)

    def release_exclusive(self) -> None:
        self._release(True)


class NoLock(StageLock):
    """No guarantee at all: what the G1/G2 tests run against to show that they would catch a violation."""

    async def acquire_shared(self) -> bool:
        self.readers += 1
        return False

    def release_shared(self) -> None:
        self.readers -= 1

    async def acquire_exclusive(self) -> bool:
        self.writing = True
        return False

    def release_exclusive(self) -> None:
        self.writing = False


@dataclass(frozen=True, slots=True)
class Interval:
    """Who held which (rail, stage) sub-mappings from when to when (for the G1/G2 audit)."""

    what: str  # "op" or "change"
    label: str
    cells: frozenset[tuple[int, int]]
    start_ns: int
    end_ns: int


def violations(intervals: Sequence[Interval]) -> list[tuple[Interval, Interval]]:
    """Every operation and change that overlapped in time on a shared (rail, stage): empty under G1/G2."""
    ops = [i for i in intervals if i.what == "op"]
    changes = [i for i in intervals if i.what == "change"]
    return [
        (op, ch)
        for op in ops
        for ch in changes
        if op.cells & ch.cells and op.start_ns < ch.end_ns and ch.start_ns < op.end_ns
    ]


class SwitchFailed(HardwareError):
    """A rail's change failed on every try."""


@dataclass
class WriteResult:
    topo_id: str
    stages: tuple[int, ...]
    request_ns: int
    ready_ns: int
    """When every rail acknowledged (the job's ranks are released)."""
    switch_done_ns: int | None
    """The latest `ocs.complete` stamp of the change (None: nothing was sent)."""
    g2_wait_ns: int
    tries: int
    changes: list[tuple[int, Mapping, Mapping]] = field(default_factory=list)
    fallback: bool = False


class RailOrchestrator:
    """One rail: its stage sub-mappings, its locks, and the run's writer of its switch."""

    def __init__(
        self,
        rail: int,
        writer: RailWriter,
        circuits: JobCircuits,
        state: TopoState,
        *,
        locking: bool = True,
    ) -> None:
        self.rail = rail
        self.writer = writer
        self.switch = writer.switches[rail]
        self.circuits = circuits
        self.state = state
        self.locks = [StageLock() if locking else NoLock() for _ in state]

    @property
    def mapping(self) -> Mapping:
        return self.circuits.rail_mapping(self.rail, self.state)

    def change(self, target: TopoState, stages: Sequence[int]) -> RailWrite:
        """This rail's part of a write of `target`'s `stages`: their circuits within their ports."""
        mapping = frozenset(p for s in stages for p in self.circuits.sub_mapping(self.rail, s, target[s]))
        scope = {p for s in stages for p in self.circuits.stage_ports(self.rail, s)}
        return RailWrite(self.rail, mapping, scope)


class JobOrchestrator:
    """The per-job controller: topo_id writes to every rail's orchestrator, operations under G1, retries and
    the giant-ring fallback. Its `intervals` are the audit trail of who held what."""

    def __init__(
        self,
        circuits: JobCircuits,
        writer: RailWriter,
        state: TopoState,
        emit: EventSink,
        *,
        retries: int = 2,
        switch_timeout_s: float = 10.0,
        locking: bool = True,
        on_write: Callable[[int], None] | None = None,
    ) -> None:
        self.circuits = circuits
        self.on_write = on_write
        """Told the number of topo writes before each one (fault injection counts them)."""
        self.writes = 0
        self.rails = [
            RailOrchestrator(rail, writer, circuits, state, locking=locking) for rail in circuits.rails
        ]
        self.emit = emit
        self.retries = retries
        self.switch_timeout_s = switch_timeout_s
        self.fallback: dict[str, Any] | None = None
        """Set when the fallback starts: `status` in progress, up, failed or interrupted."""
        self.intervals: list[Interval] = []
        self._write_lock = asyncio.Lock()

    @property
    def state(self) -> TopoState:
        return self.rails[0].state

    @property
    def topo_id(self) -> str:
        return topo_id(self.state)

    @contextlib.asynccontextmanager
    async def operation(self, label: str, stages: Sequence[int]) -> AsyncIterator[int]:
        """Hold the op's stages shared on every rail (G1); yields how long a change made it wait (ns, 0 when
        none was in the way)."""
        t0 = now_ns()
        locks = [r.locks[s] for r in self.rails for s in sorted(stages)]
        taken: list[StageLock] = []
        blocked = False
        try:
            for lock in locks:
                blocked = await lock.acquire_shared() or blocked
                taken.append(lock)
            start = now_ns()
            yield start - t0 if blocked else 0
        finally:
            end = now_ns()
            for lock in taken:
                lock.release_shared()
            if len(taken) == len(locks):
                cells = frozenset((r.rail, s) for r in self.rails for s in stages)
                self.intervals.append(Interval("op", label, cells, start, end))

    def planned_changes(self, target: TopoState) -> list[tuple[int, Mapping, Mapping]]:
        """(rail, mapping before, after) that a write of `target` would make now, before it is sent (what
        `ready: link` subscribes for ahead of the write)."""
        stages = changed_stages(self.state, target)
        if self.fallback is not None or not stages:
            return []
        return [
            (r.rail, r.mapping, self.circuits.rail_mapping(r.rail, _with_stages(r.state, target, stages)))
            for r in self.rails
        ]

    async def write(self, target: TopoState, context: dict[str, Any] | None = None) -> WriteResult:
        """Move every rail to `target`, changing only the stages whose owner differs (G2 first).

        Writes are serialised (one job's topo_id changes one at a time): the diff and the fallback check
        are made under the write lock, against the state the previous write left, and each rail's state
        is updated only in the stages this write changed."""
        request = now_ns()
        tid = topo_id(target)
        blocked = self._write_lock.locked()
        async with self._write_lock:
            stages = changed_stages(self.state, target)
            if self.fallback is not None or not stages:
                return WriteResult(
                    tid, stages, request, now_ns(), None, 0, 0, fallback=self.fallback is not None
                )
            if self.on_write is not None:
                self.on_write(self.writes)
            self.writes += 1
            locks = [r.locks[s] for r in self.rails for s in stages]
            taken: list[StageLock] = []
            start: int | None = None
            try:
                for lock in locks:
                    blocked = await lock.acquire_exclusive() or blocked
                    taken.append(lock)
                start = now_ns()
                g2_wait = start - request if blocked else 0
                result, error = await self._write_rails(target, stages, request, g2_wait, context or {})
                if error is not None:
                    # Failed on every try: before these locks go, every later write becomes a no-op.
                    self.fallback = {
                        "at_topo_id": tid,
                        "error": error,
                        "t_ns": now_ns(),
                        "status": "in progress",
                        "giant_ring_failed": ["interrupted before the giant ring was up"],
                    }
            finally:
                if start is not None:
                    cells = frozenset((r.rail, s) for r in self.rails for s in stages)
                    self.intervals.append(Interval("change", tid, cells, start, now_ns()))
                for lock in taken:
                    lock.release_exclusive()
            if error is not None:
                # The ring rewires stages this write never locked: it takes every stage's lock itself.
                await self._fall_back(tid, error, result.changes)
                result.fallback = True
                result.ready_ns = now_ns()
            return result

    async def _write_rails(
        self, target: TopoState, stages: tuple[int, ...], request: int, g2_wait: int, context: dict[str, Any]
    ) -> tuple[WriteResult, str | None]:
        """Every rail's change, each failed one retried; the error when some rail failed every try."""
        tid = topo_id(target)
        ctx = {**context, "topo_id": tid, "stages": list(stages)}
        pending = list(self.rails)
        done_ns: list[int] = []
        changes: list[tuple[int, Mapping, Mapping]] = []
        tries = 0
        error: str | None = None
        while pending and tries <= self.retries:
            tries += 1
            # every pending rail at once, the rails of one switch as one command (decision 0054)
            results = await self.rails[0].writer.write_rails(
                [r.change(target, stages) for r in pending],
                context={**ctx, "try": tries},
                timeout_s=self.switch_timeout_s,
            )
            failed = []
            for r, res in zip(pending, results, strict=True):
                if isinstance(res, Exception):
                    if not isinstance(res, HardwareError | TimeoutError):
                        raise res
                    error = (
                        str(res)
                        or f"{r.switch.name}: apply did not finish within {self.switch_timeout_s:g} s"
                    )
                    self.emit(
                        Event(
                            t_ns=now_ns(),
                            kind=Kind.WORKLOAD_RETRY,
                            source=f"rail:{r.rail}",
                            value=error,
                            meta={**ctx, "rail": r.rail, "try": tries},
                        )
                    )
                    failed.append(r)
                    continue
                before = r.mapping
                r.state = _with_stages(r.state, target, stages)
                after = r.mapping
                changes.append((r.rail, before, after))
                if res.value.complete_ns is not None:
                    done_ns.append(res.value.complete_ns)
            pending = failed
        result = WriteResult(
            tid, stages, request, now_ns(), max(done_ns, default=None), g2_wait, tries, changes
        )
        return result, (error or "failed") if pending else None

    async def _fall_back(self, tid: str, error: str, changes: list[tuple[int, Mapping, Mapping]]) -> None:
        """Every rail onto its giant ring (full rail scope), holding every (rail, stage) lock exclusively,
        taken in the global order operations use (G2 for the whole rail); later writes are no-ops."""
        fallback = self.fallback
        assert fallback is not None
        self.emit(
            Event(
                t_ns=now_ns(),
                kind=Kind.WORKLOAD_FALLBACK,
                source="orchestrator",
                value=error,
                meta={"topo_id": tid, "phase": "start"},
            )
        )
        locks = [lock for r in self.rails for lock in r.locks]
        taken: list[StageLock] = []
        start: int | None = None
        results: list[str] = []
        finished = False
        try:
            for lock in locks:
                await lock.acquire_exclusive()
                taken.append(lock)
            start = now_ns()
            for r in self.rails:
                ring = self.circuits.giant_ring(r.rail)
                before = r.mapping
                try:
                    await r.writer.write(
                        r.rail,
                        ring,
                        scope=self.circuits.rail_scope(r.rail),
                        context={"rail": r.rail, "giant_ring": True},
                        timeout_s=self.switch_timeout_s,
                    )
                except (HardwareError, TimeoutError) as e:
                    results.append(f"rail {r.rail}: {e or 'timed out'}")
                    continue
                changes.append((r.rail, before, ring))
            finished = True
        finally:
            if start is not None:
                cells = frozenset((r.rail, s) for r in self.rails for s in range(len(r.locks)))
                self.intervals.append(Interval("change", "giant-ring", cells, start, now_ns()))
            for lock in taken:
                lock.release_exclusive()
            # Interrupted (cancelled, an unexpected error): the record says so, never "giant ring up".
            if finished:
                fallback["giant_ring_failed"] = results
                fallback["status"] = "failed" if results else "up"
            else:
                fallback["status"] = "interrupted"
                fallback["giant_ring_failed"] = [*results, "interrupted before every rail was on the ring"]
        self.emit(
            Event(
                t_ns=now_ns(),
                kind=Kind.WORKLOAD_FALLBACK,
                source="orchestrator",
                value="giant ring up" if not results else "; ".join(results),
                meta={"topo_id": tid, "phase": "done", "failed": results},
            )
        )
        if results:  # nothing left to fall back to: the job cannot go on
            raise SwitchFailed(f"giant-ring fallback failed after {error}: {'; '.join(results)}")


def _with_stages(state: TopoState, target: TopoState, stages: Sequence[int]) -> TopoState:
    """`state` with `target`'s owners in `stages` only."""
    return tuple(target[s] if s in stages else owner for s, owner in enumerate(state))
