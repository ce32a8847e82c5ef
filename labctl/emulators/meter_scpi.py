"""The N77xx power meter's SCPI grammar: mnemonics, headers, numbers with units, booleans, compound messages.

Pure text to values, and the error-queue entry (`ScpiError`) each mistake becomes; what a command does is
labctl.emulators.power_meter's. Short or long mnemonics in any case (`FETC1:CHAN1:POW?` =
`fetch1:channel1:power?`), numeric suffixes, units on numbers (`1310NM`, `0.5MS`), MIN/MAX, and program
messages of several units separated by `;` (a unit without a leading colon continues the previous one's
branch).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence

__all__ = [
    "LENGTH_UNITS",
    "OPTIONAL_NODES",
    "TIME_UNITS",
    "ScpiError",
    "boolean",
    "header_nodes",
    "number",
    "required",
    "split_units",
    "undefined_header",
]


class ScpiError(Exception):
    """One SCPI error-queue entry: `code,"message"`."""

    def __init__(self, code: int, message: str) -> None:
        super().__init__(f'{code},"{message}"')
        self.code = code


def undefined_header(header: str) -> ScpiError:
    return ScpiError(-113, f"Undefined header;{header}")


# Mnemonics: the upper-case part is the short form; either form matches, in any case.
_KEYWORDS = (
    *("SYSTem", "ERRor", "NEXT", "SENSe", "CHANnel", "POWer", "WAVelength", "UNIT", "ATIMe", "RANGe"),
    *("AUTO", "CORRection", "LOSS", "INPut", "MAGNitude", "INITiate", "CONTinuous", "IMMediate"),
    *("FETCh", "READ", "SCALar", "DC"),
)
_MNEMONIC: dict[str, str] = {}
for _word in _KEYWORDS:
    _short = "".join(c for c in _word if c.isupper())
    _MNEMONIC[_short] = _short
    _MNEMONIC[_word.upper()] = _short
_NODE = re.compile(r"^([A-Za-z]+)(\d*)$")
_NUMBER = re.compile(r"^([+-]?(?:\d+\.?\d*|\.\d+)(?:[eE][+-]?\d+)?)\s*([A-Za-z]*)$")
TIME_UNITS = {"": 1.0, "S": 1.0, "MS": 1e-3, "US": 1e-6, "NS": 1e-9}
LENGTH_UNITS = {"": 1.0, "M": 1.0, "MM": 1e-3, "UM": 1e-6, "NM": 1e-9, "PM": 1e-12}
OPTIONAL_NODES = {"SCAL", "DC", "IMM", "NEXT", "LOSS", "INP", "MAGN"}
"""Nodes a header may leave out (`[:SCALar]`, `[:IMMediate]`, …): a command means the same without them."""


def number(text: str, units: Mapping[str, float], *, minimum: float, maximum: float) -> float:
    """A numeric parameter in base units (MIN/MAX/DEF allowed): -224 if it is not one, -131 for a bad unit."""
    word = text.strip().upper()
    if word in ("MIN", "MINIMUM"):
        return minimum
    if word in ("MAX", "MAXIMUM"):
        return maximum
    match = _NUMBER.match(text.strip())
    if match is None:
        raise ScpiError(-224, "Illegal parameter value")
    unit = match.group(2).upper()
    if unit not in units:
        raise ScpiError(-131, "Invalid suffix")
    return float(match.group(1)) * units[unit]


def boolean(text: str) -> bool:
    word = text.strip().upper()
    if word in ("1", "ON"):
        return True
    if word in ("0", "OFF"):
        return False
    raise ScpiError(-224, "Illegal parameter value")


def _prefix_nodes(path: Sequence[str]) -> Iterable[tuple[str, int | None]]:
    for node in path:
        match = _NODE.match(node)
        assert match is not None
        yield match.group(1), int(match.group(2)) if match.group(2) else None


def required(argument: str) -> str:
    if not argument:
        raise ScpiError(-109, "Missing parameter")
    return argument


def split_units(line: str) -> list[str]:
    """A program message's units: split at `;` outside quoted strings."""
    units: list[str] = []
    current: list[str] = []
    quote = ""
    for c in line:
        if quote:
            quote = "" if c == quote else quote
        elif c in "\"'":
            quote = c
        elif c == ";":
            units.append("".join(current).strip())
            current = []
            continue
        current.append(c)
    units.append("".join(current).strip())
    return [u for u in units if u]


def header_nodes(header: str, text: str, branch: Sequence[str]) -> list[tuple[str, int | None]]:
    """The (short mnemonic, suffix) nodes of a header's `text` (no leading colon, no `?`), after the
    nodes of `branch` (the previous unit's, or none). A node that is no mnemonic is error -113."""
    nodes: list[tuple[str, int | None]] = list(_prefix_nodes(branch))
    for token in text.split(":"):
        match = _NODE.match(token)
        mnemonic = _MNEMONIC.get(match.group(1).upper()) if match else None
        if match is None or mnemonic is None:
            raise undefined_header(header)
        nodes.append((mnemonic, int(match.group(2)) if match.group(2) else None))
    return nodes
