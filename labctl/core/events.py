"""The event spine: one record type, JSON Lines on disk, bounded queues in memory.

Every part of labctl writes `Event`s and every report reads them back from `events.jsonl`. Times are
integer nanoseconds stamped where the signal was observed; the log assigns `seq` in arrival order and
never re-stamps `t_ns`.
"""

from __future__ import annotations

import os
from collections import deque
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import IO, Any, Final

import msgspec

from labctl.core.clock import Timebase
from labctl.core.errors import InputError

__all__ = [  # the public surface (docs/architecture.md, "Public surface"); the rest is internal
    "KINDS",
    "Event",
    "EventLog",
    "EventQueue",
    "Kind",
    "Subscriber",
    "read_events",
]

Value = int | float | str | None


class Event(msgspec.Struct, kw_only=True, gc=False):
    """One observation. `t_ns` is on the run timebase (CLOCK_MONOTONIC of the controller).

    Not tracked by the cyclic garbage collector (`gc=False`): an event holds plain values and a meta dict
    of them, never itself, so it cannot be part of a cycle; a 512-port run has thousands in flight (queues,
    log batches), which the collector's passes in the middle of a reconfiguration need not walk."""

    seq: int = -1
    t_ns: int
    wall_ns: int | None = None
    host: str = ""
    source: str
    kind: str
    value: Value = None
    reconfig: int | None = None
    meta: dict[str, Any] = msgspec.field(default_factory=dict)


class Kind:
    """The event vocabulary (DESIGN.md), as named constants: producers write `Kind.CARRIER`, consumers
    compare against it. The values are plain strings (no enum lookup on the hot path, nothing new on disk).
    Extend it; never rename a value."""

    OCS_COMMAND: Final = "ocs.command"  # t0: a change sent to the switch
    OCS_COMPLETE: Final = "ocs.complete"  # t1: the switch acknowledged it
    OCS_ERROR: Final = "ocs.error"
    OCS_VOA: Final = "ocs.voa"  # a port's attenuator set (value: dB, None for none; meta: port, mode, level)
    OCS_READ: Final = "ocs.read"
    OCS_IO: Final = "ocs.io"  # one wire command of a protocol driver (value = round trip ns)
    OCS_SESSION: Final = "ocs.session"  # a driver session: connected, lost, reconnected, noise, ack
    OCS_REPORT: Final = "ocs.report"  # an autonomous message from a switch (e.g. TL1 REPT)
    RX_POWER: Final = "rx_power"  # dBm, None = no light
    RX_UPDATE: Final = "rx_power.update"  # a module's estimated DOM update interval, ns
    INSTRUMENT: Final = "instrument"  # a bench instrument as set up (value: *IDN?; meta: its settings)
    LINK_FIRMWARE: Final = "link.firmware"  # NIC firmware link state, where observable
    LINK_STATE: Final = "link.state"  # the driver's link state for ethtool: up, down, or why down
    # A port's link settings read, applied or restored (value: the setting's label; meta: stage, asked, read)
    LINK_SETTINGS: Final = "link.settings"
    CARRIER: Final = "carrier"
    OPERSTATE: Final = "operstate"
    TRAFFIC_OK: Final = "traffic.ok"  # value = RTT ns
    TRAFFIC_LOST: Final = "traffic.lost"
    RDMA_QP_STATE: Final = "rdma.qp_state"
    RDMA_WC_ERROR: Final = "rdma.wc_error"  # a work completion with an error status (value: its name)
    RDMA_RECONNECT: Final = "rdma.reconnect"  # a QP in error reset with fresh PSNs (value: ns it took)
    GPU_PINGPONG: Final = "gpu.pingpong"
    GPU_POINTER_CHASE: Final = "gpu.pointer_chase"
    GPU_TIMER: Final = "gpu.timer"
    GPU_SKIP: Final = "gpu.skip"
    GPU_ERROR: Final = "gpu.error"
    PHASE: Final = "phase"  # the controller starts a reconfiguration
    SAMPLER_DROP: Final = "sampler.drop"
    # A sampler skipped ticks after stalls of its loop, as the run goes on (value: skipped so far; meta:
    # stalls, stall_longest_ns): a live reader sees a thinned sampler at once; run.json `probes` the record
    SAMPLER_SKIP: Final = "sampler.skip"
    SAMPLER_ERROR: Final = "sampler.error"  # a sampler gave up on one source (value: why); the rest go on
    LOOP_LAG: Final = "loop.lag"
    RUN_START: Final = "run.start"
    RUN_END: Final = "run.end"
    RUN_TIMEOUT: Final = "run.timeout"
    RUN_ABORT: Final = "run.abort"
    RUN_FAULT: Final = "run.fault"  # the lab reported a fault (value: why); the run stops and restores
    AGENT_LOST: Final = "agent.lost"  # a host's agent went offline mid-run (meta: events received before)
    AGENT_GAP: Final = (
        "agent.gap"  # a host's events went missing (value: how many; meta: after_ns, before_ns)
    )
    # The controller measured a host's agent clock (value: the offset its stamps are moved by, ns; meta:
    # uncertainty_ns, rtt_min_ns, samples, via): the live page's clock state; run.json has the record
    AGENT_CLOCK: Final = "agent.clock"
    # Workload replay (labctl.workload, issue 16)
    WORKLOAD_TOPO: Final = "workload.topo_write"  # a topo_id write on every rail (value: the topo_id)
    WORKLOAD_OP: Final = "workload.op"  # a replayed collective (value: its label; meta: times, exposed)
    WORKLOAD_STEP: Final = "workload.step"  # a replayed step (value: step time ns; meta: stall, waits)
    WORKLOAD_RETRY: Final = "workload.retry"  # a rail's change failed and is tried again (value: why)
    WORKLOAD_FALLBACK: Final = "workload.fallback"  # the job fell back to the static giant ring (value: why)
    WORKLOAD_REPLAY: Final = "workload.replay"  # a replay segment starts (value: the trace; meta: mode)


