"""One line per failed connection to a switch: `switch NAME at ADDRESS: CAUSE` (decision 0066).

The causes, worded alike for every driver: connection refused; no route to host / network unreachable;
cannot resolve the host name; timed out after N s (no answer to the connection request, or connected but
no answer to the protocol's first exchange: which); answered, but not with PROTOCOL (and what it sent);
closed the connection without answering; authentication failed.

Two halves. A driver's transport (its connection.py / port.py) raises `ConnectFailed` itself for what it
sees happen: an `OSError` from the connect (`os_cause`), bytes that are plainly another protocol, a peer
that hangs up before saying anything. What it cannot see is the switch's own connect deadline running out
(`TimeoutPolicy.deadline` raises a bare "connect did not finish within N s"): for that, the transport
writes down how far it got in the `ConnectAttempt` of the current connect (`current_attempt()`), and
`report_connect_failures`, put around `connect` by `labctl.ocs.switches.open_switch`, turns the deadline's
error into the line that says where it stopped.
"""

from __future__ import annotations

import contextvars
import errno
import functools
import socket
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

from labctl.core.errors import HardwareError

__all__ = [
    "ConnectAttempt",
    "ConnectFailed",
    "answered_not",
    "current_attempt",
    "foreign_protocol",
    "format_address",
    "os_cause",
    "report_connect_failures",
    "sample",
]


class ConnectFailed(HardwareError):
    """A switch could not be reached or did not speak its protocol: one line naming the switch, the address
    and the cause. Drivers raise it through a subclass that is also their own "connection lost" class, so
    that a reconnect loop retries it like any other loss."""

    def __init__(self, switch: str, address: str, cause: str) -> None:
        self.switch = switch
        self.address = address
        self.cause = cause
        super().__init__(f"switch {switch} at {address}: {cause}")


def format_address(host: str, port: int | None = None) -> str:
    """`host:port` (`[v6]:port`); a serial URL or device path is passed as `host` alone."""
    if port is None:
        return host
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


_CAUSES = {
    errno.ECONNREFUSED: "connection refused (nothing listens on that port)",
    errno.EHOSTUNREACH: "no route to host",
    errno.ENETUNREACH: "network unreachable",
    errno.EHOSTDOWN: "host is down",
    errno.ECONNRESET: "connection reset by the peer",
    errno.ECONNABORTED: "connection aborted",
    errno.EADDRNOTAVAIL: "address not available on this machine",
    errno.EACCES: "connection not permitted (a firewall on this machine?)",
    errno.EPERM: "connection not permitted (a firewall on this machine?)",
}


def os_cause(e: BaseException, timeout_s: float | None = None, host: str = "") -> str:
    """The cause of a failed connect, in words, from the OSError (or the first OSError it was raised from,
    as libraries wrap them); a generic description of anything else."""
    os_error = _os_error_in(e)
    if isinstance(os_error, socket.gaierror):
        return f"cannot resolve the host name {host!r}" if host else "cannot resolve the host name"
    if isinstance(os_error, TimeoutError) or (os_error is not None and os_error.errno == errno.ETIMEDOUT):
        after = f" after {timeout_s:g} s" if timeout_s is not None else ""
        return f"timed out{after}: no answer to the connection request"
    if os_error is not None:
        if os_error.errno in _CAUSES:
            return _CAUSES[os_error.errno]
        if os_error.strerror:
            return os_error.strerror[:1].lower() + os_error.strerror[1:]
    text = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
    return text


def _os_error_in(e: BaseException | None) -> OSError | None:
    """`e` if it is an OSError with an errno (or a timeout), else the first one in its chain."""
    seen = 0
    while e is not None and seen < 8:
        if isinstance(e, OSError) and (e.errno is not None or isinstance(e, TimeoutError)):
            return e
        e = e.__cause__ or e.__context__
        seen += 1
    return None


def sample(data: bytes | str, limit: int = 40) -> str:
    """A short, printable quote of what a peer sent: its first line, non-ASCII escaped, `…` if cut."""
    text = data.decode("latin-1") if isinstance(data, bytes) else data
    text = text.lstrip("\r\n")
    first = text.split("\n", 1)[0].rstrip("\r")
    more = len(first) > limit or len(first) < len(text.rstrip("\r\n"))
    shown = "".join(c if " " <= c <= "~" else f"\\x{ord(c):02x}" for c in first[:limit])
    return f"'{shown}'" + ("…" if more else "")


