"""Polatis SCPI transport: one pyvisa resource (pyvisa-py, `TCPIP::<host>::<port>::SOCKET`) that lives on
one dedicated worker thread, behind async calls, so the event loop never blocks on it.

pyvisa blocks, and pyvisa-py's socket read cannot tell a closed connection from a slow one (it waits out
its timeout, spinning). So before each read the worker waits for the socket itself: readable, and not at
its end (a peek); a line cut short by a hang-up then comes back without its LF and is refused by the
codec. A caller that gives up (its deadline) shuts the socket down from the loop thread, which wakes the
worker at once; the session is then lost (a late reply would pair with the next query) and the driver
opens a new one. Decision 0032.

Until the switch has answered once, what goes wrong is a failed connection, one line naming its cause
(`switch NAME at HOST:PORT: CAUSE`, decision 0066): refused or unreachable, closed without a word, or
answered with something that is not SCPI (bytes before any command, a line that is not ASCII, an `*IDN?`
answer that is not an identity).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import queue
import select
import socket
import threading
import time
from collections.abc import Callable
from types import ModuleType
from typing import Any, TypeVar

from labctl.core.errors import HardwareError
from labctl.core.extras import require
from labctl.ocs.connect_errors import ConnectFailed, answered_not, current_attempt, format_address, os_cause

from .codec import IDENTITY_QUERY, ScpiError, decode_reply, encode_command, parse_identity

T = TypeVar("T")


class ScpiConnectionLost(HardwareError):
    """The session ended (closed, reset, timed out mid-reply, or its lines stopped making sense)."""


class ScpiNotSent(ScpiConnectionLost):
    """The session was found ended before the command went out: it is safe to send it on a new one."""


class ScpiConnectFailed(ConnectFailed, ScpiNotSent):
    """No SCPI session came of a connection: refused, unreachable, or the peer does not speak SCPI (one
    line, `switch NAME at HOST:PORT: CAUSE`). A loss like any other to the reconnect loop."""


def load_pyvisa() -> tuple[ModuleType, ModuleType]:
    """pyvisa and its pure-Python backend, or one line naming the extra to install."""
    purpose = "the Polatis SCPI driver"
    return require("pyvisa", "scpi", purpose), require("pyvisa_py", "scpi", purpose)


class Worker:
    """One thread that runs jobs in order. `call` awaits a job's result without blocking the loop; `stop`
    lets queued jobs finish, then ends and joins the thread."""

    def __init__(self, name: str) -> None:
        self._jobs: queue.SimpleQueue[Callable[[], None] | None] = queue.SimpleQueue()
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()
        self.stopped = False

    def _run(self) -> None:
        while (job := self._jobs.get()) is not None:
            job()

    async def call(self, fn: Callable[[], T]) -> T:
        if self.stopped:
            raise ScpiConnectionLost("worker thread stopped")
        loop = asyncio.get_running_loop()
        future: asyncio.Future[T] = loop.create_future()

        def settle(result: Any, error: BaseException | None) -> None:
            if future.done():  # the caller gave up (cancelled): nobody reads this result
                return
            if error is not None:
                future.set_exception(error)
            else:
                future.set_result(result)

        def job() -> None:
            try:
                result: Any = fn()
                error: BaseException | None = None
            except BaseException as e:  # delivered to the awaiting caller
                result, error = None, e
            with contextlib.suppress(RuntimeError):  # the loop is closed: nobody waits any more
                loop.call_soon_threadsafe(settle, result, error)

        self._jobs.put(job)
        return await future

    async def stop(self) -> None:
        if self.stopped:
            return
        self.stopped = True
        loop = asyncio.get_running_loop()
        done = loop.create_future()

        def last() -> None:
            with contextlib.suppress(RuntimeError):
                loop.call_soon_threadsafe(_finish, done)

        self._jobs.put(last)
        self._jobs.put(None)
        await asyncio.shield(done)  # if this is cancelled, the thread still ends by itself after its job
        self._thread.join(timeout=1.0)  # it has run its last job: it ends now


class ScpiConnection:
    """One SCPI session: a pyvisa resource used only on `worker`. `lost` says why it ended (None: up).
    Each `write`/`query` is one job on the worker, so two commands never interleave on the wire."""

    def __init__(self, label: str, host: str, port: int, worker: Worker) -> None:
        self.label = label
        self.host = host
        self.port = port
        self.resource_name = f"TCPIP::{host}::{port}::SOCKET"
        self.worker = worker
        self.lost: str | None = "not open"
        self._pyvisa, _ = load_pyvisa()
        self._resource: Any = None
        self._socket: socket.socket | None = None
        self.address = format_address(host, port)
        self._attempt = current_attempt(label)
        self._answered = False
        """The switch has answered a query in SCPI: from then on a failure is a lost session."""

    def _not_scpi(self, cause: str) -> ScpiConnectFailed:
        """Before the first answer: the connection failed, for `cause`; the session is over."""
        self.lost = self.lost or cause
        return ScpiConnectFailed(self.label, self.address, cause)

    # -- on the worker thread ------------------------------------------------------------------------------
    def _open_sync(self, timeout_s: float) -> None:
        pyvisa = self._pyvisa
        # One ResourceManager per backend per process (pyvisa hands every caller the same one): it is never
        # closed here, as that would close every resource in the process, not only this one.
        manager = pyvisa.ResourceManager("@py")
        try:
            resource = manager.open_resource(
                self.resource_name,
                read_termination="\n",
                write_termination="\n",
                open_timeout=max(1, int(timeout_s * 1000)),
                timeout=max(1, int(timeout_s * 1000)),
            )
        except Exception as e:  # pyvisa-py raises bare Exceptions too ("could not connect: ...")
            if "error_timeout" in str(e) or "VI_ERROR_TMO" in str(e):
                cause = f"timed out after {timeout_s:g} s: no answer to the connection request"
            else:
                cause = os_cause(e, timeout_s, self.host)
            raise self._not_scpi(cause) from None
        sock = _socket_of(resource)
        refused = sock.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR) if sock is not None else 0
        if refused:  # pyvisa-py takes a refused connect for an open one; its first write would fail
            with contextlib.suppress(Exception):
                resource.close()
            raise self._not_scpi(os_cause(OSError(refused, os.strerror(refused)), timeout_s, self.host))
        self._attempt.connected = True
        self._attempt.waiting_for = "no answer to the first SCPI query"
        attributes = pyvisa.constants.ResourceAttribute
        with contextlib.suppress(pyvisa.errors.Error):
            # A reply cut short by a hang-up comes back as it is (without its LF) instead of the read
            # waiting out its timeout for an end that will not come.
            resource.set_visa_attribute(attributes.suppress_end_enabled, pyvisa.constants.VI_FALSE)
        if sock is not None:
            # A command without a reply followed by a query is two small writes: without this, Nagle
            # holds the query until the switch's delayed ACK of the command (~40 ms on Linux).
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self._resource, self._socket = resource, sock
        self.lost = None

    def _write_sync(self, command: str, timeout_s: float) -> None:
        if self.lost is not None or self._resource is None:
            raise ScpiNotSent(f"{self.label}: connection lost ({self.lost or 'not open'})")
        if self._socket is not None:
            self._check_idle(self._socket)
        try:
            self._resource.timeout = max(1, int(timeout_s * 1000))
            self._resource.write(command)
        except (self._pyvisa.errors.Error, OSError) as e:
            if not self._answered:
                raise self._not_scpi(f"the connection failed before any answer: {os_cause(e)}") from None
            raise self._fail(f"write failed: {e}") from None

    def _read_sync(self, timeout_s: float) -> str:
        resource = self._resource
        if self.lost is not None or resource is None:
            raise ScpiConnectionLost(f"{self.label}: connection lost ({self.lost or 'not open'})")
        deadline = time.monotonic() + timeout_s
        if self._socket is not None and not _buffered(resource):
            self._wait_readable(self._socket, deadline)
        try:
            resource.timeout = max(1, int((deadline - time.monotonic()) * 1000))
            raw = resource.read_raw()
        except self._pyvisa.errors.VisaIOError as e:
            if e.error_code == self._pyvisa.constants.StatusCode.error_timeout:
                raise self._fail(f"no reply within {timeout_s:.3g} s") from None
            raise self._fail(f"read failed: {e}") from None
        except OSError as e:
            raise self._fail(f"read failed: {e}") from None
        if self.lost is not None:  # aborted while reading: what came back is not to be trusted
            raise ScpiConnectionLost(f"{self.label}: connection lost ({self.lost})")
        if not self._answered:
            self._attempt.hear(raw)
        try:
            text = decode_reply(raw)
        except ScpiError as e:
            if not self._answered:
                raise self._not_scpi(answered_not("SCPI", raw)) from None
            raise self._fail(str(e)) from None
        if _buffered(resource):  # two lines for one query: replies and queries no longer pair up
            if not self._answered:
                raise self._not_scpi(answered_not("SCPI", raw + _pending(resource))) from None
            raise self._fail(f"more than one reply line (after {text[:60]!r})")
        return text

    def _check_idle(self, sock: socket.socket) -> None:
        """Before a command: the switch has sent nothing since the last reply (not a hang-up, not a stray
        line that would be taken for this command's reply)."""
        try:
            readable, _, _ = select.select([sock], [], [], 0)
            if not readable:
                return
            stray = sock.recv(64, socket.MSG_PEEK)
            reason = f"unsolicited bytes {stray[:32]!r}" if stray else "connection closed by the switch"
        except (OSError, ValueError) as e:
            stray, reason = None, f"connection failed: {e}"
        if not self._answered:  # before any answer: this is not an SCPI switch (or not one that lets us in)
            self._attempt.hear(stray or b"")
            if stray:
                raise self._not_scpi(answered_not("SCPI", stray, ", before any command"))
            raise self._not_scpi("closed the connection without answering" if stray == b"" else reason)
        self.lost = self.lost or reason
        raise ScpiNotSent(f"{self.label}: {reason}")

    def _wait_readable(self, sock: socket.socket, deadline: float) -> None:
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                raise self._fail("no reply within the deadline")
            try:
                readable, _, _ = select.select([sock], [], [], min(left, 1.0))
                if not readable:
                    continue
                if self.lost is not None:
                    raise ScpiConnectionLost(f"{self.label}: connection lost ({self.lost})")
                if sock.recv(1, socket.MSG_PEEK) == b"":
                    if not self._answered:
                        raise self._not_scpi("closed the connection without answering")
                    raise self._fail("connection closed by the switch")
                return
            except (OSError, ValueError) as e:  # ValueError: the socket was closed under us
                raise self._fail(f"read failed: {e}") from None

    def _fail(self, reason: str) -> ScpiConnectionLost:
        self.lost = self.lost or reason
        return ScpiConnectionLost(f"{self.label}: {reason}")

    def _close_sync(self) -> None:
        resource, self._resource, self._socket = self._resource, None, None
        if resource is not None:
            with contextlib.suppress(Exception):  # closing what is already broken may fail; it is gone
                resource.close()

    # -- from the loop -------------------------------------------------------------------------------------
    async def open(self, timeout_s: float) -> None:
        self._attempt = current_attempt(self.label)
        self._attempt.dialling(self.address, "SCPI")
        try:
            await self.worker.call(lambda: self._open_sync(timeout_s))
        except asyncio.CancelledError:
            self._attempt.interrupted = True
            raise

    async def write(self, command: str, timeout_s: float) -> None:
        line = encode_command(command)
        await self._guarded(lambda: self._write_sync(line, timeout_s))

    async def query(self, command: str, timeout_s: float) -> str:
        line = encode_command(command)

        def exchange() -> str:
            self._write_sync(line, timeout_s)
            text = self._read_sync(timeout_s)
            if not self._answered:
                self._first_answer(command, text)
            return text

        if not self._answered:
            self._attempt.waiting_for = f"no answer to {command}"
        return await self._guarded(exchange)

    def _first_answer(self, command: str, text: str) -> None:
        """On the worker: the first reply of the session. To `*IDN?` it must be an identity (a web server's
        or a shell's line is not); then the peer speaks SCPI."""
        if command == IDENTITY_QUERY:
            try:
                parse_identity(text)
            except ScpiError:
                raise self._not_scpi(answered_not("SCPI", text.encode(), f" to {command}")) from None
        self._answered = self._attempt.understood = True

    async def _guarded(self, fn: Callable[[], T]) -> T:
        try:
            return await self.worker.call(fn)
        except asyncio.CancelledError:
            if not self._answered:
                self._attempt.interrupted = True
            self.abort("abandoned mid-command (deadline)")
            raise

    def abort(self, reason: str) -> None:
        """End the session now, from the loop thread: a worker blocked on the socket wakes at once."""
        self.lost = self.lost or reason
        sock = self._socket
        if sock is not None:
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)

    async def close(self) -> None:
        self.abort("closed")
        with contextlib.suppress(ScpiConnectionLost):
            await self.worker.call(self._close_sync)