KINDS = frozenset(v for k, v in vars(Kind).items() if k.isupper())

_encoder = msgspec.json.Encoder()
_decoder = msgspec.json.Decoder(Event)

Subscriber = Callable[[Event], None]

BATCH = 64
"""Events an EventLog encodes and writes at a time. The write happens in the middle of whatever recorded
the event that filled the batch (the run engine's pump, between the samplers' ticks): 256 events were
0.3-0.9 ms of encoding and writing there on a busy 2-core machine, 64 are about a quarter of that."""


class EventLog:
    """Append-only event log: assigns seq, fills wall_ns, tags the current reconfiguration, writes JSONL.

    Writes are batched in memory and pushed to the file when the batch is full, on `flush()` (the controller
    flushes at every reconfiguration boundary and periodically) and on `close()`. Whole lines only reach the
    file, so a killed process leaves a file that is readable up to the last flush.
    """

    def __init__(self, path: Path | None, timebase: Timebase, *, batch: int = BATCH) -> None:
        self.path = path
        self.timebase = timebase
        self.reconfig: int | None = None
        self._seq = 0
        self._wall_offset_ns = timebase.wall_of(0)  # wall = t + offset (Timebase.wall_of), per event
        self._batch = batch
        self._pending: list[Event] = []
        self._subscribers: list[Subscriber] = []
        self._file: IO[bytes] | None = open(path, "ab") if path is not None else None  # noqa: SIM115

    @property
    def count(self) -> int:
        return self._seq

    def subscribe(self, callback: Subscriber) -> Callable[[], None]:
        self._subscribers.append(callback)
        return lambda: self._subscribers.remove(callback)

    def record(self, event: Event) -> Event:
        event.seq = self._seq
        self._seq += 1
        if event.wall_ns is None:
            event.wall_ns = event.t_ns + self._wall_offset_ns
        if event.reconfig is None:
            event.reconfig = self.reconfig
        pending = self._pending
        pending.append(event)
        if len(pending) >= self._batch:
            self._write_pending()
        if self._subscribers:
            for callback in self._subscribers:
                callback(event)
        return event

    def emit(
        self,
        t_ns: int,
        kind: str,
        source: str,
        value: Value = None,
        *,
        host: str = "",
        meta: dict[str, Any] | None = None,
    ) -> Event:
        return self.record(
            Event(t_ns=t_ns, kind=kind, source=source, value=value, host=host, meta=meta or {})
        )

    def _write_pending(self) -> None:
        if self._file is not None and self._pending:
            self._file.write(_encoder.encode_lines(self._pending))
        self._pending.clear()

    def flush(self, *, durable: bool = False) -> None:
        """Push batched events to the file (then a killed process loses nothing); `durable` also fsyncs,
        which can block for a long time on a busy disk: inside a run use `flush_durably()`."""
        self._write_pending()
        if self._file is not None:
            self._file.flush()
            if durable:
                os.fsync(self._file.fileno())

    async def flush_durably(self) -> None:
        """flush(), then fsync in a worker thread so samplers on the event loop keep their timing (an
        fsync behind other disk traffic can take tens of ms). Used at every reconfiguration boundary."""
        import asyncio  # here, not at the top: reading or writing events needs no event loop

        self.flush()
        if self._file is not None:
            await asyncio.to_thread(os.fsync, self._file.fileno())

    def close(self) -> None:
        if self._file is not None:
            self.flush(durable=True)
            self._file.close()
            self._file = None
        self._pending.clear()

    def reopen(self) -> None:
        """Append to a closed log again, seq continuing (what happened after the run's end: its analysis
        failing). Close it again when done."""
        if self._file is None and self.path is not None:
            self._file = open(self.path, "ab")  # noqa: SIM115


