"""Each agent's event stream at the controller: what came, what was lost, and the agent going away.

Events go onto the run timebase as they come; lost batches and events are counted and marked in the
stream (AGENT_GAP); an agent that goes offline past its grace, or restarts, while its probes run is lost
(AGENT_LOST, and the run told). `HostLink` is what the controller knows about one agent;
`StreamReceiver` is a part of `labctl.agents.hub.AgentHub` (a mixin: the hub's `__init__` sets the state
named below).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import msgspec

from labctl.agents.broker import BrokerSettings, secret_env
from labctl.agents.clock import HostClockModel, OffsetEstimate
from labctl.agents.wire import Batch, Rejected, Rejections, decode, parse_status, shift_stamps
from labctl.core.clock import now_ns
from labctl.core.errors import HardwareError
from labctl.core.events import Event, EventQueue, Kind
from labctl.inventory.schema import Inventory

log = logging.getLogger("labctl.agents")

APPLIED_EVERY_NS = 50_000_000


@dataclass
class HostLink:
    """What the controller knows about one agent's stream."""

    host: str
    sources: set[str]
    queue: EventQueue = field(default_factory=EventQueue)
    online: asyncio.Event = field(default_factory=asyncio.Event)
    next_seq: int = 0
    cursor: int = 0  # the agent's event count up to the last batch seen (the next batch's n0 if none is lost)
    delivered: int = 0
    batches: int = 0
    missing_batches: int = 0
    missing_events: int = 0
    duplicates: int = 0
    agent_dropped: int = 0
    offset: OffsetEstimate | None = None  # the latest burst's own estimate
    clock: HostClockModel = field(default_factory=HostClockModel)
    identity: dict[str, Any] | None = None
    """The agent's clock identity and a (monotonic, realtime) pair read together, from its pongs."""
    applied: list[tuple[int, int]] = field(default_factory=list)
    """(controller time, offset removed from the agent's stamps then), at most one per APPLIED_EVERY_NS: the
    final record states how far what was applied strayed from the run's final clock estimate."""
    world_offset_ns: int | None = None
    """The offset the agent's world mirror places model times with (fixed at start): its events are put
    back on the run timebase with the same number, so a model time makes the round trip exactly. Without
    a mirror (real probes), the latest estimate is used."""
    started: bool = False
    latency_ns: list[int] = field(default_factory=list)
    record_latency: bool = False
    stream_base: tuple[int, int] | None = None  # (seq, events) where this run's stream starts on the agent
    first_seen: tuple[int, int] | None = None  # (seq, n0) of the first batch, if it beat the start reply
    stopped: bool = False  # its stop reply came: the probes are over, going offline now loses nothing
    incarnation: str | None = None  # the agent process running this run's probes (from its start reply)
    online_incarnation: str | None = None  # the process of the last `online` status seen
    offline_since: int | None = None  # seen offline while its probes ran; lost if still so after the grace
    grace_timer: asyncio.TimerHandle | None = None
    lost_at_ns: int | None = None  # when the agent went offline while its probes ran (controller clock)
    lost_at_wall_ns: int | None = None
    lost_reason: str | None = None  # "offline" (past the grace) or "restarted" (a new agent process)
    lost_seen: str | None = None  # what stamped the loss: "last will" (seen going) or "successor" (seen back)
    time_sync: dict[str, Any] | None = None  # the host's clock discipline, as its agent read it at start
    clock_udp: tuple[str, int] | None = None  # where the agent's clock responder listens (its broker pongs)
    clock_via: str | None = None  # how the latest burst went: "udp" or "broker"
    udp_unanswered: bool = False  # UDP pings to it got no pong: measured through the broker from then on
    last_event_ns: int | None = None  # the latest stamp among this run's events from the host (run timebase)
    bad_signatures: int = 0  # messages on its topics whose MAC its key does not check: a secret that differs
    agent_rejections: dict[str, Any] | None = None  # what the agent itself refused (from its stop reply)

    def gap(self, missing: int, before_ns: int | None) -> None:
        """Events of this host went missing (a broker outage): say so in the stream, between the latest
        stamp received before them and the earliest after (None: the end), for the readers of the run
        (labctl.analysis.invariants: nothing is known of the host's signals in between)."""
        if missing <= 0:
            return
        t = before_ns if before_ns is not None else (self.last_event_ns or now_ns())
        meta: dict[str, Any] = {"missing_events": missing}
        if self.last_event_ns is not None:
            meta["after_ns"] = self.last_event_ns
        if before_ns is not None:
            meta["before_ns"] = before_ns
        self.queue.put(
            Event(
                t_ns=t,
                kind=Kind.AGENT_GAP,
                source=f"agent:{self.host}",
                host=self.host,
                value=missing,
                meta=meta,
            )
        )

    def begin_stream(self, seq: int, n: int) -> None:
        """The agent's counters when this run's probes started (from its start reply). An agent outlives
        runs, so its sequence numbers do not start at 0: only gaps after this point are this run's loss."""
        if self.first_seen is not None:  # batches of this run already came: count what preceded the first
            self.missing_batches += max(0, self.first_seen[0] - seq)
            self.missing_events += max(0, self.first_seen[1] - n)
        else:
            self.next_seq, self.cursor = seq, n
        self.stream_base = (seq, n)

    @property
    def probes_running(self) -> bool:
        """This run's probes are running on the agent: the span in which its going away is a loss."""
        return self.started and not self.stopped and self.lost_at_ns is None

    def cancel_grace(self) -> None:
        if self.grace_timer is not None:
            self.grace_timer.cancel()
            self.grace_timer = None
        self.offline_since = None

    @property
    def history(self) -> list[OffsetEstimate]:
        return self.clock.history

    def offset_now(self, t_ns: int) -> int:
        """The offset to remove from stamps arriving at controller time t_ns: the mirror's fixed one where
        the agent mirrors the world (a model time then makes the round trip exactly), else the clock model's
        at that time."""
        offset = self.world_offset_ns if self.world_offset_ns is not None else self.clock.offset_at(t_ns)
        if not self.applied or t_ns - self.applied[-1][0] >= APPLIED_EVERY_NS:
            self.applied.append((t_ns, offset))
        return offset

    def stats(self) -> dict[str, int]:
        return {
            "batches": self.batches,
            "events": self.delivered,
            "missing_batches": self.missing_batches,
            "missing_events": self.missing_events,
            "duplicate_batches": self.duplicates,
            "agent_dropped": self.agent_dropped,
            "queue_dropped": self.queue.dropped,
        }


