"""The loopback protocol's codec: messages <-> text lines. Pure: no I/O; raises only `CodecError`."""

from __future__ import annotations

from labctl.core.errors import HardwareError, InputError
from labctl.inventory.mapping import Mapping, PortSpace


class CodecError(HardwareError):
    """A reply the codec cannot read (a switch speaking something else, a garbled line)."""


def query_size() -> str:
    return "SIZE?"


def query_patches() -> str:
    return "PATCHES?"


def query_power(port: int) -> str:
    return f"POWER? {port}"


def connect(ingress: int, egress: int) -> str:
    return f"CONNECT {ingress} {egress}"


def disconnect(ingress: int) -> str:
    return f"DISCONNECT {ingress}"


def parse_size(reply: str) -> PortSpace:
    """`8x8` -> PortSpace(8, 8)."""
    try:
        return PortSpace.parse(reply)
    except InputError:
        raise CodecError(f"unreadable size {reply!r}") from None


def parse_patches(reply: str) -> Mapping:
    """`1>9,2>10` -> {(1, 9), (2, 10)}; an empty line: no patches."""
    try:
        pairs = [item.split(">") for item in reply.split(",") if item]
        return frozenset((int(ingress), int(egress)) for ingress, egress in pairs)
    except ValueError:
        raise CodecError(f"unreadable patch list {reply!r}") from None


def parse_power(reply: str) -> float | None:
    """`-3.50` -> -3.5 dBm; `DARK` -> None (no light)."""
    try:
        return None if reply == "DARK" else float(reply)
    except ValueError:
        raise CodecError(f"unreadable power {reply!r}") from None
