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
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass
from types import TracebackType
from typing import Protocol, Self

from labctl.clock import now_ns
from labctl.errors import InputError
from labctl.events import Event, Kind
from labctl.linux.linkstate import LinkState, LinkStateReader
from labctl.linux.netlink import NetlinkError
from labctl.probes import PortSite, ProbeContext, ProbeKind
from labctl.sampling import Probe, QueueProbe, ticks


@dataclass(frozen=True, slots=True)
class LinkTarget:
    source: str
    host: str
    ifname: str
    netns: str | None = None


class Reader(Protocol):
    def read(self) -> LinkState: ...

    def close(self) -> None: ...


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
        self._wake = asyncio.Event()
        self.polls = 0
        self.read_errors = 0

    async def __aenter__(self) -> Self:
        self._check_startable()
        try:
            for target in self.targets:
                try:
                    self.readers[target.source] = self.open_reader(target)
                except NetlinkError as e:  # no ethtool netlink here: say so, keep the other ports
                    self._error(target, f"link state not readable on {target.ifname}: {e}")
        except BaseException:
            self._close_readers()
            raise
        return await super().__aenter__()

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        try:
            await super().__aexit__(exc_type, exc, tb)
        finally:
            self._close_readers()

    def _close_readers(self) -> None:
        for reader in self.readers.values():
            reader.close()
        self.readers.clear()

    def _error(self, target: LinkTarget, why: str) -> None:
        self.queue.put(
            Event(t_ns=now_ns(), kind=Kind.SAMPLER_ERROR, source=target.source, host=target.host, value=why)
        )

    def open_window(self, sources: Collection[str] | None = None) -> None:
        self._window = frozenset(self._by_source if sources is None else sources)
        self._wake.set()

    def close_window(self) -> None:
        self._window = None

    def _polling(self) -> list[str]:
        window = self._window
        return [] if window is None else [s for s in self.readers if s in window]

    def _poll(self, source: str) -> None:
        target, reader = self._by_source[source], self.readers[source]
        try:
            state = reader.read()
        except NetlinkError as e:
            self.read_errors += 1
            if self.read_errors == 1:
                self._error(target, f"link state read failed on {target.ifname}: {e}")
            return
        t = now_ns()
        self.polls += 1
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
        for source in list(self.readers):
            self._poll(source)
        while True:
            if not self._polling():
                await self._wake.wait()
            self._wake.clear()
            async with contextlib.aclosing(ticks(self.period_ns)) as schedule:
                async for _ in schedule:
                    polling = self._polling()
                    if not polling:
                        break
                    for source in polling:
                        self._poll(source)


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
