"""Carrier probe: a raw rtnetlink link subscriber per network namespace, plus a poll in reconfigurations.

Facts that shape it (../shared/reference/probes.md §2):
- There are no kernel timestamps on rtnetlink; each datagram is stamped with `monotonic_ns()` right after
  `recv()`, before anything is parsed, and only ifindex, flags, IFLA_CARRIER, IFLA_OPERSTATE and the carrier
  up/down counters are decoded (pyroute2's full parse costs ~0.2 ms a message and stacks up in bursts).
- linkwatch defers carrier-*down* notifications on non-urgent devices (physical NICs; veths whose ifindex
  equals their peer's) by up to 1 s and coalesces short flaps away. The kernel's carrier bit and counters
  are updated synchronously, and RTM_GETLINK both reads them and flushes the pending notification, so
  while a reconfiguration window is open the probe polls every watched device that it believes is up with
  RTM_GETLINK at `poll_hz` (default 2 kHz, on a timerfd). Carrier-up is urgent, so down devices are not
  polled.
- The up/down counters reveal flaps that no message showed: an event whose counters moved by more than the
  transition it carries gets `meta.flaps`; if the state is unchanged it is still emitted, marked
  `meta.coalesced`.
Poll replies carry `meta.via = "poll"` and `meta.after_ns` (the previous poll reply: the change happened
between the two).
- Each namespace's socket carries a classic-BPF filter (labctl.linux.rtnl.link_filter): the kernel queues
  only the notifications of the watched interfaces and the replies to the probe's own requests. A namespace
  that holds 128 veth ends of which 64 are watched would otherwise queue, wake the probe for and hand it
  about 2.5 notifications per toggle (the peer's admin change and its linkwatch one, then ours), of which
  one is wanted (decision 0051).
- When the socket is readable the probe first reads every queued datagram into one preallocated buffer,
  stamping each as it is read, and parses them afterwards: a backlog (a burst of 64 ports, or the probe woken
  late on a busy machine) is stamped at the pace of `recv`, about 2 µs a datagram, not of the parse.
"""

from __future__ import annotations

import asyncio
import errno
import socket
import struct
from collections.abc import Collection, Sequence
from dataclasses import dataclass, field

from labctl.core.clock import now_ns
from labctl.core.errors import InputError
from labctl.core.events import Event, Kind
from labctl.linux import netns
from labctl.linux.netlink import attach_filter, iter_messages
from labctl.linux.rtnl import (
    IFF_LOWER_UP,
    LINK_FILTER_MAX,
    OPERSTATES,
    RTM_NEWLINK,
    RTMGRP_LINK,
    dump_links_request,
    getlink_request,
    link_filter,
    open_route_socket,
    parse_link,
)
from labctl.linux.timerfd import PeriodicTimer
from labctl.probes.base import ProbeContext, ProbeKind
from labctl.probes.sampling import Probe, QueueProbe

DUMP_SEQ = 1
POLL_SEQ = 2
_IFINDEX = struct.Struct("=i")
RECV_SLOT = 65536
"""Room kept free in the receive buffer for the next datagram: a dump reply packs links into up to ~32 KiB."""
RECV_BUFFER = 4 * RECV_SLOT
"""Read before any is parsed: at least 4 datagrams of any size, ~170 notifications of ~1.5 KiB (a burst of
64 ports is 64 with the filter); a larger backlog is parsed and read again in rounds."""


@dataclass(frozen=True, slots=True)
class CarrierTarget:
    """One interface to watch: in namespace `netns` (None: the current one), reported as `source`."""

    netns: str | None
    ifname: str
    source: str
    host: str = ""


@dataclass(slots=True)
class _Watched:
    target: CarrierTarget
    ifindex: int
    poll_request: bytes
    carrier: int | None = None
    operstate: int | None = None
    up_count: int | None = None
    down_count: int | None = None
    last_poll_ns: int | None = None


@dataclass(slots=True)
class _Namespace:
    name: str | None
    sock: socket.socket
    watched: dict[int, _Watched] = field(default_factory=dict)
    buffer: bytearray = field(default_factory=lambda: bytearray(RECV_BUFFER))
    filtered: bool = False


