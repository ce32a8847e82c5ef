"""DiCon 3D MEMS matrix (GP600/GP700 "X1") RS-232 ASCII protocol: bytes <-> commands and replies.

Pure: no I/O, no clock. Commands are ASCII lines; set commands (`X1 CH <in> <out>`) have no reply, queries
answer one line each, in order; errors go to an error queue read with `SYST:ERR?` (decision 0033).
There is no tag on a reply, so each query knows the one line that answers it (`X1 CH 3?` is answered by
`3,<out>`) and anything else on the line is noise: a line with a byte outside printable ASCII is never a
reply (line noise at a wrong baud rate or a glitch), whatever its shape.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Generic, Literal, TypeVar, cast

from labctl.core.errors import HardwareError
from labctl.inventory.mapping import Mapping, MappingDiff, PortSpace

T = TypeVar("T")

LineEnding = Literal["CR", "LF", "CRLF"]
LINE_ENDINGS: dict[str, bytes] = {"CR": b"\r", "LF": b"\n", "CRLF": b"\r\n"}
NO_ERROR = 0
MAX_LINE = 4096  # bytes without a line ending: what is buffered is noise, not a reply


class DiconProtocolError(HardwareError):
    """A reply that is well formed but says something impossible (a port outside the switch)."""


def encode(command: str, ending: LineEnding = "CR") -> bytes:
    """One command line. Commands are ASCII by construction; a non-ASCII one is a programming error."""
    return command.encode("ascii") + LINE_ENDINGS[ending]


def encode_all(commands: Iterable[str], ending: LineEnding = "CR") -> bytes:
    return b"".join(encode(c, ending) for c in commands)


class LineDecoder:
    """Splits what the switch sends into lines at CR, LF or CRLF; empty lines are dropped. Bytes after the
    last line ending stay buffered until more arrive (`pending`)."""

    def __init__(self) -> None:
        self._buf = bytearray()

    def feed(self, data: bytes) -> list[bytes]:
        self._buf += data
        lines: list[bytes] = []
        start = 0
        for i, byte in enumerate(self._buf):
            if byte in (0x0D, 0x0A):
                if i > start:
                    lines.append(bytes(self._buf[start:i]))
                start = i + 1
        del self._buf[:start]
        if len(self._buf) > MAX_LINE:  # no line ending for this long: noise, hand it over as one line
            lines.append(bytes(self._buf))
            self._buf.clear()
        return lines

    @property
    def pending(self) -> bytes:
        return bytes(self._buf)

    def clear(self) -> None:
        self._buf.clear()


def printable(line: bytes) -> str | None:
    """The line as text if every byte is printable ASCII (a candidate reply), else None (noise)."""
    if all(0x20 <= b < 0x7F for b in line):
        return line.decode("ascii").strip()
    return None


@dataclass(frozen=True)
class Query(Generic[T]):
    """A query and how to recognise its one reply line (None: this line does not answer it)."""

    text: str
    pattern: re.Pattern[str]
    kind: Literal["channel", "dim", "idn", "conf", "error", "text"]
    channel: int | None = None

    def match(self, line: bytes) -> T | None:
        text = printable(line)
        if text is None:
            return None
        m = self.pattern.fullmatch(text)
        if m is None:
            return None
        return cast(T, self._value(m))

    def _value(self, m: re.Match[str]) -> object:
        if self.kind == "channel":
            return int(m[2])
        if self.kind == "dim":
            return PortSpace(int(m[1]), int(m[2]))
        if self.kind == "idn":
            return tuple(part.strip() for part in m[0].split(","))
        if self.kind == "error":
            return SwitchError(int(m[1]), m[2].strip().strip('"'))
        return m[0].strip()


@dataclass(frozen=True)
class SwitchError:
    """One entry of the switch's error queue (`+0, No Error` when it is empty)."""

    code: int
    message: str

    def __str__(self) -> str:
        return f"{self.code:+d}, {self.message}"


