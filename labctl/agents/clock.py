"""An agent's clock against the controller's: offset and drift over a run, with an uncertainty it earns.

Three sources, each recorded, the tightest sound one applied (decision 0040):
- **shared clock**: the agent runs on the controller's kernel (same boot id, same time-namespace offset,
  its clock not synthetic): both read one CLOCK_MONOTONIC, the offset is 0 exactly.
- **exchange**: timestamped ping/pong over the broker, many during the run (bursts, the fastest of each
  kept), a line fitted through the kept offsets (offset at a reference time plus drift); the bound holds
  if each leg of a kept round trip took ≥ 0: the truth at each kept sample is within its RTT/2 of the
  sample, hence within that plus the residual of the line, and between samples a linear truth keeps the
  line's error within the larger of its neighbours'.
- **daemon**: both hosts' clocks disciplined (ptp4l, chrony) to one reference: each host's CLOCK_MONOTONIC
  minus its CLOCK_REALTIME, read together, gives the offset, within the two daemons' own error bounds.
"""

from __future__ import annotations

import functools
import itertools
import math
import os
import statistics
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from labctl.core.errors import HardwareError


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

    @property
    def mid_ns(self) -> int:
        """When (controller clock) the sample's offset holds best: halfway through the round trip."""
        return (self.t1 + self.t4) // 2


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
    """One burst's estimate. Keep the lowest-RTT quarter (at least 3): queueing delay only ever adds to an
    RTT, so the fastest round trips are the most symmetric. Each sample bounds the offset to ± RTT/2; the
    median of the kept offsets is within half the largest kept RTT of the truth."""
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


