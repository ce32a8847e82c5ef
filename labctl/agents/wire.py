"""The agents' wire format: message structs, topics, signing (HMAC over topic and body), rejections."""

from __future__ import annotations

import hashlib
import hmac
import logging
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

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


class PingArgs(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    t1: int


class WindowArgs(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """A reconfiguration starts (`open`: the affected port sources of this host) or ends (`open` None)."""

    open: list[str] | None = None


class SwitchedArgs(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """The switch acknowledged moving these port sources' light (the controller's t1)."""

    sources: list[str]


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
