"""The NETCONF front end of the switch emulator: a NETCONF server over SSH that behaves like a Polatis switch.

Sessions, users, the fault plan and the order in which changes take effect are the shared core's
(labctl.emulators.core); this module serves SSH (asyncssh, 127.0.0.1, a host key generated for this
emulator and never written anywhere), the `netconf` subsystem, RFC 6242 framing (base:1.0 `]]>]]>`, and
base:1.1 chunks once both hellos name it), the hello with the Polatis optical-switch module revision, and
the operations get, get-config and edit-config (subtree filters, the empty-container form ONOS sends
included) on cross-connects, the variable optical attenuators (`voa`) and the power monitor settings
(`opm-config`), lock/unlock, the optical-switch RPC port-set-state, RFC 5277 create-subscription with the
polatis-switch `activity-log-notification` for every change, and close-session. Replies leave in the order
the requests came (RFC 6241 §4.5), each after the model's mirrors have settled, with the fault plan's faults.
A refusal (the model's ChangeRefused, or the fault plan's) is an `rpc-error` with error-tag
`operation-failed`. The fault plan counts every `<rpc>` (not the hello); a drop hangs up the SSH connection;
garbage goes inside a reply's XML (well framed, not XML) or before its framing (`between`).

This parser and formatter are written independently of the driver's codec
(labctl/ocs/drivers/polatis_netconf/codec.py) on purpose, so that a mistake in one is not mirrored by the
other. Data nodes follow the shared reference §2; what no source shows (the dark-port power reading, the
model name's suffix) is an emulator choice, listed in docs/decisions/0031.
"""

from __future__ import annotations

import asyncio
import copy
import dataclasses
import itertools
import re
import time
import xml.etree.ElementTree as ET
from collections.abc import Callable, Iterable
from collections.abc import Mapping as MappingType
from dataclasses import dataclass
from typing import Any, cast
from xml.sax.saxutils import escape, quoteattr

from labctl.core.errors import InputError
from labctl.core.extras import require
from labctl.emulators.core import FaultPlan, Session, SwitchEmulator, load_faults
from labctl.inventory.mapping import MappingDiff
from labctl.models.switch import VOA_MODES, ChangeRefused, OpmConfig, SwitchModel, VoaSetting

__all__ = [
    "FramingError",
    "NetconfEmulator",
    "frame_chunked",
    "frame_eom",
    "load_faults",
    "subtree_filter",
    "take_chunked",
    "take_eom",
]

BASE = "urn:ietf:params:xml:ns:netconf:base:1.0"
OPSW = "http://www.polatis.com/yang/optical-switch"
PLTS = "http://www.polatis.com/yang/polatis-switch"
NOTIF = "urn:ietf:params:xml:ns:netconf:notification:1.0"
CAP_10 = "urn:ietf:params:netconf:base:1.0"
CAP_11 = "urn:ietf:params:netconf:base:1.1"
CAPABILITIES = (
    "urn:ietf:params:netconf:capability:writable-running:1.0",
    "urn:ietf:params:netconf:capability:notification:1.0",  # RFC 5277 §3.1
    "urn:ietf:params:netconf:capability:interleave:1.0",  # RFC 5277 §6: RPCs go on while subscribed
    f"{PLTS}?module=polatis-switch&revision=2017-09-11",
)
STREAMS = ("NETCONF", "Polatis")
"""RFC 5277's default stream, and the one Polatis sends its notifications on (polatis-switch YANG,
`mask-notification`; ONOS's notificationStream=Polatis). Both carry the same events here."""
_DECIMAL2 = re.compile(r"^[+-]?\d{1,6}(\.\d{1,2})?$")  # the YANG's floatFormat2d: two fraction digits
LATEST_REVISION = "2018-03-22"
NO_LIGHT_DBM = -99.99  # a dark port's reading, as the TL1 front end prints it (the real value is unverified)
EOM = b"]]>]]>"
MAX_MESSAGE = 4 * 1024 * 1024  # one edit-config of every pair on a 576x576 switch is ~100 kB
MAX_CHUNK = 4_294_967_295  # RFC 6242 §4.2


# -- RFC 6242 framing --------------------------------------------------------------------------------------
class FramingError(Exception):
    """Bytes that are not NETCONF framing: RFC 6242 says to end the session."""


def frame_eom(message: bytes) -> bytes:
    return message + EOM


def frame_chunked(message: bytes, chunk_size: int | None = None) -> bytes:
    """base:1.1: the message in chunks of at most `chunk_size` bytes (default: one), then `\\n##\\n`."""
    if not message:
        raise ValueError("a chunked message has at least one byte")
    size = chunk_size or len(message)
    chunks = (message[i : i + size] for i in range(0, len(message), size))
    return b"".join(b"\n#%d\n%s" % (len(c), c) for c in chunks) + b"\n##\n"


def take_eom(buf: bytearray) -> bytes | None:
    """base:1.0: one message off the front of `buf`, up to `]]>]]>` (None: not complete yet)."""
    end = buf.find(EOM)
    if end < 0:
        return None
    message = bytes(buf[:end]).strip()
    del buf[: end + len(EOM)]
    return message


_CHUNK_SIZE = re.compile(rb"[1-9][0-9]{0,9}")


