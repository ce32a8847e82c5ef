"""The controller's side of the agents: one MQTT client for all (`AgentHub`) and a `RemoteProbe` per host.

The hub's parts are modules of their own: its connection to the broker (labctl.agents.hub_connection),
commands and their replies (labctl.agents.hub_commands), each agent's event stream and presence
(labctl.agents.hub_streams), and the clock exchange (labctl.agents.clock_exchange). Here: the hub that
holds them (their state is set in its `__init__`), what comes in, the world feed to the agents' mirrors,
the run.json report, and the probe a run sees for each host.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
from collections import Counter, OrderedDict
from collections.abc import AsyncIterator, Callable, Collection, Sequence
from types import TracebackType
from typing import Any, Self

import aiomqtt

from labctl.agents.broker import BrokerSettings
from labctl.agents.clock import ClockIdentity
from labctl.agents.clock_exchange import ClockExchange, clock_record
from labctl.agents.clockping import ClockPinger
from labctl.agents.hub_commands import (
    _REFUSAL_OF_KIND,
    REFUSALS,
    RefusedReply,
    _Answered,
    _Pending,
    refused_replies_line,
)
from labctl.agents.hub_connection import HubConnection, _Outgoing
from labctl.agents.hub_streams import HostLink, StreamReceiver
from labctl.agents.wire import (
    NOTICE_T,
    Rejected,
    Rejections,
    ReplayGuard,
    Signer,
    World,
    WorldItem,
    _enc,
    world_topic,
)
from labctl.core.clock import now_ns
from labctl.core.errors import HardwareError
from labctl.core.events import Event
from labctl.inventory.profiles import Profile
from labctl.inventory.schema import Inventory
from labctl.labs.base import Lab, LabContext
from labctl.linux.timesync import clock_sync_state
from labctl.probes.sampling import ProbeSettings

log = logging.getLogger("labctl.agents")

HORIZON_INTERVAL_S = 0.02
"""How often a run's mirrors hear how far the model is complete when nothing changes: well inside the
mirrors' lag (decision 0046), so a quiet feed never holds their samplers."""


class AgentHub(HubConnection, StreamReceiver, ClockExchange):
    """The controller's single MQTT client: receives every agent's events and replies, sends commands and
    the simulated world, measures clock offsets, counts what was lost or rejected."""

    def __init__(self, inventory: Inventory, broker: BrokerSettings) -> None:
        # The state of the hub and of each of its parts (the mixins above), all set here.
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
        self.world_horizon: Callable[[], int] | None = None
        """Where the lab has a model the agents mirror: the model time it is complete through (every
        change up to it made, hence handed to `world`). Each world message says it, after its items, and
        one goes out every HORIZON_INTERVAL_S while probes run, so that a mirror's samplers never read past
        what has reached them (decision 0086)."""
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
            asyncio.create_task(self._world_horizons(), name="hub:world-horizon"),
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
                host: clock_record(link, self.identity) for host, link in self.links.items() if link.history
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
                        "seen": link.lost_seen,
                    }
                    for host, link in self.links.items()
                    if link.lost_at_ns is not None
                },
            },
        }

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

    # -- the world feed (modeled labs: each agent's mirror, labctl.agents.mirror) ----------------------------
    def world(self, item: WorldItem) -> None:
        """Queue a world update; updates of one loop iteration go out as one message."""
        if not self._world_pending:
            asyncio.get_running_loop().call_soon(self._flush_world)
        self._world_pending.append(item)

    def _flush_world(self, *, horizon: bool = False) -> None:
        """What is pending as one message, with the model's horizon; `horizon`: the horizon alone too."""
        items, self._world_pending = self._world_pending, []
        if items or horizon:
            self.world_messages += 1
            self.world_items += len(items)
            through = self.world_horizon() if self.world_horizon is not None else None
            payload = _enc.encode(World(items=items, through_ns=through))
            self._outgoing.put_nowait(_Outgoing(world_topic(self.lab), lambda: payload))

    async def _world_horizons(self) -> None:
        """While a run's agents mirror the model: its horizon every HORIZON_INTERVAL_S, with or without
        changes (a mirror waits for it before reading further)."""
        while True:
            await asyncio.sleep(HORIZON_INTERVAL_S)
            if self.world_horizon is not None and any(link.probes_running for link in self.links.values()):
                self._flush_world(horizon=True)

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
        through = self.world_horizon() if self.world_horizon is not None else None
        payload = _enc.encode(World(items=items, snapshot=snapshot, through_ns=through))
        self._outgoing.put_nowait(_Outgoing(world_topic(self.lab), lambda: payload))


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
            self.hub.post(self.host, "set_circuits", {"circuits": mine, NOTICE_T: now_ns()})

    def open_window(self, sources: Collection[str] | None = None) -> None:
        """Forward the controller's reconfiguration window to the agent's probes (dense Rx-power reports,
        the carrier poll), for this host's affected ports."""
        mine = sorted(self.link.sources if sources is None else set(sources) & self.link.sources)
        self._window_open = bool(mine)
        if mine:
            self.hub.post(self.host, "window", {"open": mine, NOTICE_T: now_ns()})

    def close_window(self) -> None:
        if self._window_open:
            self._window_open = False
            self.hub.post(self.host, "window", {NOTICE_T: now_ns()})

    def expect_switch_acks(self) -> None:
        """Deliberately nothing: the agent's probes are not told to rely on `switched` alone. It reaches
        them a broker hop (a few ms on a busy host) after t1, so they keep their dense reports around a
        reconfiguration, which put a report within two sampling periods of t1 when a dark gap fell between
        samples; `switched` then ends them and reports the next sample."""

    def switched(self, sources: Collection[str]) -> None:
        """Forward the switch's acknowledgement (t1) for this host's ports to its agent's probes."""
        mine = sorted(set(sources) & self.link.sources)
        if mine:
            self.hub.post(self.host, "switched", {"sources": mine, NOTICE_T: now_ns()})


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
