"""Polatis NETCONF transport: one ncclient SSH session, driven from asyncio without blocking the loop.

ncclient blocks (paramiko connect, key exchange, authentication, the hello exchange), so every call into it
runs on the session's own worker thread (`_Worker`, one per session, joined on close). Replies are not
waited for on that thread: the driver writes each `<rpc>` with its own message-id, and a listener that
ncclient calls from its reader thread hands every reply back to the loop (`call_soon_threadsafe`) by
message-id, so a request abandoned at its deadline leaves the worker free. Host keys are checked by labctl
alone (known_hosts file or a pinned SHA256 fingerprint) before the password is sent; ncclient's implicit
~/.ssh/known_hosts lookup is switched off so that it cannot widen the policy.

A failed open is one line, `switch NAME at HOST:PORT: CAUSE` (decision 0066): the socket is labctl's own
(`_TapSocket`, which keeps the first bytes the server sent, so a web server on the port is named as one);
a connect abandoned at its deadline shuts that socket down, so paramiko's threads end at once instead of
waiting out its own 15 s banner timeout; what paramiko and ncclient log from the threads of labctl's
sessions (tracebacks included) goes to labctl's logger at DEBUG level, never to the terminal.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import hashlib
import logging
import queue
import socket
import threading
from collections.abc import Callable, Iterable
from concurrent.futures import Future
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

from labctl.core.errors import HardwareError, InputError
from labctl.core.extras import require
from labctl.ocs.connect_errors import (
    ConnectAttempt,
    ConnectFailed,
    answered_not,
    current_attempt,
    format_address,
    os_cause,
)

from .codec import NS_BASE

log = logging.getLogger("labctl.ocs.drivers.polatis_netconf")

T = TypeVar("T")


class NetconfConnectionLost(HardwareError):
    """The NETCONF session ended (closed, reset, timed out, or its messages stopped being NETCONF)."""


class NetconfConnectFailed(ConnectFailed, NetconfConnectionLost):
    """No NETCONF session came of a connection: refused, unreachable, not SSH, the SSH or NETCONF setup
    failed (one line, `switch NAME at HOST:PORT: CAUSE`). A loss like any other to the reconnect loop."""


class NetconfLoginRefused(HardwareError):
    """The switch refused the user or password. Not retried: the next try would be refused too."""


class HostKeyRefused(HardwareError):
    """The switch's SSH host key is not the one the host-key policy accepts; nothing was sent."""


@dataclass(frozen=True)
class HostKeyPolicy:
    """Which SSH host key a switch may present: one listed for it in a known_hosts file, or exactly one
    pinned key (`SHA256:…` as `ssh-keygen -l` prints it). Never "accept whatever comes"."""

    known_hosts: Path | None = None
    sha256: str | None = None

    def check(self, host: str, port: int, key: Any) -> str | None:
        """None when the paramiko key `key` is acceptable, else why not (one line)."""
        fingerprint = sha256_fingerprint(key.asbytes())
        if self.sha256 is not None:
            if fingerprint == normalize_fingerprint(self.sha256):
                return None
            return f"host key {fingerprint} is not the pinned {normalize_fingerprint(self.sha256)}"
        if self.known_hosts is None:
            return f"no host-key policy accepts {fingerprint}"
        paramiko = require("paramiko", "netconf", "the polatis-netconf driver")
        keys = paramiko.HostKeys()
        try:
            keys.load(str(self.known_hosts))
        except OSError as e:
            return f"cannot read known_hosts {self.known_hosts}: {e.strerror or e}"
        for name in (host, f"[{host}]:{port}"):
            if keys.check(name, key):
                return None
        return f"host key {fingerprint} of {host}:{port} is not in {self.known_hosts}"


def sha256_fingerprint(blob: bytes) -> str:
    """OpenSSH's `SHA256:<base64 without padding>` of a public key blob."""
    return "SHA256:" + base64.b64encode(hashlib.sha256(blob).digest()).decode().rstrip("=")


def normalize_fingerprint(text: str) -> str:
    text = text.strip()
    return text if text.startswith("SHA256:") else f"SHA256:{text}"