def take_chunked(buf: bytearray) -> bytes | None:
    """base:1.1: one whole chunked message off the front of `buf` (None: not complete yet; the chunks
    seen so far stay in `buf`). Anything that breaks the framing raises FramingError."""
    parts: list[bytes] = []
    pos = 0
    while True:
        head = bytes(buf[pos : pos + 3])
        if len(head) < 3:
            if not b"\n#".startswith(head[:2]):
                raise FramingError(f"expected a chunk header at byte {pos}, got {head!r}")
            return None
        if head[:2] != b"\n#":
            raise FramingError(f"expected a chunk header at byte {pos}, got {head!r}")
        if head[2:3] == b"#":
            if len(buf) < pos + 4:
                return None
            if buf[pos + 3] != 0x0A:
                raise FramingError("end-of-chunks marker not followed by a newline")
            if not parts:
                raise FramingError("a message with no chunk")
            del buf[: pos + 4]
            return b"".join(parts)
        newline = buf.find(b"\n", pos + 2, pos + 2 + 11)
        if newline < 0:
            if len(buf) >= pos + 2 + 11:
                raise FramingError("chunk size longer than 10 digits")
            return None
        digits = bytes(buf[pos + 2 : newline])
        if not _CHUNK_SIZE.fullmatch(digits) or int(digits) > MAX_CHUNK:
            raise FramingError(f"bad chunk size {digits[:12]!r}")
        start, size = newline + 1, int(digits)
        if len(buf) < start + size:
            return None
        parts.append(bytes(buf[start : start + size]))
        pos = start + size


# -- subtree filtering (RFC 6241 §6) -----------------------------------------------------------------------
def _named(data_tag: str, filter_tag: str) -> bool:
    """A filter node without a namespace matches the name in any namespace."""
    if filter_tag.startswith("{"):
        return data_tag == filter_tag
    return data_tag.rsplit("}", 1)[-1] == filter_tag


def _value(element: ET.Element) -> str:
    return (element.text or "").strip()


def _filter_node(data: ET.Element, node: ET.Element) -> ET.Element | None:
    """`data` as the filter node `node` (same name) selects it, or None where it selects nothing."""
    children = list(node)
    if not children:
        if _value(node):  # a content match node on its own: the leaf if it has that value
            return copy.deepcopy(data) if _value(data) == _value(node) else None
        return copy.deepcopy(data)  # a selection node, or an empty container: all of it
    matches = [c for c in children if len(c) == 0 and _value(c)]
    for match in matches:
        if not any(_named(d.tag, match.tag) and _value(d) == _value(match) for d in data):
            return None  # a list entry whose key (or any content match) differs
    others = [c for c in children if not any(c is m for m in matches)]
    out = ET.Element(data.tag, data.attrib)
    if not others:
        out.extend(copy.deepcopy(d) for d in data)  # content matches only: the whole entry
        return out
    for child in data:
        if any(_named(child.tag, m.tag) for m in matches):
            out.append(copy.deepcopy(child))
            continue
        for other in others:
            if _named(child.tag, other.tag):
                selected = _filter_node(child, other)
                if selected is not None:
                    out.append(selected)
                    break
    return out if matches or len(out) else None


def subtree_filter(roots: Iterable[ET.Element], nodes: Iterable[ET.Element] | None) -> list[ET.Element]:
    """The parts of the data trees `roots` that the filter's top-level `nodes` select (None: no filter)."""
    roots = list(roots)
    if nodes is None:
        return roots
    nodes = list(nodes)
    out: list[ET.Element] = []
    for root in roots:
        for node in nodes:
            if _named(root.tag, node.tag):
                selected = _filter_node(root, node)
                if selected is not None:
                    out.append(selected)
                    break
    return out


# -- XML out -----------------------------------------------------------------------------------------------
def _split(tag: str) -> tuple[str, str]:
    if tag.startswith("{"):
        ns, _, local = tag[1:].partition("}")
        return ns, local
    return "", tag


def to_xml(element: ET.Element, parent_ns: str = "") -> str:
    """Serialize with a default namespace declared where it changes (no `ns0:` prefixes)."""
    ns, local = _split(element.tag)
    attrs = "".join(f" {k}={quoteattr(v)}" for k, v in element.attrib.items() if not k.startswith("{"))
    declare = f' xmlns="{ns}"' if ns != parent_ns else ""
    inner = escape(element.text or "") + "".join(to_xml(c, ns) + escape(c.tail or "") for c in element)
    return f"<{local}{declare}{attrs}>{inner}</{local}>" if inner else f"<{local}{declare}{attrs}/>"


def _leaf(parent: ET.Element, tag: str, text: object) -> ET.Element:
    element = ET.SubElement(parent, tag)
    element.text = str(text)
    return element


# -- errors ------------------------------------------------------------------------------------------------
class _RpcError(Exception):
    def __init__(
        self, tag: str, message: str, *, type_: str = "application", info: MappingType[str, str] | None = None
    ) -> None:
        super().__init__(message)
        self.tag = tag
        self.message = message
        self.type = type_
        self.info = dict(info or {})


def _error_xml(error: _RpcError) -> str:
    info = "".join(f"<{k}>{escape(v)}</{k}>" for k, v in error.info.items())
    return (
        f"<rpc-error><error-type>{error.type}</error-type><error-tag>{error.tag}</error-tag>"
        f"<error-severity>error</error-severity>"
        f'<error-message xml:lang="en">{escape(error.message)}</error-message>'
        + (f"<error-info>{info}</error-info>" if info else "")
        + "</rpc-error>"
    )


# -- sessions ----------------------------------------------------------------------------------------------
class _ChannelWriter:
    """The part of a StreamWriter the core's Session uses, over an asyncssh server process: `close` ends
    the channel (exit status 0); `transport.abort()` drops the whole SSH connection, as a switch that
    hangs up does (asyncssh sends what it already has, then disconnects)."""

    def __init__(self, process: Any) -> None:
        self._process = process
        self.transport = self

    def write(self, data: bytes) -> None:
        self._process.stdout.write(data)

    def is_closing(self) -> bool:
        return bool(self._process.stdout.is_closing())

    def close(self) -> None:
        try:
            self._process.exit(0)
        except Exception:  # the channel is already gone
            return

    def abort(self) -> None:
        self._process.channel.get_connection().close()


@dataclass(eq=False)
class NetconfSession(Session):
    """One NETCONF session: its id, whether hellos are exchanged, the framing chosen, the last reply."""

    session_id: int = 0
    hello_done: bool = False
    base: str = "1.0"
    ending: bool = False
    last_reply: asyncio.Task[None] | None = None
    address: str = ""
    subscription: list[ET.Element] | None = None
    """The filter of this session's RFC 5277 subscription ([] : none, every event); None: not subscribed."""


