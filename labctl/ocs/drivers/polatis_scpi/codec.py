"""Polatis SCPI codec: pure, text in and out, raises only `ScpiError`.

Builds the program messages the driver sends (channel lists `(@1,2,3)`, `OXC:SWIT:CONN:ADD/SUB/ONLY`,
`:PMON:POW?` in chunks of at most 256 ports) and parses the switch's response lines (`*IDN?` and the port
space in its product code, `OXC:SWIT:CONN:STAT?`, `:PMON:POW?`, `SYST:ERR?`, `*OPC?`). Facts: shared
reference ocs-protocols.md §3.1; what no source shows (the no-light reading, the empty STAT? reply) is
read leniently here and listed in docs/decisions/0032.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Literal

from labctl.core.errors import HardwareError
from labctl.inventory.mapping import Mapping, PortSpace

IDENTITY_QUERY = "*IDN?"
OPERATION_COMPLETE_QUERY = "*OPC?"
CLEAR_STATUS = "*CLS"
ERROR_QUERY = "SYST:ERR?"
CONNECTIONS_QUERY = "OXC:SWIT:CONN:STAT?"

MAX_PORTS_PER_QUERY = 256
"""`:PMON:POW?` asks for at most this many ports at once (the public client chunks the same way, §3.1)."""
MAX_PAIRS_PER_COMMAND = 256
"""A CONN:ADD/SUB names at most this many pairs; a longer change is split (no source gives a limit)."""
ERROR_QUEUE_DEPTH = 32
"""`SYST:ERR?` is asked at most this many times per check; a queue that never empties is a faulty switch."""
NO_LIGHT_DBM = -90.0
"""A power reading at or below this is "no light" (None). The real floor value is unverified."""
MAX_REPLY_CHARS = 1 << 20
"""A response line longer than this is not a Polatis reply (1,000 ports of power is ~10 kB)."""

ChangeVerb = Literal["ADD", "SUB", "ONLY"]


class ScpiError(HardwareError):
    """A response line that is not what the query it answers can return (framing, grammar, payload).

    SCPI replies carry no tag: after one, the line stream cannot be trusted to pair replies with queries,
    so the driver drops the session and opens a new one."""


def _clip(text: str, limit: int = 80) -> str:
    return text if len(text) <= limit else text[: limit - 1] + "…"


# -- framing -------------------------------------------------------------------------------------------------
_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f]")


def decode_reply(raw: bytes) -> str:
    """One response line as read off the wire (it must end in LF; a CR before it is dropped). A line that
    was cut short, or holds bytes no SCPI reply holds (control characters, non-ASCII), is an ScpiError."""
    if not raw.endswith(b"\n"):
        raise ScpiError(f"reply cut short without its line end: {_clip(repr(raw))}")
    if len(raw) > MAX_REPLY_CHARS:
        raise ScpiError(f"reply of {len(raw)} bytes is longer than any reply of this switch")
    try:
        text = raw[:-1].removesuffix(b"\r").decode("ascii")
    except UnicodeDecodeError:
        raise ScpiError(f"reply is not ASCII: {_clip(repr(raw))}") from None
    if _CONTROL.search(text):
        raise ScpiError(f"reply holds control characters: {_clip(repr(raw))}")
    return text


def encode_command(command: str) -> str:
    """A program message as sent (the transport adds the LF). Refuses what would split or end it early."""
    if not command or "\n" in command or "\r" in command or not command.isascii():
        raise ValueError(f"not a one-line ASCII SCPI command: {command!r}")
    return command


# -- channel lists -------------------------------------------------------------------------------------------
def channel_list(ports: Iterable[int]) -> str:
    """`(@1,2,3)` in the order given; `(@)` for none."""
    return "(@" + ",".join(str(int(p)) for p in ports) + ")"


_CHANNEL_LIST = re.compile(r"^\(@\s*([^()]*?)\s*\)$")
_CHANNEL_ITEM = re.compile(r"^(\d{1,6})(?::(\d{1,6}))?$")


def parse_channel_list(text: str) -> list[int]:
    """`(@1,2,5:7)` → [1, 2, 5, 6, 7] (ranges `a:b` ascending, as SCPI writes them); `(@)` → []."""
    m = _CHANNEL_LIST.match(text.strip())
    if m is None:
        raise ScpiError(f"not a channel list: {_clip(text)!r}")
    body = m[1]
    if not body:
        return []
    ports: list[int] = []
    for item in body.split(","):
        im = _CHANNEL_ITEM.match(item.strip())
        if im is None:
            raise ScpiError(f"bad channel {_clip(item.strip())!r} in {_clip(text)!r}")
        low, high = int(im[1]), int(im[2] or im[1])
        if high < low or high - low > 100_000:
            raise ScpiError(f"bad channel range {item.strip()!r} in {_clip(text)!r}")
        ports.extend(range(low, high + 1))
    return ports


def _split_top(text: str) -> list[str]:
    """Split on commas outside parentheses."""
    parts: list[str] = []
    depth = 0
    start = 0
    for i, ch in enumerate(text):
        if ch == "(":
            depth += 1
        elif ch == ")":
            depth -= 1
            if depth < 0:
                raise ScpiError(f"unbalanced parentheses in {_clip(text)!r}")
        elif ch == "," and depth == 0:
            parts.append(text[start:i])
            start = i + 1
    if depth:
        raise ScpiError(f"unbalanced parentheses in {_clip(text)!r}")
    parts.append(text[start:])
    return parts


# -- cross-connects ------------------------------------------------------------------------------------------
def connection_command(verb: ChangeVerb, pairs: Iterable[tuple[int, int]]) -> str:
    """`OXC:SWIT:CONN:<verb> (@i1,i2,…),(@o1,o2,…)`: ingress list, then the egress list in the same order
    (pair k is ingress k → egress k). Pairs are written sorted by ingress port."""
    ordered = sorted(pairs)
    ingress = channel_list(i for i, _ in ordered)
    egress = channel_list(e for _, e in ordered)
    return f"OXC:SWIT:CONN:{verb} {ingress},{egress}"


def connection_commands(verb: Literal["ADD", "SUB"], pairs: Iterable[tuple[int, int]]) -> list[str]:
    """The change as CONN:ADD or CONN:SUB commands of at most MAX_PAIRS_PER_COMMAND pairs each."""
    ordered = sorted(pairs)
    return [
        connection_command(verb, ordered[i : i + MAX_PAIRS_PER_COMMAND])
        for i in range(0, len(ordered), MAX_PAIRS_PER_COMMAND)
    ]


def parse_connections(reply: str) -> Mapping:
    """`OXC:SWIT:CONN:STAT?` → the patches. `(@1,2),(@9,10)` is {(1, 9), (2, 10)}. A switch with no
    connection may answer `(@),(@)`, `(@)` or an empty line (which one is unverified): all read as none."""
    text = reply.strip()
    if text in ("", "(@)", "(@),(@)"):
        return frozenset()
    halves = _split_top(text)
    if len(halves) != 2:
        raise ScpiError(f"{CONNECTIONS_QUERY}: expected (@ingress…),(@egress…), got {_clip(reply)!r}")
    ingress, egress = (parse_channel_list(h) for h in halves)
    if len(ingress) != len(egress):
        raise ScpiError(
            f"{CONNECTIONS_QUERY}: {len(ingress)} ingress but {len(egress)} egress ports in {_clip(reply)!r}"
        )
    pairs = list(zip(ingress, egress, strict=True))
    mapping = frozenset(pairs)
    if len(mapping) != len(pairs) or len({p for pair in pairs for p in pair}) != 2 * len(pairs):
        raise ScpiError(f"{CONNECTIONS_QUERY}: a port appears twice in {_clip(reply)!r}")
    return mapping


# -- power ---------------------------------------------------------------------------------------------------
def power_queries(ports: Sequence[int]) -> list[tuple[list[int], str]]:
    """`:PMON:POW? (@…)` per chunk of at most MAX_PORTS_PER_QUERY ports, with the ports it asks for."""
    chunks = [list(ports[i : i + MAX_PORTS_PER_QUERY]) for i in range(0, len(ports), MAX_PORTS_PER_QUERY)]
    return [(chunk, f":PMON:POW? {channel_list(chunk)}") for chunk in chunks]


_NUMBER = re.compile(r"^[+-]?(\d+(\.\d*)?|\.\d+)([eE][+-]?\d+)?$")


def parse_power(reply: str, ports: Sequence[int]) -> dict[int, float | None]:
    """`(v1,v2,…)` in dBm, one per port asked for, in order; at or below NO_LIGHT_DBM (or NaN) is None."""
    text = reply.strip()
    if text.startswith("(") and text.endswith(")"):
        text = text[1:-1]
    values = [v.strip() for v in text.split(",")] if text.strip() else []
    if len(values) != len(ports):
        raise ScpiError(f":PMON:POW?: {len(ports)} ports asked, {len(values)} values in {_clip(reply)!r}")
    out: dict[int, float | None] = {}
    for port, value in zip(ports, values, strict=True):
        if value.upper() in ("NAN", "9.91E37", "+9.91E37"):  # SCPI's "not a number"
            out[port] = None
            continue
        if not _NUMBER.match(value):
            raise ScpiError(f":PMON:POW?: port {port}: {_clip(value)!r} is not a dBm value")
        dbm = float(value)
        out[port] = None if dbm <= NO_LIGHT_DBM else dbm
    return out


# -- status --------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class DeviceError:
    """One entry of the switch's SCPI error queue: `-221,"Settings conflict;port 9 in use"`."""

    code: int
    message: str

    @property
    def ok(self) -> bool:
        return self.code == 0

    def __str__(self) -> str:
        return f"{self.code} {self.message}"