def channel_query(ingress: int) -> Query[int]:
    """`X1 CH <in>?` -> `<in>,<out>` (out 0: the input is parked, no patch)."""
    pattern = re.compile(rf"\s*({ingress})\s*,\s*(\d{{1,5}})\s*")
    return Query(f"X1 CH {ingress}?", pattern, "channel", ingress)


DIM_QUERY: Query[PortSpace] = Query("X1 DIM?", re.compile(r"\s*(\d{1,5})\s*,\s*(\d{1,5})\s*"), "dim")
IDN_QUERY: Query[tuple[str, ...]] = Query("*IDN?", re.compile(r"[^,]+(,[^,]*){3,}"), "idn")
CONF_QUERY: Query[str] = Query("SYST:CONF?", re.compile(r"\s*[A-Za-z]\d*(\s*,\s*[A-Za-z]\w*)*\s*"), "conf")
ERROR_QUERY: Query[SwitchError] = Query("SYST:ERR?", re.compile(r"\s*([+-]?\d{1,6})\s*,\s*(.*?)\s*"), "error")


def set_channel(ingress: int, output: int) -> str:
    """`X1 CH <in> <out>`: point input `in` at output `out` (0: park it, no light out). No reply."""
    return f"X1 CH {ingress} {output}"


# -- labctl's port numbering ----------------------------------------------------------------------------
def output_of(space: PortSpace, egress: int) -> int:
    """Switch output number (1..N) of egress port N_in+o."""
    return egress - space.n_ingress


def egress_of(space: PortSpace, output: int) -> int:
    return space.n_ingress + output


def mapping_from_channels(space: PortSpace, channels: dict[int, int], switch: str = "switch") -> Mapping:
    """The patches from `input -> output` read-backs (output 0: none)."""
    patches: set[tuple[int, int]] = set()
    for ingress, output in channels.items():
        if output == 0:
            continue
        if not 1 <= output <= space.n_egress:
            raise DiconProtocolError(
                f"{switch}: X1 CH {ingress}? reports output {output}, outside 1..{space.n_egress}"
            )
        patches.add((ingress, egress_of(space, output)))
    return frozenset(patches)


def change_commands(space: PortSpace, current: Iterable[tuple[int, int]], diff: MappingDiff) -> list[str]:
    """The `X1 CH` commands that carry out `diff`, in an order the switch accepts at every step: an output
    is only named once the input holding it has let go. An input that moves goes straight to its new output
    (one command, one mirror move); inputs that only lose their patch are parked first; a cycle of inputs
    that take each other's outputs (a swap) is broken by parking one of them."""
    held = {egress: ingress for ingress, egress in current}  # egress -> ingress holding it now
    target = {ingress: egress for ingress, egress in diff.add}
    commands: list[str] = []
    for ingress, egress in sorted(diff.remove):
        if ingress not in target and held.get(egress) == ingress:
            commands.append(set_channel(ingress, 0))
            del held[egress]
    todo = dict(sorted(target.items()))
    parked: set[int] = set()
    while todo:
        progressed = False
        for ingress, egress in list(todo.items()):
            holder = held.get(egress)
            if holder is None or holder == ingress:
                commands.append(set_channel(ingress, output_of(space, egress)))
                for e, i in list(held.items()):
                    if i == ingress:
                        del held[e]
                held[egress] = ingress
                del todo[ingress]
                progressed = True
        if progressed:
            continue
        # Every remaining input waits for another's output (a swap): park one to free its output. If that
        # frees nothing, an output is held by a patch the diff keeps; send the rest as it is and let the
        # switch report the conflict (its error queue) rather than loop.
        ingress = next(iter(todo))
        if ingress in parked:
            commands.extend(set_channel(i, output_of(space, e)) for i, e in todo.items())
            break
        parked.add(ingress)
        commands.append(set_channel(ingress, 0))
        for e, i in list(held.items()):
            if i == ingress:
                del held[e]
    return commands