class NetconfEmulator(SwitchEmulator):
    """The NETCONF front end. `start()` serves SSH on (127.0.0.1, ephemeral port by default); `close()`
    ends every session. `host_key_sha256` is the fingerprint of the key it serves (a client pins it).
    `revision` is the optical-switch module revision its hello advertises (before 2017-08-04 the list is
    `pairs`); `bases` the framings it offers. Test API (from the core): `set_faults`, `lose_state`,
    `commands`, `sessions`."""

    change_verbs = frozenset({"EDIT-CONFIG"})
    max_input = MAX_MESSAGE

    def __init__(
        self,
        model: SwitchModel,
        *,
        users: MappingType[str, str],
        host: str = "127.0.0.1",
        port: int = 0,
        faults: FaultPlan | None = None,
        session_timeout_s: float | None = None,
        revision: str = LATEST_REVISION,
        bases: tuple[str, ...] = ("1.0", "1.1"),
    ) -> None:
        super().__init__(
            model, users=users, host=host, port=port, faults=faults, session_timeout_s=session_timeout_s
        )
        if not re.fullmatch(r"\d{4}-\d{2}-\d{2}", revision):
            raise InputError(f"optical-switch revision {revision!r} is not a date like {LATEST_REVISION}")
        if not bases or not set(bases) <= {"1.0", "1.1"}:
            raise InputError(f"NETCONF base versions {bases!r}: choose from 1.0 and 1.1")
        self._asyncssh = require("asyncssh", "netconf", "the NETCONF emulator")
        self._host_key = self._asyncssh.generate_private_key("ssh-ed25519")
        self.host_key_sha256: str = self._host_key.get_fingerprint("sha256")
        self.host_key_openssh: str = self._host_key.export_public_key("openssh").decode().strip()
        """The public key as a known_hosts line writes it (`ssh-ed25519 AAAA…`)."""
        self.revision = revision
        self.list_name = "pair" if revision >= "2017-08-04" else "pairs"
        self.bases = bases
        self.disabled: set[int] = set()
        self.locked_by: NetconfSession | None = None
        self.notifications_sent = 0
        self._staged: list[Callable[[], None]] = []  # config an edit-config applies once its change went in
        self._activity: list[str] = []  # what the current RPC changed, for activity-log-notification
        self._acceptor: Any = None
        self._connections: set[Any] = set()
        self._session_ids = itertools.count(1)

    # -- lifecycle ------------------------------------------------------------------------------------------
    async def start(self) -> None:
        emulator, asyncssh = self, self._asyncssh

        class Server(asyncssh.SSHServer):  # type: ignore[misc,name-defined]
            def connection_made(self, conn: Any) -> None:
                self._conn = conn
                emulator._connections.add(conn)

            def connection_lost(self, exc: Exception | None) -> None:
                emulator._connections.discard(self._conn)

            def begin_auth(self, username: str) -> bool:
                return True  # authentication is always required

            def password_auth_supported(self) -> bool:
                return True

            def validate_password(self, username: str, password: str) -> bool:
                return emulator.authenticate(username, password) is True

        self._acceptor = await asyncssh.create_server(
            Server,
            self.host,
            self.port,
            server_host_keys=[self._host_key],
            process_factory=self._process,
            encoding=None,
            allow_scp=False,
            agent_forwarding=False,
            x11_forwarding=False,
        )
        self.port = self._acceptor.sockets[0].getsockname()[1]

    async def close(self) -> None:
        acceptor, self._acceptor = self._acceptor, None
        if acceptor is not None:
            acceptor.close()
        await super().close()  # ends every NETCONF session and waits for its handler
        connections = list(self._connections)
        for conn in connections:
            conn.abort()
        await asyncio.gather(*(c.wait_closed() for c in connections), return_exceptions=True)
        if acceptor is not None:
            await acceptor.wait_closed()

    def lose_state(self) -> None:
        """As after a reboot: every patch gone, outputs dark, every port enabled."""
        super().lose_state()
        self.disabled.clear()

    async def _process(self, process: Any) -> None:
        """One SSH channel: only the `netconf` subsystem; the hello goes out at once (RFC 6241 §8.1)."""
        if process.subsystem != "netconf":
            process.stderr.write(b"this switch serves only the netconf subsystem\n")
            process.exit(1)
            return
        writer = _ChannelWriter(process)
        peer = process.get_extra_info("peername")
        session = NetconfSession(
            cast(asyncio.StreamWriter, writer),
            user=process.get_extra_info("username"),
            session_id=next(self._session_ids),
            address=str(peer[0]) if peer else "",
        )
        session.write(frame_eom(self._hello(session.session_id).encode()))
        try:
            await self._serve(
                cast(asyncio.StreamReader, process.stdin), cast(asyncio.StreamWriter, writer), session
            )
        except self._asyncssh.Error:
            pass  # the client went away mid-read
        finally:
            if self.locked_by is session:
                self.locked_by = None

    def _hello(self, session_id: int) -> str:
        caps = [CAP_10] * ("1.0" in self.bases) + [CAP_11] * ("1.1" in self.bases) + list(CAPABILITIES)
        caps.append(f"{OPSW}?module=optical-switch&revision={self.revision}")
        listed = "".join(f"<capability>{escape(c)}</capability>" for c in caps)
        return (
            f'<?xml version="1.0" encoding="UTF-8"?><hello xmlns="{BASE}"><capabilities>{listed}'
            f"</capabilities><session-id>{session_id}</session-id></hello>"
        )

    # -- framing --------------------------------------------------------------------------------------------
    def next_command(self, buf: bytearray) -> str | None:
        """Outside a session (never called by the session loop, which calls `frame`): base:1.0."""
        message = take_eom(buf)
        return None if message is None else message.decode("utf-8", errors="replace")

    def frame(self, session: Session, buf: bytearray) -> str | None:
        assert isinstance(session, NetconfSession)
        if session.ending:
            buf.clear()  # after close-session nothing more is read
            return None
        try:
            message = take_chunked(buf) if session.hello_done and session.base == "1.1" else take_eom(buf)
        except FramingError:
            buf.clear()
            session.abort()
            return None
        return None if message is None else message.decode("utf-8", errors="replace")

    def _framed(self, session: NetconfSession, xml: str) -> bytes:
        payload = xml.encode()
        return frame_chunked(payload) if session.base == "1.1" else frame_eom(payload)

    def _garbled(self, session: NetconfSession, xml: str) -> bytes:
        """A reply with the fault plan's garbage: "inside" puts it in the XML, just after the opening tag,
        and frames that (a well-framed message that is not XML, as from a buggy agent); "between" puts it
        before the framed reply (bytes outside any message: under base:1.1 the framing itself breaks). The
        noise starts with a control character, which XML never allows, so it always breaks the message."""
        noise = bytes([self.rng.choice(_CONTROL)]) + bytes(
            self.rng.choice(_NOISE) for _ in range(self.rng.randint(3, 23))
        )
        if self.faults.garbage_position == "between":
            return noise + b"\r\n" + self._framed(session, xml)
        payload = xml.encode()
        inside = payload.find(b">") + 1
        garbled = payload[:inside] + noise + payload[inside:]
        return frame_chunked(garbled) if session.base == "1.1" else frame_eom(garbled)

    # -- one message ----------------------------------------------------------------------------------------
    async def handle(self, session: Session, text: str) -> None:
        assert isinstance(session, NetconfSession)
        if not session.hello_done:
            self._client_hello(session, text)
            return
        faults = self.arrived()
        if faults.drop:
            session.abort()
            return
        moving: asyncio.Task[tuple[int, int]] | None = None
        attributes: dict[str, str] = {}
        self._staged, self._activity = [], []
        try:
            rpc = _parse(text)
            if rpc.tag != f"{{{BASE}}}rpc":
                raise _RpcError("unknown-element", f"expected <rpc> of {BASE}, got {rpc.tag}", type_="rpc")
            attributes = {k: v for k, v in rpc.attrib.items() if not k.startswith("{")}
            if "message-id" not in attributes:
                raise _RpcError(
                    "missing-attribute",
                    "<rpc> has no message-id",
                    type_="rpc",
                    info={"bad-attribute": "message-id", "bad-element": "rpc"},
                )
            operations = list(rpc)
            if len(operations) != 1:
                raise _RpcError("malformed-message", "an <rpc> holds exactly one operation", type_="rpc")
            body, diff = self._operation(session, operations[0])
            if diff is not None and not diff.empty:
                moving = await self.move(diff)
            for apply in self._staged:  # attenuators and monitors, once the patches were accepted
                apply()
            if self._activity:
                self._report(session, "; ".join(self._activity), moving)
        except _RpcError as e:
            body = _error_xml(e)
        except ChangeRefused as e:  # the switch itself said no
            body = _error_xml(_RpcError("operation-failed", str(e)))
        finally:
            self._staged, self._activity = [], []
        attrs = "".join(f" {k}={quoteattr(v)}" for k, v in attributes.items())
        reply = f'<rpc-reply xmlns="{BASE}"{attrs}>{body}</rpc-reply>'
        if faults.garbage:  # put in here, not by deliver(): inside the XML, then framed
            data = self._garbled(session, reply)
            faults = dataclasses.replace(faults, garbage=False)
        else:
            data = self._framed(session, reply)
        session.last_reply = self.deliver(
            session, data, self._after_previous(session, moving), faults, garbage_at=0, forbidden=b""
        )
        if session.ending:
            session.last_reply.add_done_callback(lambda _: session.writer.close())

    def _after_previous(
        self, session: NetconfSession, moving: asyncio.Task[tuple[int, int]] | None
    ) -> asyncio.Task[tuple[int, int]] | None:
        """What the reply waits for: the mirrors, and the session's previous reply (replies in order)."""
        previous = session.last_reply
        if previous is None or previous.done():
            return moving

        async def in_order() -> tuple[int, int]:
            await asyncio.wait({previous})
            return await moving if moving is not None else (0, 0)

        return asyncio.create_task(in_order())

    def _client_hello(self, session: NetconfSession, text: str) -> None:
        """The client's hello decides the framing; anything else ends the session (RFC 6241 §8.1)."""
        try:
            hello = _parse(text)
        except _RpcError:
            session.abort()
            return
        if hello.tag != f"{{{BASE}}}hello" or hello.find(f"{{{BASE}}}session-id") is not None:
            session.abort()
            return
        caps = {_value(c) for c in hello.iter(f"{{{BASE}}}capability")}
        if (
            not caps
            & {CAP_10, CAP_11}
            & {c for c, b in ((CAP_10, "1.0"), (CAP_11, "1.1")) if b in self.bases}
        ):
            session.abort()
            return
        session.hello_done = True
        session.base = "1.1" if CAP_11 in caps and "1.1" in self.bases else "1.0"

    def _operation(self, session: NetconfSession, op: ET.Element) -> tuple[str, MappingDiff | None]:
        ns, name = _split(op.tag)
        handlers: dict[
            tuple[str, str], Callable[[NetconfSession, ET.Element], tuple[str, MappingDiff | None]]
        ]
        handlers = {
            (BASE, "get"): self._get,
            (BASE, "get-config"): self._get_config,
            (BASE, "edit-config"): self._edit_config,
            (BASE, "lock"): self._lock,
            (BASE, "unlock"): self._unlock,
            (BASE, "close-session"): self._close_session,
            (OPSW, "port-set-state"): self._port_set_state,
            (NOTIF, "create-subscription"): self._create_subscription,
        }
        handler = handlers.get((ns, name))
        if handler is None:
            if ns not in (BASE, OPSW, PLTS, NOTIF):
                raise _RpcError("unknown-namespace", f"unknown namespace {ns!r}", type_="protocol")
            raise _RpcError("operation-not-supported", f"{name} is not supported here", type_="protocol")
        return handler(session, op)

    # -- operations -----------------------------------------------------------------------------------------
    def _filter(self, op: ET.Element) -> list[ET.Element] | None:
        flt = op.find(f"{{{BASE}}}filter")
        if flt is None:
            return None
        kind = flt.get("type", "subtree")
        if kind != "subtree":
            raise _RpcError(
                "operation-not-supported", f"filter type {kind!r} (only subtree)", type_="protocol"
            )
        return list(flt)

    def _data(self, nodes: list[ET.Element] | None, *, config_only: bool) -> str:
        builders = {
            "product-information": self._product,
            "cross-connects": self._cross_connects,
            "port-config": self._port_config,
            "opm-power": self._opm_power,
            "opm-config": self._opm_config,
            "voa": self._voa,
        }
        if config_only:
            config = ("cross-connects", "port-config", "opm-config", "voa")
            builders = {k: v for k, v in builders.items() if k in config}
        wanted = None if nodes is None else {_split(n.tag)[1] for n in nodes}
        roots = [build(config_only) for name, build in builders.items() if wanted is None or name in wanted]
        return "<data>" + "".join(to_xml(e, BASE) for e in subtree_filter(roots, nodes)) + "</data>"

    def _get(self, session: NetconfSession, op: ET.Element) -> tuple[str, None]:
        return self._data(self._filter(op), config_only=False), None

    def _get_config(self, session: NetconfSession, op: ET.Element) -> tuple[str, None]:
        self._datastore(op, "source")
        return self._data(self._filter(op), config_only=True), None

    def _datastore(self, op: ET.Element, role: str) -> None:
        holder = op.find(f"{{{BASE}}}{role}")
        if holder is None or len(holder) != 1:
            raise _RpcError(
                "missing-element",
                f"<{role}> names no datastore",
                type_="protocol",
                info={"bad-element": role},
            )
        store = _split(holder[0].tag)[1]
        if store != "running":
            raise _RpcError(
                "invalid-value", f"datastore {store!r}: this switch has only running", type_="protocol"
            )

    def _lock(self, session: NetconfSession, op: ET.Element) -> tuple[str, None]:
        self._datastore(op, "target")
        if self.locked_by is not None and self.locked_by is not session:
            raise _RpcError(
                "lock-denied",
                "running is locked",
                type_="protocol",
                info={"session-id": str(self.locked_by.session_id)},
            )
        self.locked_by = session
        return "<ok/>", None

    def _unlock(self, session: NetconfSession, op: ET.Element) -> tuple[str, None]:
        self._datastore(op, "target")
        if self.locked_by is not session:
            raise _RpcError("operation-failed", "this session holds no lock on running", type_="protocol")
        self.locked_by = None
        return "<ok/>", None

    def _close_session(self, session: NetconfSession, op: ET.Element) -> tuple[str, None]:
        session.ending = True
        return "<ok/>", None

    def _port_set_state(self, session: NetconfSession, op: ET.Element) -> tuple[str, None]:
        n = self.model.space.n_ingress + self.model.space.n_egress
        changes: list[tuple[int, bool]] = []
        for child in op:
            name = _split(child.tag)[1]
            if name not in ("port-enab", "port-disab"):
                raise _RpcError(
                    "unknown-element", f"port-set-state has no {name}", info={"bad-element": name}
                )
            port = _port(child, n, name)
            changes.append((port, name == "port-disab"))
        for port, disable in changes:
            (self.disabled.add if disable else self.disabled.discard)(port)
        if changes:
            self._activity.append(
                "port-set-state: "
                + ", ".join(f"{'disable' if off else 'enable'} {port}" for port, off in changes)
            )
        return "<ok/>", None

    def _create_subscription(self, session: NetconfSession, op: ET.Element) -> tuple[str, None]:
        """RFC 5277 §2.1.1: a stream (default NETCONF), an optional subtree filter; no replay."""
        if session.subscription is not None:
            raise _RpcError("operation-failed", "this session already has a subscription (RFC 5277 §2.1.1)")
        stream, nodes = "NETCONF", []
        for child in op:
            name = _split(child.tag)[1]
            if name == "stream":
                stream = _value(child)
            elif name == "filter":
                if child.get("type", "subtree") != "subtree":
                    raise _RpcError("operation-not-supported", "filter type (only subtree)", type_="protocol")
                nodes = list(child)
            elif name in ("startTime", "stopTime"):
                raise _RpcError(
                    "operation-failed",
                    f"{name}: this switch keeps no notification replay",
                    info={"bad-element": name},
                )
            else:
                raise _RpcError(
                    "unknown-element", f"create-subscription has no {name}", info={"bad-element": name}
                )
        if stream not in STREAMS:
            raise _RpcError(
                "invalid-value",
                f"no stream {stream!r} (streams: {', '.join(STREAMS)})",
                info={"bad-element": "stream"},
            )
        session.subscription = nodes
        return "<ok/>", None

    # -- notifications --------------------------------------------------------------------------------------
    def _report(
        self, origin: NetconfSession, activity: str, moving: asyncio.Task[tuple[int, int]] | None
    ) -> None:
        """A polatis-switch `activity-log-notification` for a change, to every subscribed session: once the
        mirrors have settled (a change of patches) or at once (settings)."""
        event = ET.Element(f"{{{PLTS}}}activity-log-notification")
        _leaf(event, f"{{{PLTS}}}notification-username", origin.user or "")
        if origin.address:
            _leaf(event, f"{{{PLTS}}}notification-ip-address", origin.address)
        _leaf(event, f"{{{PLTS}}}notification-protocol", "NETCONF")
        _leaf(event, f"{{{PLTS}}}notification-activity", activity)
        if moving is None:
            self.notify(event)
            return

        def settled(task: asyncio.Task[tuple[int, int]]) -> None:
            if not task.cancelled() and task.exception() is None:
                self.notify(event)

        moving.add_done_callback(settled)

    def notify(self, event: ET.Element) -> int:
        """Send one notification (RFC 5277 §4) to every session subscribed to it; how many got it."""
        stamp = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime()) + f".{time.time_ns() % 10**9 // 10**6:03d}Z"
        sent = 0
        for session in list(self._sessions):
            assert isinstance(session, NetconfSession)
            if session.subscription is None or session.closed or session.ending:
                continue
            selected = subtree_filter([event], session.subscription or None)
            if not selected:
                continue
            message = (
                f'<notification xmlns="{NOTIF}"><eventTime>{stamp}</eventTime>'
                f"{to_xml(selected[0], NOTIF)}</notification>"
            )
            session.write(self._framed(session, message))
            sent += 1
        self.notifications_sent += sent
        return sent

    def _edit_config(self, session: NetconfSession, op: ET.Element) -> tuple[str, MappingDiff | None]:
        self._datastore(op, "target")
        if self.locked_by is not None and self.locked_by is not session:
            raise _RpcError(
                "in-use",
                "running is locked by another session",
                type_="protocol",
                info={"session-id": str(self.locked_by.session_id)},
            )
        default = _value(op.find(f"{{{BASE}}}default-operation") or ET.Element("x")) or "merge"
        if default not in ("merge", "replace", "none"):
            raise _RpcError("invalid-value", f"default-operation {default!r}", type_="protocol")
        config = op.find(f"{{{BASE}}}config")
        if config is None:
            raise _RpcError(
                "missing-element",
                "edit-config without <config>",
                type_="protocol",
                info={"bad-element": "config"},
            )
        if self.refuse("EDIT-CONFIG"):
            raise _RpcError("operation-failed", "change refused (injected fault)")
        patches = dict(self.model.patches)
        after = dict(patches)
        for container in config:
            ns, name = _split(container.tag)
            if ns != OPSW:
                raise _RpcError(
                    "unknown-namespace", f"{name} in namespace {ns!r}", info={"bad-namespace": ns}
                )
            if name == "voa":
                self._edit_voa(container, default)
            elif name == "opm-config":
                self._edit_opm_config(container, default)
            elif name == "cross-connects":
                self._edit_cross_connects(container, after, default)
            else:
                raise _RpcError("operation-not-supported", f"editing {name} is not supported here")
        egress_of: dict[int, int] = {}
        for ingress, egress in after.items():
            if egress in egress_of:
                raise _RpcError(
                    "in-use",
                    f"egress {egress} would carry ingress {egress_of[egress]} and {ingress}",
                    info={"bad-element": "egress"},
                )
            egress_of[egress] = ingress
        before, wanted = set(patches.items()), set(after.items())
        diff = MappingDiff(remove=frozenset(before - wanted), add=frozenset(wanted - before))
        if not diff.empty:
            self._activity.insert(
                0,
                "cross-connects: "
                + ", ".join(
                    [f"add {i}>{e}" for i, e in sorted(diff.add)]
                    + [f"delete {i}>{e}" for i, e in sorted(diff.remove)]
                ),
            )
        return "<ok/>", diff

    def _entries(self, container: ET.Element, default: str) -> list[tuple[str, int, ET.Element]]:
        """(operation, port-id, entry) of each `port` of a per-port config list (voa, opm-config); a
        container-level delete/remove/replace first resets every port (operation "reset", port 0)."""
        n = self.model.space.n_ingress + self.model.space.n_egress
        name = _split(container.tag)[1]
        container_op = _operation_of(container) or default
        out: list[tuple[str, int, ET.Element]] = []
        if container_op in ("replace", "delete", "remove"):
            out.append(("reset", 0, container))
            if container_op != "replace":
                return out
        inherited = "merge" if container_op == "replace" else container_op
        for entry in container:
            ns, local = _split(entry.tag)
            if ns != OPSW or local != "port":
                raise _RpcError("unknown-element", f"{name} has no {local}", info={"bad-element": local})
            operation = _operation_of(entry) or inherited
            if operation not in ("merge", "replace", "create", "delete", "remove", "none"):
                raise _RpcError(
                    "bad-attribute",
                    f"operation {operation!r}",
                    type_="protocol",
                    info={"bad-attribute": "operation", "bad-element": "port"},
                )
            port_el = entry.find(f"{{{OPSW}}}port-id")
            if port_el is None:
                raise _RpcError(
                    "missing-element", f"{name}/port without port-id", info={"bad-element": "port-id"}
                )
            out.append((operation, _port(port_el, n, "port-id"), entry))
        return out

    def _edit_voa(self, container: ET.Element, default: str) -> None:
        """`voa/port{port-id, atten-mode, atten-level, reference-port}`, checked in full before any is set
        (applied once the edit's cross-connects went in)."""
        space = self.model.space
        settings: dict[int, VoaSetting] = {}
        for operation, port, entry in self._entries(container, default):
            if operation == "reset":
                settings.update({e: VoaSetting() for e in self.model.voa})
                continue
            if not space.is_egress(port):
                raise _RpcError(
                    "invalid-value",
                    f"port {port} is an ingress port: attenuators sit on egress ports",
                    info={"bad-element": "port-id"},
                )
            if operation == "none":
                continue
            current = settings.get(port, self.model.voa_setting(port))
            if operation in ("delete", "remove"):
                if operation == "delete" and current.mode == "VOA_MODE_NONE":
                    raise _RpcError("data-missing", f"port {port} has no attenuation set")
                settings[port] = VoaSetting()
                continue
            if operation == "create" and current.mode != "VOA_MODE_NONE":
                raise _RpcError("data-exists", f"port {port} already has an attenuation set")
            base = current if operation == "merge" else VoaSetting()
            mode_el = entry.find(f"{{{OPSW}}}atten-mode")
            mode = base.mode if mode_el is None else _value(mode_el)
            if mode not in VOA_MODES:
                raise _RpcError(
                    "invalid-value",
                    f"atten-mode {mode!r}: one of {', '.join(VOA_MODES)}",
                    info={"bad-element": "atten-mode"},
                )
            level_el = entry.find(f"{{{OPSW}}}atten-level")
            level = base.level if level_el is None else _decimal2(level_el, "atten-level")
            ref_el = entry.find(f"{{{OPSW}}}reference-port")
            reference = base.reference if ref_el is None else _reference(ref_el, space)
            settings[port] = VoaSetting(mode, level, reference if mode == "VOA_MODE_RELATIVE" else 0)
        if not settings:
            return

        def apply() -> None:
            for port, setting in sorted(settings.items()):
                self.model.set_voa(port, setting)

        self._staged.append(apply)
        self._activity.append(
            "voa: "
            + ", ".join(
                f"port {p} {s.mode}" + (f" {s.level:.2f}" if s.mode in _LEVEL_MODES else "")
                for p, s in sorted(settings.items())
            )
        )

    def _edit_opm_config(self, container: ET.Element, default: str) -> None:
        """`opm-config/port{port-id, wavelength, offset, averaging-time}`, checked in full first."""
        configs: dict[int, OpmConfig] = {}
        for operation, port, entry in self._entries(container, default):
            if operation == "reset":
                configs.update({p: OpmConfig() for p in self.model.opm})
                continue
            if operation == "none":
                continue
            current = configs.get(port, self.model.opm_config(port))
            if operation in ("delete", "remove"):
                configs[port] = OpmConfig()
                continue
            base = current if operation == "merge" else OpmConfig()
            wave_el = entry.find(f"{{{OPSW}}}wavelength")
            offset_el = entry.find(f"{{{OPSW}}}offset")
            avg_el = entry.find(f"{{{OPSW}}}averaging-time")
            wavelength = base.wavelength_nm if wave_el is None else _decimal2(wave_el, "wavelength")
            if not 1260.0 <= wavelength <= 1640.0:
                raise _RpcError(
                    "invalid-value",
                    f"wavelength {wavelength:g} is outside 1260.0..1640.0 nm",
                    info={"bad-element": "wavelength"},
                )
            offset = base.offset_db if offset_el is None else _decimal2(offset_el, "offset")
            if not -100.0 <= offset <= 100.0:
                raise _RpcError(
                    "invalid-value", f"offset {offset:g} is outside -100..100", info={"bad-element": "offset"}
                )
            averaging = base.averaging_time
            if avg_el is not None:
                text = _value(avg_el)
                if not text.isdigit() or not 1 <= int(text) <= 8:
                    raise _RpcError(
                        "invalid-value",
                        f"averaging-time {text!r} is not 1..8",
                        info={"bad-element": "averaging-time"},
                    )
                averaging = int(text)
            configs[port] = OpmConfig(wavelength, offset, averaging)
        if not configs:
            return

        def apply() -> None:
            for port, config in sorted(configs.items()):
                self.model.set_opm(port, config)

        self._staged.append(apply)
        self._activity.append(
            "opm-config: "
            + ", ".join(
                f"port {p} wavelength {c.wavelength_nm:.2f} offset {c.offset_db:.2f} averaging-time "
                f"{c.averaging_time}"
                for p, c in sorted(configs.items())
            )
        )

    def _edit_cross_connects(self, container: ET.Element, after: dict[int, int], default: str) -> None:
        space = self.model.space
        n = space.n_ingress + space.n_egress
        container_op = _operation_of(container) or default
        if container_op in ("replace", "delete", "remove"):
            if container_op == "delete" and not after:
                raise _RpcError("data-missing", "there are no cross-connects to delete")
            after.clear()
            if container_op != "replace":
                return
        inherited = "merge" if container_op == "replace" else container_op
        for entry in container:
            ns, name = _split(entry.tag)
            if ns != OPSW or name != self.list_name:
                raise _RpcError(
                    "unknown-element",
                    f"cross-connects has no {name} (revision {self.revision} calls it {self.list_name})",
                    info={"bad-element": name},
                )
            operation = _operation_of(entry) or inherited
            ingress_el = entry.find(f"{{{OPSW}}}ingress")
            if ingress_el is None:
                raise _RpcError("missing-element", f"{name} without ingress", info={"bad-element": "ingress"})
            ingress = _port(ingress_el, n, "ingress")
            if not space.is_ingress(ingress):
                raise _RpcError(
                    "invalid-value",
                    f"port {ingress} is not an ingress (1..{space.n_ingress})",
                    info={"bad-element": "ingress"},
                )
            egress_el = entry.find(f"{{{OPSW}}}egress")
            egress = None if egress_el is None else _port(egress_el, n, "egress")
            if egress is not None and not space.is_egress(egress):
                raise _RpcError(
                    "invalid-value", f"port {egress} is not an egress", info={"bad-element": "egress"}
                )
            if operation == "none":
                continue
            if operation in ("merge", "replace", "create"):
                if egress is None:
                    raise _RpcError(
                        "missing-element", f"{name} {ingress} without egress", info={"bad-element": "egress"}
                    )
                if operation == "create" and ingress in after:
                    raise _RpcError("data-exists", f"ingress {ingress} is already connected")
                after[ingress] = egress
            elif operation in ("delete", "remove"):
                held = after.get(ingress)
                if held is None or (egress is not None and held != egress):
                    if operation == "delete":
                        raise _RpcError("data-missing", f"no cross-connect {ingress},{egress or '*'}")
                    continue
                del after[ingress]
            else:
                raise _RpcError(
                    "bad-attribute",
                    f"operation {operation!r}",
                    type_="protocol",
                    info={"bad-attribute": "operation", "bad-element": name},
                )

    # -- data trees -----------------------------------------------------------------------------------------
    def _product(self, config_only: bool) -> ET.Element:
        space = self.model.space
        root = ET.Element(f"{{{OPSW}}}product-information")
        _leaf(root, f"{{{OPSW}}}manufacturer", "Polatis")
        _leaf(root, f"{{{OPSW}}}serial-number", "LABCTL-EMU-0001")
        _leaf(root, f"{{{OPSW}}}model-name", f"N-VST-{space.n_ingress}x{space.n_egress}-LABCTL-EMU")
        _leaf(root, f"{{{OPSW}}}software-version", "labctl-emulator")
        return root

    def _cross_connects(self, config_only: bool) -> ET.Element:
        root = ET.Element(f"{{{OPSW}}}cross-connects")
        for ingress, egress in sorted(self.model.patches):
            entry = ET.SubElement(root, f"{{{OPSW}}}{self.list_name}")
            _leaf(entry, f"{{{OPSW}}}ingress", ingress)
            _leaf(entry, f"{{{OPSW}}}egress", egress)
        return root

    def _port_config(self, config_only: bool) -> ET.Element:
        root = ET.Element(f"{{{OPSW}}}port-config")
        for port in self.model.space.all_ports:
            entry = ET.SubElement(root, f"{{{OPSW}}}port")
            _leaf(entry, f"{{{OPSW}}}port-id", port)
            _leaf(entry, f"{{{OPSW}}}label", "")
            if not config_only:
                _leaf(entry, f"{{{OPSW}}}status", "DISABLED" if port in self.disabled else "ENABLED")
        return root

    def _opm_config(self, config_only: bool) -> ET.Element:
        root = ET.Element(f"{{{OPSW}}}opm-config")
        for port in self.model.space.all_ports:
            config = self.model.opm_config(port)
            entry = ET.SubElement(root, f"{{{OPSW}}}port")
            _leaf(entry, f"{{{OPSW}}}port-id", port)
            _leaf(entry, f"{{{OPSW}}}wavelength", f"{config.wavelength_nm:.2f}")
            _leaf(entry, f"{{{OPSW}}}offset", f"{config.offset_db:.2f}")
            _leaf(entry, f"{{{OPSW}}}averaging-time", config.averaging_time)
        return root

    def _voa(self, config_only: bool) -> ET.Element:
        """Every egress port's attenuator (atten-level only where the mode uses it, reference-port only for
        RELATIVE: the YANG's `when` conditions)."""
        root = ET.Element(f"{{{OPSW}}}voa")
        for port in self.model.space.egress:
            setting = self.model.voa_setting(port)
            entry = ET.SubElement(root, f"{{{OPSW}}}port")
            _leaf(entry, f"{{{OPSW}}}port-id", port)
            _leaf(entry, f"{{{OPSW}}}atten-mode", setting.mode)
            if setting.mode in _LEVEL_MODES:
                _leaf(entry, f"{{{OPSW}}}atten-level", f"{setting.level:.2f}")
            if setting.mode == "VOA_MODE_RELATIVE":
                _leaf(entry, f"{{{OPSW}}}reference-port", setting.reference)
        return root

    def _opm_power(self, config_only: bool) -> ET.Element:
        root = ET.Element(f"{{{OPSW}}}opm-power")
        for port in self.model.space.all_ports:
            entry = ET.SubElement(root, f"{{{OPSW}}}port")
            _leaf(entry, f"{{{OPSW}}}port-id", port)
            dbm = self.model.monitor_dbm(port)
            _leaf(entry, f"{{{OPSW}}}power", f"{NO_LIGHT_DBM if dbm is None else dbm:.2f}")
        return root


