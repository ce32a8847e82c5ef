"""The globaltimer's own update granularity, and the SM clock it implies."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .backend import GpuBackend, TimerRaw
from .stats import Distribution, cycles_per_ns, granularity_ns


@dataclass(frozen=True)
class TimerResult:
    device: int
    sm: int
    granularity_ns: float  # median step of %globaltimer
    step_ns: Distribution
    sm_clock_ghz: float  # clock64 cycles per globaltimer ns over the run
    read_cycles: Distribution  # SM cycles per (globaltimer + clock64) read pair in the spin loop
    host_start_ns: int
    host_end_ns: int


def timer_result(raw: TimerRaw) -> TimerResult:
    steps = np.asarray(raw.step_ns, dtype=np.float64)
    cycles = np.asarray(raw.step_cycles, dtype=np.float64)
    reads = np.maximum(np.asarray(raw.reads, dtype=np.float64), 1.0)
    return TimerResult(
        device=raw.device,
        sm=raw.sm,
        granularity_ns=granularity_ns(steps),
        step_ns=Distribution.of(steps[1:] if steps.size > 1 else steps),
        sm_clock_ghz=cycles_per_ns(steps, cycles),
        read_cycles=Distribution.of((cycles / reads)[1:] if steps.size > 1 else cycles / reads),
        host_start_ns=raw.host_start_ns,
        host_end_ns=raw.host_end_ns,
    )


def measure_timer(backend: GpuBackend, device: int, changes: int = 2000) -> TimerResult:
    return timer_result(backend.timer(device, changes))