class NetlinkCarrierProbe(QueueProbe):
    """`carrier` (0/1) and `operstate` events per watched interface, source `nic:<host>/<ifname>`."""

    name = "carrier"

    def __init__(
        self, targets: Sequence[CarrierTarget], *, poll_hz: float = 2000.0, always_poll: bool = False
    ) -> None:
        super().__init__()
        if poll_hz < 1000:
            raise ValueError("the reconfiguration poll must run at 1 kHz or more")
        self.targets = list(targets)
        self.poll_period_ns = round(1e9 / poll_hz)
        self.always_poll = always_poll
        self._spaces: list[_Namespace] = []
        self._window: set[str] | None = None
        self._window_open = always_poll
        self._timer: PeriodicTimer | None = None
        self.polls = 0
        self.poll_skips = 0
        self.overruns = 0
        self.messages = 0

    # -- reconfiguration window (called by the controller around each reconfiguration) ---------------------
    def open_window(self, sources: Collection[str] | None = None) -> None:
        """Poll the carrier of `sources` (None: every watched port) until `close_window()`."""
        self._window = set(sources) if sources is not None else None
        self._window_open = True
        self._start_timer()

    def close_window(self) -> None:
        if self.always_poll:
            return
        self._window_open = False
        self._window = None
        if self._timer is not None:
            self._timer.close()
            self._timer = None

    def _start_timer(self) -> None:
        if self._timer is None and self._spaces and self._window_open:
            self._timer = PeriodicTimer(self.poll_period_ns, self._poll)

    # -- lifecycle -----------------------------------------------------------------------------------------
    def _open(self) -> None:
        by_ns: dict[str | None, list[CarrierTarget]] = {}
        for target in self.targets:
            by_ns.setdefault(target.netns, []).append(target)
        for name, targets in by_ns.items():
            with netns.entered(name):
                # Subscribe before resolving and dumping, so no change falls between dump and events.
                sock = open_route_socket(RTMGRP_LINK, blocking=False)
                space = _Namespace(name, sock)
                self._spaces.append(space)
                for target in targets:
                    try:
                        index = socket.if_nametoindex(target.ifname)
                    except OSError:
                        where = f"namespace {name}" if name else "this namespace"
                        # Named on input (CLI or inventory): bad input, as for the DOM probe.
                        raise InputError(
                            f"carrier probe: no interface {target.ifname!r} in {where}"
                        ) from None
                    space.watched[index] = _Watched(target, index, getlink_request(index, POLL_SEQ))
                self._filter(space)

    def _filter(self, space: _Namespace) -> None:
        """Let the kernel drop what this socket does not need. Messages queued before the filter is attached
        are still read, and the receive path checks the ifindex itself: the filter only saves work."""
        if len(space.watched) > LINK_FILTER_MAX:
            return
        portid = space.sock.getsockname()[0]
        try:
            attach_filter(space.sock, link_filter(portid, space.watched))
        except OSError:  # a kernel that refuses it: every notification is read, as without the filter
            return
        space.filtered = True

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        try:
            self._open()
            for space in self._spaces:
                loop.add_reader(space.sock.fileno(), self._readable, space)
                space.sock.send(dump_links_request(DUMP_SEQ))
            self._start_timer()
            await asyncio.Event().wait()
        finally:
            if self._timer is not None:
                self._timer.close()
                self._timer = None
            for space in self._spaces:
                loop.remove_reader(space.sock.fileno())
                space.sock.close()
            self._spaces.clear()

    # -- receive -------------------------------------------------------------------------------------------
    def _readable(self, space: _Namespace) -> None:
        sock, buffer = space.sock, space.buffer
        view = memoryview(buffer)
        last = len(buffer) - RECV_SLOT
        received: list[tuple[int, int, int]] = []  # (t_ns, start, end) of each datagram read into `buffer`
        drained = False
        while not drained:
            # Read everything queued, stamping each datagram on receipt, and parse once the queue is empty
            # (or the buffer full): a backlog is stamped at the pace of recv, not of the parse.
            at = 0
            received.clear()
            while at <= last:
                try:
                    size = sock.recv_into(view[at:], RECV_SLOT)
                except BlockingIOError:
                    drained = True
                    break
                except OSError as e:
                    if e.errno != errno.ENOBUFS:
                        raise
                    # The socket overflowed and notifications were lost: re-read every watched device.
                    self.overruns += 1
                    self._send(space, b"".join(w.poll_request for w in space.watched.values()))
                    continue
                received.append((now_ns(), at, at + size))  # stamped on receipt, before any parsing
                at += size
            for t, start, end in received:
                self._parse(space, buffer, start, end, t)

    def _parse(self, space: _Namespace, data: bytearray, start: int, end: int, t: int) -> None:
        watched = space.watched
        for kind, _flags, seq, begin, stop in iter_messages(data, start, end):
            if kind != RTM_NEWLINK:
                continue
            w = watched.get(_IFINDEX.unpack_from(data, begin + 4)[0])
            if w is None:
                continue
            self.messages += 1
            via = "event" if seq == 0 else "dump" if seq == DUMP_SEQ else "poll"
            self._update(w, data, begin, stop, t, via)

    def _update(self, w: _Watched, data: bytes | bytearray, start: int, end: int, t: int, via: str) -> None:
        st = parse_link(data, start, end)
        carrier = st.carrier if st.carrier is not None else int(bool(st.flags & IFF_LOWER_UP))
        flaps = 0
        if w.up_count is not None and st.up_count is not None and st.down_count is not None:
            moved = (st.up_count - w.up_count) + (st.down_count - (w.down_count or 0))
            seen = 1 if (w.carrier is not None and carrier != w.carrier) else 0
            flaps = max(0, moved - seen) // 2
        if st.up_count is not None:
            w.up_count, w.down_count = st.up_count, st.down_count
        target = w.target
        if w.carrier is None or carrier != w.carrier or flaps:
            meta: dict[str, object] = {
                "ifindex": w.ifindex,
                "via": via,
                "up_count": st.up_count,
                "down_count": st.down_count,
            }
            if w.carrier is None:
                meta["initial"] = True
            if flaps:
                meta["flaps"] = flaps
                if carrier == w.carrier:
                    meta["coalesced"] = True
            if via == "poll" and w.last_poll_ns is not None:
                meta["after_ns"] = w.last_poll_ns
            self.queue.put(
                Event(
                    t_ns=t,
                    kind=Kind.CARRIER,
                    source=target.source,
                    host=target.host,
                    value=carrier,
                    meta=meta,
                )
            )
            w.carrier = carrier
        if st.operstate is not None and st.operstate != w.operstate:
            name = OPERSTATES[st.operstate] if st.operstate < len(OPERSTATES) else str(st.operstate)
            self.queue.put(
                Event(
                    t_ns=t,
                    kind=Kind.OPERSTATE,
                    source=target.source,
                    host=target.host,
                    value=name,
                    meta={"ifindex": w.ifindex, "via": via},
                )
            )
            w.operstate = st.operstate
        if via == "poll":
            w.last_poll_ns = t

    # -- poll ----------------------------------------------------------------------------------------------
    def _poll(self, _expirations: int) -> None:
        window = self._window
        for space in self._spaces:
            batch = b"".join(
                w.poll_request
                for w in space.watched.values()
                if w.carrier != 0 and (window is None or w.target.source in window)
            )
            if batch:
                self.polls += 1
                self._send(space, batch)

    def _send(self, space: _Namespace, batch: bytes) -> None:
        try:
            space.sock.send(batch)
        except (BlockingIOError, OSError):
            self.poll_skips += 1


def _build(ctx: ProbeContext) -> Probe:
    return NetlinkCarrierProbe(
        [CarrierTarget(site.netns, site.port.ifname, site.port.source, site.port.host) for site in ctx.ports]
    )


PROBE = ProbeKind(
    "carrier",
    (Kind.CARRIER, Kind.OPERSTATE),
    "Linux carrier and operstate of each port's interface (rtnetlink, with a poll in reconfigurations)",
    _build,
)