_ERROR = re.compile(r'^\s*([+-]?\d{1,6})\s*,\s*(?:"((?:[^"]|"")*)"|([^"]*))\s*$')


def parse_error(reply: str) -> DeviceError:
    """`SYST:ERR?` → its entry. `0,"No error"`, `-221,"Settings conflict"`, and the unquoted `0,No error`
    some instruments write."""
    m = _ERROR.match(reply)
    if m is None:
        raise ScpiError(f'{ERROR_QUERY}: expected <code>,"<message>", got {_clip(reply)!r}')
    message = m[2].replace('""', '"') if m[2] is not None else m[3].strip()
    return DeviceError(int(m[1]), message)


def describe_errors(switch: str, command: str, errors: Sequence[DeviceError]) -> str:
    """One line for a command the switch reported errors for."""
    listed = "; ".join(_clip(str(e), 160) for e in errors)
    return f"{switch}: {_clip(command, 120)} failed: {listed}"


def parse_operation_complete(reply: str) -> None:
    """`*OPC?` answers `1` once every pending operation has finished."""
    if reply.strip() not in ("1", "+1"):
        raise ScpiError(f"{OPERATION_COMPLETE_QUERY}: expected 1, got {_clip(reply)!r}")


# -- identity ------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Identity:
    """`*IDN?`: manufacturer, model (the Polatis product code), serial number, firmware version."""

    manufacturer: str
    model: str
    serial: str
    firmware: str
    space: PortSpace | None
    """The port space from the product code's `-<in>x<out>-`; None when it has none."""

    def __str__(self) -> str:
        return ",".join(x for x in (self.manufacturer, self.model, self.serial, self.firmware) if x)


_SIZE = re.compile(r"(?:^|-)(\d{1,4})x(\d{1,4})(?:-|$)", re.IGNORECASE)


def parse_identity(reply: str) -> Identity:
    """`Polatis,N-VST-192x192-LA1-DMHNV-701,001705,6.5.1.7` → the identity; the port space from the first
    `-<in>x<out>-` of the product code (case-insensitive: `24X24` too)."""
    fields = [f.strip() for f in reply.split(",")]
    if len(fields) < 2 or not fields[0] or not fields[1]:
        raise ScpiError(f"{IDENTITY_QUERY}: expected <manufacturer>,<model>,…, got {_clip(reply)!r}")
    fields += [""] * (4 - len(fields))
    space = None
    if m := _SIZE.search(fields[1]):
        n_in, n_out = int(m[1]), int(m[2])
        if n_in >= 1 and n_out >= 1:
            space = PortSpace(n_in, n_out)
    return Identity(fields[0], fields[1], fields[2], ",".join(fields[3:]).strip(","), space)
