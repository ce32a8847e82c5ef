"""The ethtool link state: the reply decoder against constructed LINKSTATE_GET replies, and the probe
polling a replayed sequence of them through a reconfiguration window (decision 0023), with fake readers
that fail (netlink errors, the socket's timeout) or block (a slow firmware access)."""

from __future__ import annotations

import asyncio
import errno
import itertools
import threading
from collections.abc import Callable

import pytest

from labctl.core.events import Event
from labctl.linux.linkstate import (
    LinkState,
    LinkStateReader,
    parse_linkstate,
)
from labctl.linux.netlink import NetlinkError
from labctl.probes.linkstate import LinkStateProbe, LinkTarget
from tests.helpers.linkstate import reply


class Replay:
    """A reader that answers with recorded replies, one per poll, the last one forever after."""

    def __init__(self, replies: list[bytes]) -> None:
        self.replies = list(replies)
        self.closed = False

    def read(self) -> LinkState:
        payload = self.replies.pop(0) if len(self.replies) > 1 else self.replies[0]
        return parse_linkstate(payload)

    def close(self) -> None:
        self.closed = True


async def test_a_window_records_the_inside_of_the_firmware_phase() -> None:
    """Light back → auto-negotiation → link training → up: one event per change, each with the poll before."""
    replay = Replay(
        [reply(1)]  # the initial read, before the reconfiguration
        + [reply(0, (0, 1))] * 3  # autoneg, no partner yet
        + [reply(0, (0, 2))] * 2  # autoneg, ack not received
        + [reply(0, (1, 1))] * 4  # link training
        + [reply(1, down_count=1)]  # up
    )
    target = LinkTarget("nic:h1/ens1f0np0", "h1", "ens1f0np0")
    probe = LinkStateProbe([target], hz=1000, open_reader=lambda t: replay)
    seen: list[Event] = []
    async with probe:
        reader = asyncio.create_task(_collect(probe, seen))
        await asyncio.sleep(0.05)
        assert [e.value for e in seen] == ["up"], "outside a window only the first reading"
        probe.open_window(["nic:h1/ens1f0np0"])
        for _ in range(200):
            if seen[-1].value == "up" and len(seen) > 1:
                break
            await asyncio.sleep(0.01)
        probe.close_window()
    await reader
    assert replay.closed
    assert [e.value for e in seen] == [
        "up",
        "autoneg/no_partner_detected",
        "autoneg/ack_not_received",
        "link_training_failure/kr_frame_lock_not_acquired",
        "up",
    ]
    assert all(e.kind == "link.state" and e.source == "nic:h1/ens1f0np0" for e in seen)
    assert [e.meta.get("ext_state") for e in seen] == [None, 0, 0, 1, None]
    assert seen[-1].meta["down_count"] == 1
    for before, after in itertools.pairwise(seen):
        assert before.t_ns <= after.meta["after_ns"] < after.t_ns  # the change fell between two polls
    assert probe.polls >= 11


class Script:
    """A reader that plays a script, one entry per read: a reply, or an exception to raise (the last entry
    forever after). Records the thread of each read and whether it was closed mid-read."""

    def __init__(self, script: list[bytes | BaseException], *, gate: threading.Event | None = None) -> None:
        self.script = list(script)
        self.gate = gate  # when set up, every read after the first waits for it (a slow firmware access)
        self.reads = 0
        self.threads: set[int] = set()
        self.entered = threading.Event()
        self.reading = False
        self.closed = False
        self.closed_mid_read = False

    def read(self) -> LinkState:
        self.threads.add(threading.get_ident())
        self.reads += 1
        self.reading = True
        try:
            if self.gate is not None and self.reads > 1:
                self.entered.set()
                if not self.gate.wait(5):
                    raise AssertionError("the read was never released: it blocked the loop releasing it")
            step = self.script.pop(0) if len(self.script) > 1 else self.script[0]
            if isinstance(step, BaseException):
                raise step
            return parse_linkstate(step)
        finally:
            self.reading = False

    def close(self) -> None:
        self.closed_mid_read = self.closed_mid_read or self.reading
        self.closed = True


async def _collect(probe: LinkStateProbe, seen: list[Event]) -> None:
    async for event in probe.events():
        seen.append(event)


async def _until(condition: Callable[[], bool], within_s: float = 5.0) -> None:
    for _ in range(round(within_s / 0.005)):
        if condition():
            return
        await asyncio.sleep(0.005)
    raise AssertionError(f"not within {within_s} s")


def _probe_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name.startswith("link-state")]


