"""The controller's side: one MQTT client for every agent (`AgentHub`) and a `RemoteProbe` per host."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import itertools
import logging
import os
import secrets
import time
from collections import Counter, OrderedDict
from collections.abc import AsyncIterator, Callable, Collection, Sequence
from dataclasses import dataclass, field
from types import TracebackType
from typing import Any, Self

import aiomqtt
import msgspec

from labctl.agents.broker import BrokerSettings, login_failure, secret_env
from labctl.agents.clock import (
    ClockIdentity,
    HostClockModel,
    OffsetEstimate,
    OffsetSample,
)
from labctl.agents.clockping import ClockPinger
from labctl.agents.wire import (
    CONTROLLER,
    Batch,
    Command,
    Rejected,
    Rejections,
    ReplayGuard,
    Reply,
    Sealed,
    Signer,
    World,
    WorldItem,
    _enc,
    decode,
    parse_status,
    shift_stamps,
    topic,
    world_topic,
)
from labctl.core.clock import now_ns
from labctl.core.errors import HardwareError
from labctl.core.events import Event, EventQueue, Kind
from labctl.inventory.profiles import Profile
from labctl.inventory.schema import Inventory
from labctl.labs.base import Lab, LabContext
from labctl.linux.timesync import clock_sync_state
from labctl.probes.sampling import ProbeSettings

log = logging.getLogger("labctl.agents")


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

    def clock_record(self, controller: ClockIdentity) -> dict[str, Any]:
        """run.json `clock_offsets.<host>`: the source that set the uncertainty, the offset removed and its
        uncertainty over the run (the source's own, plus how far the applied offsets strayed from the final
        estimate), the exchange-based estimate beside it whatever the source, and every burst."""
        model = self.clock
        fit = model.fit
        end = self.applied[-1][0] if self.applied else (fit.last_ns if fit else 0)
        source = model.source
        stray = max((abs(off - model.offset_at(t)) for t, off in self.applied), default=0)
        worst = max((model.uncertainty_at(t) for t, _ in self.applied), default=model.uncertainty_at(end))
        record: dict[str, Any] = {
            "source": source,
            "offset_ns": model.offset_at(end),
            "uncertainty_ns": worst + stray,
            "applied_stray_ns": stray,
            "shared_clock": model.shared,
        }
        if self.clock_via is not None:
            record["exchange_via"] = self.clock_via
            if self.clock_via == "udp" and self.clock_udp is not None:
                record["exchange_address"] = f"{self.clock_udp[0]}:{self.clock_udp[1]}"
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
        if self.world_offset_ns is not None:
            record["applied_offset_ns"] = self.world_offset_ns
        if self.identity is not None:
            keys = ("boot_id", "timens_ns", "synthetic", "clock")
            record["identity"] = {k: self.identity[k] for k in keys if k in self.identity}
        record["controller_identity"] = controller.as_dict()
        record["history"] = [e.as_dict() for e in model.history]
        return record

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


@dataclass
class _Outgoing:
    topic: str
    body: Callable[[], bytes]  # built at send time, so a ping's t1 is stamped as it leaves
    # A request's caller gives up at its timeout: a command still unsent then (no broker) is dropped, so a
    # `start` the controller already reported as failed cannot reach an agent after a reconnect.
    expires_ns: int | None = None
    host: str | None = None  # whose key signs it (None: every host's, the world feed)
    cmd_id: int | None = None  # a command's id: each send of it may be answered once


@dataclass
class _Pending:
    """A command sent to one host and not answered yet."""

    op: str
    future: asyncio.Future[Reply] | None = None  # a request waiting for the reply (None: posted only)
    sends: int = 0  # handed to the client this often (a broker outage resends it): as many answers come
    t4: int = 0  # a ping's reply, stamped as it came off the socket


@dataclass
class _Answered:
    op: str
    duplicates_left: int  # answers still expected to the resends of the command


class RefusedReply(Rejected):
    """A reply that answers no command sent to the host that sent it; `refusal` says how (REFUSALS)."""

    def __init__(self, kind: str, refusal: str, reason: str) -> None:
        super().__init__(kind, reason)
        self.refusal = refusal


REFUSALS = {
    "forged": "the id of a command sent to another host",
    "unsolicited": "the id of no command sent",
    "replayed": "a command already answered (a stamp seen before, or a second answer to one sending)",
    "wrong_op": "another operation than the command's",
    "off_topic": "another host's signature, or another host named, on the replying host's topic",
    "unauthorised": "a signature that does not check",
    "malformed": "does not decode",
}
"""Why the controller refused a reply (run.json `agents.replies_refused`)."""


def refused_replies_line(agents: dict[str, Any]) -> str | None:
    """For the end of a run (run.json `agents`): the replies the controller refused, by reason; None if
    none. Each is an agent's answer to no command sent to it: a host answering for another, a replay."""
    refused = {reason: n for reason, n in (agents.get("replies_refused") or {}).items() if n}
    if not refused:
        return None
    total = sum(refused.values())
    reasons = ", ".join(f"{n} {reason}" for reason, n in refused.items())
    return (
        f"{total} agent repl{'y' if total == 1 else 'ies'} refused ({reasons}): an agent answered commands "
        "not sent to it; none was used (run.json agents.replies_refused)"
    )


