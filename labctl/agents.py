"""Host agents over MQTT: `labctl agent` runs one host's probes and streams their events to the controller.

Topics (`<lab>` and `<host>` from the inventory):
- `labctl/<lab>/<host>/events`  agent → controller: batches of events, QoS 1, one sequence number per
  batch plus the count of events before it, so lost batches *and* lost events are counted;
- `labctl/<lab>/<host>/cmd`     controller → agent: an allow-list of commands with validated arguments
  (`start`/`stop` named probes, `set_circuits`, `ping` for the clock offset); never a shell;
- `labctl/<lab>/<host>/reply`   agent → controller: one reply per command;
- `labctl/<lab>/<host>/status`  retained `online`, and `offline` as the agent's last will;
- `labctl/<lab>/_world`         controller → agents, simulated labs only: the switch's light and the NIC
  link transitions of the one behavioural model of the lab (decision 0017).
Every payload is `MAC BODY`: MAC is HMAC-SHA256 over topic and body with the inventory's
`broker.auth_key` (`-` without a key). Messages that do not decode or validate are *malformed*; a bad
MAC, an unknown host, or a batch carrying events of another host's ports are *unauthorised*; both are
dropped and counted, never acted on.

Clock: the controller measures each agent's offset (agent clock − controller clock) with timestamped
ping/pong over the broker, keeps the lowest-RTT samples (their offsets' median; uncertainty = half the
largest kept RTT, a strict bound), at run start, every `clock_sync_interval_s` and at run end (so every
run brackets its drift, however short), shifts agent stamps onto the run timebase, and writes every
estimate to run.json `clock_offsets`.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import hashlib
import hmac
import logging
import os
import random
import re
import secrets
import socket
import statistics
from collections import Counter, OrderedDict, deque
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from types import TracebackType
from typing import Any, ClassVar, Self
from urllib.parse import urlsplit

import aiomqtt
import msgspec

from labctl.clock import now_ns
from labctl.errors import HardwareError, InputError
from labctl.events import Event, EventQueue
from labctl.experiment import ProbeSettings
from labctl.inventory import Inventory, NicPort, Secret
from labctl.labs.base import Lab, LabContext
from labctl.models.fabric import SimFabric
from labctl.models.switch import SwitchModel
from labctl.profiles import Profile
from labctl.sampling import QueueProbe

log = logging.getLogger("labctl.agents")

PROBE_NAMES = ("link", "rx_power", "traffic")
WORLD_KINDS = frozenset({"light", "link.firmware", "carrier", "transport"})
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")
BATCH_INTERVAL_S = 0.005
BATCH_MAX = 512
OUTBOX_MAX = 200_000
RECONNECT_MAX_S = 2.0  # agents retry a lost broker with backoff up to this


# -- wire format -----------------------------------------------------------------------------------------
class Batch(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    host: str
    seq: int
    n0: int  # events this agent had sent (or tried to) before this batch
    dropped: int  # the agent's own sampler drops so far
    events: list[Event]


class Command(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    id: int
    op: str
    args: dict[str, Any] = {}


class Reply(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    host: str
    id: int
    op: str
    ok: bool
    error: str | None = None
    t2: int | None = None
    t3: int | None = None
    seq: int | None = None  # batches sent so far
    n: int | None = None  # events sent so far


class StartArgs(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    probes: list[str]
    settings: dict[str, Any]
    profile: dict[str, Any]
    seed: int
    world_offset_ns: int = 0


class StopArgs(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    probes: list[str] | None = None


class CircuitArgs(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    circuits: dict[str, str | None]


class PingArgs(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    t1: int


class WorldItem(msgspec.Struct, array_like=True):
    kind: str
    port: str
    t_ns: int
    value: int = 0
    peer: str | None = None
    settle_ns: int = 0
    level_dbm: float = 0.0


class World(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    items: list[WorldItem]


_enc = msgspec.json.Encoder()
_DECODERS: dict[type[Any], Any] = {
    t: msgspec.json.Decoder(t)
    for t in (Batch, Command, Reply, World, StartArgs, StopArgs, CircuitArgs, PingArgs)
}


def decode(kind: type[Any], body: bytes) -> Any:
    return _DECODERS[kind].decode(body)


def topic(lab: str, host: str, leaf: str) -> str:
    return f"labctl/{lab}/{host}/{leaf}"


def world_topic(lab: str) -> str:
    return f"labctl/{lab}/_world"


class Rejected(Exception):
    def __init__(self, kind: str, reason: str) -> None:
        super().__init__(reason)
        self.kind = kind  # "malformed" | "unauthorised"
        self.reason = reason


class Signer:
    """HMAC-SHA256 over topic and body; binding the topic stops a message being replayed onto another
    host's topic. Without a key nothing is signed and nothing can be checked (the inventory decides)."""

    def __init__(self, key: Secret | None) -> None:
        self._key = key.reveal().encode() if key is not None else None

    def _mac(self, topic_name: str, body: bytes) -> bytes:
        assert self._key is not None
        return hmac.new(self._key, topic_name.encode() + b"\0" + body, hashlib.sha256).hexdigest().encode()

    def seal(self, topic_name: str, body: bytes) -> bytes:
        mac = self._mac(topic_name, body) if self._key is not None else b"-"
        return mac + b" " + body

    def open(self, topic_name: str, payload: bytes) -> bytes:
        mac, sep, body = payload.partition(b" ")
        if not sep:
            raise Rejected("malformed", "no MAC field")
        if self._key is not None and not hmac.compare_digest(mac, self._mac(topic_name, body)):
            raise Rejected("unauthorised", "bad MAC")
        return body


