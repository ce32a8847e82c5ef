"""The firmware's view of each port's link, polled through reconfigurations (ethtool LINKSTATE_GET).

While a reconfiguration window holds a port, the probe polls its link state at `link_state_hz` and writes
a `link.state` event on every change: value `up`, `down`, or the firmware's reason while the link is down
(`autoneg/no_partner_detected`, `link_training_failure/kr_frame_lock_not_acquired`, …; labctl.linux.
linkstate), meta `ext_state`/`ext_substate` (the uapi codes), `down_count` where the kernel reports it,
and `after_ns`: the previous poll, so the change happened between the two. Outside windows it reads each
port once at start and then stays quiet: on mlx5 every read is a firmware register access.

On a ConnectX-6 Dx (mlx5) the link bit is the netdev carrier, so this probe does not give t3 (decision
0023): it gives the inside of the firmware phase, how long the port sat in auto-negotiation, in link
training, waiting for PCS/FEC lock. A driver without `get_link_ext_state` (veth, most virtual devices)
reports only up/down.

Reads block (a netlink request answered inside the kernel; on mlx5 a firmware register access), so they run
off the event loop, which the agent shares with the 1 kHz traffic probe: one poll round (every polled port,
each stamped as its reply arrives) at a time in the probe's own thread. At most one round is in flight and
each read is bounded by its socket's timeout (1 s), so a slow NIC delays this probe's rounds, never the
loop. A read that fails (a netlink error, that timeout) is a read error of its port and polling goes on:
errors are counted per port (`read_errors_by_port`), and a `sampler.error` (meta `read_errors`: the port's
count so far) reports the first error of each streak of failed reads and every change of reason.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass
from types import TracebackType
from typing import Protocol, Self

from labctl.core.clock import now_ns
from labctl.core.errors import InputError
from labctl.core.events import Event, Kind
from labctl.linux.linkstate import LinkState, LinkStateReader
from labctl.linux.netlink import NetlinkError
from labctl.probes.base import PortSite, ProbeContext, ProbeKind
from labctl.probes.sampling import Probe, QueueProbe, ticks


@dataclass(frozen=True, slots=True)
class LinkTarget:
    source: str
    host: str
    ifname: str
    netns: str | None = None


class Reader(Protocol):
    def read(self) -> LinkState:
        """Blocking; raises OSError (NetlinkError, TimeoutError) when the state cannot be read."""
        ...

    def close(self) -> None: ...


# One port's outcome in a poll round: its source, the state read (or why not), when the reply arrived.
Reading = tuple[str, LinkState | OSError, int]


def _open(target: LinkTarget) -> Reader:
    return LinkStateReader(target.ifname, target.netns)


class LinkStateProbe(QueueProbe):
    name = "link-state"
    counters = ("polls", "read_errors")

    def __init__(
        self,
        targets: Sequence[LinkTarget],
        *,
        hz: float = 100.0,
        open_reader: Callable[[LinkTarget], Reader] = _open,
    ) -> None:
        super().__init__()
        self.targets = list(targets)
        self.period_ns = round(1e9 / hz)
        self.open_reader = open_reader
        self.readers: dict[str, Reader] = {}
        self._by_source = {t.source: t for t in self.targets}
        self._last: dict[str, tuple[bool | None, int | None, int | None]] = {}
        self._last_t: dict[str, int] = {}
        self._window: frozenset[str] | None = None  # the sources a reconfiguration holds (None: no window)
        self._final_read: frozenset[str] = frozenset()  # a window just closed: read these once more
        self._wake = asyncio.Event()
        self._thread: concurrent.futures.ThreadPoolExecutor | None = None  # where reads run
        self._round: concurrent.futures.Future[list[Reading]] | None = None  # the latest poll round
        self._stopping = False  # read by the reading thread between ports: a round being left stops early
        self.polls = 0
        self.read_errors = 0
        self.read_errors_by_port: dict[str, int] = {}
        self._last_error: dict[str, str] = {}  # each port's last reported reason

    def stats(self) -> dict[str, float | int]:
        out = super().stats()
        out["ports_with_read_errors"] = len(self.read_errors_by_port)
        return out

    async def __aenter__(self) -> Self:
        self._check_startable()
        try:
            for target in self.targets:
                try:
                    self.readers[target.source] = self.open_reader(target)
                except (NetlinkError, TimeoutError) as e:  # no ethtool netlink here: say so, keep the others
                    self._error(target, f"link state not readable on {target.ifname}: {e}")
            self._thread = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="link-state")
            return await super().__aenter__()
        except BaseException:
            self._stop_reading()
            raise

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self._stopping = True
        try:
            await super().__aexit__(exc_type, exc, tb)
            in_flight = self._round
            if in_flight is not None and not in_flight.done():
                # Cancelling the task does not stop a read in its thread: let it end (within its socket's
                # timeout; the round reads no further port) rather than close the socket under it.
                with contextlib.suppress(Exception):  # its outcome no longer matters, only its end
                    await asyncio.wrap_future(in_flight)
        finally:
            self._stop_reading()

    def _stop_reading(self) -> None:
        """Close the readers once no read is in flight (in the reading thread if one still is: only when we
        were cancelled while waiting for it), and let the thread go."""
        in_flight = self._round
        if in_flight is None:
            self._close_readers()
        else:
            in_flight.add_done_callback(lambda _round: self._close_readers())  # at once if it is done
        if self._thread is not None:
            self._thread.shutdown(wait=False)

    def _close_readers(self) -> None:
        for reader in self.readers.values():
            reader.close()
        self.readers.clear()

    def _error(self, target: LinkTarget, why: str, **meta: object) -> None:
        self.queue.put(
            Event(
                t_ns=now_ns(),
                kind=Kind.SAMPLER_ERROR,
                source=target.source,
                host=target.host,
                value=why,
                meta={"probe": self.name, **meta},
            )
        )

    def open_window(self, sources: Collection[str] | None = None) -> None:
        self._window = frozenset(self._by_source if sources is None else sources)
        self._wake.set()

    def close_window(self) -> None:
        # One more read of the window's ports when it closes: a change after the last poll (the link coming
        # up in the last period) would otherwise be seen only at the next window, filed under the wrong one.
        if self._window is not None:
            self._final_read = self._window
        self._window = None
        self._wake.set()

    def _polling(self) -> list[str]:
        window = self._window
        return [] if window is None else [s for s in self.readers if s in window]

    def _read_round(self, sources: list[str]) -> list[Reading]:
        """In the reading thread: read each port once, stamping each reply as it arrives."""
        out: list[Reading] = []
        for source in sources:
            if self._stopping:
                break
            try:
                state: LinkState | OSError = self.readers[source].read()
            except OSError as e:  # NetlinkError, or the socket's timeout (TimeoutError): this port's error
                state = e
            out.append((source, state, now_ns()))
        return out

    async def _poll(self, sources: list[str]) -> None:
        assert self._thread is not None
        self._round = self._thread.submit(self._read_round, sources)
        for source, state, t in await asyncio.wrap_future(self._round):
            if isinstance(state, OSError):
                self._failed(source, state)
            else:
                self._record(source, state, t)

    def _failed(self, source: str, error: OSError) -> None:
        target = self._by_source[source]
        self.read_errors += 1
        count = self.read_errors_by_port[source] = self.read_errors_by_port.get(source, 0) + 1
        why = f"link state read failed on {target.ifname}: {_reason(error)}"
        if self._last_error.get(source) != why:  # a port's first error, or a new reason: not every poll
            self._last_error[source] = why
            self._error(target, why, at="poll", read_errors=count)

    def _record(self, source: str, state: LinkState, t: int) -> None:
        target = self._by_source[source]
        self.polls += 1
        self._last_error.pop(source, None)  # read again: the next failure is news
        key = (state.link, state.ext_state, state.ext_substate)
        previous_t = self._last_t.get(source)
        self._last_t[source] = t
        if self._last.get(source) == key:
            return
        self._last[source] = key
        meta: dict[str, object] = {"link": state.link}
        if state.ext_state is not None:
            meta.update(ext_state=state.ext_state, ext_substate=state.ext_substate)
        if state.down_count is not None:
            meta["down_count"] = state.down_count
        if previous_t is not None:
            meta["after_ns"] = previous_t
        self.queue.put(
            Event(t_ns=t, kind=Kind.LINK_STATE, source=source, host=target.host, value=state.label, meta=meta)
        )

    async def _run(self) -> None:
        if self.readers:
            await self._poll(list(self.readers))
        while True:
            if not self._polling() and not self._final_read:
                await self._wake.wait()
            self._wake.clear()
            if self._polling():
                async with contextlib.aclosing(ticks(self.period_ns)) as schedule:
                    async for _ in schedule:
                        polling = self._polling()
                        if not polling:
                            break
                        await self._poll(polling)
            final, self._final_read = self._final_read, frozenset()
            if final:
                await self._poll([s for s in self.readers if s in final])


def _reason(error: OSError) -> str:
    if isinstance(error, TimeoutError) and not isinstance(error, NetlinkError):
        return f"no reply within the socket's timeout ({error})"
    return str(error)


def _build(ctx: ProbeContext) -> Probe:
    return LinkStateProbe(
        [_target(site) for site in ctx.ports],
        hz=ctx.settings.link_state_hz,
    )


def _target(site: PortSite) -> LinkTarget:
    if not site.port.ifname:
        raise InputError(f"{site.port.label}: no interface name")
    return LinkTarget(site.port.source, site.port.host, site.port.ifname, site.netns)


PROBE = ProbeKind(
    "link-state",
    (Kind.LINK_STATE,),
    "each port's link as its driver tells ethtool, with the firmware's reason while down, polled in "
    "reconfiguration windows",
    _build,
)
