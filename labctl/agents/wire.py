"""The agents' wire format: message structs, topics, signing (HMAC over topic and body), rejections."""

from __future__ import annotations

import hashlib
import hmac
import logging
import secrets
import time
from collections import Counter, OrderedDict
from dataclasses import dataclass, field
from typing import Annotated, Any, Literal

import msgspec

from labctl.core.events import Event, Kind
from labctl.inventory.config import Secret
from labctl.models.fabric import TRANSPORT

log = logging.getLogger("labctl.agents")

WORLD_KINDS = frozenset({"light", Kind.LINK_FIRMWARE, Kind.CARRIER, TRANSPORT})

STAMP_META = ("prev_ns", "after_ns", "sent_ns", "detected_ns", "started_ns")
"""Event meta fields that hold a time on the observing host's clock, like `t_ns` (the previous sample a
mark's bracket starts at, when a ping was sent or given up on, ...): shifted onto the run timebase with it.
Other `*_ns` meta fields are durations and stay as they are."""


def shift_stamps(event: Event, delta_ns: int) -> None:
    """Move an event's time, and every time in its meta, by `delta_ns` (from one clock onto another)."""
    event.t_ns += delta_ns
    meta = event.meta
    for key in STAMP_META:
        value = meta.get(key)
        if type(value) is int:
            meta[key] = value + delta_ns


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
    data: dict[str, Any] | None = None  # what an `inspect` found
    incarnation: str | None = None  # the answering agent process (`Agent.incarnation`): a restart shows