@dataclass
class Rejections:
    """Messages dropped on receipt, by class and reason."""

    malformed: int = 0
    unauthorised: int = 0
    reasons: Counter[str] = field(default_factory=Counter)

    def add(self, kind: str, reason: str, where: str) -> None:
        if kind == "unauthorised":
            self.unauthorised += 1
        else:
            self.malformed += 1
        self.reasons[f"{kind}: {reason}"] += 1
        if self.reasons[f"{kind}: {reason}"] == 1:  # the first of each kind is logged; all are counted
            log.warning("rejected %s message on %s: %s", kind, where, reason)

    def as_dict(self) -> dict[str, Any]:
        return {"malformed": self.malformed, "unauthorised": self.unauthorised, "reasons": dict(self.reasons)}


# -- broker connection -----------------------------------------------------------------------------------
@dataclass(frozen=True)
class BrokerSettings:
    """Resolved connection settings. Secrets stay `Secret` until the client is built."""

    lab: str
    hostname: str
    port: int
    tls: bool
    username: Secret | None = None
    password: Secret | None = None
    ca_file: str | None = None
    cert_file: str | None = None
    key_file: str | None = None
    auth_key: Secret | None = None
    clock_sync_interval_s: float = 10.0
    clock_samples: int = 16

    @classmethod
    def from_inventory(cls, inventory: Inventory, url: str | None = None) -> BrokerSettings:
        spec = inventory.model.broker
        url = url or (spec.url if spec is not None else None)
        if url is None:
            raise InputError(f"{inventory.path}: no `broker:` section and no --broker URL")
        parts = urlsplit(url)
        try:
            port = parts.port
        except ValueError as e:
            raise InputError(f"--broker {url!r}: {e}") from None
        if parts.scheme not in ("mqtt", "mqtts") or not parts.hostname:
            raise InputError(f"--broker {url!r}: use mqtt://HOST:PORT or mqtts://HOST:PORT")
        for name in (inventory.lab, *inventory.hosts):
            if not _NAME.match(name):
                raise InputError(
                    f"{inventory.path}: {name!r} cannot be part of an MQTT topic (use [A-Za-z0-9_.-])"
                )
        tls = parts.scheme == "mqtts" or (spec is not None and spec.tls is not None)
        where = "the inventory's broker section"
        return cls(
            lab=inventory.lab,
            hostname=parts.hostname,
            port=port or (8883 if tls else 1883),
            tls=tls,
            username=spec.username.resolve(where) if spec and spec.username else None,
            password=spec.password.resolve(where) if spec and spec.password else None,
            ca_file=spec.tls.ca_file if spec and spec.tls else None,
            cert_file=spec.tls.cert_file if spec and spec.tls else None,
            key_file=spec.tls.key_file if spec and spec.tls else None,
            auth_key=spec.auth_key.resolve(where) if spec and spec.auth_key else None,
            clock_sync_interval_s=spec.clock_sync_interval_s if spec else 10.0,
            clock_samples=spec.clock_samples if spec else 16,
        )

    def client(self, identifier: str, will: aiomqtt.Will | None = None) -> aiomqtt.Client:
        tls_params = (
            aiomqtt.TLSParameters(ca_certs=self.ca_file, certfile=self.cert_file, keyfile=self.key_file)
            if self.tls
            else None
        )
        return aiomqtt.Client(
            self.hostname,
            self.port,
            username=self.username.reveal() if self.username else None,
            password=self.password.reveal() if self.password else None,
            identifier=identifier,
            will=will,
            clean_session=True,
            tls_params=tls_params,
            keepalive=5,
            timeout=5,
            # Small messages both ways (ping/pong, commands): Nagle + delayed ACK would add ~40 ms each.
            socket_options=[(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)],
        )


# -- clock offset ----------------------------------------------------------------------------------------
@dataclass(frozen=True)
class OffsetSample:
    """One ping/pong: t1 sent and t4 received on the controller clock, t2/t3 on the agent clock."""

    t1: int
    t2: int
    t3: int
    t4: int

    @property
    def rtt_ns(self) -> int:
        return (self.t4 - self.t1) - (self.t3 - self.t2)

    @property
    def offset_ns(self) -> int:
        return ((self.t2 - self.t1) + (self.t3 - self.t4)) // 2


@dataclass(frozen=True)
class OffsetEstimate:
    offset_ns: int  # agent clock − controller clock
    uncertainty_ns: int  # the true offset lies within ± this, if each leg took ≥ 0
    rtt_min_ns: int
    rtt_median_ns: int
    samples: int
    kept: int
    measured_at_ns: int

    def as_dict(self) -> dict[str, int]:
        return {k: int(v) for k, v in self.__dict__.items()}


