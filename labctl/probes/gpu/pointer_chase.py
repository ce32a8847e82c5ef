"""Pointer chasing: dependent loads over a footprint sized for one level of the memory hierarchy.

Levels: shared memory (ld.shared), L1 (ld.global.ca over a footprint far below L1), L2 (ld.global.cg,
which skips L1, over a footprint far below L2), HBM (ld.global.cg over several times the L2 size, visited in
random order, so it also pays TLB misses). Each trial times `hops` dependent loads with clock64 (cycles)
and globaltimer (ns) on one SM; the per-hop figures are span / hops and the distribution is over trials.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from .backend import ChaseConfig, ChaseKernel, DeviceInfo, GpuBackend
from .stats import Distribution, single_cycle

KiB = 1024
MiB = 1024 * KiB
SHARED_MAX_BYTES = 48 * KiB  # dynamic shared memory available without opting in


@dataclass(frozen=True)
class LevelSpec:
    level: str
    kernel: ChaseKernel
    footprint_bytes: int
    stride_bytes: int
    hops: int
    trials: int
    warm_passes: int  # full walks of the chain before timing (fills the level)

    @property
    def slots(self) -> int:
        return self.footprint_bytes // self.stride_bytes


def default_levels(device: DeviceInfo, trials: int = 32) -> list[LevelSpec]:
    hbm = max(512 * MiB, 8 * device.l2_bytes)
    hbm = min(hbm, device.memory_bytes // 4) if device.memory_bytes else hbm
    return [
        LevelSpec("shared", "chase_shared", 16 * KiB, 64, 4096, trials, 2),
        LevelSpec("L1", "chase_global_ca", 16 * KiB, 128, 4096, trials, 2),
        LevelSpec("L2", "chase_global_cg", 2 * MiB, 128, 4096, trials, 1),
        LevelSpec("HBM", "chase_global_cg", hbm, 512, 2048, max(trials // 2, 4), 0),
    ]


@dataclass(frozen=True)
class Published:
    """Pointer-chasing hit latency in cycles: the seed paper's Table 8 (Luo et al. 2025 for RTX4090, A100,
    H800; H100 and B300 measured by the paper's authors), range over those GPUs, and the issue's nominal."""

    nominal_cycles: float
    low_cycles: float
    high_cycles: float
    figure24_b300_ns: float | None
    source: str


PUBLISHED: dict[str, Published] = {
    "shared": Published(
        29.0, 28.6, 30.1, 14.0, "Table 8: 30.1/29.0/29.0/29.0/28.6 (4090/A100/H800/H100/B300)"
    ),
    "L1": Published(33.0, 32.0, 41.1, 17.0, "Table 8: 32.0/33.0/32.0/41.1/34.1 (4090/A100/H800/H100/B300)"),
    "L2": Published(
        270.0,
        202.8,
        502.0,
        140.0,
        "Table 8: 273.0/202.8-408/264.5-502/276.2/276.8 (4090/A100/H800/H100/B300)",
    ),
}
LARGE_DIFFERENCE = 0.25  # beyond the published range by more than this fraction


@dataclass(frozen=True)
class ChaseResult:
    level: str
    kernel: str
    device: int
    footprint_bytes: int
    stride_bytes: int
    hops: int
    trials: int
    sm: int
    cycles_per_hop: Distribution
    ns_per_hop: Distribution
    host_start_ns: int
    host_end_ns: int
    samples_cycles_per_hop: np.ndarray = field(repr=False)


def chase_config(device: int, spec: LevelSpec, rng: np.random.Generator) -> ChaseConfig:
    if spec.kernel == "chase_shared" and spec.footprint_bytes > SHARED_MAX_BYTES:
        raise ValueError(f"shared-memory footprint {spec.footprint_bytes} B exceeds {SHARED_MAX_BYTES} B")
    word = 4 if spec.kernel == "chase_shared" else 8
    if spec.stride_bytes % word or spec.stride_bytes < word:
        raise ValueError(f"stride {spec.stride_bytes} B is not a multiple of the {word}-byte pointer")
    if spec.slots < 2:
        raise ValueError(
            f"footprint {spec.footprint_bytes} B holds fewer than two {spec.stride_bytes}-B slots"
        )
    return ChaseConfig(
        device=device,
        level=spec.level,
        kernel=spec.kernel,
        footprint_bytes=spec.slots * spec.stride_bytes,
        stride_bytes=spec.stride_bytes,
        hops=spec.hops,
        trials=spec.trials,
        warm_hops=spec.warm_passes * spec.slots,
        next_slot=single_cycle(spec.slots, rng),
    )


def run_level(backend: GpuBackend, device: int, spec: LevelSpec, rng: np.random.Generator) -> ChaseResult:
    raw = backend.chase(chase_config(device, spec, rng))
    cfg = raw.config
    per_hop_cycles = np.asarray(raw.cycles, dtype=np.float64) / cfg.hops
    per_hop_ns = np.asarray(raw.ns, dtype=np.float64) / cfg.hops
    return ChaseResult(
        level=cfg.level,
        kernel=cfg.kernel,
        device=cfg.device,
        footprint_bytes=cfg.footprint_bytes,
        stride_bytes=cfg.stride_bytes,
        hops=cfg.hops,
        trials=cfg.trials,
        sm=raw.sm,
        cycles_per_hop=Distribution.of(per_hop_cycles),
        ns_per_hop=Distribution.of(per_hop_ns),
        host_start_ns=raw.host_start_ns,
        host_end_ns=raw.host_end_ns,
        samples_cycles_per_hop=per_hop_cycles,
    )


@dataclass(frozen=True)
class Comparison:
    level: str
    measured_cycles: float
    published: Published | None
    verdict: str  # "within", "near", "LARGE DIFFERENCE", "no published value"
    relative: float | None  # distance outside the range, as a fraction of the nearer bound (0 inside)

    def line(self) -> str:
        if self.published is None:
            return f"{self.level:>6}: {self.measured_cycles:8.1f} cycles/hop  (no published value)"
        p = self.published
        ratio = self.measured_cycles / p.nominal_cycles
        return (
            f"{self.level:>6}: {self.measured_cycles:8.1f} cycles/hop  "
            f"published {p.low_cycles:g}-{p.high_cycles:g}"
            f" (nominal {p.nominal_cycles:g}, x{ratio:.2f})  {self.verdict}"
        )


def compare(level: str, measured_cycles: float) -> Comparison:
    p = PUBLISHED.get(level)
    if p is None:
        return Comparison(level, measured_cycles, None, "no published value", None)
    if p.low_cycles <= measured_cycles <= p.high_cycles:
        return Comparison(level, measured_cycles, p, "within", 0.0)
    if measured_cycles < p.low_cycles:
        rel = (p.low_cycles - measured_cycles) / p.low_cycles
    else:
        rel = (measured_cycles - p.high_cycles) / p.high_cycles
    verdict = "LARGE DIFFERENCE" if rel > LARGE_DIFFERENCE else "near"
    return Comparison(level, measured_cycles, p, verdict, rel)
