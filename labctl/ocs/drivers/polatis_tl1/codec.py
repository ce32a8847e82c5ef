"""Polatis TL1 codec: pure, bytes in and out, raises only `Tl1Error`.

`Tl1Command` renders one input message (secrets revealed only into the wire bytes); `Tl1Decoder` parses
the switch's output incrementally into responses, acknowledgments, autonomous messages and noise; the
payload parsers read RTRV-PATCH, RTRV-PORT-POWER/-SHUTTER and RTRV-EQPT SIZE. Facts (grammar, framing,
port numbering, what is unverified): shared reference ocs-protocols.md §1; decision 0007.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from labctl.core.errors import HardwareError, InputError
from labctl.inventory.config import Secret
from labctl.inventory.mapping import PortSpace

NO_LIGHT_DBM = -90.0
"""A power reading at or below this is "no light" (None). The real floor value is unverified (§1.4)."""

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


def parse_attenuation(lines: Sequence[str]) -> dict[int, float | None]:
    """RTRV-PORT-ATTEN's `"<port>:<mode>,<level>,<reference>"` lines as dB below each port's patched light:
    0.0 for NONE, the level for RELATIVE to the patched ingress (no or 0 reference), None for a setting of
    another kind (a target power, maximum, fixed, or relative to a named port)."""
    out: dict[int, float | None] = {}
    for port, text in parse_port_values(lines, "RTRV-PORT-ATTEN").items():
        mode, _, rest = text.partition(",")
        level, _, reference = rest.partition(",")
        mode = mode.strip().upper()
        if mode == "NONE":
            out[port] = 0.0
        elif mode in ("RELATIVE", "REL") and reference.strip() in ("", "0"):
            try:
                out[port] = float(level)
            except ValueError:
                raise Tl1Error(f"RTRV-PORT-ATTEN level is not a number: {_clip(text)!r}") from None
        else:
            out[port] = None
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