def estimate_offset(samples: list[OffsetSample], keep_fraction: float = 0.25) -> OffsetEstimate:
    """Keep the lowest-RTT quarter (at least 3): queueing delay only ever adds to an RTT, so the fastest
    round trips are the most symmetric. Each sample bounds the offset to ± RTT/2; the median of the kept
    offsets is within half the largest kept RTT of the truth."""
    if not samples:
        raise HardwareError("clock offset: no ping/pong sample came back")
    ranked = sorted(samples, key=lambda s: s.rtt_ns)
    kept = ranked[: max(3, round(len(ranked) * keep_fraction))]
    return OffsetEstimate(
        offset_ns=int(statistics.median(s.offset_ns for s in kept)),
        uncertainty_ns=max(s.rtt_ns for s in kept) // 2 + 1,
        rtt_min_ns=ranked[0].rtt_ns,
        rtt_median_ns=int(statistics.median(s.rtt_ns for s in ranked)),
        samples=len(samples),
        kept=len(kept),
        measured_at_ns=samples[-1].t4,
    )


# -- the agent's view of a simulated lab -----------------------------------------------------------------
class FabricMirror(SimFabric):
    """A `SimFabric` that does not compute link physics itself: the controller's model is the one truth
    (both ends of a link must agree on when it trains), and this copy replays its light and transitions at
    their model times, so the simulated probes on this host read the same lab as a one-process run."""

    def __init__(self, inventory: Inventory, profile: Profile, rng: random.Random) -> None:
        dark = {
            name: SwitchModel(name, spec.space, profile, rng) for name, spec in inventory.switches.items()
        }
        super().__init__(inventory, dark, profile, rng)
        self.by_source = {p.source: p for p in inventory.ports}

    def apply(self, item: WorldItem, t_local_ns: int) -> None:
        port = self.by_source.get(item.port)
        if port is None or item.kind not in WORLD_KINDS:
            raise Rejected("malformed", f"world item for unknown port or kind {item.kind!r}")
        if item.kind == "light":
            st = self.ports[port]
            st.light_from = self.by_source.get(item.peer) if item.peer is not None else None
            st.light_t_ns = t_local_ns
            st.settle_ns = item.settle_ns
            st.rx_level_dbm = item.level_dbm
        else:
            self._transition(port, item.kind, 1 if item.value else 0, t_local_ns)


def host_probes(
    fabric: SimFabric, ports: list[NicPort], peers: list[NicPort], settings: ProbeSettings, names: list[str]
) -> dict[str, QueueProbe]:
    """This host's simulated probes. The traffic probe knows every port as a possible peer, but only
    pings from the ports `set_circuits` gives it, which are this host's."""
    from labctl.models.probes import SimLinkProbe, SimRxPowerProbe, SimTrafficProbe

    report_ns = round(settings.report_interval_ms * 1e6)
    make: dict[str, Callable[[], QueueProbe]] = {
        "link": lambda: SimLinkProbe(fabric, ports),
        "rx_power": lambda: SimRxPowerProbe(
            fabric,
            ports,
            hz=settings.rx_power_hz,
            deadband_db=settings.rx_power_deadband_db,
            report_interval_ns=report_ns,
        ),
        "traffic": lambda: SimTrafficProbe(
            fabric,
            peers,
            interval_us=settings.traffic_interval_us,
            timeout_us=settings.traffic_timeout_us,
            report_interval_ns=report_ns,
        ),
    }
    return {name: make[name]() for name in names}


