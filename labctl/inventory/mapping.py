"""Port mappings on an optical circuit switch.

A mapping is a set of (ingress, egress) patches. On an NxM switch ingress ports are 1..N and egress ports
N+1..N+M (Polatis numbering). A valid mapping is a matching: every port appears at most once, light only
flows ingress → egress. Everything is validated here before any driver sends a byte.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass

from labctl.core.errors import InputError, MappingError

__all__ = [  # the public surface (docs/architecture.md, "Public surface"); the rest is internal
    "Mapping",
    "MappingDiff",
    "Patch",
    "PortSpace",
    "apply_diff",
    "diff_mapping",
    "ports_of",
    "validate_mapping",
]

Patch = tuple[int, int]
Mapping = frozenset[Patch]

MAX_PORTS_PER_SIDE = 4096  # the largest OCS made has 576 per side (Polatis 576x576); room for a decade
_SIZE = re.compile(r"^\s*(\d+)\s*[xX]\s*(\d+)\s*$")


@dataclass(frozen=True, slots=True)
class PortSpace:
    """Port numbering of an NxM switch: ingress 1..N, egress N+1..N+M."""

    n_ingress: int
    n_egress: int

    @classmethod
    def parse(cls, size: str) -> PortSpace:
        m = _SIZE.match(size)
        if not m or int(m[1]) < 1 or int(m[2]) < 1:
            raise InputError(f"switch size {size!r} is not of the form NxM (e.g. 32x32)")
        if int(m[1]) > MAX_PORTS_PER_SIDE or int(m[2]) > MAX_PORTS_PER_SIDE:
            raise InputError(f"switch size {size!r}: at most {MAX_PORTS_PER_SIDE} ports per side")
        return cls(int(m[1]), int(m[2]))

    def __str__(self) -> str:
        return f"{self.n_ingress}x{self.n_egress}"

    @property
    def ingress(self) -> range:
        return range(1, self.n_ingress + 1)

    @property
    def egress(self) -> range:
        return range(self.n_ingress + 1, self.n_ingress + self.n_egress + 1)

    @property
    def all_ports(self) -> range:
        return range(1, self.n_ingress + self.n_egress + 1)

    def is_ingress(self, port: int) -> bool:
        return 1 <= port <= self.n_ingress

    def is_egress(self, port: int) -> bool:
        return self.n_ingress < port <= self.n_ingress + self.n_egress

    def describe(self, port: int) -> str:
        if self.is_ingress(port):
            return "ingress"
        if self.is_egress(port):
            return "egress"
        return "out of range"


_VALID: dict[tuple[frozenset[Patch], PortSpace], Mapping] = {}
_VALID_MAX = 256


def validate_mapping(patches: Iterable[Patch], space: PortSpace, *, switch: str = "switch") -> Mapping:
    """Return the patches as a Mapping, or raise MappingError naming the first offending patch.

    A mapping given as a frozenset that passed before is not checked again: an experiment cycles through
    the same few, and checking hundreds of patches is a millisecond of loop time per rail command."""
    if isinstance(patches, frozenset):
        known = _VALID.get((patches, space))
        if known is not None:
            return known
        mapping = _validate(patches, space, switch)
        if len(_VALID) >= _VALID_MAX:
            _VALID.clear()
        _VALID[(patches, space)] = mapping
        return mapping
    return _validate(patches, space, switch)


def _validate(patches: Iterable[Patch], space: PortSpace, switch: str) -> Mapping:
    seen_in: dict[int, Patch] = {}
    seen_out: dict[int, Patch] = {}
    for patch in patches:
        if len(patch) != 2 or not all(isinstance(p, int) and not isinstance(p, bool) for p in patch):
            raise MappingError(f"{switch}: patch {patch!r} is not a pair of port numbers")
        ingress, egress = patch
        for port in (ingress, egress):
            if not 1 <= port <= space.n_ingress + space.n_egress:
                raise MappingError(
                    f"{switch}: patch ({ingress}, {egress}): port {port} is out of range "
                    f"1..{space.n_ingress + space.n_egress} for a {space} switch"
                )
        if not space.is_ingress(ingress):
            raise MappingError(
                f"{switch}: patch ({ingress}, {egress}): {ingress} is not an ingress port "
                f"(ingress is 1..{space.n_ingress})"
            )
        if not space.is_egress(egress):
            raise MappingError(
                f"{switch}: patch ({ingress}, {egress}): {egress} is not an egress port "
                f"(egress is {space.egress.start}..{space.egress.stop - 1})"
            )
        if ingress in seen_in:
            raise MappingError(
                f"{switch}: ingress port {ingress} is used twice: "
                f"{seen_in[ingress]} and ({ingress}, {egress})"
            )
        if egress in seen_out:
            raise MappingError(
                f"{switch}: egress port {egress} is used twice: {seen_out[egress]} and ({ingress}, {egress})"
            )
        seen_in[ingress] = (ingress, egress)
        seen_out[egress] = (ingress, egress)
    return frozenset(seen_in.values())


def ports_of(mapping: Iterable[Patch]) -> set[int]:
    return {p for patch in mapping for p in patch}


@dataclass(frozen=True, slots=True)
class MappingDiff:
    """What to send to move a switch from `current` to `desired` within `scope`."""

    remove: frozenset[Patch]
    add: frozenset[Patch]

    @property
    def empty(self) -> bool:
        return not self.remove and not self.add

    @property
    def changed_ports(self) -> set[int]:
        return ports_of(self.remove) | ports_of(self.add)


def diff_mapping(
    current: Iterable[Patch], desired: Mapping, scope: Iterable[int] | None = None
) -> MappingDiff:
    """Patches to remove and add so that every port in `scope` is as `desired` says.

    The scope defaults to the ports `desired` names. Ports in scope that `desired` leaves out end up
    unpatched; patches entirely outside the scope are never touched, so other users of the switch keep
    their circuits. A current patch that shares one port with a desired patch is removed, even if its other
    end lies outside the scope: a port can only carry one circuit.
    """
    current = frozenset(current)
    in_scope = ports_of(desired) | (set(scope) if scope is not None else set())
    remove = frozenset(p for p in current if (p[0] in in_scope or p[1] in in_scope) and p not in desired)
    add = frozenset(desired - current)
    return MappingDiff(remove=remove, add=add)


def apply_diff(current: Iterable[Patch], diff: MappingDiff) -> Mapping:
    return frozenset((set(current) - diff.remove) | diff.add)