class StartArgs(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    probes: list[str]
    settings: dict[str, Any]
    profile: dict[str, Any]
    seed: int
    world_offset_ns: int = 0
    mirror_lag_ns: int = 0  # a mirrored world: how far the mirror runs behind the model (decision 0046)


class StopArgs(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    probes: list[str] | None = None


class CircuitArgs(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    circuits: dict[str, str | None]
    t_ns: int | None = None
    """When the controller re-targeted (its clock): a mirror applies it at that model time (NOTICE_T)."""


class PingArgs(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    t1: int


class WindowArgs(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """A reconfiguration starts (`open`: the affected port sources of this host) or ends (`open` None)."""

    open: list[str] | None = None
    t_ns: int | None = None
    """When the controller opened or closed it (its clock; NOTICE_T)."""


class SwitchedArgs(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """The switch acknowledged moving these port sources' light (the controller's t1)."""

    sources: list[str]
    t_ns: int | None = None
    """When the controller had the acknowledgement (its clock; NOTICE_T)."""


NOTICE_T = "t_ns"
"""The controller's notices to an agent's probes (`set_circuits`, `window`, `switched`) carry the controller's
clock when it acted. A mirror of the model applies each at that model time, in order with the world feed's
changes, as the controller's own probes see it in a one-process run; without it (an older controller), at
the notice's arrival, a broker hop later. A host's own probes (a real lab) act on arrival either way."""


_Name = Annotated[str, msgspec.Meta(min_length=1, max_length=64, pattern=r"^\S+$")]
_Ifname = Annotated[str, msgspec.Meta(min_length=1, max_length=15, pattern=r"^[^\s/:]+$")]


class LinkSettingsArgs(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """Link settings as `labctl.nic.settings.settings_to_json` writes them (its `label` is ignored)."""

    autoneg: bool | None = None
    speed_mbps: Annotated[int, msgspec.Meta(ge=1, le=1_600_000)] | None = None
    duplex: Literal["full", "half"] | None = None
    link_modes: Annotated[list[_Name], msgspec.Meta(max_length=128)] | None = None
    fec: Literal["off", "rs", "baser", "llrs", "auto"] | None = None
    priv_flags: Annotated[dict[_Name, bool], msgspec.Meta(max_length=64)] = {}
    label: Annotated[str, msgspec.Meta(max_length=4096)] | None = None


class LinkArgs(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """The `link` command: what one of this host's ports supports, holds, or is to be set to (decision
    0079). `port` is its interface name as the inventory gives it; `settings` goes with `apply` only."""

    op: Literal["support", "read", "apply"]
    port: _Ifname
    settings: LinkSettingsArgs | None = None


HAPPENS, ANNOUNCED, WITHDRAWN = 0, 1, 2
"""WorldItem.mode: a change of the model (scheduled, or happening), one drawn ahead of its switch command
(decision 0041: held by a mirror until the command's schedule confirms it, a loss applied at once), or the
withdrawal of what was announced for a port (its light as given, now)."""


class WorldItem(msgspec.Struct, array_like=True):
    kind: str
    port: str
    t_ns: int
    value: int = 0
    peer: str | None = None
    settle_ns: int = 0
    level_dbm: float = 0.0
    mode: int = HAPPENS
    wait_ns: int = 0
    """ANNOUNCED returning light: how long past `t_ns` a mirror may hold it for its confirmation."""


class World(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    items: list[WorldItem]
    snapshot: bool = False  # the whole world as it is now (a run's start), not changes as they happen
    through_ns: int | None = None
    """The controller's model is complete through this model time: every change up to it is in this
    message or an earlier one (a mirror reads no instant past it; decision 0086). None: not said."""


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


def status_body(state: str, incarnation: str) -> bytes:
    """An agent's status message: `online ID` or `offline ID`, ID naming the agent process."""
    return f"{state} {incarnation}".encode()


def parse_status(body: bytes) -> tuple[str, str]:
    """(state, incarnation) of a status message; Rejected if it is not one."""
    state, _, incarnation = body.decode(errors="replace").partition(" ")
    if state not in ("online", "offline") or not incarnation:
        raise Rejected("malformed", "status must be 'online ID' or 'offline ID'")
    return state, incarnation


class Rejected(Exception):
    def __init__(self, kind: str, reason: str) -> None:
        super().__init__(reason)
        self.kind = kind  # "malformed" | "unauthorised" | "replayed" | "forged"
        self.reason = reason


CONTROLLER = "controller"
"""The name the controller signs as (an agent signs as its host)."""


@dataclass(frozen=True)
class Sealed:
    """An opened message: who signed it (as it says; checked by the MAC where there is a key), the signing
    process's session and counter, and the body."""

    signer: str
    session: str
    counter: int
    body: bytes


class Signer:
    """HMAC-SHA256 over topic, stamp and body. A payload is `MAC STAMP BODY`: STAMP is `signer.session.n`,
    the signer's name (`controller` or a host), a random session per signing object and a counter that
    only grows (wall-clock ns, at least one more than the last), so a receiver can tell a message that was
    captured and published again (`ReplayGuard`) and, with per-host keys, who really signed it. Binding
    the topic stops a message being replayed onto another host's topic. Without a key the MAC is `-`:
    nothing can be checked (the inventory decides). A message for several receivers with their own keys
    (the world feed) carries one MAC per receiver: `name=MAC,name=MAC`."""

    def __init__(self, key: Secret | None, name: str = CONTROLLER) -> None:
        self._key = key.reveal().encode() if key is not None else None
        self.name = name
        self.session = secrets.token_hex(4)
        self._last = 0

    @property
    def keyed(self) -> bool:
        return self._key is not None

    def _mac(self, topic_name: str, stamp: bytes, body: bytes) -> bytes:
        assert self._key is not None
        msg = topic_name.encode() + b"\0" + stamp + b"\0" + body
        return hmac.new(self._key, msg, hashlib.sha256).hexdigest().encode()

    def stamp(self) -> bytes:
        n = max(time.time_ns(), self._last + 1)
        self._last = n
        return f"{self.name}.{self.session}.{n}".encode()

    def seal(self, topic_name: str, body: bytes) -> bytes:
        stamp = self.stamp()
        mac = self._mac(topic_name, stamp, body) if self._key is not None else b"-"
        return mac + b" " + stamp + b" " + body

    def seal_for(self, topic_name: str, body: bytes, receivers: dict[str, Signer]) -> bytes:
        """One message for several receivers, each checking it with its own key (the receivers' signers
        on this side); this signer's stamp."""
        stamp = self.stamp()
        macs = [
            name.encode() + b"=" + signer._mac(topic_name, stamp, body)
            for name, signer in receivers.items()
            if signer._key is not None
        ]
        return (b",".join(macs) or b"-") + b" " + stamp + b" " + body

    @staticmethod
    def _fields(payload: bytes) -> tuple[bytes, bytes, bytes]:
        mac, sep, rest = payload.partition(b" ")
        if not sep:
            raise Rejected("malformed", "no MAC field")
        stamp, _, body = rest.partition(b" ")
        return mac, stamp, body

    @staticmethod
    def peek(payload: bytes) -> Sealed:
        """The stamp and body, unchecked (which key checks it may depend on who it says signed it)."""
        _, stamp, body = Signer._fields(payload)
        parts = stamp.decode(errors="replace").rsplit(".", 2)
        if len(parts) != 3 or not parts[0] or not parts[2].isdigit():
            raise Rejected("malformed", "no signer stamp")
        return Sealed(parts[0], parts[1], int(parts[2]), body)

    def open_sealed(self, topic_name: str, payload: bytes) -> Sealed:
        """Check the MAC with this signer's key (for a message to several receivers: the MAC for this
        signer's name), then read the stamp; the stamp and body."""
        if self._key is None:
            return self.peek(payload)
        mac, stamp, body = self._fields(payload)
        if b"=" in mac:
            mine = self.name.encode() + b"="
            mac = next((m[len(mine) :] for m in mac.split(b",") if m.startswith(mine)), b"")
            if not mac:
                raise Rejected("unauthorised", f"not signed for {self.name}")
        if not hmac.compare_digest(mac, self._mac(topic_name, stamp, body)):
            raise Rejected("unauthorised", "bad MAC")
        return self.peek(payload)

    def open(self, topic_name: str, payload: bytes) -> bytes:
        return self.open_sealed(topic_name, payload).body


REPLAY_WINDOW_NS = 600_000_000_000
"""A message from a signer session the receiver has not seen is accepted only if its stamp is at most this
old on the receiver's wall clock (10 min: loose enough for hosts whose clocks disagree by minutes; the
sessions seen are then held to their counters)."""


class ReplayGuard:
    """Refuses a message whose stamp is not newer than the last one seen from the same signer session on
    the same topic (a capture published again; a QoS-1 redelivery of the very same message counts here
    too), and one from an unknown session older than REPLAY_WINDOW_NS. Status messages are not checked:
    they are retained and last wills, old by design (decision 0024 tells a stale one)."""

    MAX_SESSIONS = 4096

    def __init__(self) -> None:
        self._last: OrderedDict[tuple[str, str, str], int] = OrderedDict()

    def check(self, topic_name: str, sealed: Sealed) -> None:
        key = (topic_name, sealed.signer, sealed.session)
        last = self._last.get(key)
        if last is None:
            if sealed.counter < time.time_ns() - REPLAY_WINDOW_NS:
                raise Rejected("replayed", "stamped before the replay window by a sender session not seen")
        elif sealed.counter <= last:
            raise Rejected("replayed", "not newer than the last message of its sender")
        self._last[key] = sealed.counter
        self._last.move_to_end(key)
        while len(self._last) > self.MAX_SESSIONS:
            self._last.popitem(last=False)


@dataclass
class Rejections:
    """Messages dropped on receipt, by class and reason: malformed (does not decode or validate),
    unauthorised (bad MAC, unknown host, another host's ports), replayed (a stamp seen before), forged (a
    valid signature by another identity than the topic's own: one host posing as another)."""

    malformed: int = 0
    unauthorised: int = 0
    replayed: int = 0
    forged: int = 0
    reasons: Counter[str] = field(default_factory=Counter)

    def add(self, kind: str, reason: str, where: str) -> None:
        if kind in ("unauthorised", "replayed", "forged"):
            setattr(self, kind, getattr(self, kind) + 1)
        else:
            self.malformed += 1
        self.reasons[f"{kind}: {reason}"] += 1
        if self.reasons[f"{kind}: {reason}"] == 1:  # the first of each kind is logged; all are counted
            log.warning("rejected %s message on %s: %s", kind, where, reason)

    def as_dict(self) -> dict[str, Any]:
        return {
            "malformed": self.malformed,
            "unauthorised": self.unauthorised,
            "replayed": self.replayed,
            "forged": self.forged,
            "reasons": dict(self.reasons),
        }