async def test_a_read_that_times_out_is_counted_per_port_and_polling_goes_on() -> None:
    """The netlink socket's 1 s timeout raises TimeoutError, not NetlinkError: it must be a read error of
    that port like any other, not the end of the probe. Errors are counted per port, and each port's first
    error (and each change of reason) is reported, not only the first error of the whole probe."""
    timeout = TimeoutError("timed out")
    eio = NetlinkError(errno.EIO, "firmware access failed")
    a = Script([reply(1), timeout, timeout, reply(0, (0, 1)), reply(0, (0, 1)), reply(1)])
    b = Script([reply(1), eio, timeout, reply(0)])
    readers = {"nic:h1/a": a, "nic:h1/b": b}
    targets = [LinkTarget(source, "h1", source[-1]) for source in readers]
    probe = LinkStateProbe(targets, hz=1000, open_reader=lambda t: readers[t.source])
    seen: list[Event] = []
    async with probe:
        pumping = asyncio.create_task(_collect(probe, seen))
        await _until(lambda: len(seen) == 2)
        probe.open_window()
        await _until(lambda: [e.value for e in seen if e.source == "nic:h1/a"][-1:] == ["up"] and a.reads > 2)
        await _until(lambda: any(e.value == "down" for e in seen if e.source == "nic:h1/b"))
        probe.close_window()
        assert probe._task is not None and not probe._task.done(), "a timed-out read ended the probe"
    await pumping
    changes = {s: [e.value for e in seen if e.source == s and e.kind == "link.state"] for s in readers}
    assert changes == {"nic:h1/a": ["up", "autoneg/no_partner_detected", "up"], "nic:h1/b": ["up", "down"]}
    errors = [(e.source, e.meta["read_errors"], str(e.value)) for e in seen if e.kind == "sampler.error"]
    assert [(s, n) for s, n, _ in errors] == [("nic:h1/a", 1), ("nic:h1/b", 1), ("nic:h1/b", 2)], errors
    assert "timed out" in errors[0][2] and "firmware access failed" in errors[1][2]
    assert probe.read_errors_by_port == {"nic:h1/a": 2, "nic:h1/b": 2}
    assert probe.read_errors == 4 and probe.stats()["ports_with_read_errors"] == 2


async def test_reads_run_off_the_event_loop_and_end_before_their_socket_closes() -> None:
    """On mlx5 each read is a firmware access, next to the 1 kHz traffic probe on the same loop: reads run
    in the probe's own thread. Here a read waits until the loop releases it, which it could not if the read
    held the loop. Leaving the probe mid-read waits for that read before closing the reader, and leaves no
    thread behind."""
    gate = threading.Event()
    slow = Script([reply(1), reply(0)], gate=gate)
    probe = LinkStateProbe([LinkTarget("nic:h1/s", "h1", "s")], hz=1000, open_reader=lambda t: slow)
    async with probe:
        await _until(lambda: slow.reads == 1)
        probe.open_window()
        await _until(slow.entered.is_set)  # a read in flight, waiting for the loop to let it finish
        gate.set()
        await _until(lambda: slow.reads >= 3)
        gate.clear()
        slow.entered.clear()
        await _until(slow.entered.is_set)  # leave while the next read is in flight...
        asyncio.get_running_loop().call_later(0.05, gate.set)  # ...which ends a little later
    assert threading.get_ident() not in slow.threads and len(slow.threads) == 1
    assert slow.closed and not slow.closed_mid_read
    for thread in _probe_threads():
        thread.join(5)
    assert not _probe_threads()


def test_the_readers_socket_timeout_is_a_netlink_error_naming_the_interface() -> None:
    """What the probe and any other caller catch: the socket's TimeoutError comes out as a NetlinkError."""
    try:
        reader = LinkStateReader("lo")  # the request itself goes unsent: the reply is what times out
    except NetlinkError as e:
        pytest.skip(f"no ethtool generic netlink family here: {e}")

    def no_reply(msg: bytearray) -> memoryview:
        raise TimeoutError("timed out")

    reader.nl.request = no_reply  # type: ignore[method-assign]
    try:
        with pytest.raises(NetlinkError, match=r"no reply about lo within 1 s") as info:
            reader.read()
        assert info.value.errno == errno.ETIMEDOUT
    finally:
        reader.close()


async def test_closing_a_window_reads_its_ports_once_more() -> None:
    """The link comes up between the window's last poll and its close: one more read as the window closes
    records it in this reconfiguration, not at the start of the next window."""
    target = LinkTarget("nic:h1/a", "h1", "a")
    script = Script([reply(1), reply(0, (0, 1)), reply(1)])  # before; in the window; at the close
    probe = LinkStateProbe([target], hz=5, open_reader=lambda t: script)  # 200 ms: no second poll in time
    seen: list[Event] = []
    async with probe:
        pumping = asyncio.create_task(_collect(probe, seen))
        await _until(lambda: len(seen) == 1)
        probe.open_window()
        await _until(lambda: len(seen) == 2)
        probe.close_window()
        await _until(lambda: len(seen) == 3, within_s=1)  # at the window's next tick, which finds it closed
    await pumping
    assert [e.value for e in seen] == ["up", "autoneg/no_partner_detected", "up"]
    assert script.reads == 3
