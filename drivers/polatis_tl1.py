"""Polatis TL1 driver: asyncio TCP transport → TL1 codec → `PolatisTl1Switch` (an `OpticalSwitch`).

Three layers, each usable alone:
- codec (`Tl1Command`, `Tl1Decoder`, payload parsers): pure, bytes in and out, raises only `Tl1Error`;
- transport (`Tl1Connection`): one TCP stream, a reader task feeding the decoder, replies matched to
  requests by ctag, so several commands can be in flight and autonomous messages never confuse it;
- driver (`PolatisTl1Switch`): login, commands, apply-with-verify through `labctl.ocs.converge`,
  reconnect after a lost connection, keep-alive, timing and `ocs.*` events.

Facts (grammar, framing, port numbering, what is unverified): shared reference ocs-protocols.md §1.
Decisions: docs/decisions/0007 (framing and ctag matching), 0008 (pipelining, the emulated lab).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import re
from collections.abc import Awaitable, Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar

from labctl.clock import now_ns
from labctl.errors import HardwareError, InputError
from labctl.events import Event
from labctl.inventory import Secret, SecretRef, SwitchSpec
from labctl.mapping import Mapping, MappingDiff, PortSpace
from labctl.ocs import ApplyResult, EventSink, SwitchOps, Timed, TimeoutPolicy, converge

log = logging.getLogger("labctl.drivers.polatis_tl1")

T = TypeVar("T")

DEFAULT_PORT = 3082  # TL1-RAW on Polatis (reference §1.1)
NO_LIGHT_DBM = -90.0
"""A power reading at or below this is "no light" (None). The real floor value is unverified (§1.4)."""
MAX_PORTS_PER_COMMAND = 64  # keeps AIDs short; a DLT-PATCH list longer than this is split

# Standard TL1 error codes (Telcordia GR-833 style, as listed in public TL1 manuals). Polatis-specific
# codes are unverified; an unknown code is still carried, only without a meaning.
ERROR_CODES: dict[str, str] = {
    "ICNV": "command not valid",
    "IICM": "invalid command",
    "IICT": "invalid correlation tag",
    "IIAC": "invalid access identifier",
    "IITA": "invalid target identifier",
    "IISP": "invalid syntax or punctuation",
    "IDNV": "data not valid",
    "IDRG": "data range error",
    "IPNV": "parameter not valid",
    "IPMS": "parameter missing",
    "IENE": "entity does not exist",
    "IEAE": "entity already exists",
    "SAIS": "already in service",
    "SARB": "all resources busy",
    "SROF": "requested operation failed",
    "SSRE": "system resources exceeded",
    "PLNA": "login not active",
    "PICC": "illegal command code",
    "PIUI": "illegal user identity",
    "PIUC": "illegal user code (password)",
}


# ==================================================================================================== codec
class Tl1Error(HardwareError):
    """Bytes from the switch that are not TL1 as this codec understands it (framing, grammar, payload).

    After one, the byte stream cannot be trusted: the transport drops the connection and reconnects.
    """


_VERB = re.compile(r"^[A-Z][A-Z0-9]*(?:-[A-Z0-9]+){0,2}$")
_CTAG = re.compile(r"^[A-Za-z0-9]{1,6}$")
_FIELD_BAD = re.compile(r"[;:\r\n]")


@dataclass(frozen=True)
class Tl1Command:
    """One input message: `VERB:TID:AID:CTAG:<blocks joined by ':'>;`.

    A block may be a `Secret` (the ACT-USER password): `encode()` reveals it into the bytes that go on the
    wire, and only there; `str()` (used in logs, events and exceptions) shows `********` instead.
    """

    verb: str
    ctag: str
    aid: str = ""
    tid: str = ""
    blocks: tuple[str | Secret, ...] = ("",)

    def __post_init__(self) -> None:
        if not _VERB.match(self.verb):
            raise ValueError(f"not a TL1 verb: {self.verb!r}")
        if not _CTAG.match(self.ctag):
            raise ValueError(f"not a TL1 ctag (1-6 letters or digits): {self.ctag!r}")
        for part in (self.aid, self.tid, *(b for b in self.blocks if isinstance(b, str))):
            if _FIELD_BAD.search(part):
                raise ValueError(f"TL1 field {part!r} contains ';', ':' or a line break")
        for secret in (b for b in self.blocks if isinstance(b, Secret)):
            value = secret.reveal()
            # Checked here, once, so a bad secret never reaches the wire or an exception text.
            if _FIELD_BAD.search(value) or not value.isascii():
                raise InputError(
                    f"{self.verb}: the secret from ${{{secret.name}}} contains ';', ':', a line break or "
                    "non-ASCII characters, which TL1 cannot carry"
                )

    def _render(self, reveal: bool) -> str:
        blocks = [(b.reveal() if reveal else "********") if isinstance(b, Secret) else b for b in self.blocks]
        return ":".join([self.verb, self.tid, self.aid, self.ctag, *blocks]) + ";"

    def encode(self) -> bytes:
        """The exact request bytes (CRLF after the `;`, as a terminal sends; the switch accepts LF too)."""
        return (self._render(reveal=True) + "\r\n").encode("ascii")

    def __str__(self) -> str:
        return self._render(reveal=False)

    __repr__ = __str__


@dataclass(frozen=True)
class Tl1Response:
    """A reply to one command, matched by ctag. `lines` are the payload lines with quotes removed."""

    ctag: str
    status: str  # COMPLD | DENY | PRTL | DELAY | RTRV
    sid: str
    date: str
    time: str
    lines: tuple[str, ...] = ()
    comments: tuple[str, ...] = ()
    error_code: str | None = None


@dataclass(frozen=True)
class Tl1Ack:
    """An acknowledgment (`IP <ctag>` = in progress, also PF/OK/NA/NG/RL) that precedes a slow reply."""

    ctag: str
    code: str


@dataclass(frozen=True)
class Tl1Autonomous:
    """An autonomous message (`A`, `*C`, `**`, `*^` … e.g. `REPT DBCHG`), not tied to any command."""

    alarm: str
    atag: str
    verb: str
    sid: str
    date: str
    time: str
    lines: tuple[str, ...] = ()
    comments: tuple[str, ...] = ()


@dataclass(frozen=True)
class Tl1Noise:
    """A line outside any message that is none of the above (banner, line noise); reported, then skipped."""

    text: str


Tl1Message = Tl1Response | Tl1Ack | Tl1Autonomous | Tl1Noise

_HEADER = re.compile(r"^\s*(?:(\S.*?)\s+)?(\d{2,4}-\d\d-\d\d)\s+(\d\d:\d\d:\d\d)\s*$")
_RESPONSE = re.compile(r"^M\s+(\S+)\s+(COMPLD|DENY|PRTL|DELAY|RTRV)\s*$", re.IGNORECASE)
_AUTONOMOUS = re.compile(r"^(\*C|\*\*|\*\^|A)\s+(\S+)\s+(\S.*?)\s*$")
_ACK = re.compile(r"^(IP|PF|OK|NA|NG|RL)\s+([A-Za-z0-9]{1,6})\s*<?\s*$")
_CODE = re.compile(r"^[A-Z]{4}$")

_IDLE, _HEAD, _BODY = 0, 1, 2


@dataclass
class _Partial:
    """A message being read: its header, its status line, its body so far."""

    sid: str
    date: str
    time: str
    kind: str = ""  # "M" or an alarm code
    tag: str = ""
    status: str = ""
    code: str | None = None
    lines: list[str] = field(default_factory=list)
    comments: list[str] = field(default_factory=list)


class Tl1Decoder:
    """Incremental TL1 output parser: `feed(bytes)` returns every message completed by those bytes.

    A message ends at a line that is only `;` (or `>`, "more to follow"); a `;` anywhere else (inside a
    quoted payload line) ends nothing. The final `;` and a `<` prompt often arrive without a line break,
    so a partial line that is exactly one of them is taken as complete.
    """

    MAX_LINE = 64 * 1024
    MAX_LINES = 100_000

    def __init__(self) -> None:
        self._buf = bytearray()
        self._state = _IDLE
        self._msg: _Partial | None = None
        self._continued: dict[str, _Partial] = {}  # ctag → a response ended with '>' so far

    def feed(self, data: bytes) -> list[Tl1Message]:
        self._buf += data
        out: list[Tl1Message] = []
        try:
            while True:
                nl = self._buf.find(b"\n")
                if nl < 0:
                    break
                line = self._buf[:nl].decode("latin-1")
                del self._buf[: nl + 1]
                self._line(line, out)
            tail = self._buf.decode("latin-1").strip(" \t\r\x00")
            if (self._state == _IDLE and tail in ("<", ">")) or (self._state == _BODY and tail in (";", ">")):
                self._buf.clear()
                self._line(tail, out)
            elif len(self._buf) > self.MAX_LINE:
                raise Tl1Error(f"TL1 line longer than {self.MAX_LINE} bytes without a line break")
        except Tl1Error:
            self.reset()
            raise
        return out

    def reset(self) -> None:
        self._buf.clear()
        self._state = _IDLE
        self._msg = None
        self._continued.clear()

    def _line(self, raw: str, out: list[Tl1Message]) -> None:
        line = raw.strip("\r\x00")
        text = line.strip()
        if self._state == _IDLE:
            self._idle(line, text, out)
        elif self._state == _HEAD:
            self._head(text)
        else:
            self._body(line, text, out)

    def _idle(self, line: str, text: str, out: list[Tl1Message]) -> None:
        if not text or text[0] in "<>":
            return  # blank line, or a prompt / continuation mark
        if m := _ACK.match(text):
            out.append(Tl1Ack(ctag=m[2], code=m[1]))
        elif m := _HEADER.match(line):
            self._msg = _Partial(sid=(m[1] or "").strip(), date=m[2], time=m[3])
            self._state = _HEAD
        elif _RESPONSE.match(text):
            raise Tl1Error(f"TL1 status line without a header: {_clip(text)!r}")
        else:
            out.append(Tl1Noise(_clip(text)))

    def _head(self, text: str) -> None:
        assert self._msg is not None
        if not text:
            return
        if m := _RESPONSE.match(text):
            self._msg.kind, self._msg.tag, self._msg.status = "M", m[1], m[2].upper()
        elif m := _AUTONOMOUS.match(text):
            self._msg.kind, self._msg.tag, self._msg.status = m[1], m[2], m[3]
        else:
            raise Tl1Error(f"expected a TL1 'M <ctag> <status>' or autonomous line, got {_clip(text)!r}")
        self._state = _BODY

    def _body(self, line: str, text: str, out: list[Tl1Message]) -> None:
        msg = self._msg
        assert msg is not None
        if text[:1] in (";", ">"):
            # The terminator; an acknowledgment or the next message may follow on the same line.
            self._finish(msg, more=text[0] == ">", out=out)
            if text[1:].strip():
                self._line(text[1:], out)
            return
        if not text:
            return
        if len(msg.lines) + len(msg.comments) >= self.MAX_LINES:
            raise Tl1Error(f"TL1 message with more than {self.MAX_LINES} lines")
        if len(text) >= 2 and text[0] == '"' and text[-1] == '"':
            msg.lines.append(text[1:-1].replace('\\"', '"'))
        elif text.startswith("/*") and text.endswith("*/"):
            msg.comments.append(text[2:-2].strip())
        elif msg.status == "DENY" and msg.code is None and not msg.lines and _CODE.match(text):
            msg.code = text
        elif _HEADER.match(line):
            raise Tl1Error("a TL1 message started before the previous one ended with ';'")
        elif line[:1] in (" ", "\t") and '"' not in text:
            msg.lines.append(text)  # an unquoted, indented payload line (some firmware omits quotes)
        else:
            raise Tl1Error(f"unexpected line in the body of TL1 message {msg.tag}: {_clip(text)!r}")

    def _finish(self, msg: _Partial, *, more: bool, out: list[Tl1Message]) -> None:
        self._state, self._msg = _IDLE, None
        if msg.kind != "M":
            out.append(
                Tl1Autonomous(
                    alarm=msg.kind,
                    atag=msg.tag,
                    verb=msg.status,
                    sid=msg.sid,
                    date=msg.date,
                    time=msg.time,
                    lines=tuple(msg.lines),
                    comments=tuple(msg.comments),
                )
            )
            return
        earlier = self._continued.pop(msg.tag, None)
        if earlier is not None:
            earlier.lines.extend(msg.lines)
            earlier.comments.extend(msg.comments)
            earlier.code = earlier.code or msg.code
            earlier.status = msg.status
            msg = earlier
            if len(msg.lines) > self.MAX_LINES:
                raise Tl1Error(f"TL1 response {msg.tag} with more than {self.MAX_LINES} lines")
        if more:
            if len(self._continued) >= 64:
                raise Tl1Error("too many TL1 responses left open with '>'")
            self._continued[msg.tag] = msg
            return
        out.append(
            Tl1Response(
                ctag=msg.tag,
                status=msg.status,
                sid=msg.sid,
                date=msg.date,
                time=msg.time,
                lines=tuple(msg.lines),
                comments=tuple(msg.comments),
                error_code=msg.code,
            )
        )


def _clip(text: str, limit: int = 80) -> str:
    return text if len(text) <= limit else text[:limit] + "…"


# -- payloads ---------------------------------------------------------------------------------------------
def format_ports(ports: Iterable[int]) -> str:
    """An AID port list: `&` separates, `&&` spans a run of 3 or more consecutive ports (`1&&4&7`)."""
    items = sorted(set(ports))
    if not items:
        raise ValueError("an empty port list has no TL1 form")
    parts: list[str] = []
    i = 0
    while i < len(items):
        j = i
        while j + 1 < len(items) and items[j + 1] == items[j] + 1:
            j += 1
        if j - i >= 2:
            parts.append(f"{items[i]}&&{items[j]}")
        else:
            parts.extend(str(p) for p in items[i : j + 1])
        i = j + 1
    return "&".join(parts)


_PATCH_LINE = re.compile(r"^\s*(\d{1,6})\s*,\s*(\d{1,6})\s*(?::.*)?$")
_PORT_VALUE = re.compile(r"^\s*(\d{1,6})\s*:\s*(.*?)\s*$")
_SIZE_LINE = re.compile(r"SIZE\s*=\s*(\d{1,6})\s*[xX]\s*(\d{1,6})", re.IGNORECASE)


def parse_patches(lines: Sequence[str]) -> frozenset[tuple[int, int]]:
    """RTRV-PATCH payload: one `"<ingress>,<egress>"` line per connection."""
    out: set[tuple[int, int]] = set()
    for line in lines:
        m = _PATCH_LINE.match(line)
        if not m:
            raise Tl1Error(f"RTRV-PATCH line is not '<ingress>,<egress>': {_clip(line)!r}")
        out.add((int(m[1]), int(m[2])))
    return frozenset(out)


def parse_port_values(lines: Sequence[str], what: str) -> dict[int, str]:
    """`"<port>:<value>"` lines (RTRV-PORT-POWER, RTRV-PORT-SHUTTER)."""
    out: dict[int, str] = {}
    for line in lines:
        m = _PORT_VALUE.match(line)
        if not m:
            raise Tl1Error(f"{what} line is not '<port>:<value>': {_clip(line)!r}")
        out[int(m[1])] = m[2]
    return out


def parse_power(lines: Sequence[str]) -> dict[int, float | None]:
    out: dict[int, float | None] = {}
    for port, text in parse_port_values(lines, "RTRV-PORT-POWER").items():
        try:
            dbm = float(text)
        except ValueError:
            raise Tl1Error(f"RTRV-PORT-POWER: port {port}: {_clip(text)!r} is not a dBm value") from None
        out[port] = None if dbm != dbm or dbm <= NO_LIGHT_DBM else dbm  # NaN or floor → no light
    return out


def parse_size(lines: Sequence[str]) -> PortSpace:
    """RTRV-EQPT SYSTEM PARAMETER=SIZE payload, `SYSTEM:SIZE=<in>x<out>`."""
    for line in lines:
        if m := _SIZE_LINE.search(line):
            if int(m[1]) < 1 or int(m[2]) < 1:
                break
            return PortSpace(int(m[1]), int(m[2]))
    raise Tl1Error(f"RTRV-EQPT SIZE: no 'SIZE=<in>x<out>' in {[_clip(x) for x in lines]!r}")


# ================================================================================================ transport
class Tl1ConnectionLost(HardwareError):
    """The TCP connection to the switch ended (closed, reset, or its bytes stopped being TL1)."""


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

    async def open(self, host: str, port: int) -> None:
        try:
            self._reader, self._writer = await asyncio.open_connection(host, port)
        except OSError as e:
            self.lost = f"cannot connect to {host}:{port}: {e.strerror or e}"
            raise Tl1ConnectionLost(f"{self.label}: {self.lost}") from None
        self._task = asyncio.create_task(self._read_loop(), name=f"tl1-reader:{self.label}")

    def next_ctag(self) -> str:
        while True:
            self._ctag = self._ctag % 999_999 + 1
            ctag = str(self._ctag)
            if ctag not in self._pending:
                return ctag

    async def request(self, command: Tl1Command) -> Tl1Response:
        if self.lost is not None or self._writer is None:
            raise Tl1ConnectionLost(f"{self.label}: connection lost ({self.lost or 'not open'})")
        if command.ctag in self._pending:
            raise ValueError(f"ctag {command.ctag} is already in flight")
        future: asyncio.Future[Tl1Response] = asyncio.get_running_loop().create_future()
        self._pending[command.ctag] = future
        try:
            self._writer.write(command.encode())
            return await future
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
                for message in self._decoder.feed(data):
                    self._dispatch(message)
        except Tl1Error as e:
            reason = f"framing error: {e}"
        except OSError as e:
            reason = f"{type(e).__name__}: {e.strerror or e}"
        except asyncio.CancelledError:
            self._fail("closed")
            raise
        except Exception as e:  # e.g. an event sink that raised: fail pending requests now, not at timeout
            reason = f"message handling failed: {type(e).__name__}: {e}"
            log.exception("TL1 reader stopped")
        self._fail(reason)

    def _dispatch(self, message: Tl1Message) -> None:
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
                future.set_exception(Tl1ConnectionLost(f"{self.label}: connection lost ({reason})"))
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


# =================================================================================================== driver
class Tl1Deny(HardwareError):
    """The switch refused a command (`M <ctag> DENY`). Carries the error code and the command (redacted)."""

    def __init__(self, switch: str, command: str, code: str | None, comments: Sequence[str] = ()) -> None:
        self.switch = switch
        self.command = command
        self.code = code
        self.comments = tuple(comments)
        meaning = ERROR_CODES.get(code or "")
        text = f"{switch}: {command} denied: {code or 'no error code'}"
        if meaning:
            text += f" ({meaning})"
        if self.comments:
            text += " — " + "; ".join(self.comments)
        super().__init__(text)


@dataclass(frozen=True)
class Tl1Endpoint:
    host: str
    port: int = DEFAULT_PORT


class PolatisTl1Switch:
    """A Polatis switch over TL1. Satisfies `OpticalSwitch`; every call returns a `Timed` result and
    writes events (`ocs.io` per command, `ocs.session`, `ocs.report`, `ocs.read`, `rx_power`, and the
    `ocs.command`/`ocs.complete`/`ocs.error` of `converge`)."""

    def __init__(
        self,
        name: str,
        space: PortSpace,
        *,
        endpoint: Tl1Endpoint,
        user: str,
        password: SecretRef | Secret | None,
        emit: EventSink,
        timeouts: TimeoutPolicy | None = None,
        pipeline_depth: int = 16,
        keepalive_s: float | None = 20.0,
        attempts: int = 3,
    ) -> None:
        if pipeline_depth < 1:
            raise ValueError("pipeline_depth must be at least 1")
        self.name = name
        self.space = space
        self.endpoint = endpoint
        self.user = user
        self.timeouts = timeouts or TimeoutPolicy()
        self.pipeline_depth = pipeline_depth
        self.keepalive_s = keepalive_s
        self.attempts = attempts
        self.sid: str = ""
        self.reconnects = 0
        self._password = password
        self._secret: Secret | None = None
        self._emit_sink = emit
        self._source = f"ocs:{name}"
        self._conn: Tl1Connection | None = None
        self._generation = 0
        self._recover_lock = asyncio.Lock()
        self._keepalive_task: asyncio.Task[None] | None = None
        self._last_io_ns = 0
        self._closed = True

    # -- construction from the inventory -------------------------------------------------------------------
    @classmethod
    def from_spec(
        cls, name: str, spec: SwitchSpec, emit: EventSink, *, pipeline_depth: int = 16
    ) -> PolatisTl1Switch:
        """The driver for an inventory switch that is a real (network-reachable) Polatis."""
        if spec.address is None:
            raise InputError(f"switch {name} (polatis-tl1) needs an `address` (and `port`, default 3082)")
        if spec.user is None:
            raise InputError(f"switch {name} (polatis-tl1) needs a `user` (and a `password: ${{ENV}}`)")
        return cls(
            name,
            spec.space,
            endpoint=Tl1Endpoint(spec.address, spec.port or DEFAULT_PORT),
            user=spec.user,
            password=spec.password,
            emit=emit,
            timeouts=TimeoutPolicy(connect_s=spec.timeout_s, operation_s=spec.timeout_s),
            pipeline_depth=pipeline_depth,
        )

    # -- events ----------------------------------------------------------------------------------------------
    def _emit(self, kind: str, value: Any, t_ns: int | None = None, **meta: Any) -> None:
        self._emit_sink(Event(t_ns=t_ns or now_ns(), kind=kind, source=self._source, value=value, meta=meta))

    def _scrub(self, text: str) -> str:
        """Never let the password through, even if a switch echoed it back in a comment."""
        if self._secret is not None and self._secret.reveal():
            text = text.replace(self._secret.reveal(), "********")
        return text

    def _on_message(self, message: Tl1Message) -> None:
        if isinstance(message, Tl1Autonomous):
            self._emit(
                "ocs.report",
                message.verb,
                alarm=message.alarm,
                atag=message.atag,
                lines=[self._scrub(x) for x in message.lines[:64]],
            )
        elif isinstance(message, Tl1Response):
            self._emit("ocs.session", "unmatched-reply", ctag=message.ctag, status=message.status)
        elif isinstance(message, Tl1Ack):
            self._emit("ocs.session", "ack", ctag=message.ctag, code=message.code)
        else:
            self._emit("ocs.session", "noise", text=self._scrub(message.text))

    # -- one command ---------------------------------------------------------------------------------------
    async def _exchange(self, conn: Tl1Connection, command: Tl1Command) -> Tl1Response:
        """Send one command on `conn`, await its reply; time it, write `ocs.io`, raise `Tl1Deny` on DENY."""
        start = now_ns()
        try:
            response = await conn.request(command)
        except Tl1ConnectionLost as e:
            end = now_ns()
            self._emit(
                "ocs.io",
                end - start,
                end,
                command=str(command),
                ctag=command.ctag,
                status="lost",
                error=self._scrub(str(e)),
            )
            raise
        end = self._last_io_ns = now_ns()
        self._emit(
            "ocs.io",
            end - start,
            end,
            command=str(command),
            ctag=command.ctag,
            status=response.status,
            code=response.error_code,
        )
        if response.status == "DENY":
            raise Tl1Deny(
                self.name, str(command), response.error_code, [self._scrub(c) for c in response.comments]
            )
        return response

    async def _call(
        self, verb: str, aid: str = "", blocks: tuple[str, ...] = ("",), *, idempotent: bool
    ) -> Tl1Response:
        """One command with the loss policy: a connection found dead before sending is re-established
        first; one lost while the command was in flight is re-established (reconnect, re-login, re-read
        the patches) and then the command is repeated if it only reads, or reported as lost if it changes
        the switch, so that the caller decides from the re-read state."""
        for attempt in (1, 2):
            conn = self._require_conn()
            generation = self._generation
            if conn.lost is not None:
                await self._recover(generation, conn.lost)
                continue
            command = Tl1Command(verb, conn.next_ctag(), aid=aid, blocks=blocks)
            try:
                return await self._exchange(conn, command)
            except Tl1ConnectionLost as e:
                patches = await self._recover(generation, str(e))
                if idempotent and attempt == 1:
                    continue
                held = f"; it now holds {len(patches)} patches" if patches is not None else ""
                raise Tl1ConnectionLost(
                    f"{self.name}: connection lost during {command}; reconnected and re-read the switch{held}"
                ) from None
        raise Tl1ConnectionLost(f"{self.name}: connection lost twice during {verb}")

    def _require_conn(self) -> Tl1Connection:
        if self._closed or self._conn is None:
            raise HardwareError(f"{self.name}: not connected")
        return self._conn

    # -- session -------------------------------------------------------------------------------------------
    async def _open(self) -> None:
        """TCP, ACT-USER, check the switch size against the inventory."""
        if self._secret is None and isinstance(self._password, SecretRef):
            self._secret = self._password.resolve(f"switch {self.name}")
        elif isinstance(self._password, Secret):
            self._secret = self._password
        conn = Tl1Connection(self.name, self._on_message)
        await conn.open(self.endpoint.host, self.endpoint.port)
        try:
            login = Tl1Command(
                "ACT-USER",
                conn.next_ctag(),
                aid=self.user,
                blocks=("", self._secret if self._secret is not None else ""),
            )
            reply = await self._exchange(conn, login)
            self.sid = reply.sid
            size = parse_size((await self._exchange(conn, self._size_command(conn))).lines)
        except BaseException:
            await conn.close()
            raise
        if size != self.space:
            await conn.close()
            raise InputError(
                f"switch {self.name}: the inventory says {self.space} but the switch reports {size}"
            )
        if self._closed:  # close() ran while we were (re)connecting: this connection must not outlive it
            await conn.close()
            raise Tl1ConnectionLost(f"{self.name}: driver closed while connecting")
        old, self._conn = self._conn, conn
        self._generation += 1
        self._last_io_ns = now_ns()
        if old is not None:
            await old.close()

    @staticmethod
    def _size_command(conn: Tl1Connection) -> Tl1Command:
        return Tl1Command("RTRV-EQPT", conn.next_ctag(), aid="SYSTEM", blocks=("", "", "PARAMETER=SIZE"))

    async def _recover(self, generation: int, reason: str) -> Mapping | None:
        """Reconnect, log in again and re-read the patches; once per lost connection, however many
        commands noticed it. Bounded by the caller's deadline (and by connect_s)."""
        async with self._recover_lock:
            if self._generation != generation or self._closed:
                return None
            self._emit("ocs.session", "lost", reason=self._scrub(reason))
            delay_s = 0.02
            try:
                async with asyncio.timeout(self.timeouts.connect_s):
                    while True:
                        try:
                            await self._open()
                            break
                        except Tl1ConnectionLost as e:
                            self._emit("ocs.session", "reconnect-failed", reason=self._scrub(str(e)))
                            await asyncio.sleep(delay_s)
                            delay_s = min(delay_s * 2, 1.0)
            except TimeoutError:
                raise Tl1ConnectionLost(
                    f"{self.name}: connection lost ({self._scrub(reason)}) and not re-established within "
                    f"{self.timeouts.connect_s:g} s"
                ) from None
            self.reconnects += 1
            assert self._conn is not None
            patches = parse_patches((await self._exchange(self._conn, self._patch_command(self._conn))).lines)
            self._emit("ocs.session", "reconnected", patches=len(patches))
            self._emit("ocs.read", len(patches), patches=sorted(patches), after="reconnect")
            return patches

    @staticmethod
    def _patch_command(conn: Tl1Connection, aid: str = "") -> Tl1Command:
        return Tl1Command("RTRV-PATCH", conn.next_ctag(), aid=aid)

    async def connect(self) -> None:
        if not self._closed:
            return
        self._closed = False
        try:
            async with self.timeouts.deadline(self.name, "connect", self.timeouts.connect_s):
                await self._open()
        except BaseException:
            self._closed = True
            raise
        self._emit("ocs.session", "connected", host=self.endpoint.host, port=self.endpoint.port, sid=self.sid)
        if self.keepalive_s:
            self._keepalive_task = asyncio.create_task(self._keepalive(), name=f"tl1-keepalive:{self.name}")

    async def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        task, self._keepalive_task = self._keepalive_task, None
        if task is not None:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
        conn, self._conn = self._conn, None
        if conn is None:
            return
        if conn.lost is None:
            with contextlib.suppress(HardwareError, TimeoutError):
                async with asyncio.timeout(min(1.0, self.timeouts.operation_s)):
                    await self._exchange(conn, Tl1Command("CANC-USER", conn.next_ctag(), aid=self.user))
        await conn.close()
        self._emit("ocs.session", "closed")

    async def _keepalive(self) -> None:
        """RTRV-HDR whenever the session has been idle for `keepalive_s`, so that the switch's session
        timeout never logs us out; also notices a connection lost while idle and re-establishes it."""
        assert self.keepalive_s is not None
        period_ns = int(self.keepalive_s * 1e9)
        while True:
            idle_ns = now_ns() - self._last_io_ns
            await asyncio.sleep(max(period_ns - idle_ns, period_ns // 10) / 1e9)
            conn = self._conn
            if conn is None:
                return
            if conn.lost is None and now_ns() - self._last_io_ns < period_ns:
                continue
            try:
                async with self.timeouts.deadline(self.name, "keep-alive"):
                    await self._call("RTRV-HDR", idempotent=True)
            except (HardwareError, InputError) as e:
                log.warning("%s: keep-alive failed: %s", self.name, self._scrub(str(e)))
                self._emit("ocs.error", self._scrub(f"keep-alive failed: {e}"))

    # -- OpticalSwitch ---------------------------------------------------------------------------------------
    async def _read(self) -> Mapping:
        reply = await self._call("RTRV-PATCH", idempotent=True)
        patches = parse_patches(reply.lines)
        for ingress, egress in patches:
            if ingress not in self.space.all_ports or egress not in self.space.all_ports:
                raise Tl1Error(
                    f"{self.name}: RTRV-PATCH reports port outside {self.space}: ({ingress}, {egress})"
                )
        return patches

    async def _each(self, calls: Sequence[Callable[[], Awaitable[T]]]) -> list[T]:
        """Run commands one at a time, or up to `pipeline_depth` in flight (distinct ctags). All finish
        before the first failure is raised, so nothing is left in flight."""
        if self.pipeline_depth == 1 or len(calls) == 1:
            return [await c() for c in calls]
        window = asyncio.Semaphore(self.pipeline_depth)

        async def one(call: Callable[[], Awaitable[T]]) -> T:
            async with window:
                return await call()

        results = await asyncio.gather(*(one(c) for c in calls), return_exceptions=True)
        for r in results:
            if isinstance(r, BaseException):
                raise r
        return results  # type: ignore[return-value]

    async def _send(self, diff: MappingDiff) -> None:
        """DLT-PATCH the ingress ends of the patches that go (one `&` list per 64 ports), then ENT-PATCH
        each new pair (bulk ENT-PATCH is unverified on real firmware, §1.2)."""
        removals = sorted(ingress for ingress, _ in diff.remove)
        for i in range(0, len(removals), MAX_PORTS_PER_COMMAND):
            chunk = format_ports(removals[i : i + MAX_PORTS_PER_COMMAND])
            await self._call("DLT-PATCH", chunk, idempotent=False)
        adds = sorted(diff.add)
        await self._each(
            [functools.partial(self._call, "ENT-PATCH", f"{i},{e}", idempotent=False) for i, e in adds]
        )

    async def _timed(self, operation: str, coro: Callable[[], Awaitable[T]]) -> Timed[T]:
        self._require_conn()
        start = now_ns()
        async with self.timeouts.deadline(self.name, operation):
            value = await coro()
        return Timed(value, start, now_ns())

    async def get_mapping(self) -> Timed[Mapping]:
        result = await self._timed("RTRV-PATCH", self._read)
        self._emit(
            "ocs.read",
            len(result.value),
            result.end_ns,
            patches=sorted(result.value),
            elapsed_ns=result.elapsed_ns,
        )
        return result

    async def apply(
        self,
        mapping: Iterable[tuple[int, int]],
        *,
        scope: Iterable[int] | None = None,
        context: dict[str, Any] | None = None,
    ) -> Timed[ApplyResult]:
        ops = SwitchOps(
            self._read,
            self._send,
            attempts=self.attempts,
            extra_meta={"driver": "polatis-tl1", "pipeline_depth": self.pipeline_depth},
        )
        return await self._timed(
            "apply", lambda: converge(self.name, self.space, ops, mapping, scope, self._emit_sink, context)
        )

    async def disconnect(
        self, ports: Iterable[int], *, context: dict[str, Any] | None = None
    ) -> Timed[ApplyResult]:
        return await self.apply((), scope=ports, context=context)

    async def port_power(self, ports: Iterable[int]) -> Timed[dict[int, float | None]]:
        wanted = sorted(set(ports))
        self._check_ports(wanted)

        async def read() -> dict[int, float | None]:
            powers = parse_power(
                (await self._call("RTRV-PORT-POWER", format_ports(wanted), idempotent=True)).lines
            )
            return {p: powers.get(p) for p in wanted}

        result = await self._timed("RTRV-PORT-POWER", read)
        for port, dbm in result.value.items():
            self._emit_sink(
                Event(
                    t_ns=result.end_ns,
                    kind="rx_power",
                    source=f"{self._source}/{port}",
                    value=dbm,
                    meta={"monitor": "switch"},
                )
            )
        return result

    # -- the rest of the TL1 command set ---------------------------------------------------------------------
    def _check_ports(self, ports: Sequence[int]) -> None:
        if not ports:
            raise InputError(f"{self.name}: no ports given")
        bad = [p for p in ports if p not in self.space.all_ports]
        if bad:
            raise InputError(f"{self.name}: ports {bad} are outside 1..{self.space.all_ports.stop - 1}")

    async def retrieve_patches(self, ports: Iterable[int] | None = None) -> Timed[Mapping]:
        """RTRV-PATCH, optionally only the patches touching `ports`."""
        aid = ""
        if ports is not None:
            wanted = sorted(set(ports))
            self._check_ports(wanted)
            aid = format_ports(wanted)
        return await self._timed(
            "RTRV-PATCH",
            lambda: self._parsed("RTRV-PATCH", aid, parse_patches),
        )

    async def _parsed(
        self, verb: str, aid: str, parse: Callable[[Sequence[str]], T], blocks: tuple[str, ...] = ("",)
    ) -> T:
        return parse((await self._call(verb, aid, blocks, idempotent=True)).lines)

    async def delete_patches(self, ports: Iterable[int] | str) -> Timed[None]:
        """DLT-PATCH on ports (an `&`/`&&` list) or "ALL". Bypasses apply-with-verify: prefer `disconnect`."""
        if isinstance(ports, str):
            if ports.upper() != "ALL":
                raise InputError(f"{self.name}: DLT-PATCH takes ports or ALL, not {ports!r}")
            aid = "ALL"
        else:
            wanted = sorted(set(ports))
            self._check_ports(wanted)
            aid = format_ports(wanted)

        async def run() -> None:
            await self._call("DLT-PATCH", aid, idempotent=False)

        return await self._timed("DLT-PATCH", run)

    async def enter_patch(self, ingress: int, egress: int) -> Timed[None]:
        """One ENT-PATCH. Bypasses apply-with-verify: prefer `apply`."""
        self._check_ports([ingress, egress])

        async def run() -> None:
            await self._call("ENT-PATCH", f"{ingress},{egress}", idempotent=False)

        return await self._timed("ENT-PATCH", run)

    async def _shutter(self, verb: str, ports: Iterable[int]) -> Timed[None]:
        wanted = sorted(set(ports))
        self._check_ports(wanted)

        async def run() -> None:
            await self._call(verb, format_ports(wanted), idempotent=True)

        return await self._timed(verb, run)

    async def close_shutters(self, ports: Iterable[int]) -> Timed[None]:
        """OPR-PORT-SHUTTER: block light on the ports."""
        return await self._shutter("OPR-PORT-SHUTTER", ports)

    async def open_shutters(self, ports: Iterable[int]) -> Timed[None]:
        """RLS-PORT-SHUTTER: let light through again."""
        return await self._shutter("RLS-PORT-SHUTTER", ports)

    async def shutter_states(self, ports: Iterable[int]) -> Timed[dict[int, str]]:
        """RTRV-PORT-SHUTTER: the switch's state token per port (`OPEN`/`CLOSED` here; unverified, §1.4)."""
        wanted = sorted(set(ports))
        self._check_ports(wanted)
        return await self._timed(
            "RTRV-PORT-SHUTTER",
            lambda: self._parsed(
                "RTRV-PORT-SHUTTER",
                format_ports(wanted),
                lambda lines: {
                    p: v.upper() for p, v in parse_port_values(lines, "RTRV-PORT-SHUTTER").items()
                },
            ),
        )

    async def retrieve_size(self) -> Timed[PortSpace]:
        """RTRV-EQPT::SYSTEM:::PARAMETER=SIZE."""
        return await self._timed(
            "RTRV-EQPT", lambda: self._parsed("RTRV-EQPT", "SYSTEM", parse_size, ("", "", "PARAMETER=SIZE"))
        )

    async def retrieve_netype(self) -> Timed[tuple[str, ...]]:
        """RTRV-NETYPE: `vendor,model,type,version`."""

        def parse(lines: Sequence[str]) -> tuple[str, ...]:
            if not lines:
                raise Tl1Error(f"{self.name}: RTRV-NETYPE returned no line")
            return tuple(part.strip() for part in lines[0].split(","))

        return await self._timed("RTRV-NETYPE", lambda: self._parsed("RTRV-NETYPE", "", parse))

    async def retrieve_header(self) -> Timed[str]:
        """RTRV-HDR: the switch's SID (`( nil )` when it has no name)."""

        async def run() -> str:
            return (await self._call("RTRV-HDR", idempotent=True)).sid

        return await self._timed("RTRV-HDR", run)