# -- the agent -------------------------------------------------------------------------------------------
class Agent:
    """One host's agent. `skew_ns` shifts this agent's clock (tests and bench: a host whose monotonic
    clock disagrees with the controller's, on one machine)."""

    def __init__(
        self,
        inventory: Inventory,
        host: str,
        broker: BrokerSettings,
        *,
        skew_ns: int = 0,
        reconnect_s: float = 0.2,
    ) -> None:
        if host not in inventory.model.hosts:
            raise InputError(
                f"--host {host!r}: not a host of {inventory.path} (known: {', '.join(inventory.hosts)})"
            )
        drivers = {s.driver for s in inventory.switches.values()}
        if drivers != {"sim"}:
            raise InputError(
                f"{inventory.path}: agents in this version run simulated probes only (switch drivers "
                f"{sorted(drivers)}); real-NIC agent probes are not available yet"
            )
        self.inventory = inventory
        self.host = host
        self.broker = broker
        self.skew_ns = skew_ns
        self.reconnect_s = reconnect_s
        self.ports = [p for p in inventory.ports if p.host == host]
        self.sources = {p.source for p in self.ports}
        self.all_sources = {p.source for p in inventory.ports}
        self.signer = Signer(broker.auth_key)
        self.rejections = Rejections()
        self.mirror = FabricMirror(inventory, inventory.profile(), random.Random())
        self.world_offset_ns = 0
        self.seq = 0  # batches sent (or lost trying)
        self.sent_events = 0
        self.lost_batches = 0  # publish failed (broker away): the controller sees the gap
        self.reconnects = 0
        self.connected = asyncio.Event()
        self._client: aiomqtt.Client | None = None
        self._outbox: deque[Event] = deque()
        self._outbox_dropped = 0
        self._probes: dict[str, QueueProbe] = {}
        self._pumps: dict[str, asyncio.Task[None]] = {}
        self._handled: OrderedDict[int, Reply] = OrderedDict()
        self._cmd_lock = asyncio.Lock()
        self._replying: set[asyncio.Task[bool]] = set()
        self._topics = {leaf: topic(broker.lab, host, leaf) for leaf in ("events", "cmd", "reply", "status")}
        self._world = world_topic(broker.lab)

    def now(self) -> int:
        return now_ns() + self.skew_ns

    @property
    def dropped(self) -> int:
        return self._outbox_dropped + sum(p.dropped for p in self._probes.values())

    # -- main loop ----------------------------------------------------------------------------------------
    async def run(self) -> None:
        """Connect, and reconnect whenever the broker goes away, until cancelled; probes keep sampling."""
        flusher = asyncio.create_task(self._flusher(), name=f"agent:{self.host}:flush")
        try:
            delay = self.reconnect_s
            while True:
                started = now_ns()
                try:
                    await self._session()
                except aiomqtt.MqttError as e:
                    # Once per outage at warning level; the retries of a long outage only at debug.
                    (log.warning if delay == self.reconnect_s else log.debug)(
                        "agent %s: broker connection lost: %s", self.host, e
                    )
                self.reconnects += 1
                if now_ns() - started > 5_000_000_000:  # that session was up for a while: a new outage
                    delay = self.reconnect_s
                await asyncio.sleep(delay)
                delay = min(delay * 2, RECONNECT_MAX_S)
        finally:
            flusher.cancel()
            for t in self._replying:
                t.cancel()
            await asyncio.gather(flusher, *self._replying, return_exceptions=True)
            await self._stop_probes(list(self._probes))

    async def _session(self) -> None:
        status = self._topics["status"]
        will = aiomqtt.Will(status, self.signer.seal(status, b"offline"), qos=1, retain=True)
        ident = f"labctl-agent-{self.broker.lab}-{self.host}-{secrets.token_hex(3)}"
        async with self.broker.client(ident, will) as client:
            await client.subscribe(self._topics["cmd"], qos=1)
            await client.subscribe(self._world, qos=1)
            await client.publish(status, self.signer.seal(status, b"online"), qos=1, retain=True)
            self._client = client
            self.connected.set()
            try:
                async for message in client.messages:
                    t_rx = self.now()
                    await self._on_message(str(message.topic), message.payload, t_rx)
            finally:
                self._client = None
                self.connected.clear()
                # A clean exit sends no last will: say `offline` ourselves so no stale `online` is retained.
                with contextlib.suppress(aiomqtt.MqttError, TimeoutError):
                    await asyncio.wait_for(
                        client.publish(status, self.signer.seal(status, b"offline"), qos=1, retain=True), 1.0
                    )

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
    async def _pump(self, probe: QueueProbe) -> None:
        async for event in probe.events():
            if len(self._outbox) >= OUTBOX_MAX:
                self._outbox.popleft()
                self._outbox_dropped += 1
            self._outbox.append(event)

    async def flush(self) -> None:
        while self._outbox:
            events = [self._outbox.popleft() for _ in range(min(BATCH_MAX, len(self._outbox)))]
            for e in events:
                e.t_ns += self.skew_ns  # onto this host's clock (no-op without a test skew)
                e.host = self.host
            batch = Batch(
                host=self.host, seq=self.seq, n0=self.sent_events, dropped=self.dropped, events=events
            )
            self.seq += 1
            self.sent_events += len(events)
            if not await self._publish(self._topics["events"], _enc.encode(batch)):
                self.lost_batches += 1

    async def _flusher(self) -> None:
        while True:
            await asyncio.sleep(BATCH_INTERVAL_S)
            await self.flush()

    # -- commands in --------------------------------------------------------------------------------------
    async def _on_message(self, topic_name: str, payload: Any, t_rx: int) -> None:
        try:
            if not isinstance(payload, bytes):
                raise Rejected("malformed", "payload is not bytes")
            body = self.signer.open(topic_name, payload)
            if topic_name == self._world:
                try:
                    world = decode(World, body)
                except msgspec.DecodeError as e:
                    raise Rejected("malformed", f"world: {e}") from None
                for item in world.items:
                    self.mirror.apply(item, item.t_ns + self.world_offset_ns - self.skew_ns)
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
        if cmd.op == "ping" and reply.ok:
            reply.t3 = self.now()
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
        unknown = sorted(set(args.probes) - set(PROBE_NAMES))
        if unknown or not args.probes:
            raise Rejected("malformed", f"unknown probes {unknown} (allowed: {', '.join(PROBE_NAMES)})")
        try:
            settings = ProbeSettings.model_validate(args.settings)
            profile = Profile.model_validate(args.profile)
        except ValueError as e:
            raise Rejected("malformed", f"bad settings or profile: {str(e).splitlines()[0]}") from None
        await self._stop_probes(list(self._probes))
        await self.flush()  # whatever an earlier run left goes out first: this run's stream starts after it
        seq0, n0 = self.seq, self.sent_events
        self.mirror.cancel_pending()
        self.mirror = FabricMirror(self.inventory, profile, random.Random(args.seed))
        self.world_offset_ns = args.world_offset_ns
        probes = host_probes(
            self.mirror, self.ports, self.inventory.ports, settings, sorted(set(args.probes))
        )
        for name, probe in probes.items():
            await probe.__aenter__()
            self._probes[name] = probe
            self._pumps[name] = asyncio.create_task(self._pump(probe), name=f"agent:{self.host}:{name}")
        return Reply(host=self.host, id=cmd.id, op=cmd.op, ok=True, seq=seq0, n=n0)

    async def _stop_probes(self, names: list[str]) -> None:
        for name in names:
            probe = self._probes.pop(name, None)
            if probe is None:
                continue
            await probe.__aexit__(None, None, None)
            pump = self._pumps.pop(name)
            await pump  # ends once the probe's queue is closed and drained

    async def _cmd_stop(self, cmd: Command, t_rx: int) -> Reply:
        args: StopArgs = self._args(StopArgs, cmd)
        names = list(self._probes) if args.probes is None else args.probes
        if set(names) - set(PROBE_NAMES):
            raise Rejected("malformed", f"unknown probes {sorted(set(names) - set(PROBE_NAMES))}")
        await self._stop_probes(names)
        await self.flush()  # everything sampled so far goes out before the reply that counts it
        return Reply(host=self.host, id=cmd.id, op=cmd.op, ok=True, seq=self.seq, n=self.sent_events)

    async def _cmd_set_circuits(self, cmd: Command, t_rx: int) -> Reply:
        args: CircuitArgs = self._args(CircuitArgs, cmd)
        for source, peer in args.circuits.items():
            if source not in self.sources:
                raise Rejected("unauthorised", f"{source} is not a port of {self.host}")
            if peer is not None and peer not in self.all_sources:
                raise Rejected("malformed", f"unknown peer port {peer}")
        traffic = self._probes.get("traffic")
        if traffic is not None:
            traffic.set_circuits(args.circuits)  # type: ignore[attr-defined]
        return Reply(host=self.host, id=cmd.id, op=cmd.op, ok=True)

    COMMANDS: ClassVar[dict[str, Callable[[Agent, Command, int], Any]]] = {
        "ping": _cmd_ping,
        "start": _cmd_start,
        "stop": _cmd_stop,
        "set_circuits": _cmd_set_circuits,
    }