def read_events(path: Path) -> Iterator[Event]:
    """Read events.jsonl; a torn last line (process killed mid-write) is skipped, anything else raises."""
    with open(path, "rb") as f:
        lines = f.read().split(b"\n")
    last = len(lines) - 1
    for i, line in enumerate(lines):
        if not line:
            continue
        try:
            yield _decoder.decode(line)
        except msgspec.DecodeError as e:
            if i == last:  # no trailing newline: the write was cut short
                return
            raise InputError(f"{path}:{i + 1}: not a valid event line ({e})") from None


def torn_tail(path: Path) -> int:
    """Bytes of an incomplete last line (the writer was killed mid-line), which readers skip; 0 if none."""
    with open(path, "rb") as f:
        f.seek(0, os.SEEK_END)
        size = f.tell()
        f.seek(max(size - (1 << 20), 0))
        tail = f.read()
    segment = tail.rsplit(b"\n", 1)[-1]
    if not segment:
        return 0
    try:
        _decoder.decode(segment)
    except msgspec.DecodeError:
        return len(segment)
    return 0


def decode_event(line: bytes) -> Event:
    return _decoder.decode(line)


def encode_event(event: Event) -> bytes:
    return _encoder.encode(event)


class EventQueue:
    """Bounded queue between a sampler and its consumer. When full, the oldest event is dropped and counted:
    a slow consumer never blocks a sampler, and a drop is never silent."""

    def __init__(self, maxsize: int = 65536) -> None:
        import asyncio

        self._items: deque[Event] = deque()
        self._maxsize = maxsize
        self._ready = asyncio.Event()
        self._closed = False
        self.dropped = 0

    @property
    def maxsize(self) -> int:
        return self._maxsize

    def put(self, event: Event) -> None:
        if self._closed:
            return
        if len(self._items) >= self._maxsize:
            self._items.popleft()
            self.dropped += 1
        self._items.append(event)
        self._ready.set()

    def close(self) -> None:
        self._closed = True
        self._ready.set()

    def __len__(self) -> int:
        return len(self._items)

    def drain(self) -> list[Event]:
        """Everything still queued, at once (a consumer's last read after the producer stopped)."""
        items = list(self._items)
        self._items.clear()
        return items

    def pop(self, n: int) -> list[Event]:
        """Up to `n` of the oldest events, oldest first (a consumer taking a burst a few at a time)."""
        items = self._items
        if len(items) <= n:
            out = list(items)
            items.clear()
            return out
        popleft = items.popleft
        return [popleft() for _ in range(n)]

    async def wait(self) -> bool:
        """Wait until an event is queued (True) or the queue is closed and empty (False)."""
        while not self._items:
            if self._closed:
                return False
            self._ready.clear()
            await self._ready.wait()
        return True

    async def __aiter__(self) -> AsyncIterator[Event]:
        while True:
            while self._items:
                yield self._items.popleft()
            if self._closed:
                return
            self._ready.clear()
            await self._ready.wait()