_REFUSAL_OF_KIND = {"forged": "off_topic", "replayed": "replayed", "malformed": "malformed"}
MAX_PENDING = 4096
"""Commands per host kept waiting for their reply (replies that never came), and answered ids kept."""


APPLIED_EVERY_NS = 50_000_000
NAGLE_RTT_NS = 30_000_000
"""A fastest round trip through the broker this slow (on a LAN) is the signature of Nagle + delayed ACK."""
UDP_PING_TIMEOUT_S = 0.2
"""A clock ping straight to an agent not answered by then is lost (a LAN round trip is well under 1 ms)."""
_RESEND = _Outgoing("", lambda: b"")
"""Queued by a publish that failed: the sender hands everything unacknowledged to the client again."""
PENDING_PUBLISH_WARNING = 1000
"""aiomqtt warns ("There are N pending publish calls") past 10 publishes awaiting their PUBACK, a sign of a
leak in most clients. The hub's sender keeps every unacknowledged message in flight by design (a
reconfiguration's commands and world updates go out together, tens of messages): warn only past this."""


class AgentHub:
    """The controller's single MQTT client: receives every agent's events and replies, sends commands and
    the simulated world, measures clock offsets, counts what was lost or rejected."""

    def __init__(self, inventory: Inventory, broker: BrokerSettings) -> None:
        self.inventory = inventory
        self.broker = broker
        self.lab = broker.lab
        self.signer = Signer(broker.auth_key)  # the shared key (unsigned without one): stamps the world feed
        self.replays = ReplayGuard()
        self.links = {
            host: HostLink(host, {p.source for p in inventory.ports if p.host == host})
            for host in inventory.hosts
        }
        self.rejections = Rejections()
        self.reconnects = 0
        self.expired_commands = 0
        self.connected = asyncio.Event()
        self.identity = ClockIdentity.here()  # the controller's clock: an agent with the same one shares it
        self.world_snapshot: Callable[[], list[WorldItem]] | None = None
        self.controller_time_sync: dict[str, Any] | None = None
        """This host's clock discipline (labctl.linux.timesync), for the daemon source of the clock model."""
        self.on_lost: Callable[[str], None] | None = None
        """Called with the reason when a started agent goes offline."""
        # A reply is matched only against the commands sent to the host that answers (decision 0072).
        self._pending: dict[str, dict[int, _Pending]] = {host: {} for host in inventory.hosts}
        self._answered: dict[str, OrderedDict[int, _Answered]] = {
            host: OrderedDict() for host in inventory.hosts
        }
        self.replies_refused: Counter[str] = Counter()
        self.duplicate_replies = 0  # answers to a command the hub sent again (a broker outage): expected
        self._outgoing: asyncio.Queue[_Outgoing] = asyncio.Queue()
        self._unacked: dict[int, _Outgoing] = {}  # handed to the client, no PUBACK yet: in send order
        self._keys = itertools.count()
        self._publishing: set[asyncio.Task[None]] = set()
        self._world_pending: list[WorldItem] = []
        self._tasks: list[asyncio.Task[None]] = []
        self._client: aiomqtt.Client | None = None
        self.client_id: str | None = None  # the MQTT client id of the latest connection
        self._last_error: aiomqtt.MqttError | None = None
        self._refused = asyncio.Event()
        self._refusal: str | None = None  # the one line for a login or TLS failure
        self._nagle_warned = False
        self._pingers: dict[str, ClockPinger] = {}
        self.world_messages = 0
        self.world_items = 0  # the broker answered and said no: waiting longer cannot help

    @functools.cached_property
    def signers(self) -> dict[str, Signer]:
        """What signs the messages to each host and checks those from it: the host's own key with per-host
        identities (decision 0067), else the shared one. Read from the environment when first needed."""
        return {host: Signer(self.broker.key_for(host), CONTROLLER) for host in self.inventory.hosts}

    # -- lifecycle ----------------------------------------------------------------------------------------
    async def start(self, timeout_s: float = 10.0) -> None:
        self.broker.credentials()  # every secret this side needs is set: one line now, naming it
        assert self.signers
        if self.broker.tls:
            self.broker.tls_context()  # its files readable: one line now, not a connection that never comes
        self.controller_time_sync = await asyncio.to_thread(clock_sync_state)
        self._tasks = [
            asyncio.create_task(self._connection(), name="hub:connection"),
            asyncio.create_task(self._sender(), name="hub:sender"),
            asyncio.create_task(self._sync_clocks(), name="hub:clock-sync"),
        ]
        waits = [asyncio.ensure_future(self.connected.wait()), asyncio.ensure_future(self._refused.wait())]
        try:
            await asyncio.wait(waits, timeout=timeout_s, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for w in waits:
                w.cancel()
        if self.connected.is_set():
            return
        await self.stop()
        where = f"MQTT broker {self.broker.hostname}:{self.broker.port}"
        if self._refused.is_set() and self._refusal is not None:
            raise HardwareError(self._refusal)
        last = f" (last error: {self._last_error})" if self._last_error is not None else ""
        raise HardwareError(f"{where} not reachable within {timeout_s:g} s{last}")

    async def stop(self) -> None:
        # A grace period still running decides nothing any more: no loss (and no fault) after the hub stops.
        for link in self.links.values():
            link.cancel_grace()
        # What is queued (the last world updates, a window closing) goes out and is acknowledged before the
        # client disconnects: no publish is left in flight, none is cut off half-sent.
        if self._tasks and not await self.drain():
            log.info("controller: %d message(s) to agents unacknowledged at stop", len(self._unacked))
        for t in [*self._tasks, *self._publishing]:
            t.cancel()
        await asyncio.gather(*self._tasks, *self._publishing, return_exceptions=True)
        self._tasks = []
        for pinger in self._pingers.values():
            pinger.close()
        self._pingers.clear()
        for link in self.links.values():
            link.queue.close()

    def report(self) -> dict[str, Any]:
        """For run.json: clock offsets per agent (with every re-measurement) and stream accounting."""
        refused = {reason: self.replies_refused[reason] for reason in REFUSALS}
        note = refused_replies_line({"replies_refused": refused})
        return {
            # what the run's status line adds (labctl run prints each): here, replies refused
            "status_notes": [note] if note else [],
            "clock_offsets": {
                host: link.clock_record(self.identity) for host, link in self.links.items() if link.history
            },
            "time_sync": {host: link.time_sync for host, link in self.links.items() if link.time_sync},
            "agents": {
                "broker": f"{self.broker.hostname}:{self.broker.port}",
                "reconnects": self.reconnects,
                "expired_commands": self.expired_commands,
                "world": {"messages": self.world_messages, "items": self.world_items},
                "rejected": self.rejections.as_dict(),
                "replies_refused": refused,
                "duplicate_replies": self.duplicate_replies,
                "identities": "per-host" if self.broker.per_host else "shared",
                "agent_rejected": {
                    host: link.agent_rejections
                    for host, link in self.links.items()
                    if link.agent_rejections is not None
                },
                "streams": {host: link.stats() for host, link in self.links.items() if link.started},
                "lost": {
                    host: {
                        "t_ns": link.lost_at_ns,
                        "wall_ns": link.lost_at_wall_ns,
                        "reason": link.lost_reason,
                    }
                    for host, link in self.links.items()
                    if link.lost_at_ns is not None
                },
            },
        }

    async def _connection(self) -> None:
        while True:
            try:
                # (A broker with `use_username_as_clientid` replaces it with the controller's user.)
                ident = self.client_id = f"labctl-controller-{self.lab}-{os.getpid()}-{secrets.token_hex(3)}"
                async with self.broker.client(ident) as client:
                    client.pending_calls_threshold = PENDING_PUBLISH_WARNING
                    for leaf in ("events", "reply", "status"):
                        await client.subscribe(topic(self.lab, "+", leaf), qos=1)
                    self._client = client
                    self._last_error = None
                    self.connected.set()
                    if self.reconnects:
                        self.resnapshot()  # what the agents' mirrors missed while we were away
                    async for message in client.messages:
                        t_rx = now_ns()
                        self._on_message(str(message.topic), message.payload, t_rx)
            except aiomqtt.MqttError as e:
                refusal = login_failure(self.broker, e)
                if refusal is not None:
                    self._refusal = refusal
                    self._refused.set()
                # Once per outage at warning level; the retries of a long outage only at debug.
                (log.debug if self._last_error is not None else log.warning)(
                    "controller: broker connection lost: %s", e
                )
                self._last_error = e
            else:
                self._last_error = None
            finally:
                self._client = None
                self.connected.clear()
            self.reconnects += 1
            await asyncio.sleep(0.2)

    async def _sender(self) -> None:
        """Commands and world updates go out in order and are retried across broker restarts.

        Pipelined: whatever is queued is handed to the client as soon as it is queued, without waiting for
        the PUBACKs of what went before. (Waiting for the previous batch's acknowledgements, as this did,
        held every light change behind a broker round trip, and behind a burst of commands several: the
        agents' mirrors, hence their sampled Rx power, lagged the model by ~5-15 ms on a loaded host.)
        What is not acknowledged stays in `_unacked`, in send order, and is handed to the client again
        when a publish fails or a new connection is up: the agent answers a repeated command id without
        acting twice, and world updates are states (a repeated one changes nothing)."""
        last_client: aiomqtt.Client | None = None
        while True:
            batch = [await self._outgoing.get()]
            while not self._outgoing.empty():
                batch.append(self._outgoing.get_nowait())
            resend = _RESEND in batch
            batch = [item for item in batch if item is not _RESEND]
            if resend:
                await asyncio.sleep(0.05)  # a failed publish: give the connection a moment to be seen gone
            while True:
                await self.connected.wait()
                client = self._client
                if client is not None:
                    break
                await asyncio.sleep(0.01)
            if resend or client is not last_client:
                # Everything the broker has not acknowledged goes again, first and in its order.
                batch = [*self._unacked.values(), *batch]
                self._unacked.clear()
            last_client = client
            for item in self._unexpired(batch):
                if item.cmd_id is not None:
                    self._count_send(item)
                key = next(self._keys)
                self._unacked[key] = item
                # Tasks start in order, and each hands its packet to the client on its first step.
                task = asyncio.create_task(self._publish(client, key, item), name="hub:publish")
                self._publishing.add(task)
                task.add_done_callback(self._publishing.discard)

    async def _publish(self, client: aiomqtt.Client, key: int, item: _Outgoing) -> None:
        try:
            await client.publish(item.topic, self._seal(item), qos=1, timeout=5)
        except aiomqtt.MqttError:
            if client is self._client:  # (a new connection already got everything unacknowledged)
                self._outgoing.put_nowait(_RESEND)
        else:
            self._unacked.pop(key, None)

    def _seal(self, item: _Outgoing) -> bytes:
        body = item.body()
        if item.host is not None:
            return self.signers[item.host].seal(item.topic, body)
        if self.broker.per_host:  # the world feed: one MAC per host, each agent checks its own
            return self.signer.seal_for(item.topic, body, self.signers)
        return self.signer.seal(item.topic, body)

    def _open(self, host: str, topic_name: str, payload: bytes) -> Sealed:
        """Check a message on `host`'s topics with the key of whoever it says signed it: the host's own
        (its messages), or, where another host's key checks it, that host posing as this one: forged."""
        mine = self.signers[host]
        claimed = Signer.peek(payload)
        if not mine.keyed:  # unsigned lab: who signed is only a claim, nothing can check it
            return claimed
        if claimed.signer == host:
            return mine.open_sealed(topic_name, payload)
        other = self.signers.get(claimed.signer)
        if other is not None and other.keyed:
            other.open_sealed(topic_name, payload)  # raises unless that host's key really signed it
            raise Rejected("forged", f"{claimed.signer} signed a message on {host}'s topic")
        raise Rejected("unauthorised", f"signed as {claimed.signer!r} on {host}'s topic")

    async def drain(self, timeout_s: float = 2.0) -> bool:
        """Until everything queued has been sent and acknowledged by the broker (or `timeout_s`): a clean
        stop leaves no publish in flight. False if something was still unacknowledged."""
        deadline = now_ns() + round(timeout_s * 1e9)
        while (not self._outgoing.empty() or self._unacked) and now_ns() < deadline:
            if not self.connected.is_set():
                break  # no broker: what is unsent stays unsent (counted by the agents' stream accounting)
            await asyncio.sleep(0.005)
        return self._outgoing.empty() and not self._unacked

    def _count_send(self, item: _Outgoing) -> None:
        """One more answer may come to this command: an agent answers every copy it gets (acting once)."""
        assert item.host is not None and item.cmd_id is not None
        pending = self._pending[item.host].get(item.cmd_id)
        if pending is not None:
            pending.sends += 1
            return
        answered = self._answered[item.host].get(item.cmd_id)
        if answered is not None:  # answered already, sent again (its PUBACK was lost with the connection)
            answered.duplicates_left += 1

    def _unexpired(self, batch: list[_Outgoing]) -> list[_Outgoing]:
        now = now_ns()
        keep = [item for item in batch if item.expires_ns is None or item.expires_ns > now]
        self.expired_commands += len(batch) - len(keep)
        return keep

    # -- receive ------------------------------------------------------------------------------------------
    def _on_message(self, topic_name: str, payload: Any, t_rx: int) -> None:
        parts = topic_name.split("/")
        try:
            if len(parts) != 4 or parts[0] != "labctl" or parts[1] != self.lab:
                raise Rejected("unauthorised", f"unexpected topic {topic_name}")
            link = self.links.get(parts[2])
            if link is None:
                raise Rejected("unauthorised", f"host {parts[2]!r} is not in the inventory")
            if not isinstance(payload, bytes):
                raise Rejected("malformed", "payload is not bytes")
            leaf = parts[3]
            try:
                sealed = self._open(link.host, topic_name, payload)
            except Rejected as r:
                if r.reason == "bad MAC":
                    link.bad_signatures += 1
                raise
            if leaf != "status":  # retained and last wills are old by design (decision 0024)
                self.replays.check(topic_name, sealed)
            body = sealed.body
            if leaf == "events":
                self._on_batch(link, body, t_rx)
            elif leaf == "reply":
                self._on_reply(link, body, t_rx)
            elif leaf == "status":
                self._on_status(link, body, t_rx)
            else:
                raise Rejected("unauthorised", f"unexpected topic {topic_name}")
        except Rejected as r:
            self.rejections.add(r.kind, r.reason, topic_name)
            if len(parts) == 4 and parts[3] == "reply":
                refusal = r.refusal if isinstance(r, RefusedReply) else _REFUSAL_OF_KIND.get(r.kind, r.kind)
                self.replies_refused[refusal] += 1

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

    def _on_reply(self, link: HostLink, body: bytes, t_rx: int) -> None:
        try:
            reply: Reply = decode(Reply, body)
        except msgspec.DecodeError as e:
            raise Rejected("malformed", f"reply: {e}") from None
        if reply.host != link.host:
            raise RefusedReply(
                "unauthorised", "off_topic", f"reply from {reply.host!r} on {link.host}'s topic"
            )
        if link.probes_running and link.incarnation is not None and reply.incarnation != link.incarnation:
            # A new agent process answering (its `online` may not have reached us yet): a restart.
            self._lost(link, t_rx if link.offline_since is None else link.offline_since, "restarted")
        pending = self._pending[link.host]
        sent = pending.get(reply.id)
        if sent is None:
            self._unmatched(link.host, reply)
            return
        if sent.op != reply.op:  # refused, and the command still waits for its own answer
            raise RefusedReply("forged", "wrong_op", f"a {reply.op} reply to a {sent.op} command")
        del pending[reply.id]
        answered = self._answered[link.host]
        answered[reply.id] = _Answered(reply.op, max(0, sent.sends - 1))
        while len(answered) > MAX_PENDING:
            answered.popitem(last=False)
        sent.t4 = t_rx  # (a ping's t4, stamped as the reply came off the socket)
        if sent.future is not None and not sent.future.done():
            sent.future.set_result(reply)

    def _unmatched(self, host: str, reply: Reply) -> None:
        """A reply to no command waiting on `host`: the expected answer to a command sent again, or
        refused, saying why."""
        answered = self._answered[host].get(reply.id)
        if answered is not None:
            if answered.op != reply.op:
                raise RefusedReply("forged", "wrong_op", f"a {reply.op} reply to a {answered.op} command")
            if answered.duplicates_left > 0:
                answered.duplicates_left -= 1
                self.duplicate_replies += 1
                return
            raise RefusedReply("replayed", "replayed", "a second reply to a command sent once")
        if any(
            reply.id in self._pending[other] or reply.id in self._answered[other]
            for other in self.links
            if other != host
        ):
            raise RefusedReply("forged", "forged", "a reply to a command sent to another host")
        raise RefusedReply("forged", "unsolicited", "a reply to no command sent")

    def _still_offline(self, link: HostLink, since_ns: int) -> None:
        link.grace_timer = None
        if link.offline_since == since_ns and link.probes_running:
            self._lost(link, since_ns, "offline")

    def _lost(self, link: HostLink, t_rx: int, reason: str) -> None:
        """An agent whose probes are running went offline (its connection dropped: the broker sent its last
        will) and did not come back within `agent_grace_s` (a broker restart would have brought it back), or
        came back as a new process (`reason` "restarted"): say so in its stream, where it stops, and tell the
        run. `t_rx` is when it was seen going (or, if that was missed, seen restarted)."""
        link.cancel_grace()
        link.lost_at_ns = t_rx
        link.lost_at_wall_ns = time.time_ns() - (now_ns() - t_rx)
        link.lost_reason = reason
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

    # -- send ---------------------------------------------------------------------------------------------
    def post(
        self,
        host: str,
        op: str,
        args: dict[str, Any],
        stamp: Callable[[], dict[str, Any]] | None = None,
        expires_ns: int | None = None,
    ) -> int:
        return self._send_command(host, op, args, stamp, expires_ns)[0]

    def _send_command(
        self,
        host: str,
        op: str,
        args: dict[str, Any],
        stamp: Callable[[], dict[str, Any]] | None = None,
        expires_ns: int | None = None,
        future: asyncio.Future[Reply] | None = None,
    ) -> tuple[int, _Pending]:
        # Random per command (not a counter): a host sees the ids of its own commands only, and no id
        # of another host's follows from them (decision 0072); nor does an agent that outlives a run
        # answer a new run's command from its reply cache. Collisions at 63 bits: none in practice.
        cmd_id = secrets.randbits(63)
        pending = self._pending[host]
        sent = pending[cmd_id] = _Pending(op, future)
        while len(pending) > MAX_PENDING:  # replies that never came
            del pending[next(iter(pending))]

        def body() -> bytes:
            return _enc.encode(Command(id=cmd_id, op=op, args={**args, **(stamp() if stamp else {})}))

        self._outgoing.put_nowait(_Outgoing(topic(self.lab, host, "cmd"), body, expires_ns, host, cmd_id))
        return cmd_id, sent

    async def request(
        self, host: str, op: str, args: dict[str, Any], timeout_s: float = 10.0, *, check: bool = True
    ) -> Reply:
        """Send a command and wait for its reply; one the agent refused raises HardwareError with its
        error (`check`), or is returned as it came (`check=False`: the caller reads its `data`)."""
        fut: asyncio.Future[Reply] = asyncio.get_running_loop().create_future()
        self._send_command(host, op, args, expires_ns=now_ns() + round(timeout_s * 1e9), future=fut)
        try:
            reply = await asyncio.wait_for(fut, timeout_s)
        except TimeoutError:
            raise HardwareError(f"agent {host}: no reply to {op} within {timeout_s:g} s") from None
        if check and not reply.ok:
            raise HardwareError(f"agent {host}: {op} refused: {reply.error}")
        return reply

    def world(self, item: WorldItem) -> None:
        """Queue a world update; updates of one loop iteration go out as one message."""
        if not self._world_pending:
            asyncio.get_running_loop().call_soon(self._flush_world)
        self._world_pending.append(item)

    def _flush_world(self) -> None:
        items, self._world_pending = self._world_pending, []
        if items:
            self.world_messages += 1
            self.world_items += len(items)
            payload = _enc.encode(World(items=items))
            self._outgoing.put_nowait(_Outgoing(world_topic(self.lab), lambda: payload))

    def resnapshot(self) -> None:
        """The whole world again, to every agent, if a run's agents mirror it: after an outage a mirror's
        copy is stale (a clean session drops what was published meanwhile) and serves no traffic until
        this comes."""
        if self.world_snapshot is not None and any(link.probes_running for link in self.links.values()):
            self.world_now(self.world_snapshot(), snapshot=True)

    def world_now(self, items: list[WorldItem], *, snapshot: bool = False) -> None:
        """Queue world items as one message now, after the updates already pending; `snapshot`: they are
        the whole world as it is (a run's start), which a mirror applies without counting them late."""
        self._flush_world()
        payload = _enc.encode(World(items=items, snapshot=snapshot))
        self._outgoing.put_nowait(_Outgoing(world_topic(self.lab), lambda: payload))

    # -- clocks -------------------------------------------------------------------------------------------
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


class RemoteProbe:
    """A `CircuitProbe` whose samples come from a host's agent: the controller's view of that agent."""

    def __init__(
        self,
        hub: AgentHub,
        host: str,
        probes: Sequence[str],
        settings: ProbeSettings,
        profile: Profile,
        seed: int,
    ) -> None:
        self.hub = hub
        self.probe_names = list(probes)
        self._window_open = False
        self.host = host
        self.name = f"agent:{host}"
        self.link = hub.links[host]
        self.settings = settings
        self.profile = profile
        self.seed = seed
        self._stats: dict[str, Any] = {}

    async def __aenter__(self) -> Self:
        await self.hub.wait_online(self.host)
        await self.hub.measure(self.host)
        offset = self.link.clock.offset_at(now_ns())  # 0 exactly on a shared clock
        if self.hub.world_snapshot is not None:  # the agent mirrors the world at this offset
            self.link.world_offset_ns = offset
        reply = await self.hub.request(
            self.host,
            "start",
            {
                "probes": self.probe_names,
                "settings": self.settings.model_dump(mode="json"),
                "profile": self.profile.model_dump(mode="json"),
                "seed": self.seed,
                "world_offset_ns": offset,
                "mirror_lag_ns": (
                    round(self.hub.broker.mirror_lag_ms * 1e6) if self.hub.world_snapshot is not None else 0
                ),
            },
        )
        if reply.seq is not None and reply.n is not None:
            self.link.begin_stream(reply.seq, reply.n)
        if reply.data is not None:
            self.link.time_sync = reply.data.get("time_sync")
            self.hub.discipline(self.host, self.hub.controller_time_sync)
        self.link.incarnation = reply.incarnation
        self.link.started = True
        snapshot = self.hub.world_snapshot
        if snapshot is not None:
            self.hub.world_now(snapshot(), snapshot=True)
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        if self.link.offline_since is not None:
            # Offline within its grace: back (a broker outage) or lost, the grace decides; no stop request
            # waiting out its own timeout for an agent that is gone.
            await self.hub.settle(self.host)
        if self.link.lost_at_ns is not None:  # gone: nothing to stop, nothing more will come
            self.link.queue.close()
            return
        if self.link.online.is_set():  # the closing estimate: with the opening one it brackets the drift
            with contextlib.suppress(HardwareError, TimeoutError):
                await asyncio.wait_for(self.hub.measure(self.host), 5.0)
        try:
            reply = await self.hub.request(self.host, "stop", {}, timeout_s=10.0)
        except HardwareError as e:
            log.warning("%s", e)
        else:
            if self.link.lost_at_ns is not None:  # answered by a new agent process: its counts are not ours
                self.link.queue.close()
                return
            self.link.stopped = True
            if reply.data is not None:
                rejected = reply.data.get("rejected")
                if isinstance(rejected, dict):
                    self.link.agent_rejections = rejected
                world = reply.data.get("world")
                self._stats = {**reply.data.get("probes", {}), **({"world": world} if world else {})}
            # Everything the agent sent precedes its reply on the broker; what never came is lost.
            assert reply.seq is not None and reply.n is not None
            self.link.missing_batches += max(0, reply.seq - self.link.next_seq)
            self.link.missing_events += max(0, reply.n - self.link.cursor)
            self.link.gap(reply.n - self.link.cursor, None)  # the last ones never came
            self.link.next_seq = max(self.link.next_seq, reply.seq)
            self.link.cursor = max(self.link.cursor, reply.n)
        self.link.queue.close()

    def events(self) -> AsyncIterator[Event]:
        return aiter(self.link.queue)

    @property
    def dropped(self) -> int:
        """Events lost anywhere between the agent's sampler and the run log: agent queue, broker, here."""
        return self.link.agent_dropped + self.link.missing_events + self.link.queue.dropped

    def stats(self) -> dict[str, Any]:
        """For run.json `probes`: the drops, what each of the agent's probes did, by name (e.g.
        `rx-power.samples_per_s_per_port` against the configured rate on that host), and `world`: how its
        mirror of the model kept up (modeled labs: light changes applied at their model time or late, and
        by how much)."""
        return {"dropped": self.dropped, **self._stats}

    def set_circuits(self, peers: dict[str, str | None]) -> None:
        mine = {s: p for s, p in peers.items() if s in self.link.sources}
        if mine:
            self.hub.post(self.host, "set_circuits", {"circuits": mine})

    def open_window(self, sources: Collection[str] | None = None) -> None:
        """Forward the controller's reconfiguration window to the agent's probes (dense Rx-power reports,
        the carrier poll), for this host's affected ports."""
        mine = sorted(self.link.sources if sources is None else set(sources) & self.link.sources)
        self._window_open = bool(mine)
        if mine:
            self.hub.post(self.host, "window", {"open": mine})

    def close_window(self) -> None:
        if self._window_open:
            self._window_open = False
            self.hub.post(self.host, "window", {})

    def expect_switch_acks(self) -> None:
        """Deliberately nothing: the agent's probes are not told to rely on `switched` alone. It reaches
        them a broker hop (a few ms on a busy host) after t1, so they keep their dense reports around a
        reconfiguration, which put a report within two sampling periods of t1 when a dark gap fell between
        samples; `switched` then ends them and reports the next sample."""

    def switched(self, sources: Collection[str]) -> None:
        """Forward the switch's acknowledgement (t1) for this host's ports to its agent's probes."""
        mine = sorted(set(sources) & self.link.sources)
        if mine:
            self.hub.post(self.host, "switched", {"sources": mine})


def run_probes_on_agents(lab: Lab, ctx: LabContext, probes: Sequence[str]) -> AgentHub:
    """What every lab kind whose hosts run agents shares: one hub (started with the lab, stopped when it
    closes, its report merged into run.json), a `RemoteProbe` running `probes` on each host that has
    ports, and an agent lost mid-run raising the lab's fault. Returns the hub (a modeled lab feeds it)."""
    hub = AgentHub(ctx.inventory, BrokerSettings.from_inventory(ctx.inventory))
    lab.probes.extend(
        RemoteProbe(hub, host, probes, ctx.probes, ctx.profile, ctx.rng.getrandbits(32))
        for host in ctx.inventory.hosts
        if hub.links[host].sources
    )

    async def stop_hub() -> None:
        await hub.stop()
        lab.meta.update(hub.report())

    hub.on_lost = lab.fault.raise_  # a host's agent gone mid-run ends the run, with the host and when
    lab.start_hooks.append(hub.start)
    lab.async_close_hooks.append(stop_hub)
    return hub
