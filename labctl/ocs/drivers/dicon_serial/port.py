"""The serial line of the DiCon driver: one pyserial port, owned by one dedicated worker thread.

pyserial blocks, so every call on the port (open, write, read, close) runs on the thread; the async driver
awaits `transact`, which writes a batch of command lines and reads reply lines until the caller's codec
says the batch is answered, or the line has been quiet too long. Each line is stamped (`now_ns`) on the
thread as it is read. A transaction that ended early (a timeout, a cancelled await, a line with bytes
left over) leaves the line "dirty": the next one first resynchronises (ends any half-sent command with a
line ending, discards everything until the line has been quiet, flushes), so a late reply can never be
taken for the answer to a later query; bytes that arrived unasked between batches are discarded the
same way. (A reply later than the quiet period that lands inside a later batch can still be taken
for its answer: the protocol has no tags to tell them apart.) `serial.serial_for_url` opens a device
path, `socket://` and `rfc2217://` alike.

A port that does not open, or a peer that never says anything the DiCon command set would, is one line
naming its cause (`switch NAME at URL: CAUSE`, decision 0066); until the first `*IDN?` answer, the line
keeps the first bytes it heard for that line.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import threading
import time
import warnings
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, Literal

from labctl.core.clock import now_ns
from labctl.core.errors import HardwareError
from labctl.core.extras import require
from labctl.ocs.connect_errors import ConnectAttempt, ConnectFailed, answered_not, current_attempt, os_cause

from .codec import IDN_QUERY, LINE_ENDINGS, LineDecoder, LineEnding

POLL_S = 0.02  # how long one read waits for a byte: bounds how soon a cancelled transaction notices
RESYNC_MAX_S = 5.0  # a line that never goes quiet (a babbling device) is flushed after this anyway


class PortLost(HardwareError):
    """The port failed (unplugged adapter, console server hung up, device gone)."""


class PortOpenFailed(ConnectFailed, PortLost):
    """The port did not open: no such device, refused, unreachable... (one line, `switch NAME at URL:
    CAUSE`). A loss like any other to the reopen loop."""


PROTOCOL = "the DiCon command set"


@dataclass(frozen=True)
class LineSettings:
    baudrate: int = 115200
    bytesize: Literal[5, 6, 7, 8] = 8
    parity: Literal["N", "E", "O", "M", "S"] = "N"
    stopbits: float = 1
    line_ending: LineEnding = "CR"

    def describe(self) -> str:
        stop = f"{self.stopbits:g}"
        return f"{self.baudrate} {self.bytesize}{self.parity}{stop}"


@dataclass(frozen=True)
class Line:
    t_ns: int
    data: bytes


@dataclass
class Transaction:
    """What one `transact` saw: when the batch went out, every line read (noise included), and whether
    the codec called it answered."""

    sent_ns: int
    lines: list[Line]
    complete: bool


Done = Callable[[Sequence[bytes]], bool]


def open_serial(url: str, settings: LineSettings, label: str | None = None) -> Any:
    """`serial.serial_for_url` with the line settings; the import is the [serial] extra's. With `label` (the
    switch's name) a port that does not open is a `PortOpenFailed` naming why."""
    serial = require("serial", "serial", "the DiCon serial switch driver")
    try:
        with warnings.catch_warnings():  # pyserial 3.5's rfc2217 reader thread calls setDaemon()
            warnings.simplefilter("ignore", DeprecationWarning)
            port = serial.serial_for_url(
                url,
                baudrate=settings.baudrate,
                bytesize=settings.bytesize,
                parity=settings.parity,
                stopbits=settings.stopbits,
                timeout=POLL_S,
                # rfc2217:// supports no write timeout; a local device is locked against a second opener
                write_timeout=None if url.startswith("rfc2217://") else 5.0,
                exclusive=True if "://" not in url else None,
                do_not_open=True,
            )
            if url.startswith("socket://"):
                # pyserial's socket open() flushes what already arrived, unread: a foreign peer's banner
                # (an SSH server's, say) would be lost, and with it the one clue to what answered.
                port.reset_input_buffer = lambda: None
                try:
                    port.open()
                finally:
                    del port.reset_input_buffer
            else:
                port.open()
    except (serial.SerialException, OSError, ValueError, NotImplementedError) as e:
        if label is not None:
            raise PortOpenFailed(label, url, _open_cause(url, e)) from None
        raise PortLost(f"cannot open {url}: {e}") from None
    return port