_SIGNATURES = (
    (b"SSH-", "an SSH server"),
    (b"HTTP/", "a web server"),
    (b"\xff\xfb", "a telnet server"),
    (b"\xff\xfd", "a telnet server"),
    (b"\x16\x03", "a TLS server"),
)


def foreign_protocol(data: bytes) -> str | None:
    """What `data` (a peer's first bytes) plainly is, when it is a protocol no switch protocol starts with:
    an SSH or HTTP server, telnet negotiation, TLS. None when it could be anything else."""
    head = data.lstrip(b"\r\n")
    for prefix, what in _SIGNATURES:
        if head.startswith(prefix):
            return what
    return None


def answered_not(protocol: str, heard: bytes, hint: str = "") -> str:
    """`answered, but not with PROTOCOL (it sent '…')`, naming the protocol it was where that is plain."""
    what = foreign_protocol(heard)
    sent = f"{what} sent {sample(heard)}" if what else f"it sent {sample(heard)}"
    return f"answered, but not with {protocol} ({sent}{hint})"


@dataclass
class ConnectAttempt:
    """How far one `connect` got, written by the driver's transport as it goes (from any thread: each field
    is one assignment), read by `report_connect_failures` when the connect deadline ends it."""

    switch: str
    timeout_s: float | None = None
    address: str = ""
    protocol: str = ""
    """What the switch should speak (TL1, SSH, SCPI...), for "answered, but not with ..."."""
    connected: bool = False
    """The transport is up (TCP connected, port open)."""
    waiting_for: str = ""
    """What was missing when last heard of, to follow "connected, but": "no answer to ACT-USER", "no SSH
    banner", "the SSH key exchange did not finish"."""
    heard: bytes = b""
    """The first bytes the peer sent (a sample), if any."""
    understood: bool = False
    """The peer sent at least one message of the expected protocol."""
    interrupted: bool = False
    """The transport's wait was cancelled: the connect deadline passed (or the caller gave up)."""
    notes: list[str] = field(default_factory=list)

    def dialling(self, address: str, protocol: str) -> None:
        """A connection to `address` starts. Dialling the same address again within one connect (a driver
        that reopens its line) keeps what the earlier tries heard."""
        if address == self.address and protocol == self.protocol:
            return
        self.address, self.protocol = address, protocol
        self.connected = self.understood = self.interrupted = False
        self.heard = b""
        self.waiting_for = ""

    def hear(self, data: bytes) -> None:
        if data and len(self.heard) < 256:
            self.heard += data[: 256 - len(self.heard)]

    def explain(self) -> str | None:
        """The cause, when what was recorded says more than a bare "did not finish": the deadline passed
        at a known step, or the peer answered in another protocol. None: nothing to add."""
        if not self.address:
            return None
        if self.heard and not self.understood:
            return answered_not(self.protocol, self.heard)
        if not self.interrupted:
            return None
        after = f"timed out after {self.timeout_s:g} s" if self.timeout_s is not None else "timed out"
        if not self.connected:
            return f"{after}: no answer to the connection request"
        return f"{after}: connected, but {self.waiting_for or 'the protocol did not answer'}"

    def failure(self) -> ConnectFailed | None:
        cause = self.explain()
        return None if cause is None else ConnectFailed(self.switch, self.address, cause)


_current: contextvars.ContextVar[ConnectAttempt | None] = contextvars.ContextVar(
    "labctl_connect_attempt", default=None
)


def current_attempt(switch: str) -> ConnectAttempt:
    """The record of the connect now running for `switch` (inside `report_connect_failures`), or a
    detached one that nobody reads (a reconnect, a driver built without `open_switch`)."""
    attempt = _current.get()
    if attempt is not None and attempt.switch == switch:
        return attempt
    return ConnectAttempt(switch)


def report_connect_failures(
    name: str, connect: Callable[[], Awaitable[None]], timeout_s: float
) -> Callable[[], Awaitable[None]]:
    """`connect` with its failures as one line each: a `ConnectFailed` from the transport goes through; a
    bare HardwareError (the deadline's) becomes the line the transport's record explains, if it does."""

    @functools.wraps(connect)
    async def connect_reporting() -> None:
        attempt = ConnectAttempt(name, timeout_s)
        token = _current.set(attempt)
        try:
            await connect()
        except ConnectFailed:
            raise
        except HardwareError:
            failure = attempt.failure()
            if failure is None:
                raise
            raise failure from None
        finally:
            _current.reset(token)

    return connect_reporting