# -- the controller side ---------------------------------------------------------------------------------
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
    offset: OffsetEstimate | None = None
    history: list[OffsetEstimate] = field(default_factory=list)
    started: bool = False
    latency_ns: list[int] = field(default_factory=list)
    record_latency: bool = False
    stream_base: tuple[int, int] | None = None  # (seq, events) where this run's stream starts on the agent
    first_seen: tuple[int, int] | None = None  # (seq, n0) of the first batch, if it beat the start reply

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
    def offset_ns(self) -> int:
        return self.offset.offset_ns if self.offset is not None else 0

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


class AgentHub:
    """The controller's single MQTT client: receives every agent's events and replies, sends commands and
    the simulated world, measures clock offsets, counts what was lost or rejected."""

    def __init__(self, inventory: Inventory, broker: BrokerSettings) -> None:
        self.inventory = inventory
        self.broker = broker
        self.lab = broker.lab
        self.signer = Signer(broker.auth_key)
        self.links = {
            host: HostLink(host, {p.source for p in inventory.ports if p.host == host})
            for host in inventory.hosts
        }
        self.rejections = Rejections()
        self.reconnects = 0
        self.expired_commands = 0
        self.connected = asyncio.Event()
        self.world_snapshot: Callable[[], list[WorldItem]] | None = None
        # Command ids are random per hub: an agent that outlives a run caches replies by id (to answer
        # QoS-1 duplicates), and a new run counting from 1 again would get the old run's answers.
        self._next_id = secrets.randbits(48)
        self._replies: dict[int, asyncio.Future[Reply]] = {}
        self._sent_ops: dict[int, str] = {}
        self._pings: dict[int, int] = {}
        self._outgoing: asyncio.Queue[_Outgoing] = asyncio.Queue()
        self._world_pending: list[WorldItem] = []
        self._tasks: list[asyncio.Task[None]] = []
        self._client: aiomqtt.Client | None = None

    # -- lifecycle ----------------------------------------------------------------------------------------
    async def start(self, timeout_s: float = 10.0) -> None:
        self._tasks = [
            asyncio.create_task(self._connection(), name="hub:connection"),
            asyncio.create_task(self._sender(), name="hub:sender"),
            asyncio.create_task(self._sync_clocks(), name="hub:clock-sync"),
        ]
        try:
            await asyncio.wait_for(self.connected.wait(), timeout_s)
        except TimeoutError:
            await self.stop()
            raise HardwareError(
                f"MQTT broker {self.broker.hostname}:{self.broker.port} not reachable within {timeout_s:g} s"
            ) from None

    async def stop(self) -> None:
        for t in self._tasks:
            t.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        self._tasks = []
        for link in self.links.values():
            link.queue.close()

    def report(self) -> dict[str, Any]:
        """For run.json: clock offsets per agent (with every re-measurement) and stream accounting."""
        return {
            "clock_offsets": {
                host: {
                    **(link.offset.as_dict() if link.offset else {}),
                    "history": [e.as_dict() for e in link.history],
                }
                for host, link in self.links.items()
                if link.history
            },
            "agents": {
                "broker": f"{self.broker.hostname}:{self.broker.port}",
                "reconnects": self.reconnects,
                "expired_commands": self.expired_commands,
                "rejected": self.rejections.as_dict(),
                "streams": {host: link.stats() for host, link in self.links.items() if link.started},
            },
        }

    async def _connection(self) -> None:
        while True:
            try:
                ident = f"labctl-controller-{self.lab}-{os.getpid()}-{secrets.token_hex(3)}"
                async with self.broker.client(ident) as client:
                    for leaf in ("events", "reply", "status"):
                        await client.subscribe(topic(self.lab, "+", leaf), qos=1)
                    self._client = client
                    self.connected.set()
                    async for message in client.messages:
                        t_rx = now_ns()
                        self._on_message(str(message.topic), message.payload, t_rx)
            except aiomqtt.MqttError as e:
                log.warning("controller: broker connection lost: %s", e)
            finally:
                self._client = None
                self.connected.clear()
            self.reconnects += 1
            await asyncio.sleep(0.2)

    async def _sender(self) -> None:
        """Commands and world updates go out in order and are retried across broker restarts. Everything
        queued is handed to the client at once and acknowledged together: no waiting for one PUBACK before
        the next message leaves (the world feed must not lag behind commands)."""
        while True:
            batch = [await self._outgoing.get()]
            while not self._outgoing.empty():
                batch.append(self._outgoing.get_nowait())
            while True:
                await self.connected.wait()
                client = self._client
                if client is None:
                    continue
                batch = self._unexpired(batch)
                if not batch:
                    break
                try:
                    # Tasks start in order, and each hands its packet to the client on its first step.
                    await asyncio.gather(
                        *(
                            client.publish(
                                item.topic, self.signer.seal(item.topic, item.body()), qos=1, timeout=5
                            )
                            for item in batch
                        )
                    )
                    break
                except aiomqtt.MqttError:
                    # Resend all: the agent answers a repeated command id without acting twice, and world
                    # updates are states, so a duplicate changes nothing.
                    await asyncio.sleep(0.05)

    def _unexpired(self, batch: list[_Outgoing]) -> list[_Outgoing]:
        now = now_ns()
        keep = [item for item in batch if item.expires_ns is None or item.expires_ns > now]
        self.expired_commands += len(batch) - len(keep)
        return keep

    # -- receive ------------------------------------------------------------------------------------------
    def _on_message(self, topic_name: str, payload: Any, t_rx: int) -> None:
        try:
            parts = topic_name.split("/")
            if len(parts) != 4 or parts[0] != "labctl" or parts[1] != self.lab:
                raise Rejected("unauthorised", f"unexpected topic {topic_name}")
            link = self.links.get(parts[2])
            if link is None:
                raise Rejected("unauthorised", f"host {parts[2]!r} is not in the inventory")
            if not isinstance(payload, bytes):
                raise Rejected("malformed", "payload is not bytes")
            body = self.signer.open(topic_name, payload)
            leaf = parts[3]
            if leaf == "events":
                self._on_batch(link, body, t_rx)
            elif leaf == "reply":
                self._on_reply(link, body, t_rx)
            elif leaf == "status":
                if body == b"online":
                    link.online.set()
                elif body == b"offline":
                    link.online.clear()
                else:
                    raise Rejected("malformed", "status must be online/offline")
            else:
                raise Rejected("unauthorised", f"unexpected topic {topic_name}")
        except Rejected as r:
            self.rejections.add(r.kind, r.reason, topic_name)

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
        link.missing_events += max(0, batch.n0 - link.cursor)
        link.next_seq = batch.seq + 1
        link.cursor = batch.n0 + len(batch.events)
        link.batches += 1
        link.agent_dropped = batch.dropped
        offset = link.offset_ns
        bad = 0
        for ev in batch.events:
            if ev.source not in link.sources or ev.host != link.host:
                bad += 1
                continue
            ev.t_ns -= offset  # onto the run timebase
            if link.record_latency:
                link.latency_ns.append(t_rx - ev.t_ns)
            ev.seq = -1
            ev.wall_ns = None
            ev.reconfig = None
            link.delivered += 1
            link.queue.put(ev)
        if bad:
            self.rejections.add("unauthorised", f"{bad} event(s) for ports not on {link.host}", link.host)

    def _on_reply(self, link: HostLink, body: bytes, t_rx: int) -> None:
        try:
            reply: Reply = decode(Reply, body)
        except msgspec.DecodeError as e:
            raise Rejected("malformed", f"reply: {e}") from None
        if reply.host != link.host:
            raise Rejected("unauthorised", f"reply from {reply.host!r} on {link.host}'s topic")
        if reply.op == "ping" and reply.id in self._pings:
            self._pings[reply.id] = t_rx  # t4, stamped as the reply came off the socket
        sent_op = self._sent_ops.pop(reply.id, reply.op)
        if sent_op != reply.op:
            log.warning(
                "%s: dropped a reply to command %d: op %r, sent %r", link.host, reply.id, reply.op, sent_op
            )
            return
        fut = self._replies.pop(reply.id, None)
        if fut is not None and not fut.done():
            fut.set_result(reply)

    # -- send ---------------------------------------------------------------------------------------------
    def post(
        self,
        host: str,
        op: str,
        args: dict[str, Any],
        stamp: Callable[[], dict[str, Any]] | None = None,
        expires_ns: int | None = None,
    ) -> int:
        cmd_id = self._next_id
        self._next_id += 1
        self._sent_ops[cmd_id] = op
        while len(self._sent_ops) > 4096:  # replies that never came
            del self._sent_ops[next(iter(self._sent_ops))]

        def body() -> bytes:
            return _enc.encode(Command(id=cmd_id, op=op, args={**args, **(stamp() if stamp else {})}))

        self._outgoing.put_nowait(_Outgoing(topic(self.lab, host, "cmd"), body, expires_ns))
        return cmd_id

    async def request(self, host: str, op: str, args: dict[str, Any], timeout_s: float = 10.0) -> Reply:
        fut: asyncio.Future[Reply] = asyncio.get_running_loop().create_future()
        cmd_id = self.post(host, op, args, expires_ns=now_ns() + round(timeout_s * 1e9))
        self._replies[cmd_id] = fut
        try:
            reply = await asyncio.wait_for(fut, timeout_s)
        except TimeoutError:
            raise HardwareError(f"agent {host}: no reply to {op} within {timeout_s:g} s") from None
        finally:
            self._replies.pop(cmd_id, None)
        if not reply.ok:
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
            payload = _enc.encode(World(items=items))
            self._outgoing.put_nowait(_Outgoing(world_topic(self.lab), lambda: payload))

    # -- clocks -------------------------------------------------------------------------------------------
    async def ping(self, host: str, timeout_s: float = 1.0) -> OffsetSample | None:
        sent: dict[str, int] = {}

        def stamp() -> dict[str, int]:
            sent["t1"] = now_ns()
            return {"t1": sent["t1"]}

        fut: asyncio.Future[Reply] = asyncio.get_running_loop().create_future()
        cmd_id = self.post(host, "ping", {}, stamp, expires_ns=now_ns() + round(timeout_s * 1e9))
        self._replies[cmd_id] = fut
        self._pings[cmd_id] = 0
        try:
            reply = await asyncio.wait_for(fut, timeout_s)
        except TimeoutError:
            return None
        finally:
            self._replies.pop(cmd_id, None)
            t4 = self._pings.pop(cmd_id, 0)
        if not reply.ok or reply.t2 is None or reply.t3 is None or not t4:
            return None
        return OffsetSample(sent["t1"], reply.t2, reply.t3, t4)

    async def measure(self, host: str, samples: int | None = None) -> OffsetEstimate:
        """One ping at a time (no self-inflicted queueing), then keep the fastest round trips."""
        got = []
        for _ in range(samples or self.broker.clock_samples):
            sample = await self.ping(host)
            if sample is not None:
                got.append(sample)
        est = estimate_offset(got)
        link = self.links[host]
        link.offset = est
        link.history.append(est)
        return est

    async def _sync_clocks(self) -> None:
        while True:
            await asyncio.sleep(self.broker.clock_sync_interval_s)
            for host, link in self.links.items():
                if link.started and link.online.is_set():
                    with contextlib.suppress(HardwareError):
                        await self.measure(host)

    async def wait_online(self, host: str, timeout_s: float = 10.0) -> None:
        try:
            await asyncio.wait_for(self.links[host].online.wait(), timeout_s)
        except TimeoutError:
            raise HardwareError(
                f"agent {host} is not online at {self.broker.hostname}:{self.broker.port} "
                f"(start it with `labctl agent --host {host}`)"
            ) from None