class _Worker:
    """One thread that runs one session's blocking calls in order. A call whose caller gave up (a deadline)
    still runs; its result then goes to `orphan` on this thread (e.g. to close a session that finished
    connecting after nobody wanted it any more)."""

    def __init__(self, name: str) -> None:
        self._jobs: queue.SimpleQueue[tuple[Callable[[], Any], Future[Any]] | None] = queue.SimpleQueue()
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        _own(self._thread)
        self._thread.start()

    def _run(self) -> None:
        while True:
            job = self._jobs.get()
            if job is None:
                return
            fn, future = job
            if not future.set_running_or_notify_cancel():
                continue
            try:
                future.set_result(fn())
            except BaseException as e:  # handed to the awaiting coroutine
                future.set_exception(e)

    def submit(self, fn: Callable[[], T]) -> Future[T]:
        future: Future[T] = Future()
        self._jobs.put((fn, future))
        return future

    async def call(self, fn: Callable[[], T], orphan: Callable[[T], None] | None = None) -> T:
        future = self.submit(fn)
        try:
            return await asyncio.wrap_future(future)
        except asyncio.CancelledError:
            if orphan is not None:

                def adopt(done: Future[T]) -> None:
                    if not done.cancelled() and done.exception() is None:
                        result = done.result()
                        if self._thread.is_alive():
                            self.submit(lambda: orphan(result))
                        else:
                            orphan(result)

                future.add_done_callback(adopt)
            raise

    async def stop(self) -> None:
        """Run what is queued, end the thread and join it. The join itself is immediate: the thread has
        nothing left but to return."""
        await asyncio.shield(asyncio.wrap_future(self.submit(lambda: None)))
        self._jobs.put(None)
        self._thread.join(1.0)


@dataclass(frozen=True)
class Endpoint:
    host: str
    port: int