@dataclass(frozen=True)
class ClockFit:
    """offset(t) = offset_ns + drift_ppb · (t − ref_ns) / 1e9, t on the controller's clock, with a bound
    on its error at any time (`uncertainty_at`); `uncertainty_ns`: the largest over [first_ns, last_ns]."""

    offset_ns: int
    drift_ppb: float
    ref_ns: int
    first_ns: int
    last_ns: int
    kept: int
    samples: int
    rtt_min_ns: int
    rtt_max_kept_ns: int
    anchors: tuple[tuple[int, int], ...] = ()
    """(time, bound) of each kept sample: the line's error there is at most |residual| + RTT/2."""
    slope_error_ppb: float = 0.0
    """A bound on the fitted drift's error: two samples i, j bound it by (b_i + b_j) / (t_j − t_i)."""

    def at(self, t_ns: int) -> int:
        return self.offset_ns + round(self.drift_ppb * (t_ns - self.ref_ns) / 1e9)

    @functools.cached_property
    def uncertainty_ns(self) -> int:
        """The worst bound over the span, at every kept sample and between them (worked out when asked:
        the run's record wants it, shifting stamps does not)."""
        times = [t for t, _ in self.anchors]
        grid = times + [(a + b) // 2 for a, b in itertools.pairwise(times)]
        return max((self.uncertainty_at(t) for t in grid), default=0)

    def uncertainty_at(self, t_ns: int) -> int:
        """A bound on the line's error at t, if the drift was constant (the error is then linear in t): at
        most the larger bound of any two kept samples either side of t; and at most a sample's bound plus
        the error's slope (`slope_error_ppb`) times the distance to it. The tightest of these."""
        if not self.anchors:
            return 0
        reach = min(b + self.slope_error_ppb * abs(t_ns - t) / 1e9 for t, b in self.anchors)
        before = [b for t, b in self.anchors if t <= t_ns]
        after = [b for t, b in self.anchors if t >= t_ns]
        if before and after:
            reach = min(reach, max(min(before), min(after)))
        return round(reach)

    def as_dict(self) -> dict[str, Any]:
        return {
            "offset_ns": self.offset_ns,
            "drift_ppb": round(self.drift_ppb, 3),
            "ref_ns": self.ref_ns,
            "uncertainty_ns": self.uncertainty_ns,
            "first_ns": self.first_ns,
            "last_ns": self.last_ns,
            "kept": self.kept,
            "samples": self.samples,
            "rtt_min_ns": self.rtt_min_ns,
            "rtt_max_kept_ns": self.rtt_max_kept_ns,
        }


MAX_KEPT = 64
"""Samples a fit keeps at most (the fastest): its bound costs O(kept²) to work out."""
MAX_BURSTS = 512
"""Bursts a host's clock model fits over at most (the latest): a long run follows its drift, not its day."""


def fit_clock(bursts: list[list[OffsetSample]]) -> ClockFit:
    """Offset and drift from bursts of exchanges. Each burst contributes its fastest round trip (the one
    least delayed by queueing); of those, the faster half (at least two, all if fewer) are kept and a
    straight line is fitted through their offsets, each weighted by 1/RTT² (a tighter sample pins the line
    harder). The uncertainty is the largest |residual| + RTT/2 over the kept samples: a sound bound where
    each leg took ≥ 0 and the drift was constant over the run."""
    best = [min(burst, key=lambda s: s.rtt_ns) for burst in bursts if burst]
    if not best:
        raise HardwareError("clock offset: no ping/pong sample came back")
    ranked = sorted(best, key=lambda s: s.rtt_ns)
    kept = sorted(ranked[: min(MAX_KEPT, max(2, (len(ranked) + 1) // 2))], key=lambda s: s.mid_ns)
    ref = kept[0].mid_ns
    if len(kept) == 1:
        offset, drift = float(kept[0].offset_ns), 0.0
    else:
        w = [1.0 / max(s.rtt_ns, 1) ** 2 for s in kept]
        x = [(s.mid_ns - ref) / 1e9 for s in kept]  # s
        y = [float(s.offset_ns) for s in kept]
        sw = sum(w)
        mx = sum(wi * xi for wi, xi in zip(w, x, strict=True)) / sw
        my = sum(wi * yi for wi, yi in zip(w, y, strict=True)) / sw
        sxx = sum(wi * (xi - mx) ** 2 for wi, xi in zip(w, x, strict=True))
        sxy = sum(wi * (xi - mx) * (yi - my) for wi, xi, yi in zip(w, x, y, strict=True))
        drift = sxy / sxx if sxx > 0 else 0.0  # ns per s = ppb
        offset = my - drift * mx
    line = ClockFit(round(offset), drift, ref, kept[0].mid_ns, kept[-1].mid_ns, 0, 0, 0, 0)
    anchors = tuple((s.mid_ns, abs(s.offset_ns - line.at(s.mid_ns)) + s.rtt_ns // 2 + 1) for s in kept)
    # The drift's error, from the pair of tight samples that pins it best (of the tightest few).
    tight = sorted(anchors, key=lambda a: a[1])[:8]
    slope_error = min(
        ((bi + bj) / abs(tj - ti) * 1e9 for (ti, bi) in tight for (tj, bj) in tight if tj != ti),
        default=0.0 if len(kept) == 1 else math.inf,
    )
    return ClockFit(
        offset_ns=round(offset),
        drift_ppb=drift,
        ref_ns=ref,
        first_ns=kept[0].mid_ns,
        last_ns=kept[-1].mid_ns,
        kept=len(kept),
        samples=sum(len(b) for b in bursts),
        rtt_min_ns=ranked[0].rtt_ns,
        rtt_max_kept_ns=max(s.rtt_ns for s in kept),
        anchors=anchors,
        slope_error_ppb=slope_error,
    )


# -- what a host's clock is -------------------------------------------------------------------------------
@dataclass(frozen=True)
class HostClock:
    """The clock an agent stamps with: CLOCK_MONOTONIC, or (tests, bench) that clock shifted by `offset_ns`
    and running `drift_ppb` fast from `ref_ns` on: a second host's clock on one machine."""

    offset_ns: int = 0
    drift_ppb: int = 0
    ref_ns: int = 0

    @property
    def synthetic(self) -> bool:
        return bool(self.offset_ns or self.drift_ppb)

    def local(self, raw_ns: int) -> int:
        return raw_ns + self.offset_ns + (raw_ns - self.ref_ns) * self.drift_ppb // 1_000_000_000

    def raw(self, local_ns: int) -> int:
        """The CLOCK_MONOTONIC instant this clock reads `local_ns` at (to the nanosecond)."""
        since = (local_ns - self.offset_ns - self.ref_ns) * 1_000_000_000 // (1_000_000_000 + self.drift_ppb)
        raw = self.ref_ns + since
        while self.local(raw) > local_ns:  # integer rounding: at most a step or two either way
            raw -= 1
        while self.local(raw + 1) <= local_ns:
            raw += 1
        return raw


def _read(path: str) -> str | None:
    try:
        return Path(path).read_text().strip()
    except OSError:
        return None


def _timens_monotonic_ns() -> int:
    """This process's time namespace offset of CLOCK_MONOTONIC (0 outside one, or on kernels without)."""
    text = _read(f"/proc/{os.getpid()}/timens_offsets") or ""
    for line in text.splitlines():
        parts = line.split()
        if len(parts) == 3 and parts[0] in ("monotonic", "1"):
            return int(parts[1]) * 1_000_000_000 + int(parts[2])
    return 0


@dataclass(frozen=True)
class ClockIdentity:
    """What makes two processes' CLOCK_MONOTONIC one clock: the same kernel boot, the same time-namespace
    offset, and neither clock synthetic."""

    boot_id: str | None
    timens_ns: int
    synthetic: bool = False

    @classmethod
    def here(cls, clock: HostClock | None = None) -> ClockIdentity:
        return cls(
            _read("/proc/sys/kernel/random/boot_id"),
            _timens_monotonic_ns(),
            clock is not None and clock.synthetic,
        )

    def shares(self, other: ClockIdentity) -> bool:
        return (
            self.boot_id is not None
            and self.boot_id == other.boot_id
            and self.timens_ns == other.timens_ns
            and not self.synthetic
            and not other.synthetic
        )

    def as_dict(self) -> dict[str, Any]:
        return {"boot_id": self.boot_id, "timens_ns": self.timens_ns, "synthetic": self.synthetic}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> ClockIdentity:
        return cls(data.get("boot_id"), int(data.get("timens_ns", 0)), bool(data.get("synthetic", False)))


def clock_identity(clock: HostClock | None = None) -> dict[str, Any]:
    """This process's clock identity, for its pongs; a synthetic clock says what it is (a rehearsal's second
    clock: tests check the controller's estimate against it)."""
    out = ClockIdentity.here(clock).as_dict()
    if clock is not None and clock.synthetic:
        out["clock"] = {"offset_ns": clock.offset_ns, "drift_ppb": clock.drift_ppb, "ref_ns": clock.ref_ns}
    return out


# -- one host's clock over a run ------------------------------------------------------------------------
@dataclass
class HostClockModel:
    """Everything known about one agent's clock in a run, and the offset applied to its stamps."""

    bursts: list[list[OffsetSample]] = field(default_factory=list)
    history: list[OffsetEstimate] = field(default_factory=list)
    shared: bool = False
    daemon: dict[str, Any] | None = None  # {"offset_ns", "uncertainty_ns", "source"}: both hosts disciplined
    fit: ClockFit | None = None

    def add_burst(self, samples: list[OffsetSample]) -> OffsetEstimate:
        est = estimate_offset(samples)
        self.bursts.append(samples)
        del self.bursts[:-MAX_BURSTS]
        self.history.append(est)
        self.fit = fit_clock(self.bursts)
        return est

    @property
    def source(self) -> str:
        if self.shared:
            return "shared-clock"
        if self.daemon is not None and (
            self.fit is None or self.daemon["uncertainty_ns"] < self.fit.uncertainty_ns
        ):
            return str(self.daemon["source"])
        return "exchange"

    def offset_at(self, t_ns: int) -> int:
        """The offset to remove from this agent's stamps at controller time t_ns."""
        source = self.source
        if source == "shared-clock":
            return 0
        if source != "exchange":
            assert self.daemon is not None
            return int(self.daemon["offset_ns"])
        return self.fit.at(t_ns) if self.fit is not None else 0

    def uncertainty_at(self, t_ns: int) -> int:
        source = self.source
        if source == "shared-clock":
            return 0
        if source != "exchange":
            assert self.daemon is not None
            return int(self.daemon["uncertainty_ns"])
        return self.fit.uncertainty_at(t_ns) if self.fit is not None else 0
