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
"""

from __future__ import annotations

import asyncio
import contextlib
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

from .codec import LINE_ENDINGS, LineDecoder, LineEnding

POLL_S = 0.02  # how long one read waits for a byte: bounds how soon a cancelled transaction notices
RESYNC_MAX_S = 5.0  # a line that never goes quiet (a babbling device) is flushed after this anyway


class PortLost(HardwareError):
    """The port failed (unplugged adapter, console server hung up, device gone)."""


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


def open_serial(url: str, settings: LineSettings) -> Any:
    """`serial.serial_for_url` with the line settings; the import is the [serial] extra's."""
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
            )
    except (serial.SerialException, OSError, ValueError, NotImplementedError) as e:
        raise PortLost(f"cannot open {url}: {e}") from None
    return port


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
        await self._run(self._open)

    def _open(self) -> None:
        self._close_port()
        self._port = open_serial(self.url, self.settings)
        self._decoder.clear()
        try:
            self._port.reset_input_buffer()  # what a device said before we listened is not an answer
        except Exception as e:  # pyserial raises its own and OSError alike
            self._close_port()
            raise PortLost(f"{self.url}: {e}") from None
        self._dirty = False

    async def transact(self, payload: bytes, done: Done, first_s: float, idle_s: float) -> Transaction:
        """Write `payload`, then read lines until `done(lines)`, `first_s` passes without any line, or
        `idle_s` passes after the last one. Raises PortLost if the port fails (it is then closed)."""
        cancel = threading.Event()
        try:
            result: Transaction = await self._run(self._transact, payload, done, first_s, idle_s, cancel)
        except asyncio.CancelledError:
            cancel.set()  # the thread gives the transaction up at its next poll and marks the line dirty
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
                    if fresh:
                        deadline = time.monotonic() + idle_s
        except PortLost:
            raise
        except Exception as e:  # SerialException, OSError: the port is gone
            self._close_port()
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
                quiet_since = time.monotonic()
        port.reset_input_buffer()
        self.discarded += len(self._decoder.pending)
        self._decoder.clear()
        self._dirty = False

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