def _parse(text: str) -> ET.Element:
    if "<!DOCTYPE" in text or "<!ENTITY" in text:
        raise _RpcError("malformed-message", "DTDs are not accepted", type_="rpc")
    try:
        return ET.fromstring(text)
    except ET.ParseError as e:
        raise _RpcError("malformed-message", f"not XML: {e}", type_="rpc") from None


def _operation_of(element: ET.Element) -> str | None:
    """The edit operation, written `operation` (as ONOS does) or in the base namespace (`nc:`/`xc:`)."""
    return element.get(f"{{{BASE}}}operation") or element.get("operation")


_LEVEL_MODES = ("VOA_MODE_ABSOLUTE", "VOA_MODE_RELATIVE", "VOA_MODE_CONVERGED")
"""The modes whose `atten-level` exists (the YANG's `when`)."""


def _decimal2(element: ET.Element, name: str) -> float:
    """A floatFormat2d leaf (decimal64, two fraction digits)."""
    text = _value(element)
    if not _DECIMAL2.match(text):
        raise _RpcError(
            "invalid-value",
            f"{name} {text!r} is not a decimal with up to 2 fraction digits",
            info={"bad-element": name},
        )
    return float(text)


def _reference(element: ET.Element, space: Any) -> int:
    """voa reference-port: 0 (the patched ingress) or an ingress port."""
    text = _value(element)
    if not text.isdigit() or (int(text) != 0 and not space.is_ingress(int(text))):
        raise _RpcError(
            "invalid-value",
            f"reference-port {text!r} is not 0 or an ingress port 1..{space.n_ingress}",
            info={"bad-element": "reference-port"},
        )
    return int(text)


def _port(element: ET.Element, n: int, name: str) -> int:
    text = _value(element)
    if not text.isdigit() or not 1 <= int(text) <= n:
        raise _RpcError("invalid-value", f"{name} {text!r} is not a port 1..{n}", info={"bad-element": name})
    return int(text)


# Garbage: anything but the bytes that delimit XML and NETCONF framing (so that it cannot forge a message
# or a chunk), led by a control character that no XML document may contain.
_NOISE = bytes(b for b in range(256) if b not in b"<>&]#\n")
_CONTROL = bytes(b for b in range(1, 32) if b not in b"\t\n\r")
