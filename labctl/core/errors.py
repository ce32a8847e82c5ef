"""Error types. Everything a user can fix by editing input is an `InputError` (CLI exit code 2)."""

from __future__ import annotations

__all__ = [  # the public surface (docs/architecture.md, "Public surface"); the rest is internal
    "HardwareError",
    "InputError",
    "LabFault",
    "LabctlError",
    "MappingError",
    "SwitchStateMismatch",
]


class LabctlError(Exception):
    """Base class for labctl errors that carry a one-line, user-facing message."""


class InputError(LabctlError):
    """Bad input (inventory, experiment, mapping, CLI argument): one line saying what and where."""


class MappingError(InputError):
    """A port mapping that is not a valid matching on the switch it targets."""


class HardwareError(LabctlError):
    """A device misbehaved: it refused, timed out, or ended in a state other than the one requested."""


class SwitchStateMismatch(HardwareError):
    """The switch's read-back mapping differs from the requested one after all retries."""

    def __init__(self, switch: str, missing: set[tuple[int, int]], unexpected: set[tuple[int, int]]):
        self.switch = switch
        self.missing = missing
        self.unexpected = unexpected
        super().__init__(
            f"{switch}: read-back differs from the requested mapping: "
            f"missing {sorted(missing)}, unexpected {sorted(unexpected)}"
        )


class LabFault(HardwareError):
    """The lab reported a fault of its own during the run (e.g. a host's agent went offline)."""
