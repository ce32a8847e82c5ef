"""`labctl agent`: one host's probes, streamed to the controller over MQTT."""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import functools
import logging
import os
import random
import secrets
import threading
import time
from collections import OrderedDict, deque
from collections.abc import Callable
from typing import Any, ClassVar, TypeVar

import aiomqtt
import msgspec
import numpy as np

from labctl.agents.broker import BrokerSettings, login_failure
from labctl.agents.clock import HostClock, clock_identity
from labctl.agents.clockping import ClockResponder, local_address_towards
from labctl.agents.inspect import inspect_host
from labctl.agents.wire import (
    ANNOUNCED,
    CONTROLLER,
    HAPPENS,
    WITHDRAWN,
    WORLD_KINDS,
    Batch,
    CircuitArgs,
    Command,
    LinkArgs,
    PingArgs,
    Rejected,
    Rejections,
    ReplayGuard,
    Reply,
    Signer,
    StartArgs,
    StopArgs,
    SwitchedArgs,
    WindowArgs,
    World,
    WorldItem,
    _enc,
    decode,
    shift_stamps,
    status_body,
    topic,
    world_topic,
)
from labctl.core.clock import now_ns
from labctl.core.errors import HardwareError, InputError, LabctlError
from labctl.core.events import Event
from labctl.inventory.profiles import Profile
from labctl.inventory.schema import Inventory, NicPort
from labctl.labs import kinds_with_agents, lab_kinds
from labctl.labs.base import ReconfigWindow
from labctl.linux.timesync import clock_sync_state
from labctl.models.fabric import SimFabric
from labctl.models.switch import SwitchModel
from labctl.models.timeline import Scheduled, Timeline
from labctl.nic.settings import (
    LinkSettingMismatch,
    LinkSettingUnsupported,
    PortRef,
    settings_from_json,
    settings_to_json,
    support_to_json,
)
from labctl.probes.base import probe_kinds
from labctl.probes.sampling import CircuitProbe, ModelSchedule, Probe, ProbeSettings

log = logging.getLogger("labctl.agents")
T = TypeVar("T")

BATCH_MAX = 512
BATCH_GAP_NS = 20_000_000
"""At most one event batch per this interval: a publish costs this host and the broker's ~0.1-0.5 ms of CPU
(a loopback send wakes the broker), and what is sampled is stamped when sampled: a batch 20 ms later moves
no mark, it only tells the controller of a recovery that much later (a mirror lags the model as much)."""
OUTBOX_MAX = 200_000
RECONNECT_MAX_S = 2.0  # agents retry a lost broker with backoff up to this
MIRROR_WAKE_NS = 4_000_000  # a lagging mirror's samplers wake this often (ModelSchedule.wake_ns)
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