def _open_cause(url: str, e: BaseException) -> str:
    """Why a port did not open, in words: a network cause for socket:// and rfc2217://, the device's
    own for a path."""
    if "://" in url:
        host = url.split("://", 1)[1].rsplit(":", 1)[0]
        return os_cause(e, host=host)
    code = getattr(e, "errno", None) or getattr(e.__context__, "errno", None)
    if isinstance(code, int) and code > 0:
        text = os.strerror(code)
        return f"cannot open the port: {text[:1].lower()}{text[1:]}"
    return f"cannot open the port: {e}"


class SerialLine:
    """The port and its thread. `open`, `transact` and `close` are awaited on the event loop; the work
    happens on the thread, one call at a time, in the order they were awaited."""

    def __init__(self, label: str, url: str, settings: LineSettings, quiet_s: float = 0.05) -> None:
        self.label = label
        self.quiet_s = quiet_s
        """Resync: the line counts as quiet after this long without a byte (a reply later than this after
        the last one is taken for gone; the driver passes its reply timeout)."""
        self.url = url
        self.settings = settings
        self._port: Any = None
        self._decoder = LineDecoder()
        self._dirty = False
        self._executor: ThreadPoolExecutor | None = None
        self._attempt: ConnectAttempt = current_attempt(label)
        self._understood = False
        """The switch answered `*IDN?`: from then on nothing is recorded for a failed connect."""
        self.resyncs = 0
        self.discarded = 0
        """Bytes thrown away while resynchronising."""

    @property
    def is_open(self) -> bool:
        return self._port is not None

    async def _run(self, fn: Callable[..., Any], *args: Any) -> Any:
        if self._executor is None:
            self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix=f"serial:{self.label}")
        return await asyncio.get_running_loop().run_in_executor(self._executor, fn, *args)

    async def open(self) -> None:
        self._attempt = current_attempt(self.label)
        if not self._understood:
            self._attempt.dialling(self.url, PROTOCOL)
        try:
            await self._run(self._open)
        except asyncio.CancelledError:
            self._attempt.interrupted = True
            raise

    def _hear(self, data: bytes) -> None:
        if data and not self._understood:
            self._attempt.hear(data)

    def _open(self) -> None:
        self._close_port()
        self._port = open_serial(self.url, self.settings, self.label)
        self._decoder.clear()
        self._attempt.connected = True
        try:
            if not self._understood:
                # Not yet a DiCon switch: what the peer says unasked is kept, never flushed unread (a
                # banner arriving between a read and a flush would be lost, and with it the cause).
                self._listen_first(self._port)
            else:
                self._port.reset_input_buffer()  # what a device said before we listened is not an answer
        except Exception as e:  # pyserial raises its own and OSError alike
            self._close_port()
            if not self._understood:
                raise self._open_failed() from None
            raise PortLost(f"{self.url}: {e}") from None
        self._dirty = False

    def _listen_first(self, port: Any) -> None:
        """Before the switch has answered: keep what the peer says unasked (a banner: whose?)."""
        for _ in range(256):
            if not port.in_waiting:
                return
            self._hear(port.read(max(1, port.in_waiting)))

    def _open_failed(self) -> PortOpenFailed:
        """The line failed before the switch answered `*IDN?`: whatever it said was not the protocol."""
        heard = self._attempt.heard
        cause = answered_not(PROTOCOL, heard) if heard else "closed the connection without answering"
        return PortOpenFailed(self.label, self.url, cause)

    async def transact(self, payload: bytes, done: Done, first_s: float, idle_s: float) -> Transaction:
        """Write `payload`, then read lines until `done(lines)`, `first_s` passes without any line, or
        `idle_s` passes after the last one. Raises PortLost if the port fails (it is then closed)."""
        cancel = threading.Event()
        if not self._understood:
            first = payload.splitlines()[0].decode("ascii", "replace") if payload.strip() else "a command"
            self._attempt.waiting_for = f"no answer to {first}"
        try:
            result: Transaction = await self._run(self._transact, payload, done, first_s, idle_s, cancel)
        except asyncio.CancelledError:
            cancel.set()  # the thread gives the transaction up at its next poll and marks the line dirty
            if not self._understood:
                self._attempt.interrupted = True
            raise
        return result

    def _transact(
        self, payload: bytes, done: Done, first_s: float, idle_s: float, cancel: threading.Event
    ) -> Transaction:
        port = self._port
        if port is None:
            raise PortLost(f"{self.label}: the port is not open")
        try:
            if self._dirty or port.in_waiting:  # bytes nobody asked for since the last batch: stale
                self._resync(port)
            sent_ns = now_ns()
            port.write(payload)
            lines: list[Line] = []
            deadline = time.monotonic() + first_s
            while True:
                if cancel.is_set():
                    self._dirty = True
                    return Transaction(sent_ns, lines, False)
                if lines and done([line.data for line in lines]):
                    if self._decoder.pending or port.in_waiting:
                        self._dirty = True  # more than the answers came: resync before the next batch
                    return Transaction(sent_ns, lines, True)
                if time.monotonic() >= deadline:
                    self._dirty = True
                    return Transaction(sent_ns, lines, False)
                chunk = port.read(max(1, port.in_waiting))
                if chunk:
                    t_ns = now_ns()
                    fresh = self._decoder.feed(chunk)
                    lines.extend(Line(t_ns, data) for data in fresh)
                    if not self._understood:
                        self._heard_lines(chunk, fresh)
                    if fresh:
                        deadline = time.monotonic() + idle_s
        except PortLost:
            raise
        except Exception as e:  # SerialException, OSError: the port is gone
            self._close_port()
            if not self._understood and self._attempt.heard:
                raise self._open_failed() from None
            raise PortLost(f"{self.url}: {e}") from None

    def _resync(self, port: Any) -> None:
        """End any half-sent command, then discard until the line is quiet, then flush."""
        self.resyncs += 1
        port.write(LINE_ENDINGS[self.settings.line_ending])
        quiet_since = time.monotonic()
        give_up = quiet_since + RESYNC_MAX_S
        while time.monotonic() - quiet_since < self.quiet_s and time.monotonic() < give_up:
            chunk = port.read(max(1, port.in_waiting))
            if chunk:
                self.discarded += len(chunk)
                self._hear(chunk)
                quiet_since = time.monotonic()
        port.reset_input_buffer()
        self.discarded += len(self._decoder.pending)
        self._decoder.clear()
        self._dirty = False

    def _heard_lines(self, chunk: bytes, lines: list[bytes]) -> None:
        """Before the switch has answered `*IDN?`: keep what it sent (for "answered, but not with ...")."""
        if any(IDN_QUERY.match(data) is not None for data in lines):
            self._understood = self._attempt.understood = True
        else:
            self._hear(chunk)

    def mark_dirty(self) -> None:
        self._dirty = True

    async def close(self) -> None:
        """Close the port and stop the thread (joined: nothing outlives the driver)."""
        executor, self._executor = self._executor, None
        if executor is None:
            return
        try:
            await asyncio.get_running_loop().run_in_executor(executor, self._close_port)
        finally:
            executor.shutdown(wait=True)  # idle by now (the close ran last): returns at once

    def _close_port(self) -> None:
        port, self._port = self._port, None
        if port is not None:
            with contextlib.suppress(Exception):  # closing a port that already failed: nothing left to do
                port.close()
