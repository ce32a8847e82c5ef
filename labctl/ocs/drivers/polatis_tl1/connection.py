"""Polatis TL1 transport: one TCP stream, a reader task feeding the decoder, replies matched to requests by
ctag, so several commands can be in flight and autonomous messages never confuse it (decision 0007)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable

from labctl.core.errors import HardwareError
from labctl.ocs.connect_errors import (
    ConnectFailed,
    answered_not,
    current_attempt,
    foreign_protocol,
    format_address,
    os_cause,
)

from .codec import Tl1Command, Tl1Decoder, Tl1Error, Tl1Message, Tl1Noise, Tl1Response

log = logging.getLogger("labctl.ocs.drivers.polatis_tl1")


class Tl1ConnectionLost(HardwareError):
    """The TCP connection to the switch ended (closed, reset, or its bytes stopped being TL1)."""


class Tl1ConnectFailed(ConnectFailed, Tl1ConnectionLost):
    """No TL1 session came of a connection: refused, unreachable, or the peer does not speak TL1 (one line,
    `switch NAME at HOST:PORT: CAUSE`; decision 0066). A loss like any other to the reconnect loop."""


MessageHandler = Callable[[Tl1Message], None]


class Tl1Connection:
    """One TCP stream to a TL1 agent. Commands are written as issued; a reader task parses everything
    the switch sends and completes the request waiting on the reply's ctag. Several requests may be in
    flight. Replies nobody waits for (late, after a timeout) and every non-reply go to `on_message`."""

    def __init__(self, label: str, on_message: MessageHandler) -> None:
        self.label = label
        self._on_message = on_message
        self._decoder = Tl1Decoder()
        self._pending: dict[str, asyncio.Future[Tl1Response]] = {}
        self._reader: asyncio.StreamReader | None = None
        self._writer: asyncio.StreamWriter | None = None
        self._task: asyncio.Task[None] | None = None
        self._ctag = 0
        self.lost: str | None = None
        """Why the connection ended; None while it is up."""
        self.address = ""
        self._attempt = current_attempt(label)
        self._heard = b""
        """The first bytes the peer sent, until it sent a TL1 message."""
        self._understood = False
        """The peer sent a TL1 message (a reply, an acknowledgment, an autonomous report)."""
        self._failure: Tl1ConnectFailed | None = None

    async def open(self, host: str, port: int) -> None:
        self.address = format_address(host, port)
        self._attempt = attempt = current_attempt(self.label)
        attempt.dialling(self.address, "TL1")
        try:
            self._reader, self._writer = await asyncio.open_connection(host, port)
        except OSError as e:
            self.lost = os_cause(e, host=host)
            raise Tl1ConnectFailed(self.label, self.address, self.lost) from None
        except asyncio.CancelledError:
            attempt.interrupted = True
            raise
        attempt.connected = True
        attempt.waiting_for = "no answer to the first TL1 command"
        self._task = asyncio.create_task(self._read_loop(), name=f"tl1-reader:{self.label}")

    def next_ctag(self) -> str:
        while True:
            self._ctag = self._ctag % 999_999 + 1
            ctag = str(self._ctag)
            if ctag not in self._pending:
                return ctag

    async def request(self, command: Tl1Command) -> Tl1Response:
        if self._failure is not None:
            raise self._failure
        if self.lost is not None or self._writer is None:
            raise Tl1ConnectionLost(f"{self.label}: connection lost ({self.lost or 'not open'})")
        if command.ctag in self._pending:
            raise ValueError(f"ctag {command.ctag} is already in flight")
        future: asyncio.Future[Tl1Response] = asyncio.get_running_loop().create_future()
        self._pending[command.ctag] = future
        if not self._understood:
            self._attempt.waiting_for = f"no answer to {command.verb}"
        try:
            self._writer.write(command.encode())
            return await future
        except asyncio.CancelledError:
            if not self._understood:
                self._attempt.interrupted = True
            raise
        finally:
            self._pending.pop(command.ctag, None)

    async def _read_loop(self) -> None:
        assert self._reader is not None
        reason = "closed by the switch"
        try:
            while True:
                data = await self._reader.read(65536)
                if not data:
                    break
                if not self._understood:
                    self._hear(data)
                for message in self._decoder.feed(data):
                    self._dispatch(message)
                if self._failure is not None:
                    break
        except Tl1Error as e:
            reason = f"framing error: {e}"
            if not self._understood:
                self._not_tl1()
        except OSError as e:
            reason = f"{type(e).__name__}: {e.strerror or e}"
        except asyncio.CancelledError:
            self._fail("closed")
            raise
        except Exception as e:  # e.g. an event sink that raised: fail pending requests now, not at timeout
            reason = f"message handling failed: {type(e).__name__}: {e}"
            log.exception("TL1 reader stopped")
        if not self._understood and self._failure is None:
            if self._heard:
                self._not_tl1()
            else:
                self._failure = Tl1ConnectFailed(
                    self.label, self.address, "closed the connection without answering"
                )
        if self._failure is not None:
            reason = self._failure.cause
        self._fail(reason)

    # -- before the first TL1 message: is this TL1 at all? ---------------------------------------------------
    def _hear(self, data: bytes) -> None:
        if len(self._heard) < 256:
            self._heard += data[: 256 - len(self._heard)]
            self._attempt.hear(data)

    def _not_tl1(self) -> None:
        """The peer sent bytes and no TL1 message, and the connection ended (or the bytes are another
        protocol's): fail every request with the one line that says so."""
        if self._failure is None:
            cause = answered_not("TL1", self._heard)
            self._failure = Tl1ConnectFailed(self.label, self.address, cause)
        self._fail(self._failure.cause)

    def _dispatch(self, message: Tl1Message) -> None:
        if not self._understood:
            if isinstance(message, Tl1Noise):
                if foreign_protocol(self._heard) is not None:  # an SSH or web server: no TL1 will come
                    self._not_tl1()
                    return
            else:
                self._understood = self._attempt.understood = True
        if isinstance(message, Tl1Response):
            future = self._pending.get(message.ctag)
            if future is not None and not future.done():
                future.set_result(message)
                return
        self._on_message(message)

    def _fail(self, reason: str) -> None:
        if self.lost is None:
            self.lost = reason
        for future in self._pending.values():
            if not future.done():
                future.set_exception(
                    self._failure or Tl1ConnectionLost(f"{self.label}: connection lost ({reason})")
                )
        if self._writer is not None:
            self._writer.close()

    async def close(self) -> None:
        task, self._task = self._task, None
        if task is not None and not task.done():
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
        self._fail("closed")
        if self._writer is not None:
            with contextlib.suppress(OSError, asyncio.CancelledError):
                await asyncio.wait_for(self._writer.wait_closed(), 1.0)