class NetconfConnection:
    """One NETCONF session over SSH. `open` connects, authenticates and exchanges hellos on the worker
    thread; `request(xml)` sends one `<rpc>` body and returns the raw `<rpc-reply>`; `close` ends it with
    `<close-session/>` and joins every thread it started (worker, ncclient's reader, paramiko's)."""

    def __init__(self, label: str, on_message: Callable[[str, str], None]) -> None:
        self.label = label
        self._on_message = on_message  # (kind, raw) of what no request waits for: notifications, late replies
        self._worker = _Worker(f"netconf:{label}")
        self._session: Any = None
        self._pending: dict[str, asyncio.Future[str]] = {}
        self._message_id = 0
        self._loop = asyncio.get_running_loop()
        self.capabilities: tuple[str, ...] = ()
        self.session_id = ""
        self.base = "1.0"
        self.lost: str | None = None
        """Why the session ended; None while it is up."""
        self._dial: _Dial | None = None
        self._answered = False

    # -- opening --------------------------------------------------------------------------------------------
    async def open(
        self, endpoint: Endpoint, user: str, password: str, policy: HostKeyPolicy, timeout_s: float
    ) -> None:
        _quiet_third_party_logs()
        address = format_address(endpoint.host, endpoint.port)
        dial = _Dial(current_attempt(self.label), self.label, address)
        dial.attempt.dialling(address, "SSH")
        self._dial = dial

        def connect() -> Any:
            return _connect(endpoint, user, password, policy, timeout_s, self._listener(), dial)

        try:
            self._session = await self._worker.call(connect, orphan=_close_quietly)
        except asyncio.CancelledError:  # the connect deadline: end paramiko's wait now, not at its own
            dial.attempt.interrupted = True
            dial.abort()
            raise
        except HostKeyRefused as e:
            self.lost = "host key refused"
            raise HostKeyRefused(f"switch {self.label} at {address}: {e}; refusing to log in") from None
        except InputError:
            self.lost = "refused"
            raise
        except Exception as e:  # ncclient/paramiko/socket errors: one line, the reason kept
            if type(e).__name__ == "AuthenticationError":  # ncclient's: the switch refused the login
                self.lost = "login refused"
                raise NetconfLoginRefused(
                    f"switch {self.label} at {address}: authentication failed for user {user!r} "
                    "(wrong user or password)"
                ) from None
            self.lost = dial.cause(e, timeout_s, endpoint.host)
            raise NetconfConnectFailed(self.label, address, self.lost) from None
        dial.attempt.protocol = "NETCONF"
        dial.attempt.waiting_for = "no answer to the first NETCONF request"
        session = self._session
        self.capabilities = tuple(str(c) for c in session.server_capabilities)
        self.session_id = str(session.id or "")
        self.base = negotiated_base(session.client_capabilities, session.server_capabilities)

    def _listener(self) -> Any:
        transport = require("ncclient.transport", "netconf", "the polatis-netconf driver")
        connection = self

        class Listener(transport.SessionListener):  # type: ignore[misc, name-defined]
            """Called on ncclient's reader thread: hand everything to the loop."""

            def callback(self, root: tuple[str, dict[str, str]], raw: str) -> None:
                tag, attrs = root
                connection._loop.call_soon_threadsafe(connection._arrived, tag, attrs.get("message-id"), raw)

            def errback(self, ex: Exception) -> None:
                connection._loop.call_soon_threadsafe(connection._fail, _describe(ex))

        return Listener()

    # -- requests -------------------------------------------------------------------------------------------
    def next_message_id(self) -> str:
        self._message_id += 1
        return str(self._message_id)

    async def request(self, message_id: str, envelope: str) -> str:
        """Send one whole `<rpc>` (its message-id given) and wait for its reply. Being cancelled (a deadline)
        leaves the request outstanding: its reply, if one comes, is reported as late."""
        if self.lost is not None or self._session is None:
            raise NetconfConnectionLost(f"{self.label}: session lost ({self.lost or 'not open'})")
        future: asyncio.Future[str] = self._loop.create_future()
        self._pending[message_id] = future
        session, framed = self._session, frame(envelope, self.base)
        try:
            await self._worker.call(lambda: _write(session, framed))
            raw = await future
            self._answered = True
            return raw
        except asyncio.CancelledError:
            if not self._answered and self._dial is not None:  # still opening: the connect deadline
                self._dial.attempt.interrupted = True
            raise
        except NetconfConnectionLost:
            raise
        except Exception as e:  # the channel refused the bytes: the session is gone
            self._pending.pop(message_id, None)
            future.cancel()  # nobody will await it: this raises instead
            self._fail(_describe(e))
            raise NetconfConnectionLost(f"{self.label}: session lost ({self.lost})") from None
        finally:
            self._pending.pop(message_id, None)

    def _arrived(self, tag: str, message_id: str | None, raw: str) -> None:
        if tag == f"{{{NS_BASE}}}rpc-reply" and message_id is not None:
            future = self._pending.pop(message_id, None)
            if future is not None and not future.done():
                future.set_result(raw)
                return
            self._on_message("late-reply", raw)
            return
        if tag.endswith("}hello") or tag == "hello":
            return  # the server's hello, taken by ncclient
        self._on_message("notification" if tag.endswith("}notification") else "unexpected", raw)

    def _fail(self, reason: str) -> None:
        if self.lost is None:
            self.lost = reason
        for future in self._pending.values():
            if not future.done():
                future.set_exception(NetconfConnectionLost(f"{self.label}: session lost ({self.lost})"))
        self._pending.clear()

    def broken(self, reason: str) -> None:
        """Mark the session unusable (a request was abandoned, a reply made no sense): the next user opens a
        new one; this one is closed by `close`."""
        self._fail(reason)

    # -- closing --------------------------------------------------------------------------------------------
    async def close(self, goodbye: Callable[[str], str] | None = None, timeout_s: float = 1.0) -> None:
        """End the session: `goodbye(message_id)` is the whole `<close-session>` rpc, sent (and its reply
        awaited up to `timeout_s`) only while the session is healthy. Then every thread is joined."""
        try:
            if self._session is not None and goodbye is not None and self.lost is None:
                message_id = self.next_message_id()
                try:
                    async with asyncio.timeout(timeout_s):
                        await self.request(message_id, goodbye(message_id))
                except (HardwareError, TimeoutError):
                    pass
            self._fail("closed")
            session, self._session = self._session, None
            if session is not None:
                await self._worker.call(lambda: _close_quietly(session))
        finally:
            await self._worker.stop()


BASE_11 = "urn:ietf:params:netconf:base:1.1"


def negotiated_base(client: Iterable[object], server: Iterable[object]) -> str:
    """The framing both ends use after the hello (RFC 6241 8.1): base:1.1 where both advertise it, else
    1.0, from the session's public capabilities (the rule ncclient itself applies)."""
    return "1.1" if BASE_11 in {str(c) for c in client} and BASE_11 in {str(c) for c in server} else "1.0"


