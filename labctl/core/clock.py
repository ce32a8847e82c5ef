"""The run timebase: integer nanoseconds of CLOCK_MONOTONIC, plus CLOCK_REALTIME for humans.

Every event carries `t_ns` on this timebase. `wall_ns` is derived from one (mono, wall) pair read at run
start unless the observer supplies its own, so that wall stamps never jump inside a run.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

__all__ = [  # the public surface (docs/architecture.md, "Public surface"); the rest is internal
    "Timebase",
    "now_ns",
    "wall_now_ns",
]

now_ns = time.monotonic_ns
wall_now_ns = time.time_ns


@dataclass(frozen=True, slots=True)
class Timebase:
    """Pairs the run's monotonic clock with the wall clock at one instant."""

    mono0_ns: int
    wall0_ns: int

    @classmethod
    def capture(cls) -> Timebase:
        # Read wall between two monotonic reads and take the midpoint: the pair is then good to ~100 ns.
        a = now_ns()
        w = wall_now_ns()
        b = now_ns()
        return cls(mono0_ns=(a + b) // 2, wall0_ns=w)

    def wall_of(self, t_ns: int) -> int:
        return self.wall0_ns + (t_ns - self.mono0_ns)