class RemoteProbe:
    """A `CircuitProbe` whose samples come from a host's agent: the controller's view of that agent."""

    def __init__(
        self, hub: AgentHub, host: str, settings: ProbeSettings, profile: Profile, seed: int
    ) -> None:
        self.hub = hub
        self.host = host
        self.name = f"agent:{host}"
        self.link = hub.links[host]
        self.settings = settings
        self.profile = profile
        self.seed = seed

    async def __aenter__(self) -> Self:
        await self.hub.wait_online(self.host)
        est = await self.hub.measure(self.host)
        reply = await self.hub.request(
            self.host,
            "start",
            {
                "probes": list(PROBE_NAMES),
                "settings": self.settings.model_dump(mode="json"),
                "profile": self.profile.model_dump(mode="json"),
                "seed": self.seed,
                "world_offset_ns": est.offset_ns,
            },
        )
        if reply.seq is not None and reply.n is not None:
            self.link.begin_stream(reply.seq, reply.n)
        self.link.started = True
        snapshot = self.hub.world_snapshot
        if snapshot is not None:
            for item in snapshot():
                self.hub.world(item)
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        if self.link.online.is_set():  # the closing estimate: with the opening one it brackets the drift
            with contextlib.suppress(HardwareError, TimeoutError):
                await asyncio.wait_for(self.hub.measure(self.host), 5.0)
        try:
            reply = await self.hub.request(self.host, "stop", {}, timeout_s=10.0)
        except HardwareError as e:
            log.warning("%s", e)
        else:
            # Everything the agent sent precedes its reply on the broker; what never came is lost.
            assert reply.seq is not None and reply.n is not None
            self.link.missing_batches += max(0, reply.seq - self.link.next_seq)
            self.link.missing_events += max(0, reply.n - self.link.cursor)
            self.link.next_seq = max(self.link.next_seq, reply.seq)
            self.link.cursor = max(self.link.cursor, reply.n)
        self.link.queue.close()

    def events(self) -> AsyncIterator[Event]:
        return aiter(self.link.queue)

    @property
    def dropped(self) -> int:
        """Events lost anywhere between the agent's sampler and the run log: agent queue, broker, here."""
        return self.link.agent_dropped + self.link.missing_events + self.link.queue.dropped

    def set_circuits(self, peers: dict[str, str | None]) -> None:
        mine = {s: p for s, p in peers.items() if s in self.link.sources}
        if mine:
            self.hub.post(self.host, "set_circuits", {"circuits": mine})