class StreamReceiver:
    """Takes each agent's event batches and status into its `HostLink`, and tells the run when an agent
    whose probes were running is gone."""

    inventory: Inventory
    broker: BrokerSettings
    links: dict[str, HostLink]
    rejections: Rejections
    on_lost: Callable[[str], None] | None

    if TYPE_CHECKING:

        def resnapshot(self) -> None: ...

    def _on_status(self, link: HostLink, body: bytes, t_rx: int) -> None:
        """`online ID` (retained) or `offline ID` (the last will), ID naming the agent process. The same
        process offline and back within `agent_grace_s` is a broker outage; a new process is a restart: the
        one running this run's probes is gone, with them and whatever it had not sent, however quickly its
        successor came (systemd restarts a crashed agent in ~100 ms)."""
        state, incarnation = parse_status(body)
        if state == "online":
            link.online_incarnation = incarnation
            link.online.set()
            if link.probes_running and link.incarnation is not None and incarnation != link.incarnation:
                self._lost(link, t_rx if link.offline_since is None else link.offline_since, "restarted")
            elif link.offline_since is not None:  # the same process back within the grace: not a loss
                link.cancel_grace()
                self.resnapshot()  # its mirror missed the world while it was away
            elif link.probes_running:
                # The same process online again, never seen offline: a broker restart lost its will and
                # the retained status. Its mirror went stale when its session ended, and a snapshot the hub
                # sent on its own reconnect, before this agent had resubscribed, never reached it.
                self.resnapshot()
            return
        if link.online_incarnation is not None and incarnation != link.online_incarnation:
            # The will of an earlier process whose connection the broker dropped only after its successor
            # came online (a host back faster than the keepalive): it says nothing about the current one.
            log.info("%s: ignored the stale last will of agent process %s", link.host, incarnation)
            return
        link.online.clear()
        if link.probes_running and link.offline_since is None:
            link.offline_since = t_rx
            link.grace_timer = asyncio.get_running_loop().call_later(
                self.broker.agent_grace_s, self._still_offline, link, t_rx
            )

    def _on_batch(self, link: HostLink, body: bytes, t_rx: int) -> None:
        try:
            batch: Batch = decode(Batch, body)
        except msgspec.DecodeError as e:
            raise Rejected("malformed", f"events: {e}") from None
        if batch.host != link.host:
            raise Rejected("unauthorised", f"batch from {batch.host!r} on {link.host}'s topic")
        if link.stream_base is None and link.first_seen is None:
            # This run's first batch beat the agent's start reply: start counting from it for now;
            # begin_stream() settles whether anything before it was lost.
            link.first_seen = (batch.seq, batch.n0)
            link.next_seq, link.cursor = batch.seq, batch.n0
        if batch.seq < link.next_seq:
            link.duplicates += 1  # a QoS 1 redelivery
            return
        link.missing_batches += batch.seq - link.next_seq
        missing = max(0, batch.n0 - link.cursor)
        link.missing_events += missing
        link.next_seq = batch.seq + 1
        link.cursor = batch.n0 + len(batch.events)
        link.batches += 1
        link.agent_dropped = batch.dropped
        offset = link.offset_now(t_rx)
        if missing:
            link.gap(missing, min(ev.t_ns for ev in batch.events) - offset if batch.events else None)
        bad = 0
        for ev in batch.events:
            if ev.source not in link.sources or ev.host != link.host:
                bad += 1
                continue
            shift_stamps(ev, -offset)  # onto the run timebase, and the times in its meta with it
            if link.record_latency:
                link.latency_ns.append(t_rx - ev.t_ns)
            ev.seq = -1
            ev.wall_ns = None
            ev.reconfig = None
            link.delivered += 1
            if link.last_event_ns is None or ev.t_ns > link.last_event_ns:
                link.last_event_ns = ev.t_ns
            link.queue.put(ev)
        if bad:
            self.rejections.add("unauthorised", f"{bad} event(s) for ports not on {link.host}", link.host)

    def _still_offline(self, link: HostLink, since_ns: int) -> None:
        link.grace_timer = None
        if link.offline_since == since_ns and link.probes_running:
            self._lost(link, since_ns, "offline")

    def _lost(self, link: HostLink, t_rx: int, reason: str) -> None:
        """An agent whose probes are running went offline (its connection dropped: the broker sent its last
        will) and did not come back within `agent_grace_s` (a broker restart would have brought it back), or
        came back as a new process (`reason` "restarted"): say so in its stream, where it stops, and tell the
        run. `t_rx` is when it was seen going (or, if that was missed, seen restarted)."""
        # Stamped when the old process was seen going, unless its will was missed (or came after its
        # successor): then when the successor was seen, later than the loss by its restart.
        seen = "last will" if reason == "offline" or link.offline_since is not None else "successor"
        link.cancel_grace()
        link.lost_at_ns = t_rx
        link.lost_at_wall_ns = time.time_ns() - (now_ns() - t_rx)
        link.lost_reason = reason
        link.lost_seen = seen
        link.queue.put(
            Event(
                t_ns=t_rx,
                kind=Kind.AGENT_LOST,
                source=f"agent:{link.host}",
                host=link.host,
                value=link.delivered,
                meta={
                    "events_received": link.delivered,
                    "batches": link.batches,
                    "reason": reason,
                    "seen": seen,
                    "incarnation": link.incarnation,
                    **({"new_incarnation": link.online_incarnation} if reason == "restarted" else {}),
                },
            )
        )
        if self.on_lost is not None:
            when = time.strftime("%H:%M:%S", time.gmtime(link.lost_at_wall_ns / 1e9))
            if reason == "restarted":
                what = (
                    f"restarted at {when} UTC (a new agent process replaced the one running this run's "
                    "probes; what that one had not sent yet is gone)"
                )
            else:
                what = f"went offline at {when} UTC (its broker connection dropped)"
            self.on_lost(
                f"agent {link.host} {what} after {link.delivered} events; everything it sent before is kept"
            )

    async def settle(self, host: str) -> None:
        """Until an agent seen going offline is back or lost: at most what is left of its grace period."""
        link = self.links[host]
        if link.offline_since is None:
            return
        left_s = self.broker.agent_grace_s - (now_ns() - link.offline_since) / 1e9
        with contextlib.suppress(TimeoutError):
            # The grace timer runs first when both are due: a margin for the loop to get to it.
            await asyncio.wait_for(link.online.wait(), max(0.0, left_s) + 0.05)

    async def wait_online(self, host: str, timeout_s: float = 10.0) -> None:
        try:
            await asyncio.wait_for(self.links[host].online.wait(), timeout_s)
        except TimeoutError:
            link = self.links[host]
            if link.bad_signatures:
                ids = self.inventory.model.broker.identities if self.inventory.model.broker else None
                secret = secret_env(ids, host) if ids is not None else "broker.auth_key"
                raise HardwareError(
                    f"agent {host}: {link.bad_signatures} message(s) on its topics failed the signature "
                    f"check: {secret} differs between this controller and the agent on {host}"
                ) from None
            raise HardwareError(
                f"agent {host} is not online at {self.broker.hostname}:{self.broker.port} "
                f"(start it with `labctl agent --host {host}`)"
            ) from None
