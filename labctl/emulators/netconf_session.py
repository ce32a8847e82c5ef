"""One NETCONF session on the wire: RFC 6242 framing, the session's state, and the SSH channel it writes to.

Framing is base:1.0 (each message ends with `]]>]]>`) until both hellos name base:1.1, then chunks
(`\n#<size>\n…\n##\n`); bytes that break it end the session. The session's state is what the NETCONF
front end (labctl.emulators.netconf) and its operations (labctl.emulators.netconf_rpc) keep per client:
its id, the framing chosen, a pending close, the last reply (replies leave in order), its subscription.
"""

from __future__ import annotations

import asyncio
import re
import xml.etree.ElementTree as ET
from dataclasses import dataclass
from typing import Any

from labctl.emulators.core import Session

__all__ = [
    "ChannelWriter",
    "FramingError",
    "NetconfSession",
    "frame_chunked",
    "frame_eom",
    "take_chunked",
    "take_eom",
]

EOM = b"]]>]]>"
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


# -- sessions ----------------------------------------------------------------------------------------------
class ChannelWriter:
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