def frame(message: str, base: str) -> bytes:
    """RFC 6242 framing of one message: `]]>]]>` after it (base:1.0) or one chunk and the end-of-chunks
    marker (base:1.1)."""
    data = message.encode()
    if base == "1.1":
        return b"\n#%d\n%s\n##\n" % (len(data), data)
    return data + b"]]>]]>"


def _write(session: Any, data: bytes) -> None:
    """On the worker thread: the framed request straight onto the SSH channel. ncclient's own writer polls
    its queue only between 100 ms selects on the channel (its TICK), which would add up to 100 ms to every
    command's round trip; the session's reader thread is untouched, and paramiko channels take a send from
    one thread while another receives."""
    # `_transport_write` is SSHSession's own private writer (ncclient 0.6.15-0.7.x, pinned below 0.8 in
    # pyproject.toml; tests/unit/test_private_internals.py fails loudly if it goes)
    while data:
        sent = session._transport_write(data)
        if sent <= 0:
            raise NetconfConnectionLost("the SSH channel is closed")
        data = data[sent:]


def _connect(
    endpoint: Endpoint,
    user: str,
    password: str,
    policy: HostKeyPolicy,
    timeout_s: float,
    listener: Any,
    dial: _Dial,
) -> Any:
    """On the worker thread: SSH (host key checked before the password goes out), the `netconf` subsystem,
    the hello exchange. Returns the ncclient session with `listener` installed. `dial` holds the socket
    (so the loop can abort the connect) and records how far it got."""
    transport = require("ncclient.transport", "netconf", "the polatis-netconf driver")
    devices = require("ncclient.devices.default", "netconf", "the polatis-netconf driver")
    refusal: list[str] = []

    class Handler(devices.DefaultDeviceHandler):  # type: ignore[misc, name-defined]
        def handle_raw_dispatch(self, raw: str) -> Exception:
            # ncclient could not parse a message: say so to every listener (the session is then replaced)
            # instead of dropping it and leaving the request to time out.
            return NetconfConnectionLost(f"the switch sent a message that is not XML ({len(raw)} bytes)")

    class Session(transport.SSHSession):  # type: ignore[misc, name-defined]
        def load_known_hosts(self, filename: str | None = None) -> None:
            """Host keys are labctl's HostKeyPolicy alone; never ncclient's implicit ~/.ssh/known_hosts."""

    session = Session(Handler({}, None))
    _own(session)  # its reader thread: what it logs is labctl's

    def host_key_ok(host: str, _md5: str) -> bool:
        why = policy.check(endpoint.host, endpoint.port, session.transport.get_remote_server_key())
        if why is not None:
            refusal.append(why)
        dial.attempt.waiting_for = "the SSH login and the NETCONF hello did not finish"
        return why is None

    # Our own socket, with Nagle off: a request is one small SSH packet, and with Nagle on it waits for the
    # ACK of the previous one (a delayed ACK: ~40 ms on Linux), e.g. the first request after the hello.
    sock = dial.connect(endpoint, timeout_s)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    try:
        session.connect(
            endpoint.host,
            port=endpoint.port,
            sock=sock,
            timeout=timeout_s,
            username=user,
            password=password,
            hostkey_verify=True,
            unknown_host_cb=host_key_ok,
            allow_agent=False,
            look_for_keys=False,
        )
    except BaseException:
        _close_quietly(session)
        sock.close()
        if refusal:
            raise HostKeyRefused(refusal[0]) from None
        raise
    session.add_listener(listener)
    return session


def _close_quietly(session: Any) -> None:
    """Close an ncclient session and join its threads (ncclient's reader, paramiko's transport)."""
    try:
        if session.transport is not None:
            session.close()
            session.transport.join(5.0)
    except Exception as e:  # closing a half-dead session: nothing to report
        log.debug("closing a NETCONF session: %s", _describe(e))


def _describe(e: BaseException) -> str:
    text = str(e).strip().splitlines()[0] if str(e).strip() else ""
    return f"{type(e).__name__}: {text}" if text else type(e).__name__