def build_agent_lab(ctx: LabContext) -> Lab:
    """The simulated lab with its probes on `labctl agent`s: the switch and NIC behaviour model (the world)
    stays here with the switch drivers; each host's agent samples its own ports from a mirror of it."""
    from labctl.drivers.sim import SimSwitch
    from labctl.labs.base import switch_timeouts

    inv = ctx.inventory
    drivers = {s.driver for s in inv.switches.values()}
    if drivers != {"sim"}:
        raise InputError(
            f"{inv.path}: with a broker, this version runs simulated labs only "
            f"(switch drivers {sorted(drivers)})"
        )
    broker = BrokerSettings.from_inventory(inv)
    models = {
        name: SwitchModel(name, spec.space, ctx.profile, ctx.rng) for name, spec in inv.switches.items()
    }
    fabric = SimFabric(inv, models, ctx.profile, ctx.rng)
    hub = AgentHub(inv, broker)
    by_rx = {(p.switch, p.rx): p for p in inv.ports}

    def light_item(port: NicPort) -> WorldItem:
        st = fabric.state(port)
        peer = st.light_from.source if st.light_from is not None else None
        return WorldItem("light", port.source, st.light_t_ns, 0, peer, st.settle_ns, st.rx_level_dbm)

    def on_light(switch: str, egress: int, ingress: int | None, t_ns: int) -> None:
        port = by_rx.get((switch, egress))
        if port is not None:
            hub.world(light_item(port))

    def on_transition(port: NicPort, kind: str, value: int, t_ns: int) -> None:
        hub.world(WorldItem(kind, port.source, t_ns, value))

    def snapshot() -> list[WorldItem]:
        t = now_ns()
        items = []
        for port in inv.ports:
            st = fabric.state(port)
            items.append(light_item(port))
            for kind, value in (
                ("link.firmware", st.firmware),
                ("carrier", st.carrier),
                ("transport", st.transport),
            ):
                items.append(WorldItem(kind, port.source, t, value))
        return items

    for name, model in models.items():  # after the fabric's own listener: its port state is already updated
        model.add_listener(functools.partial(on_light, name))
    fabric.add_listener(on_transition)
    hub.world_snapshot = snapshot
    switches = {
        name: SimSwitch(model, ctx.emit, switch_timeouts(inv.switches[name]))
        for name, model in models.items()
    }
    probes = [
        RemoteProbe(hub, host, ctx.probes, ctx.profile, ctx.rng.getrandbits(32))
        for host in inv.hosts
        if hub.links[host].sources
    ]
    lab = Lab(
        switches=dict(switches),
        probes=list(probes),
        circuit_probes=list(probes),
        close_hooks=[fabric.cancel_pending, *(m.cancel_pending for m in models.values())],
    )

    async def stop_hub() -> None:
        await hub.stop()
        lab.meta.update(hub.report())

    lab.start_hooks.append(hub.start)
    lab.async_close_hooks.append(stop_hub)
    return lab


async def run_agent(inventory: Inventory, host: str, broker: BrokerSettings) -> None:
    """`labctl agent`: serve until cancelled (SIGINT/SIGTERM)."""
    agent = Agent(inventory, host, broker)
    await agent.run()
