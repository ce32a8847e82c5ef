"""Flag ping-pong between two SMs of one GPU or between two GPUs: round-trip distributions.

One sample = the interval between two consecutive "reply seen" stamps of the ping thread, i.e. one full
round trip (like perftest's latency tests); one-way = round trip / 2. Stamps come from %globaltimer (ns,
quantized to its update step, which is measured and reported beside) and %clock64 (cycles of the ping SM,
never compared across SMs).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

import numpy as np

from .backend import FlagOps, GpuBackend, PingPongConfig, PingPongRaw, Placement
from .stats import Distribution, deltas

# name -> (flag operations, flag placement). "flip": one flag word both sides poll and write (Fig. 23
# left, direct = volatile, atomic = acquire/release); "rwlr": direct-remote-write-local-read (Fig. 23 right).
VARIANTS: dict[str, tuple[FlagOps, Placement]] = {
    "flip-volatile": ("volatile", "flip"),
    "flip-atomic": ("acqrel", "flip"),
    "rwlr-volatile": ("volatile", "rwlr"),
    "rwlr-atomic": ("acqrel", "rwlr"),
}

Scope = Literal["intra-gpu", "inter-gpu"]
MAX_PONG_BLOCK = 8  # placements tried before reporting that both blocks shared an SM


@dataclass(frozen=True)
class PingPongResult:
    scope: Scope
    variant: str
    device: int
    peer_device: int | None
    sm_ping: int
    sm_pong: int
    pong_block: int
    iterations: int
    warmup: int
    round_trip_ns: Distribution
    one_way_ns: Distribution
    round_trip_cycles: Distribution
    timer_granularity_ns: float | None
    host_start_ns: int
    host_end_ns: int
    samples_ns: np.ndarray = field(repr=False)
    samples_cycles: np.ndarray = field(repr=False)

    @property
    def same_sm(self) -> bool:
        """Both blocks ran on one SM (only meaningful within one GPU: SM ids of two GPUs are unrelated)."""
        return self.scope == "intra-gpu" and self.sm_ping == self.sm_pong

    @property
    def quantized(self) -> bool:
        """Per-sample ns values are coarse: the timer step is more than a tenth of the median round trip
        (the mean, over consecutive stamps, is still exact)."""
        g = self.timer_granularity_ns
        return g is not None and g * 10 > self.round_trip_ns.median

    @property
    def label(self) -> str:
        where = (
            f"GPU{self.device}" if self.peer_device is None else f"GPU{self.device}<->GPU{self.peer_device}"
        )
        return f"{self.scope} {self.variant} ({where})"


def pingpong_result(raw: PingPongRaw, timer_granularity_ns: float | None) -> PingPongResult:
    cfg = raw.config
    if len(raw.ts_ns) != cfg.iterations + 1 or len(raw.ts_cycles) != cfg.iterations + 1:
        raise ValueError(f"expected {cfg.iterations + 1} stamps, got {len(raw.ts_ns)}/{len(raw.ts_cycles)}")
    rt_ns = deltas(raw.ts_ns)
    rt_cycles = deltas(raw.ts_cycles)
    variant = next(name for name, v in VARIANTS.items() if v == (cfg.ops, cfg.placement))
    rt = Distribution.of(rt_ns)
    return PingPongResult(
        scope="intra-gpu" if cfg.peer_device is None else "inter-gpu",
        variant=variant,
        device=cfg.device,
        peer_device=cfg.peer_device,
        sm_ping=raw.sm_ping,
        sm_pong=raw.sm_pong,
        pong_block=cfg.pong_block,
        iterations=cfg.iterations,
        warmup=cfg.warmup,
        round_trip_ns=rt,
        one_way_ns=rt.scaled(0.5),
        round_trip_cycles=Distribution.of(rt_cycles),
        timer_granularity_ns=timer_granularity_ns,
        host_start_ns=raw.host_start_ns,
        host_end_ns=raw.host_end_ns,
        samples_ns=rt_ns,
        samples_cycles=rt_cycles,
    )


def run_intra(
    backend: GpuBackend,
    device: int,
    variant: str,
    *,
    iterations: int,
    warmup: int,
    timer_granularity_ns: float | None = None,
) -> PingPongResult:
    """Two blocks of one GPU. Block 0 pings; the pong block is moved on (1, 2, ...) until %smid shows the
    two on different SMs; if none is, the last run is returned and reports same_sm."""
    ops, placement = VARIANTS[variant]
    result: PingPongResult | None = None
    for pong_block in range(1, MAX_PONG_BLOCK + 1):
        cfg = PingPongConfig(
            device=device,
            ops=ops,
            placement=placement,
            iterations=iterations,
            warmup=warmup,
            pong_block=pong_block,
        )
        result = pingpong_result(backend.pingpong(cfg), timer_granularity_ns)
        if not result.same_sm:
            break
    assert result is not None
    return result


def run_inter(
    backend: GpuBackend,
    device: int,
    peer: int,
    variant: str,
    *,
    iterations: int,
    warmup: int,
    timer_granularity_ns: float | None = None,
) -> PingPongResult:
    ops, placement = VARIANTS[variant]
    cfg = PingPongConfig(
        device=device, ops=ops, placement=placement, iterations=iterations, warmup=warmup, peer_device=peer
    )
    return pingpong_result(backend.pingpong(cfg), timer_granularity_ns)


def pick_peer(backend: GpuBackend, device: int, requested: int | None) -> tuple[int | None, str | None]:
    """The second GPU for the inter-GPU runs and, when there is none, why (a note for the report)."""
    devices = backend.devices()
    if requested is not None:
        if requested == device:
            return None, f"peer device {requested} is the device itself: inter-GPU ping-pong skipped"
        if requested >= len(devices):
            return None, f"peer device {requested} does not exist ({len(devices)} GPUs): inter-GPU skipped"
        if not backend.can_access_peer(device, requested) or not backend.can_access_peer(requested, device):
            return None, f"GPU {device} and GPU {requested} have no peer access: inter-GPU ping-pong skipped"
        return requested, None
    others = [d.index for d in devices if d.index != device]
    if not others:
        return None, "only one GPU: inter-GPU ping-pong skipped"
    for peer in others:
        if backend.can_access_peer(device, peer) and backend.can_access_peer(peer, device):
            return peer, None
    return None, f"no GPU has peer access with GPU {device}: inter-GPU ping-pong skipped"