def _socket_of(resource: Any) -> socket.socket | None:
    """The TCP socket under a pyvisa-py SOCKET resource (its session's `interface`); None elsewhere, where
    reads rely on the VISA timeout alone."""
    session = getattr(getattr(resource, "visalib", None), "sessions", {}).get(resource.session)
    sock = getattr(session, "interface", None)
    return sock if isinstance(sock, socket.socket) else None


def _buffered(resource: Any) -> bool:
    """pyvisa-py read more than it returned (bytes wait in its session, not in the socket). `sessions` and
    `interface` are pyvisa-py's public attributes, `_pending_buffer` its TCPIPSocketSession's private one
    (pyvisa-py 0.7-0.8, pinned below 0.9 in pyproject.toml; tests/unit/test_private_internals.py fails
    loudly if it goes)."""
    session = getattr(getattr(resource, "visalib", None), "sessions", {}).get(resource.session)
    return bool(getattr(session, "_pending_buffer", b""))


def _pending(resource: Any) -> bytes:
    """What pyvisa-py read past the reply line (see `_buffered`)."""
    session = getattr(getattr(resource, "visalib", None), "sessions", {}).get(resource.session)
    return bytes(getattr(session, "_pending_buffer", b""))


def _finish(future: asyncio.Future[None]) -> None:
    if not future.done():
        future.set_result(None)