class _TapSocket(socket.socket):
    """The session's TCP socket: as any, but it keeps the first bytes the server sends (`dial.hear`)."""

    dial: _Dial | None = None

    def recv(self, bufsize: int, flags: int = 0) -> bytes:
        data = super().recv(bufsize, flags)
        dial = self.dial
        if dial is not None and data:
            dial.hear(data)
        return data


class _Dial:
    """One connect's socket and what it heard, shared by the worker thread (which connects) and the loop
    (which aborts a connect its deadline gave up on)."""

    def __init__(self, attempt: ConnectAttempt, label: str, address: str) -> None:
        self.attempt = attempt
        self.label = label
        self.address = address
        self.sock: _TapSocket | None = None
        self.heard = b""
        self.aborted = False

    def connect(self, endpoint: Endpoint, timeout_s: float) -> _TapSocket:
        """On the worker thread: TCP to the switch, as a `_TapSocket`."""
        plain = socket.create_connection((endpoint.host, endpoint.port), timeout=timeout_s)
        sock = _TapSocket(plain.family, plain.type, plain.proto, fileno=plain.detach())
        sock.settimeout(timeout_s)
        sock.dial = self
        self.sock = sock
        self.attempt.connected = True
        self.attempt.waiting_for = "no SSH banner"
        if self.aborted:  # the loop gave up while the TCP connect was under way
            self._shut(sock)
        return sock

    def hear(self, data: bytes) -> None:
        if len(self.heard) < 256:
            self.heard += data[: 256 - len(self.heard)]
            self.attempt.hear(data)
            ssh = self.heard.lstrip().startswith(b"SSH-") or b"\nSSH-" in self.heard
            if ssh and not self.attempt.understood:
                self.attempt.understood = True
                self.attempt.waiting_for = "the SSH key exchange did not finish"

    def abort(self) -> None:
        """From the loop: end the connect now (paramiko's reads fail at once; its threads end)."""
        self.aborted = True
        if self.sock is not None:
            self._shut(self.sock)

    @staticmethod
    def _shut(sock: socket.socket) -> None:
        with contextlib.suppress(OSError):
            sock.shutdown(socket.SHUT_RDWR)

    def cause(self, e: BaseException, timeout_s: float, host: str) -> str:
        """Why the connect failed, in words (decision 0066)."""
        if self.sock is None:  # the TCP connect itself failed
            return os_cause(e, timeout_s, host)
        if self.heard and not self.attempt.understood:
            return answered_not("SSH", self.heard)
        if not self.heard:
            if _is_eof(e):
                return "closed the connection without answering"
            return f"connected, but no SSH banner ({_describe(e)})"
        text = _describe(e).removeprefix("SSHError: ").removeprefix("Negotiation failed: ")
        return f"SSH answered, but the NETCONF session did not start: {text}"


def _is_eof(e: BaseException) -> bool:
    text = str(e)
    return any(w in text for w in ("EOF", "reset by peer", "Connection reset", "closed")) or isinstance(
        e, EOFError | ConnectionError
    )


_OWNED = "labctl_netconf"
_QUIET_LOGGERS = (
    "paramiko.transport",
    "ncclient.transport.ssh",
    "ncclient.transport.session",
    "ncclient.transport.parser",
    "ncclient.operations.rpc",
)


def _own(thread: threading.Thread) -> None:
    """Mark a thread as one of labctl's NETCONF sessions' (what it logs is kept from the terminal)."""
    setattr(thread, _OWNED, True)


class _FromOwnThreads(logging.Filter):
    """Keeps what paramiko and ncclient log on the threads of labctl's sessions (the worker, ncclient's
    reader, paramiko's transport over a `_TapSocket`) from the terminal: it goes to labctl's logger at
    DEBUG instead. The failure itself reaches the user as one line (decision 0066)."""

    def filter(self, record: logging.LogRecord) -> bool:
        thread = threading.current_thread()
        if getattr(thread, _OWNED, False) or isinstance(getattr(thread, "sock", None), _TapSocket):
            log.debug("%s: %s", record.name, record.getMessage().strip().splitlines()[-1:])
            return False
        return True


_FILTER = _FromOwnThreads()


def _quiet_third_party_logs() -> None:
    for name in _QUIET_LOGGERS:
        logger = logging.getLogger(name)
        if _FILTER not in logger.filters:
            logger.addFilter(_FILTER)
