"""The NETCONF front end of the switch emulator: a NETCONF server over SSH that behaves like a Polatis switch.

Sessions, users, the fault plan and the order in which changes take effect are the shared core's
(labctl.emulators.core); what each operation does is labctl.emulators.netconf_rpc's, on the data of
labctl.emulators.netconf_data. This module serves SSH (asyncssh, 127.0.0.1, a host key generated for this
emulator and never written anywhere), the `netconf` subsystem, RFC 6242 framing (base:1.0 `]]>]]>`, and
base:1.1 chunks once both hellos name it: labctl.emulators.netconf_session), the hello with the Polatis
optical-switch module revision, and the polatis-switch `activity-log-notification` of every change to the
sessions subscribed (RFC 5277). Replies leave in the order the requests came (RFC 6241 §4.5), each after
the model's mirrors have settled, with the fault plan's faults. The fault plan counts every `<rpc>` (not
the hello); a drop hangs up the SSH connection; garbage goes inside a reply's XML (well framed, not XML)
or before its framing (`between`).
"""

from __future__ import annotations

import asyncio
import dataclasses
import itertools
import time
import xml.etree.ElementTree as ET
from collections.abc import Mapping as MappingType
from typing import Any, cast
from xml.sax.saxutils import escape

from labctl.core.errors import InputError
from labctl.core.extras import require
from labctl.emulators.core import FaultPlan, Session, load_faults
from labctl.emulators.netconf_data import (
    BASE,
    LATEST_REVISION,
    NOTIF,
    OPSW,
    PLTS,
    activity_log_notification,
    subtree_filter,
    text_of,
    to_xml,
)
from labctl.emulators.netconf_rpc import NetconfOperations, RpcError, parse_xml
from labctl.emulators.netconf_session import (
    ChannelWriter,
    FramingError,
    NetconfSession,
    frame_chunked,
    frame_eom,
    take_chunked,
    take_eom,
)
from labctl.models.switch import SwitchModel

__all__ = ["NetconfEmulator", "load_faults"]

CAP_10 = "urn:ietf:params:netconf:base:1.0"
CAP_11 = "urn:ietf:params:netconf:base:1.1"
CAPABILITIES = (
    "urn:ietf:params:netconf:capability:writable-running:1.0",
    "urn:ietf:params:netconf:capability:notification:1.0",  # RFC 5277 §3.1
    "urn:ietf:params:netconf:capability:interleave:1.0",  # RFC 5277 §6: RPCs go on while subscribed
    f"{PLTS}?module=polatis-switch&revision=2017-09-11",
)
MAX_MESSAGE = 4 * 1024 * 1024  # one edit-config of every pair on a 576x576 switch is ~100 kB


class NetconfEmulator(NetconfOperations):
    """The NETCONF front end. `start()` serves SSH on (127.0.0.1, ephemeral port by default); `close()`
    ends every session. `host_key_sha256` is the fingerprint of the key it serves (a client pins it).
    `revision` is the optical-switch module revision its hello advertises (before 2017-08-04 the list is
    `pairs`); `bases` the framings it offers. Test API (from the core): `set_faults`, `lose_state`,
    `commands`, `sessions`."""

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
            model,
            revision=revision,
            users=users,
            host=host,
            port=port,
            faults=faults,
            session_timeout_s=session_timeout_s,
        )
        if not bases or not set(bases) <= {"1.0", "1.1"}:
            raise InputError(f"NETCONF base versions {bases!r}: choose from 1.0 and 1.1")
        self._asyncssh = require("asyncssh", "netconf", "the NETCONF emulator")
        self._host_key = self._asyncssh.generate_private_key("ssh-ed25519")
        self.host_key_sha256: str = self._host_key.get_fingerprint("sha256")
        self.host_key_openssh: str = self._host_key.export_public_key("openssh").decode().strip()
        """The public key as a known_hosts line writes it (`ssh-ed25519 AAAA…`)."""
        self.bases = bases
        self.notifications_sent = 0
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

    async def _process(self, process: Any) -> None:
        """One SSH channel: only the `netconf` subsystem; the hello goes out at once (RFC 6241 §8.1)."""
        if process.subsystem != "netconf":
            process.stderr.write(b"this switch serves only the netconf subsystem\n")
            process.exit(1)
            return
        writer = ChannelWriter(process)
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
        reply, moving, activity = await self.answer(session, text)
        if activity:
            self._report(session, activity, moving)
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
            hello = parse_xml(text)
        except RpcError:
            session.abort()
            return
        if hello.tag != f"{{{BASE}}}hello" or hello.find(f"{{{BASE}}}session-id") is not None:
            session.abort()
            return
        caps = {text_of(c) for c in hello.iter(f"{{{BASE}}}capability")}
        if (
            not caps
            & {CAP_10, CAP_11}
            & {c for c, b in ((CAP_10, "1.0"), (CAP_11, "1.1")) if b in self.bases}
        ):
            session.abort()
            return
        session.hello_done = True
        session.base = "1.1" if CAP_11 in caps and "1.1" in self.bases else "1.0"

    # -- notifications --------------------------------------------------------------------------------------
    def _report(
        self, origin: NetconfSession, activity: str, moving: asyncio.Task[tuple[int, int]] | None
    ) -> None:
        """A polatis-switch `activity-log-notification` for a change, to every subscribed session: once the
        mirrors have settled (a change of patches) or at once (settings)."""
        event = activity_log_notification(origin.user or "", origin.address, activity)
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


# Garbage: anything but the bytes that delimit XML and NETCONF framing (so that it cannot forge a message
# or a chunk), led by a control character that no XML document may contain.
_NOISE = bytes(b for b in range(256) if b not in b"<>&]#\n")
_CONTROL = bytes(b for b in range(1, 32) if b not in b"\t\n\r")
