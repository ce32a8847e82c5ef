"""Statistics of benchmark samples: distributions (min/median/p99/max), round trips from stamps, the
timer's granularity, and the random single-cycle permutation a pointer chase follows."""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np


@dataclass(frozen=True)
class Distribution:
    """Summary of samples. p99 is the nearest-rank 99th percentile (the smallest sample with at least 99 %
    of the samples at or below it), so it is always an observed value, like perftest's."""

    n: int
    min: float
    median: float
    p99: float
    max: float
    mean: float

    @classmethod
    def of(cls, samples: np.ndarray | list[float]) -> Distribution:
        a = np.sort(np.asarray(samples, dtype=np.float64))
        if a.size == 0:
            raise ValueError("no samples")
        if not np.all(np.isfinite(a)):
            raise ValueError("samples must be finite")
        rank = max(math.ceil(0.99 * a.size), 1)
        return cls(
            n=int(a.size),
            min=float(a[0]),
            median=float(np.median(a)),
            p99=float(a[rank - 1]),
            max=float(a[-1]),
            mean=float(a.mean()),
        )

    def scaled(self, factor: float) -> Distribution:
        return Distribution(
            self.n,
            self.min * factor,
            self.median * factor,
            self.p99 * factor,
            self.max * factor,
            self.mean * factor,
        )

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def deltas(stamps: np.ndarray) -> np.ndarray:
    """Differences of consecutive monotonic stamps (one per round trip). Stamps that go backwards mean the
    device wrote garbage; that is an error, not a sample."""
    s = np.asarray(stamps, dtype=np.int64)
    if s.size < 2:
        raise ValueError("need at least two stamps")
    d = np.diff(s)
    if np.any(d < 0):
        raise ValueError(f"stamps go backwards at index {int(np.argmax(d < 0)) + 1}")
    return d


def granularity_ns(step_ns: np.ndarray) -> float:
    """The timer's update step: the median change, leaving out the first (it starts mid-interval)."""
    steps = np.asarray(step_ns, dtype=np.float64)
    steps = steps[1:] if steps.size > 1 else steps
    if steps.size == 0:
        raise ValueError("no timer changes")
    return float(np.median(steps))


def cycles_per_ns(step_ns: np.ndarray, step_cycles: np.ndarray) -> float:
    """The SM clock (GHz = cycles per ns) over the whole timer run, first partial step left out."""
    ns = np.asarray(step_ns, dtype=np.float64)[1:]
    cyc = np.asarray(step_cycles, dtype=np.float64)[1:]
    total = float(ns.sum())
    if total <= 0:
        raise ValueError("timer did not advance")
    return float(cyc.sum()) / total


def single_cycle(n: int, rng: np.random.Generator) -> np.ndarray:
    """next[i] for a random cyclic order of n slots that visits every slot once: shuffle the slots, then
    link each to the one after it and the last back to the first. A chase from any slot walks the whole
    footprint in an order no prefetcher can follow."""
    if n < 1:
        raise ValueError("need at least one slot")
    order = rng.permutation(n).astype(np.uint32)
    nxt = np.empty(n, dtype=np.uint32)
    nxt[order] = np.roll(order, -1)
    return nxt


def cycle_length(nxt: np.ndarray, start: int = 0) -> int:
    """Hops until the chain from `start` returns to it."""
    seen = 0
    i = start
    n = len(nxt)
    while True:
        i = int(nxt[i])
        seen += 1
        if i == start or seen > n:
            return seen
