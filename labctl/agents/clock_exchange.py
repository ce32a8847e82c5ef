"""The controller's clock exchange: measuring each agent's clock against its own, and the record of it.

Bursts of timestamped pings, straight over UDP where the agent answers there, else through the broker
(decisions 0040, 0048); the clock daemons' bound where both hosts have one; a burst again every
`clock_sync_interval_s` while the probes run; run.json `clock_offsets` (`clock_record`).
`ClockExchange` is a part of `labctl.agents.hub.AgentHub` (a mixin: the hub's `__init__` sets the state
named below); each host's clock model is labctl.agents.clock's, the UDP pinger labctl.agents.clockping's.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from typing import TYPE_CHECKING, Any

from labctl.agents.broker import BrokerSettings
from labctl.agents.clock import ClockIdentity, OffsetEstimate, OffsetSample
from labctl.agents.clockping import ClockPinger
from labctl.agents.hub_commands import CommandChannel
from labctl.agents.hub_streams import HostLink
from labctl.agents.wire import Reply, Signer
from labctl.core.clock import now_ns
from labctl.core.errors import HardwareError
from labctl.core.events import Event, Kind

log = logging.getLogger("labctl.agents")

NAGLE_RTT_NS = 30_000_000
"""A fastest round trip through the broker this slow (on a LAN) is the signature of Nagle + delayed ACK."""
UDP_PING_TIMEOUT_S = 0.2
"""A clock ping straight to an agent not answered by then is lost (a LAN round trip is well under 1 ms)."""


def clock_record(link: HostLink, controller: ClockIdentity) -> dict[str, Any]:
    """run.json `clock_offsets.<host>`: the source that set the uncertainty, the offset removed and its
    uncertainty over the run (the source's own, plus how far the applied offsets strayed from the final
    estimate), the exchange-based estimate beside it whatever the source, and every burst."""
    model = link.clock
    fit = model.fit
    end = link.applied[-1][0] if link.applied else (fit.last_ns if fit else 0)
    source = model.source
    stray = max((abs(off - model.offset_at(t)) for t, off in link.applied), default=0)
    worst = max((model.uncertainty_at(t) for t, _ in link.applied), default=model.uncertainty_at(end))
    record: dict[str, Any] = {
        "source": source,
        "offset_ns": model.offset_at(end),
        "uncertainty_ns": worst + stray,
        "applied_stray_ns": stray,
        "shared_clock": model.shared,
    }
    if link.clock_via is not None:
        record["exchange_via"] = link.clock_via
        if link.clock_via == "udp" and link.clock_udp is not None:
            record["exchange_address"] = f"{link.clock_udp[0]}:{link.clock_udp[1]}"
    if fit is not None:
        record |= {
            # One clock has no drift against itself: the fit's slope is the exchange's noise then.
            "drift_ppb": 0.0 if model.shared else round(fit.drift_ppb, 3),
            "exchange_offset_ns": fit.at(end),
            "exchange_uncertainty_ns": fit.uncertainty_ns,
            "rtt_min_ns": fit.rtt_min_ns,
            "exchange": fit.as_dict(),
        }
    if model.daemon is not None:
        record["daemon"] = model.daemon
    if link.world_offset_ns is not None:
        record["applied_offset_ns"] = link.world_offset_ns
    if link.identity is not None:
        keys = ("boot_id", "timens_ns", "synthetic", "clock")
        record["identity"] = {k: link.identity[k] for k in keys if k in link.identity}
    record["controller_identity"] = controller.as_dict()
    record["history"] = [e.as_dict() for e in model.history]
    return record


class ClockExchange(CommandChannel):
    """Measures each agent's clock against the controller's, into the host's clock model; a ping through
    the broker is a command (`ping`), hence built on the hub's command channel."""

    broker: BrokerSettings
    identity: ClockIdentity
    _pingers: dict[str, ClockPinger]
    _nagle_warned: bool

    if TYPE_CHECKING:

        @property
        def signers(self) -> dict[str, Signer]: ...

    async def ping(self, host: str, timeout_s: float = 1.0) -> OffsetSample | None:
        sent: dict[str, int] = {}

        def stamp() -> dict[str, int]:
            sent["t1"] = now_ns()
            return {"t1": sent["t1"]}

        fut: asyncio.Future[Reply] = asyncio.get_running_loop().create_future()
        _, pending = self._send_command(
            host, "ping", {}, stamp, expires_ns=now_ns() + round(timeout_s * 1e9), future=fut
        )
        try:
            reply = await asyncio.wait_for(fut, timeout_s)
        except TimeoutError:
            return None
        t4 = pending.t4
        if not reply.ok or reply.t2 is None or reply.t3 is None or not t4:
            return None
        link = self.links[host]
        if reply.data is not None and isinstance(reply.data.get("clock"), dict):
            link.identity = reply.data["clock"]
        if reply.data is not None:
            udp = reply.data.get("clock_udp")  # [address, port] of its responder, if it has one
            if isinstance(udp, list) and len(udp) == 2 and isinstance(udp[0], str) and type(udp[1]) is int:
                link.clock_udp = (udp[0], udp[1])
            else:
                link.clock_udp = None
        return OffsetSample(sent["t1"], reply.t2, reply.t3, t4)

    async def _udp_burst(self, host: str, samples: int, *, retry: bool = True) -> list[OffsetSample]:
        """A burst straight to the agent's clock responder (decision 0048); [] where none answers."""
        link = self.links[host]
        if link.identity is None or link.clock_udp is None:
            await self.ping(host)  # one through the broker: the agent's clock identity, where it listens
        address = link.clock_udp
        if address is None:
            return []
        pinger = self._pingers.get(host)
        if pinger is None or pinger.address != address:
            if pinger is not None:
                pinger.close()
            try:
                pinger = self._pingers[host] = await ClockPinger.connect(
                    address, self.lab, host, self.signers[host], now_ns
                )
            except OSError:
                self._pingers.pop(host, None)
                return []
        got: list[OffsetSample] = []
        for i in range(samples):
            pong = await pinger.ping(UDP_PING_TIMEOUT_S)
            if pong is not None:
                got.append(OffsetSample(pong.t1, pong.t2, pong.t3, pong.t4))
                if link.identity is not None:  # the (monotonic, realtime) pair the daemon source reads
                    link.identity = {**link.identity, "mono_ns": pong.t3, "real_ns": pong.real_ns}
            elif not got and i >= 1:
                break  # nothing back twice: nobody answers there
        if got or not retry:
            return got
        # A restarted agent listens elsewhere: ask where through the broker, and try once more.
        link.clock_udp = None
        await self.ping(host)
        if link.clock_udp is not None and link.clock_udp != address:
            return await self._udp_burst(host, samples, retry=False)
        return []

    async def measure(self, host: str, samples: int | None = None) -> OffsetEstimate:
        """One burst: one ping at a time (no self-inflicted queueing); the host's clock model keeps the
        fastest round trip and refits offset and drift over every burst so far. Straight over UDP where the
        agent answers there, else through the broker."""
        link = self.links[host]
        n = samples or self.broker.clock_samples
        got: list[OffsetSample] = []
        if self.broker.clock_exchange == "udp" and not link.udp_unanswered:
            got = await self._udp_burst(host, n)
            if not got and link.online.is_set():
                link.udp_unanswered = True
                log.warning(
                    "agent %s: no answer to clock pings over UDP%s: measuring its clock through the broker "
                    "(a bound ~10x looser; open UDP from the controller to the agent, broker.clock_udp_port)",
                    host,
                    f" at {link.clock_udp[0]}:{link.clock_udp[1]}" if link.clock_udp else "",
                )
        link.clock_via = "udp" if got else "broker"
        if not got:
            for _ in range(n):
                sample = await self.ping(host)
                if sample is not None:
                    got.append(sample)
        est = link.clock.add_burst(got)
        link.offset = est
        if link.clock_via == "broker" and est.rtt_min_ns >= NAGLE_RTT_NS and not self._nagle_warned:
            # ~40 ms for a small message both ways: Nagle's algorithm in the broker meeting delayed ACKs.
            self._nagle_warned = True
            log.warning(
                "agent %s: the fastest of %d round trips through %s:%d took %.1f ms: is the broker's Nagle "
                "algorithm on (mosquitto: `set_tcp_nodelay true`), or this machine starved of CPU? Clock "
                "estimates and the world feed wait on every round trip",
                host,
                est.samples,
                self.broker.hostname,
                self.broker.port,
                est.rtt_min_ns / 1e6,
            )
        if link.identity is not None:
            link.clock.shared = self.identity.shares(ClockIdentity.from_dict(link.identity))
        # in the host's stream too, as it is measured: what a live view shows of the clocks
        link.queue.put(
            Event(
                t_ns=now_ns(),
                kind=Kind.AGENT_CLOCK,
                source=f"agent:{host}",
                host=host,
                value=est.offset_ns,
                meta={
                    "uncertainty_ns": est.uncertainty_ns,
                    "rtt_min_ns": est.rtt_min_ns,
                    "samples": est.samples,
                    "via": link.clock_via,
                    "shared_clock": link.clock.shared,
                },
            )
        )
        return est

    def discipline(self, host: str, controller_sync: dict[str, Any] | None) -> None:
        """Where the agent's host and the controller's are both disciplined to one reference (ptp4l, chrony:
        `time_sync.discipline`), the offset of their monotonic clocks follows from each one's monotonic
        minus realtime, within the two daemons' bounds: recorded, and applied where tighter."""
        link = self.links[host]
        mine = (controller_sync or {}).get("discipline")
        theirs = (link.time_sync or {}).get("discipline")
        pair = link.identity or {}
        if not mine or not theirs or "mono_ns" not in pair or "real_ns" not in pair:
            return
        if mine.get("reference") != theirs.get("reference"):
            return  # two references: their disagreement is bounded by nothing either daemon knows
        if "bound_ns" not in mine or "bound_ns" not in theirs:
            return
        mono, real = now_ns(), time.time_ns()
        link.clock.daemon = {
            "source": str(theirs.get("source", "daemon")),
            "reference": theirs.get("reference"),
            "offset_ns": (int(pair["mono_ns"]) - int(pair["real_ns"])) - (mono - real),
            "uncertainty_ns": int(mine["bound_ns"]) + int(theirs["bound_ns"]),
        }

    async def _sync_clocks(self) -> None:
        """A burst per agent every `clock_sync_interval_s` while its probes run: the clock model follows
        drift through the run, not only between its start and its end."""
        while True:
            await asyncio.sleep(self.broker.clock_sync_interval_s)
            for host, link in self.links.items():
                if link.probes_running and link.online.is_set():  # not a lost agent's successor
                    with contextlib.suppress(HardwareError):
                        await self.measure(host)
