"""Clock offset between an agent and the controller, from timestamped ping/pong over the broker."""

from __future__ import annotations

import statistics
from dataclasses import dataclass

from labctl.errors import HardwareError


@dataclass(frozen=True)
class OffsetSample:
    """One ping/pong: t1 sent and t4 received on the controller clock, t2/t3 on the agent clock."""

    t1: int
    t2: int
    t3: int
    t4: int

    @property
    def rtt_ns(self) -> int:
        return (self.t4 - self.t1) - (self.t3 - self.t2)

    @property
    def offset_ns(self) -> int:
        return ((self.t2 - self.t1) + (self.t3 - self.t4)) // 2


@dataclass(frozen=True)
class OffsetEstimate:
    offset_ns: int  # agent clock − controller clock
    uncertainty_ns: int  # the true offset lies within ± this, if each leg took ≥ 0
    rtt_min_ns: int
    rtt_median_ns: int
    samples: int
    kept: int
    measured_at_ns: int

    def as_dict(self) -> dict[str, int]:
        return {k: int(v) for k, v in self.__dict__.items()}


def estimate_offset(samples: list[OffsetSample], keep_fraction: float = 0.25) -> OffsetEstimate:
    """Keep the lowest-RTT quarter (at least 3): queueing delay only ever adds to an RTT, so the fastest
    round trips are the most symmetric. Each sample bounds the offset to ± RTT/2; the median of the kept
    offsets is within half the largest kept RTT of the truth."""
    if not samples:
        raise HardwareError("clock offset: no ping/pong sample came back")
    ranked = sorted(samples, key=lambda s: s.rtt_ns)
    kept = ranked[: max(3, round(len(ranked) * keep_fraction))]
    return OffsetEstimate(
        offset_ns=int(statistics.median(s.offset_ns for s in kept)),
        uncertainty_ns=max(s.rtt_ns for s in kept) // 2 + 1,
        rtt_min_ns=ranked[0].rtt_ns,
        rtt_median_ns=int(statistics.median(s.rtt_ns for s in ranked)),
        samples=len(samples),
        kept=len(kept),
        measured_at_ns=samples[-1].t4,
    )