# -- the agent's view of a simulated lab -----------------------------------------------------------------
class FabricMirror(SimFabric):
    """A `SimFabric` that does not compute link physics itself: the controller's model is the one truth
    (both ends of a link must agree on when it trains), and this copy replays its light and transitions at
    their model times, so the simulated probes on this host read the same lab as a one-process run.

    A switch change reaches a mirror up to three times (decision 0041): announced `feed_lead_ms` before its
    command goes out (mode ANNOUNCED), confirmed at its real model time when the switch model schedules it
    on the command's arrival (HAPPENS, ahead of the change on a quiet host), and again when it happens, with
    the settle time the model drew then. An announced loss is applied at its announced time (a local
    timer), not when a message arrives; a confirmation that gets here first moves it to the model's time,
    one that comes after it counts how early the mirror went dark (`early`: the command reached the model
    off its announced moment, usually by well under a sampling period). Returning light waits for its
    confirmation (applied at its model time, or on arrival if that is past), so a mirror does not show light
    before the model's switch could have moved it, for at most `wait_ns` (as late as the controller's
    recent commands came). Anything applied after its model time is counted
    (`late`, by how much). An item older than the light state already applied to a port is stale (a
    repeat, or overtaken) and ignored."""

    def __init__(
        self, inventory: Inventory, profile: Profile, rng: random.Random, *, lag_ns: int = 0
    ) -> None:
        dark = SwitchModel.many({name: s.space for name, s in inventory.switches.items()}, profile, rng)
        super().__init__(inventory, dark, profile, rng)
        self.by_source = {p.source: p for p in inventory.ports}
        self._light_t: dict[NicPort, int] = {}  # model time (local clock) of the light state applied per port
        self.lag_ns = lag_ns
        """How far this copy runs behind the model (decision 0046): an item of model time t is applied at
        t + lag on this host's clock, so a feed that took up to `lag_ns` to get here is still on time; the
        agent stamps what its probes saw `lag_ns` earlier, back on the model's time. With a lag, the copy
        is advanced only by its samplers, each at its tick's instant (`schedule`): a tick the host ran late
        still sees the copy as it was at that instant."""
        # Changes wait on a timeline that the readers catch up (`sync_optics`), so a sample taken at t sees
        # every change due by t even when the loop runs the timer late (or, lagging, has no timer at all).
        self._announced = Timeline(pull=lag_ns > 0)
        # Its samplers wake every few ms and read every instant due since (a wake-up per instant, per
        # agent, is what a host of many agents cannot afford); well within the lag.
        self.schedule = ModelSchedule(wake_ns=min(MIRROR_WAKE_NS, lag_ns // 4)) if lag_ns > 0 else None
        self._switch_timelines.append(self._announced)
        # Per direction ("back": light reaches a port, "lost"): changes applied at their model time
        # (announced ahead), and how late each of the others was applied.
        self.on_time = {"back": 0, "lost": 0}
        self.late_ns: dict[str, list[int]] = {"back": [], "lost": []}
        self.lead_ns: list[int] = []  # how far ahead of its model time each announced change arrived
        self.early_ns: dict[str, list[int]] = {"back": [], "lost": []}
        self.confirm_lead_ns: list[int] = []  # how far ahead of its model time each return was confirmed
        self._speculative: dict[NicPort, int] = {}  # a change applied at its announced time, per port
        self._held: dict[NicPort, str] = {}  # an announced return, until its command's confirmation
        self.stale = False
        """The world feed was cut (this agent lost the broker, whose clean session dropped what came
        meanwhile): until the controller's next snapshot, no ping gets through, rather than one through a
        link this copy no longer knows to be up (decision 0044's invariant)."""
        self._pending_light: dict[tuple[NicPort, str | None], Scheduled] = {}
        self.transitions = {"on_time": 0, "late": 0}  # link, carrier and transport changes
        self.transition_late_ns: list[int] = []
        self._pending_transitions: dict[tuple[NicPort, str], list[Scheduled]] = {}

    def _drop_pending(self, port: NicPort, kind: str) -> None:
        """Forget what was still to come for this port's signal (a snapshot supersedes it)."""
        if kind == "light":
            for key in [k for k in self._pending_light if k[0] == port]:
                self._pending_light.pop(key).cancel()
            self._held.pop(port, None)
        else:
            for entry in self._pending_transitions.pop((port, kind), []):
                entry.cancel()

    def apply(self, item: WorldItem, t_local_ns: int, *, snapshot: bool = False) -> None:
        """Apply one world item whose model time is `t_local_ns` on this host's clock: now if that is
        past, else at that time (an announced return: once confirmed). `snapshot`: the state at a run's
        start, not a change (never late)."""
        port = self.by_source.get(item.port)
        if port is None or item.kind not in WORLD_KINDS or item.mode not in (HAPPENS, ANNOUNCED, WITHDRAWN):
            raise Rejected(
                "malformed", f"world item for unknown port, kind {item.kind!r} or mode {item.mode}"
            )
        if item.peer is not None and item.peer not in self.by_source:
            raise Rejected("malformed", f"world item: light from unknown port {item.peer!r}")
        now = self.now()
        t_local_ns += self.lag_ns  # on this copy's clock (a snapshot's stamps too: its events shift back)
        if snapshot:
            self._drop_pending(port, item.kind)  # the snapshot is newer than anything still to come
        if item.kind != "light":
            value = 1 if item.value else 0
            if snapshot:
                self._transition(port, item.kind, value, t_local_ns)
            elif t_local_ns > now:  # on the timeline with the light, so a reader sees both in model order
                self.transitions["on_time"] += 1
                queued = self._pending_transitions.setdefault((port, item.kind), [])
                queued[:] = [e for e in queued if e.t_ns > now and not e.cancelled]  # (the rest ran)
                queued.append(
                    self._announced.at(t_local_ns, self._transition, port, item.kind, value, t_local_ns)
                )
            else:
                self.transitions["late"] += 1
                self.transition_late_ns.append(now - t_local_ns)
                self._transition(port, item.kind, value, t_local_ns)
            return
        if snapshot:  # the state as it is: at once, whatever this copy's clock says
            self._apply_light(port, item, t_local_ns)
            return
        direction = "lost" if item.peer is None else "back"
        if item.mode == WITHDRAWN:  # nothing announced for this port happens: its light is as given, now
            for key in [k for k in self._pending_light if k[0] == port]:
                self._pending_light.pop(key).cancel()
            self._held.pop(port, None)
            self._apply_light(port, item, max(t_local_ns, self._light_t.get(port, t_local_ns)))
            return
        if item.mode == ANNOUNCED:
            self.lead_ns.append(t_local_ns - now)
            if item.peer is not None:
                # Light coming back waits for its command's confirmation: were the command late (its
                # controller's loop busy at the announced moment), the announced time would show light
                # before the model's switch could have moved it. Not past `wait_ns`, though (as late as
                # the recent commands came): a confirmation later than that means a starved feed.
                self._held[port] = item.peer
                t_local_ns += max(0, item.wait_ns)
        else:
            if port in self._held and self._held[port] == item.peer:
                del self._held[port]
                self.confirm_lead_ns.append(t_local_ns - now)
            elif (port, item.peer) in self._pending_light:
                self.confirm_lead_ns.append(t_local_ns - now)
        key = (port, item.peer)
        pending = self._pending_light.pop(key, None)
        if pending is not None:
            pending.cancel()  # confirmed at its real time: this one holds
        if t_local_ns > now:
            self._pending_light[key] = self._announced.at(
                t_local_ns, self._apply_announced, port, item, t_local_ns, direction
            )
            return
        if self._apply_light(port, item, t_local_ns):
            self.late_ns[direction].append(now - t_local_ns)
            return
        applied = self._light_t.get(port)
        if applied is not None and applied < t_local_ns and self._speculative.get(port) == applied:
            # Confirmed after the speculative loss was applied: the mirror went dark this much before the
            # model did (the command reached the model that much after its announced moment).
            self.early_ns[direction].append(t_local_ns - applied)

    def at(self, t_ns: int, callback: Callable[[], None]) -> None:
        """Run `callback` when this copy reaches t_ns (on its own clock), in order with its changes."""
        self._announced.at(t_ns, callback)

    def now(self) -> int:
        """Where this copy stands: the instant its samplers last read it at (lagging), else the clock's
        now. A change due after it is still on time."""
        return self._announced.horizon_ns if self._announced.pull else now_ns()

    def _apply_announced(self, port: NicPort, item: WorldItem, t_local_ns: int, direction: str) -> None:
        self._pending_light.pop((port, item.peer), None)
        unconfirmed = item.mode == ANNOUNCED and item.peer is not None
        if unconfirmed:
            self._held.pop(port, None)
        if self._apply_light(port, item, t_local_ns):
            if unconfirmed:  # its confirmation did not come in time: applied that wait late
                self.late_ns[direction].append(max(0, item.wait_ns))
            else:
                self.on_time[direction] += 1
            if item.mode == ANNOUNCED:
                self._speculative[port] = t_local_ns  # as announced: the confirmation may say otherwise

    def _apply_light(self, port: NicPort, item: WorldItem, t_local_ns: int) -> bool:
        """Apply a light state at its model time; False if it was stale or changed nothing."""
        st = self.ports[port]
        last = self._light_t.get(port)
        if last is not None and t_local_ns < last:
            return False  # overtaken by a later change already applied
        peer = self.by_source[item.peer] if item.peer is not None else None
        if t_local_ns == last:  # the change itself, again: now with the settle time the model drew
            st.settle_ns = item.settle_ns
            st.rx_level_dbm = item.level_dbm
            return False
        if st.light_from == peer and last is not None:
            return False  # no change (the model ignores a patch that leaves a port's light as it was)
        st.light_from = peer
        st.light_t_ns = t_local_ns
        st.settle_ns = item.settle_ns
        st.rx_level_dbm = item.level_dbm
        self._light_t[port] = t_local_ns
        return True

    def traffic_ok(self, slots: np.ndarray, peer_slots: np.ndarray, t_ns: int | None = None) -> np.ndarray:
        if self.stale:  # the feed was cut: nothing says these links are still up
            return np.zeros(slots.size, bool)
        return super().traffic_ok(slots, peer_slots, t_ns)

    def passes(self, slot: int, peer_slot: int, t_ns: int) -> bool:
        return not self.stale and super().passes(slot, peer_slot, t_ns)

    def passes_each(self, pairs: list[tuple[int, int]], t_ns: int) -> list[bool]:
        if self.stale:
            self.sync_optics(t_ns)
            return [False] * len(pairs)
        return super().passes_each(pairs, t_ns)

    def cancel_pending(self) -> None:
        super().cancel_pending()
        self._announced.cancel_all()
        self._pending_light.clear()
        self._pending_transitions.clear()
        self._held.clear()

    def stats(self) -> dict[str, int]:
        """How the world feed kept up, per direction: light changes applied at their model time, and how
        many were applied late (after a broker hop), by how much (median, max). The light coming back is
        what the optical mark measures: that many of its samples saw it late by that much."""
        out: dict[str, int] = {}
        for name, values in (("lead", self.lead_ns), ("confirm_lead", self.confirm_lead_ns)):
            if values:
                ordered = sorted(values)
                out[f"{name}_min_ns"] = ordered[0]
                out[f"{name}_median_ns"] = ordered[len(ordered) // 2]
        out["lag_ns"] = self.lag_ns
        out["transitions_on_time"] = self.transitions["on_time"]
        out["transitions_late"] = self.transitions["late"]
        if self.transition_late_ns:
            out["transitions_late_max_ns"] = max(self.transition_late_ns)
        for direction, on_time in self.on_time.items():
            late = sorted(self.late_ns[direction])
            out[f"light_{direction}_on_time"] = on_time
            out[f"light_{direction}_late"] = len(late)
            early = self.early_ns[direction]
            out[f"light_{direction}_early"] = len(early)
            if early:
                out[f"light_{direction}_early_max_ns"] = max(early)
            if late:
                out[f"light_{direction}_late_median_ns"] = late[len(late) // 2]
                out[f"light_{direction}_late_max_ns"] = late[-1]
        return out


# -- the agent -------------------------------------------------------------------------------------------
class Agent:
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

    # -- commands in --------------------------------------------------------------------------------------
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

    async def _command(self, cmd: Command, t_rx: int) -> None:
        handler = self.COMMANDS.get(cmd.op)
        if handler is not None:  # (one not allowed is logged as a rejection)
            # Clock pings come several a second while a run goes: at debug; the other commands (a few per
            # reconfiguration) at info. The operation and its id only: a start's arguments are its settings.
            (log.debug if cmd.op == "ping" else log.info)(
                "agent %s: command %s (id %d)",
                self.host,
                cmd.op,
                cmd.id,
                extra={"host": self.host, "op": cmd.op, "cmd_id": cmd.id},
            )
        if handler is None:
            self.rejections.add("unauthorised", f"command {cmd.op!r} is not allowed", self._topics["cmd"])
            reply = Reply(host=self.host, id=cmd.id, op=cmd.op, ok=False, error="command not allowed")
        elif cmd.id in self._handled:  # QoS 1 may deliver twice: answer again, act once
            reply = self._handled[cmd.id]
        else:
            async with self._cmd_lock:
                try:
                    reply = await handler(self, cmd, t_rx)
                except Rejected as r:
                    self.rejections.add(r.kind, f"{cmd.op}: {r.reason}", self._topics["cmd"])
                    reply = Reply(host=self.host, id=cmd.id, op=cmd.op, ok=False, error=r.reason)
                except Exception as e:  # a failing command must not take the agent down
                    log.exception("agent %s: %s failed", self.host, cmd.op)
                    reply = Reply(
                        host=self.host, id=cmd.id, op=cmd.op, ok=False, error=f"{cmd.op} failed: {e!r}"
                    )
            self._handled[cmd.id] = reply
            while len(self._handled) > 256:
                self._handled.popitem(last=False)
        reply.incarnation = self.incarnation
        if cmd.op == "ping" and reply.ok:
            # What the controller needs to tell a shared clock (boot id, time namespace) and to use the
            # hosts' clock daemons (this clock and CLOCK_REALTIME read together), with the pong's t3.
            real = time.time_ns()
            reply.t3 = self.now()
            reply.data = {"clock": {**self._identity, "mono_ns": reply.t3, "real_ns": real}}
            if self.clock_responder is not None and self.clock_responder.address is not None:
                reply.data["clock_udp"] = list(self.clock_responder.address)
        # Not awaited here: the message loop must not wait for the broker's PUBACK of a reply.
        task = asyncio.create_task(self._publish(self._topics["reply"], _enc.encode(reply)))
        self._replying.add(task)
        task.add_done_callback(self._replying.discard)

    def _args(self, kind: type[Any], cmd: Command) -> Any:
        try:
            return msgspec.convert(cmd.args, kind)
        except msgspec.ValidationError as e:
            raise Rejected("malformed", f"bad arguments: {e}") from None

    async def _cmd_ping(self, cmd: Command, t_rx: int) -> Reply:
        self._args(PingArgs, cmd)
        return Reply(host=self.host, id=cmd.id, op=cmd.op, ok=True, t2=t_rx)

    async def _cmd_start(self, cmd: Command, t_rx: int) -> Reply:
        args: StartArgs = self._args(StartArgs, cmd)
        unknown = sorted(set(args.probes) - set(self.allowed_probes))
        if unknown or not args.probes:
            raise Rejected(
                "malformed", f"probes {unknown} are not run here (allowed: {', '.join(self.allowed_probes)})"
            )
        try:
            settings = ProbeSettings.model_validate(args.settings)
            profile = Profile.model_validate(args.profile)
        except ValueError as e:
            raise Rejected("malformed", f"bad settings or profile: {str(e).splitlines()[0]}") from None
        await self._stop_probes(list(self._probes))
        await self.flush()  # whatever an earlier run left goes out first: this run's stream starts after it
        seq0, n0 = self.seq, self.sent_events
        if self.mirror is not None:
            self.mirror.cancel_pending()
        self.mirror_lag_ns = max(0, args.mirror_lag_ns) if self.mirrors_world else 0
        if self.mirrors_world:
            self.mirror = FabricMirror(
                self.inventory, profile, random.Random(args.seed), lag_ns=self.mirror_lag_ns
            )
        self.world_offset_ns = args.world_offset_ns
        # This host's probes, built from the registry where its lab kind says they look (the mirror of the
        # controller's model, or the host's own interfaces).
        ctx = self.agent_context(self.inventory, self.host, settings, self.mirror)
        probes = {name: probe_kinds.get(name).build(ctx) for name in sorted(set(args.probes))}
        for name, probe in probes.items():
            await probe.__aenter__()
            self._probes[name] = probe
            self._pumps[name] = asyncio.create_task(self._pump(probe), name=f"agent:{self.host}:{name}")
        log.info(
            "agent %s: probes started: %s",
            self.host,
            ", ".join(probes),
            extra={"host": self.host, "probes": list(probes), "cmd_id": cmd.id, "seed": args.seed},
        )
        sync = await asyncio.to_thread(clock_sync_state)
        return Reply(host=self.host, id=cmd.id, op=cmd.op, ok=True, seq=seq0, n=n0, data={"time_sync": sync})

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

    async def _cmd_stop(self, cmd: Command, t_rx: int) -> Reply:
        args: StopArgs = self._args(StopArgs, cmd)
        names = list(self._probes) if args.probes is None else args.probes
        if set(names) - set(self.allowed_probes):
            raise Rejected(
                "malformed", f"probes {sorted(set(names) - set(self.allowed_probes))} are not run here"
            )
        if self.mirror_lag_ns and self._probes:
            # The mirror's probes sample the model `lag` behind it: let them reach the moment of this stop
            # (and the commands received before it take effect) before they end.
            await asyncio.sleep(self.mirror_lag_ns / 1e9)
        stats = await self._stop_probes(names)
        await self.flush()  # everything sampled so far goes out before the reply that counts it
        # By probe name; and what this agent refused so far (run.json agents.agent_rejected.<host>).
        data: dict[str, Any] = {"probes": stats, "rejected": self.rejections.as_dict()}
        if self.mirror is not None:
            data["world"] = self.mirror.stats()
        return Reply(
            host=self.host, id=cmd.id, op=cmd.op, ok=True, seq=self.seq, n=self.sent_events, data=data
        )

    async def _cmd_set_circuits(self, cmd: Command, t_rx: int) -> Reply:
        args: CircuitArgs = self._args(CircuitArgs, cmd)
        for source, peer in args.circuits.items():
            if source not in self.sources:
                raise Rejected("unauthorised", f"{source} is not a port of {self.host}")
            if peer is not None and peer not in self.all_sources:
                raise Rejected("malformed", f"unknown peer port {peer}")

        def act() -> None:
            for probe in self._probes.values():
                if isinstance(probe, CircuitProbe):
                    probe.set_circuits(args.circuits)

        self._after_lag(act, t_rx)
        return Reply(host=self.host, id=cmd.id, op=cmd.op, ok=True)

    async def _cmd_window(self, cmd: Command, t_rx: int) -> Reply:
        """The controller's reconfiguration window, for the probes that sample harder inside one."""
        args: WindowArgs = self._args(WindowArgs, cmd)
        if args.open is not None and set(args.open) - self.sources:
            raise Rejected("unauthorised", f"window names ports not on {self.host}")

        def act() -> None:
            for probe in self._probes.values():
                if isinstance(probe, ReconfigWindow):
                    if args.open is None:
                        probe.close_window()
                    else:
                        probe.open_window(args.open)

        self._after_lag(act, t_rx)
        return Reply(host=self.host, id=cmd.id, op=cmd.op, ok=True)

    async def _cmd_switched(self, cmd: Command, t_rx: int) -> Reply:
        """The switch acknowledged moving these ports' light: for the probes that act on it (the Rx-power
        poller reports each port's next sample), as the controller tells its own probes."""
        args: SwitchedArgs = self._args(SwitchedArgs, cmd)
        if set(args.sources) - self.sources:
            raise Rejected("unauthorised", f"switched names ports not on {self.host}")

        def act() -> None:
            for probe in self._probes.values():
                switched = getattr(probe, "switched", None)
                if callable(switched):
                    switched(args.sources)

        self._after_lag(act, t_rx)
        return Reply(host=self.host, id=cmd.id, op=cmd.op, ok=True)

    def _after_lag(self, act: Callable[[], None], t_rx: int) -> None:
        """Run a command's effect on the probes where this host's probes are in time: at once, or, for a
        mirror running `lag` behind the model, on the mirror's timeline `lag` after it arrived, so that a
        circuit, window or switch notice reaches the samplers at the same point of the model's time as
        the light it goes with (in order with it, however late the host runs the samplers)."""
        if self.mirror is None or not self.mirror.lag_ns:
            act()
            return
        self.mirror.at(self.clock.raw(t_rx) + self.mirror.lag_ns, act)

    async def _cmd_inspect(self, cmd: Command, t_rx: int) -> Reply:
        """Read-only facts about this host's ports, for `labctl lab check` (labctl.agents.inspect)."""
        if cmd.args:
            raise Rejected("malformed", "inspect takes no arguments")
        data = await asyncio.to_thread(inspect_host, self.ports)
        return Reply(host=self.host, id=cmd.id, op=cmd.op, ok=True, data=data)

    async def _cmd_link(self, cmd: Command, t_rx: int) -> Reply:
        """One of this host's ports' link settings: what it supports, what it holds, or set (read back and
        verified by the local LinkControl). A port or setting it refuses is an answer (`data.refusal`:
        unsupported, mismatch, failed), not a rejection: the controller raises it as a local one would."""
        args: LinkArgs = self._args(LinkArgs, cmd)
        if args.port not in {p.ifname for p in self.ports}:
            raise Rejected("unauthorised", f"{args.port} is not a port of {self.host}")
        if (args.op == "apply") != (args.settings is not None):
            raise Rejected("malformed", "settings go with apply, and only with it")
        control = self.link_control
        if control is None:
            raise Rejected("malformed", f"a {self.inventory.kind} lab's agent sets no link settings")
        port = PortRef(self.host, args.port)
        data: dict[str, Any]
        try:
            if args.op == "support":
                data = {"support": support_to_json(await control.support(port))}
            elif args.op == "read":
                data = {"settings": settings_to_json(await control.read(port))}
            else:
                want = settings_from_json(msgspec.to_builtins(args.settings))
                data = {"settings": settings_to_json(await control.apply(port, want))}
        except LabctlError as e:
            if isinstance(e, LinkSettingUnsupported):
                data = {"refusal": "unsupported", "why": e.why}
            elif isinstance(e, LinkSettingMismatch):
                data = {"refusal": "mismatch", "differences": e.differences}
            else:
                data = {"refusal": "failed"}
            log.warning("agent %s: link %s %s: %s", self.host, args.op, args.port, e)
            return Reply(host=self.host, id=cmd.id, op=cmd.op, ok=False, error=str(e), data=data)
        return Reply(host=self.host, id=cmd.id, op=cmd.op, ok=True, data=data)

    COMMANDS: ClassVar[dict[str, Callable[[Agent, Command, int], Any]]] = {
        "ping": _cmd_ping,
        "start": _cmd_start,
        "stop": _cmd_stop,
        "set_circuits": _cmd_set_circuits,
        "window": _cmd_window,
        "switched": _cmd_switched,
        "inspect": _cmd_inspect,
        "link": _cmd_link,
    }
