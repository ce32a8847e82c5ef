"""The event spine: seq, wall stamps, JSONL on disk, torn lines, bounded queues with counted drops."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from labctl.core.clock import Timebase
from labctl.core.errors import InputError
from labctl.core.events import Event, EventLog, EventQueue, read_events


def make_log(tmp_path: Path, **kwargs: int) -> EventLog:
    return EventLog(tmp_path / "events.jsonl", Timebase(mono0_ns=1_000, wall0_ns=5_000_000), **kwargs)


def test_record_assigns_seq_wall_and_reconfig(tmp_path: Path) -> None:
    log = make_log(tmp_path)
    a = log.emit(2_000, "carrier", "nic:h1/eth0", 1, host="h1")
    log.reconfig = 3
    b = log.emit(2_500, "carrier", "nic:h1/eth0", 0, host="h1")
    c = log.record(Event(t_ns=2_600, kind="rx_power", source="x", wall_ns=42, reconfig=1))
    log.close()
    assert [a.seq, b.seq, c.seq] == [0, 1, 2]
    assert a.wall_ns == 5_000_000 + 1_000  # derived from the run timebase
    assert c.wall_ns == 42  # an observer's own wall stamp is kept
    assert (a.reconfig, b.reconfig, c.reconfig) == (None, 3, 1)
    back = list(read_events(tmp_path / "events.jsonl"))
    assert back == [a, b, c]
    assert all(isinstance(e.t_ns, int) for e in back)


def test_nothing_reaches_disk_before_flush_and_everything_after(tmp_path: Path) -> None:
    log = make_log(tmp_path, batch=1000)
    for i in range(10):
        log.emit(i, "traffic.ok", "s", 10)
    path = tmp_path / "events.jsonl"
    assert path.read_bytes() == b""
    log.flush(durable=True)
    assert len(list(read_events(path))) == 10
    log.close()


def test_batch_full_writes_whole_lines(tmp_path: Path) -> None:
    log = make_log(tmp_path, batch=4)
    for i in range(9):
        log.emit(i, "traffic.ok", "s", 10)
    log._file.flush()  # type: ignore[union-attr]  # what the OS has, without our flush()
    data = (tmp_path / "events.jsonl").read_bytes()
    assert data.count(b"\n") == 8 and data.endswith(b"\n")
    log.close()


def test_torn_last_line_is_skipped_but_corruption_inside_raises(tmp_path: Path) -> None:
    log = make_log(tmp_path)
    for i in range(3):
        log.emit(i, "carrier", "s", 1)
    log.close()
    path = tmp_path / "events.jsonl"
    good = path.read_bytes()
    path.write_bytes(good + b'{"seq": 3, "t_ns": 17, "so')
    assert [e.seq for e in read_events(path)] == [0, 1, 2]
    path.write_bytes(b'{"broken\n' + good)
    with pytest.raises(InputError, match=r"events.jsonl:1: not a valid event line"):
        list(read_events(path))


def test_subscribers_see_every_record(tmp_path: Path) -> None:
    log = make_log(tmp_path)
    seen: list[int] = []
    unsubscribe = log.subscribe(lambda e: seen.append(e.seq))
    log.emit(1, "phase", "controller", "dp")
    unsubscribe()
    log.emit(2, "phase", "controller", "pp")
    log.close()
    assert seen == [0]


def test_no_light_serializes_as_null(tmp_path: Path) -> None:
    log = make_log(tmp_path)
    log.emit(1, "rx_power", "s", None, meta={"mw": 0.0})
    log.close()
    (e,) = read_events(tmp_path / "events.jsonl")
    assert e.value is None and e.meta == {"mw": 0.0}


async def test_queue_drops_oldest_and_counts() -> None:
    q = EventQueue(maxsize=3)
    for i in range(5):
        q.put(Event(t_ns=i, kind="rx_power", source="s"))
    assert q.dropped == 2
    q.close()
    got = [e.t_ns async for e in q]
    assert got == [2, 3, 4]


async def test_queue_consumer_wakes_on_put() -> None:
    q = EventQueue()
    got: list[int] = []

    async def consume() -> None:
        async for e in q:
            got.append(e.t_ns)

    task = asyncio.create_task(consume())
    await asyncio.sleep(0)
    q.put(Event(t_ns=7, kind="carrier", source="s"))
    await asyncio.sleep(0)
    q.close()
    await task
    assert got == [7]


async def test_a_consumer_takes_a_burst_a_few_at_a_time_and_waits_for_more() -> None:
    q = EventQueue(maxsize=100)
    for i in range(10):
        q.put(Event(t_ns=i, kind="x", source="s"))
    assert await q.wait()  # events queued: no wait
    assert [e.t_ns for e in q.pop(4)] == [0, 1, 2, 3]
    assert [e.t_ns for e in q.pop(100)] == list(range(4, 10))
    assert q.pop(4) == [] and len(q) == 0
    waiting = asyncio.ensure_future(q.wait())
    await asyncio.sleep(0)
    assert not waiting.done()  # nothing queued: it waits
    q.put(Event(t_ns=10, kind="x", source="s"))
    assert await waiting is True
    q.close()
    assert await q.wait()  # closed, but one is still queued
    assert [e.t_ns for e in q.pop(4)] == [10]
    assert await q.wait() is False  # closed and empty: the stream is over
