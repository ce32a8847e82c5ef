"""`labctl agent`: one host's probes, streamed to the controller over MQTT.

Here: the agent's main loop (its broker sessions, reconnected until it is stopped), its events out in
batches, and what comes in. What it does for each command is labctl.agents.agent_commands; on a modeled
lab its probes read a mirror of the controller's model (labctl.agents.mirror).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import functools
import logging
import os
import secrets
import threading
import time
from collections import OrderedDict, deque
from collections.abc import Callable
from typing import Any, TypeVar

import aiomqtt
import msgspec

from labctl.agents.agent_commands import AgentCommands
from labctl.agents.broker import BrokerSettings, login_failure
from labctl.agents.clock import HostClock, clock_identity
from labctl.agents.clockping import ClockResponder, local_address_towards
from labctl.agents.mirror import FabricMirror
from labctl.agents.wire import (
    CONTROLLER,
    Batch,
    Command,
    Rejected,
    Rejections,
    ReplayGuard,
    Reply,
    Signer,
    World,
    _enc,
    decode,
    shift_stamps,
    status_body,
    topic,
    world_topic,
)
from labctl.core.clock import now_ns
from labctl.core.errors import HardwareError, InputError
from labctl.core.events import Event
from labctl.inventory.schema import Inventory
from labctl.labs import kinds_with_agents, lab_kinds
from labctl.probes.sampling import Probe

log = logging.getLogger("labctl.agents")
T = TypeVar("T")

BATCH_MAX = 512
BATCH_GAP_NS = 20_000_000
"""At most one event batch per this interval: a publish costs this host and the broker's ~0.1-0.5 ms of CPU
(a loopback send wakes the broker), and what is sampled is stamped when sampled: a batch 20 ms later moves
no mark, it only tells the controller of a recovery that much later (a mirror lags the model as much)."""
OUTBOX_MAX = 200_000
RECONNECT_MAX_S = 2.0  # agents retry a lost broker with backoff up to this
WIND_DOWN_S = 1.0  # an agent told to stop publishes what it still holds for at most this long
STOP_BUDGET_S = 1.5
"""An agent told to stop (SIGTERM, SIGINT) has ended `run()` within this, whatever state it was in
(connecting, backing off, connected, probes running, its broker going away): every wait on the way out is
cut to what is left of it. `labctl agent` exits at STOP_BUDGET_S + a little at the latest (decision 0068)."""


class DaemonThreads(concurrent.futures.ThreadPoolExecutor):
    """An executor whose every call runs on a daemon thread of its own: what is still blocked (a TCP or TLS
    connect to a broker that went away) neither delays the loop's shutdown nor the interpreter's exit. (A
    ThreadPoolExecutor only in name: asyncio takes no other kind as the loop's default; its pool of
    workers, joined at exit, is never used.)"""

    def submit(self, fn: Callable[..., T], /, *args: Any, **kwargs: Any) -> concurrent.futures.Future[T]:
        future: concurrent.futures.Future[T] = concurrent.futures.Future()

        def call() -> None:
            if not future.set_running_or_notify_cancel():
                return
            try:
                future.set_result(fn(*args, **kwargs))
            except BaseException as e:  # handed to the awaiting coroutine
                future.set_exception(e)

        threading.Thread(target=call, daemon=True, name="labctl-agent-call").start()
        return future

    def shutdown(self, wait: bool = True, *, cancel_futures: bool = False) -> None:
        """Nothing to wait for: a call still running is abandoned with its daemon thread."""


# -- the agent -------------------------------------------------------------------------------------------
class Agent(AgentCommands):
    """One host's agent. `skew_ns` and `drift_ppb` shift and scale this agent's clock (tests and bench: a
    host whose monotonic clock disagrees with the controller's and drifts from it, on one machine)."""

    def __init__(
        self,
        inventory: Inventory,
        host: str,
        broker: BrokerSettings,
        *,
        skew_ns: int = 0,
        drift_ppb: int = 0,
        reconnect_s: float = 0.2,
    ) -> None:
        if host not in inventory.model.hosts:
            raise InputError(
                f"--host {host!r}: not a host of {inventory.path} (known: {', '.join(inventory.hosts)})"
            )
        self.inventory = inventory
        self.kind = lab_kinds.get(inventory.kind)
        if self.kind.agent_context is None:
            raise InputError(
                f"{inventory.path}: a {inventory.kind} lab runs no agents "
                f"(lab kinds that do: {', '.join(kinds_with_agents())})"
            )
        self.agent_context = self.kind.agent_context
        self.allowed_probes = self.kind.agent_probes
        """The allow-list for `start`/`stop`: the probes its lab kind runs on agents."""
        self.mirrors_world = not self.kind.agents_probe_interfaces
        """Modeled probes: they read a mirror of the controller's behaviour model, fed by its world feed."""
        self.incarnation = f"{secrets.token_hex(8)}-pid{os.getpid()}-{time.time_ns()}"
        """This agent process, in its status and replies: the controller tells a restart (a new id) from a
        broker outage (the same id back), however quickly the new process came up."""
        self.host = host
        self.broker = broker
        self.clock = HostClock(skew_ns, drift_ppb, now_ns())
        self.reconnect_s = reconnect_s
        self.ports = [p for p in inventory.ports if p.host == host]
        make_control = self.kind.agent_link_control
        self.link_control = make_control(inventory, host, broker.hostname) if make_control else None
        """Reads and applies this host's ports' link settings (the `link` command; decision 0079): kept
        for the agent's life, so what it set outlives the controller that asked."""
        self.sources = {p.source for p in self.ports}
        self.all_sources = {p.source for p in inventory.ports}
        self.replays = ReplayGuard()
        self.rejections = Rejections()
        # The controller's behaviour model, replayed from its world feed, where the lab kind has one (the
        # probes of a real lab read the host's own interfaces): built by each `start`.
        self.mirror: FabricMirror | None = None
        self.world_offset_ns = 0
        self.mirror_lag_ns = 0  # the run's mirror lag (decision 0046); 0 where probes read the host itself
        self.seq = 0  # batches sent (or lost trying)
        self.sent_events = 0
        self.lost_batches = 0  # publish failed (broker away): the controller sees the gap
        self.reconnects = 0
        self.connected = asyncio.Event()
        self.stopping = False
        self._stop_at: float | None = None  # loop time by which run() must have ended
        self._task: asyncio.Task[None] | None = None
        self._mqtt: aiomqtt.Client | None = None  # the client of the session in progress (connected or not)
        self._client: aiomqtt.Client | None = None
        self._outbox: deque[Event] = deque()
        self._outbox_dropped = 0
        self._probes: dict[str, Probe] = {}
        self._pumps: dict[str, asyncio.Task[None]] = {}
        self._handled: OrderedDict[int, Reply] = OrderedDict()
        self._cmd_lock = asyncio.Lock()
        self._replying: set[asyncio.Task[bool]] = set()
        self._sending: set[asyncio.Task[bool]] = set()
        self._identity = clock_identity(self.clock)  # event batches handed to the client, no PUBACK yet
        self.clock_responder: ClockResponder | None = None
        """Answers the controller's clock pings over UDP (decision 0048), once a session found the broker."""
        self._send_soon = False
        self._last_send_ns = 0
        self._topics = {leaf: topic(broker.lab, host, leaf) for leaf in ("events", "cmd", "reply", "status")}
        self._world = world_topic(broker.lab)

    @functools.cached_property
    def signer(self) -> Signer:
        """Signs this host's messages and checks the controller's, with this host's key (decision 0067);
        read from the environment when first needed (`run()` does at once)."""
        return Signer(self.broker.key_for(self.host), self.host)

    def now(self) -> int:
        return self.clock.local(now_ns())

    @property
    def dropped(self) -> int:
        return self._outbox_dropped + sum(p.dropped for p in self._probes.values())

    # -- main loop ----------------------------------------------------------------------------------------
    def stop(self) -> None:
        """End `run()` within STOP_BUDGET_S, whatever it is doing: connecting (a connect blocked on a
        broker that does not answer is abandoned), backing off, connected with probes running (their last
        samples go out if the broker takes them in time). Safe to call more than once (a second signal)."""
        loop = asyncio.get_running_loop()
        if not self.stopping:
            self.stopping = True
            self._stop_at = loop.time() + STOP_BUDGET_S
        if self._mqtt is not None:
            self._mqtt.timeout = self._left(0.3)  # aiomqtt's own waits (its disconnect) too
        if self._task is not None and not self._task.done():
            self._task.cancel()

    def _left(self, cap: float) -> float:
        """What is left of the stop budget, at most `cap` (`cap` when not stopping); never quite 0."""
        if self._stop_at is None:
            return cap
        return max(0.01, min(cap, self._stop_at - asyncio.get_running_loop().time()))

    def _interrupted(self) -> bool:
        """Stopping, or this task was cancelled: a CancelledError that aiomqtt turned into an MqttError on
        its way out (its disconnect timing out against a broker that went away) must still end `run()`."""
        task = asyncio.current_task()
        return self.stopping or (task is not None and task.cancelling() > 0)

    async def run(self) -> None:
        """Connect, and reconnect whenever the broker goes away, until stopped (`stop()`) or cancelled; probes
        keep sampling. A login the broker refuses, or TLS that fails, ends it with one line naming this
        host (HardwareError): retrying cannot fix a wrong secret or certificate."""
        self._task = asyncio.current_task()
        self.broker.credentials()  # this host's secret is set: one line now, naming it
        assert self.signer
        if self.broker.tls:
            self.broker.tls_context()  # its files readable: one line now
        try:
            delay = self.reconnect_s
            while not self.stopping:
                started = now_ns()
                try:
                    await self._session()
                except aiomqtt.MqttError as e:
                    if self._interrupted():
                        break
                    failure = login_failure(self.broker, e)
                    if failure is not None:
                        raise HardwareError(failure) from None
                    # Once per outage at warning level; the retries of a long outage only at debug.
                    (log.warning if delay == self.reconnect_s else log.debug)(
                        "agent %s: broker connection lost: %s", self.host, e
                    )
                if self._interrupted():
                    break
                self.reconnects += 1
                if now_ns() - started > 5_000_000_000:  # that session was up for a while: a new outage
                    delay = self.reconnect_s
                await asyncio.sleep(delay)
                delay = min(delay * 2, RECONNECT_MAX_S)
        finally:
            for t in [*self._replying, *self._sending]:
                t.cancel()
            await asyncio.gather(*self._replying, *self._sending, return_exceptions=True)
            try:
                await asyncio.wait_for(self._stop_probes(list(self._probes)), self._left(5.0))
            except TimeoutError:
                log.warning("agent %s: probes still stopping at exit: %s", self.host, ", ".join(self._probes))
            if self.mirror is not None:
                self.mirror.cancel_pending()
            if self.clock_responder is not None:
                self.clock_responder.close()
                self.clock_responder = None

    async def _start_clock_responder(self) -> None:
        """On the address this host reaches the broker from (its management network), where the controller
        can reach it too; without one (no route, the port taken) clock pings go through the broker."""
        if self.clock_responder is not None or self.broker.clock_exchange != "udp":
            return
        try:
            bind = local_address_towards(self.broker.hostname, self.broker.port)
            self.clock_responder = await ClockResponder.start(
                bind,
                self.broker.lab,
                self.host,
                self.signer,
                self.now,
                self.rejections,
                port=self.broker.clock_udp_port,
            )
        except OSError as e:
            log.warning("agent %s: no UDP clock responder (%s): clock pings go via the broker", self.host, e)
        else:
            log.debug("agent %s: clock responder on %s", self.host, self.clock_responder.address)

    async def _session(self) -> None:
        status = self._topics["status"]
        online, offline = (
            self.signer.seal(status, status_body(state, self.incarnation)) for state in ("online", "offline")
        )
        will = aiomqtt.Will(status, offline, qos=1, retain=True)
        ident = f"labctl-agent-{self.broker.lab}-{self.host}-{secrets.token_hex(3)}"
        self._mqtt = self.broker.client(ident, will)
        if self.stopping:
            self._mqtt.timeout = self._left(0.3)
        try:
            await self._connected_session(self._mqtt, status, online, offline)
        finally:
            # A broker that dropped the connection after the session stopped listening (stopping, its
            # broker going away together with it) leaves aiomqtt's disconnect future failed and unread:
            # read here, or asyncio logs it as an error at exit.
            gone = getattr(self._mqtt, "_disconnected", None)
            if isinstance(gone, asyncio.Future) and gone.done() and not gone.cancelled():
                gone.exception()

    async def _connected_session(
        self, mqtt: aiomqtt.Client, status: str, online: bytes, offline: bytes
    ) -> None:
        async with mqtt as client:
            await self._start_clock_responder()
            await client.subscribe(self._topics["cmd"], qos=1)
            if self.mirrors_world:
                await client.subscribe(self._world, qos=1)
            await client.publish(status, online, qos=1, retain=True)
            self._client = client
            self.connected.set()
            # Where, never how: the broker's username, password and the signing key are not logged.
            log.info(
                "agent %s: connected to broker %s:%d%s",
                self.host,
                self.broker.hostname,
                self.broker.port,
                f" (reconnect {self.reconnects})" if self.reconnects else "",
                extra={
                    "host": self.host,
                    "broker": f"{self.broker.hostname}:{self.broker.port}",
                    "tls": self.broker.tls,
                    "reconnects": self.reconnects,
                    "incarnation": self.incarnation,
                },
            )
            try:
                async for message in client.messages:
                    t_rx = self.now()
                    await self._on_message(str(message.topic), message.payload, t_rx)
            except asyncio.CancelledError:
                # Stopping (SIGTERM, Ctrl-C) while connected: the probes' last samples and the replies on
                # their way go out before the client disconnects; nothing is left pending or unsent.
                await self._wind_down()
                raise
            finally:
                self._client = None
                self.connected.clear()
                if self.mirror is not None:
                    self.mirror.stale = True
                # A clean exit sends no last will: say `offline` ourselves so no stale `online` is retained.
                with contextlib.suppress(aiomqtt.MqttError, TimeoutError):
                    await asyncio.wait_for(
                        client.publish(status, offline, qos=1, retain=True), self._left(1.0) / 2
                    )
                if self.stopping:  # the disconnect waits for the broker at most what is left
                    client.timeout = self._left(0.3)

    async def _wind_down(self) -> None:
        """Stop the probes, publish everything they sampled, and let the replies in flight finish, within
        WIND_DOWN_S (a broker that stopped answering must not keep the agent from exiting)."""

        async def wind_down() -> None:
            await self._stop_probes(list(self._probes))
            await self.flush()
            if self._replying:
                await asyncio.wait(list(self._replying))

        try:
            # Within the stop budget, leaving some for the `offline` status and the disconnect.
            await asyncio.wait_for(wind_down(), max(0.01, self._left(WIND_DOWN_S + 0.4) - 0.4))
        except (TimeoutError, aiomqtt.MqttError) as e:
            log.warning("agent %s: stopping before its last events were acknowledged: %r", self.host, e)

    async def _publish(self, topic_name: str, body: bytes, *, retain: bool = False) -> bool:
        client = self._client
        if client is None:
            return False
        try:
            await client.publish(
                topic_name, self.signer.seal(topic_name, body), qos=1, retain=retain, timeout=5
            )
        except aiomqtt.MqttError:
            return False
        return True

    # -- events out ---------------------------------------------------------------------------------------
    async def _pump(self, probe: Probe) -> None:
        loop = asyncio.get_running_loop()
        async for event in probe.events():
            if len(self._outbox) >= OUTBOX_MAX:
                self._outbox.popleft()
                self._outbox_dropped += 1
            self._outbox.append(event)
            if not self._send_soon:
                # Everything queued by the end of this loop turn goes as one batch, and at most one batch
                # per BATCH_GAP_NS.
                self._send_soon = True
                wait_ns = self._last_send_ns + BATCH_GAP_NS - now_ns()
                if wait_ns > 0:
                    loop.call_later(wait_ns / 1e9, self._send)
                else:
                    loop.call_soon(self._send)

    def _send(self) -> None:
        """Hand every queued event to the client now, in batches, without waiting for the broker to
        acknowledge earlier ones (a wait for each PUBACK, or a fixed batching interval, would hold every
        sample a broker round trip or more). Tasks start in order and each hands its packet to the client
        on its first step, so batches leave in sequence order."""
        self._send_soon = False
        self._last_send_ns = now_ns()
        while self._outbox:
            events = [self._outbox.popleft() for _ in range(min(BATCH_MAX, len(self._outbox)))]
            lag = self.mirror_lag_ns
            for e in events:
                if self.clock.synthetic or lag:
                    # From the mirror's lagging frame back onto the model's time (decision 0046), and onto
                    # this host's clock where it has its own (tests).
                    shift_stamps(e, self.clock.local(e.t_ns - lag) - e.t_ns)
                e.host = self.host
            batch = Batch(
                host=self.host, seq=self.seq, n0=self.sent_events, dropped=self.dropped, events=events
            )
            self.seq += 1
            self.sent_events += len(events)
            task = asyncio.create_task(self._publish_batch(_enc.encode(batch)))
            self._sending.add(task)
            task.add_done_callback(self._sending.discard)

    async def _publish_batch(self, body: bytes) -> bool:
        if not await self._publish(self._topics["events"], body):
            self.lost_batches += 1
            return False
        return True

    async def flush(self) -> None:
        """Send what is queued and wait until the broker has acknowledged every batch sent so far (or the
        send failed: then counted lost)."""
        self._send()
        if self._sending:
            await asyncio.wait(list(self._sending))

    async def _stop_probes(self, names: list[str]) -> dict[str, Any]:
        """Stop these probes; what each did (its `stats()`: samples/s per port, drops, ...), by name."""
        stats: dict[str, Any] = {}
        stopped: list[str] = []
        for name in names:
            probe = self._probes.pop(name, None)
            if probe is None:
                continue
            await probe.__aexit__(None, None, None)
            pump = self._pumps.pop(name)
            await pump  # ends once the probe's queue is closed and drained
            stopped.append(name)
            probe_stats = getattr(probe, "stats", None)
            if probe_stats is not None:
                stats[name] = probe_stats()
        if stopped:
            log.info(
                "agent %s: probes stopped: %s",
                self.host,
                ", ".join(stopped),
                extra={"host": self.host, "probes": stopped, "events_sent": self.sent_events},
            )
        return stats

    # -- messages in (each command's handler: labctl.agents.agent_commands) -------------------------------
    async def _on_message(self, topic_name: str, payload: Any, t_rx: int) -> None:
        try:
            if not isinstance(payload, bytes):
                raise Rejected("malformed", "payload is not bytes")
            sealed = self.signer.open_sealed(topic_name, payload)
            if (
                sealed.signer != CONTROLLER and self.signer.keyed
            ):  # this host's key, signing as someone else than the controller
                raise Rejected("forged", f"signed as {sealed.signer!r}, not by the controller")
            self.replays.check(topic_name, sealed)
            body = sealed.body
            if topic_name == self._world:
                try:
                    world = decode(World, body)
                except msgspec.DecodeError as e:
                    raise Rejected("malformed", f"world: {e}") from None
                if self.mirror is None:  # no run started here yet: its `start` sends a snapshot
                    return
                if world.snapshot:
                    self.mirror.stale = False
                for item in world.items:
                    self.mirror.apply(
                        item, self.clock.raw(item.t_ns + self.world_offset_ns), snapshot=world.snapshot
                    )
                if world.through_ns is not None:  # after its items: the model is complete through it
                    self.mirror.confirm(self.clock.raw(world.through_ns + self.world_offset_ns))
                return
            if topic_name != self._topics["cmd"]:
                raise Rejected("unauthorised", f"unexpected topic {topic_name}")
            try:
                cmd = decode(Command, body)
            except msgspec.DecodeError as e:
                raise Rejected("malformed", f"command: {e}") from None
        except Rejected as r:
            self.rejections.add(r.kind, r.reason, topic_name)
            return
        await self._command(cmd, t_rx)
