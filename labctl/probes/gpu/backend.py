"""What a GPU backend does, as a Protocol: run one benchmark kernel and return its raw device output.

`CudaBackend` (runner.py) is the real thing, through cuda.bindings.driver; `SimulatedGpu` (sim.py) is a
behavioural model for CPU-only tests. Everything above this layer (statistics, events, tables, plots)
sees only these raw records, so it is the same code for both.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal, Protocol

import numpy as np

FlagOps = Literal["volatile", "acqrel"]
Placement = Literal["flip", "rwlr"]


@dataclass(frozen=True)
class DeviceInfo:
    index: int
    name: str
    capability: tuple[int, int]
    sm_count: int
    sm_clock_khz: int
    l2_bytes: int
    memory_bytes: int
    pci_bus_id: str = ""

    @property
    def sm_arch(self) -> str:
        return f"sm_{self.capability[0]}{self.capability[1]}"


@dataclass(frozen=True)
class PingPongConfig:
    """One ping-pong run. `peer_device` None: two blocks of `device` (block 0 pings, block `pong_block`
    pongs); else ping on `device`, pong on `peer_device`. Flags: `flip` = one word in the ping device's
    memory that both sides poll and write; `rwlr` = each side polls a word in its own memory and the other
    side writes it remotely (direct-remote-write-local-read)."""

    device: int
    ops: FlagOps
    placement: Placement
    iterations: int
    warmup: int
    peer_device: int | None = None
    pong_block: int = 1
    timeout_ns: int = 5_000_000_000


@dataclass(frozen=True)
class PingPongRaw:
    """ts_ns/ts_cycles: iterations+1 stamps by the ping thread (index 0 before the first timed round trip,
    then one after each); sm_ping/sm_pong from %smid."""

    config: PingPongConfig
    ts_ns: np.ndarray
    ts_cycles: np.ndarray
    sm_ping: int
    sm_pong: int
    polls_ping: int
    polls_pong: int
    host_start_ns: int
    host_end_ns: int


@dataclass(frozen=True)
class TimerRaw:
    """Successive changes of %globaltimer seen by one thread (the first one starts mid-interval)."""

    device: int
    step_ns: np.ndarray
    step_cycles: np.ndarray
    reads: np.ndarray
    sm: int
    host_start_ns: int
    host_end_ns: int


ChaseKernel = Literal["chase_shared", "chase_global_ca", "chase_global_cg"]


@dataclass(frozen=True)
class ChaseConfig:
    """Pointer chase over `footprint_bytes` with one pointer every `stride_bytes`, visited in the order
    `next_slot` (one cycle through every slot)."""

    device: int
    level: str
    kernel: ChaseKernel
    footprint_bytes: int
    stride_bytes: int
    hops: int
    trials: int
    warm_hops: int
    next_slot: np.ndarray = field(repr=False)


@dataclass(frozen=True)
class ChaseRaw:
    config: ChaseConfig
    cycles: np.ndarray  # per trial, for config.hops hops
    ns: np.ndarray
    sm: int
    host_start_ns: int
    host_end_ns: int


class GpuBackend(Protocol):
    """Runs benchmark kernels on CUDA devices; every method blocks until the kernel finished."""

    def devices(self) -> list[DeviceInfo]: ...

    def can_access_peer(self, device: int, peer: int) -> bool: ...

    def describe(self) -> dict[str, str]:
        """Driver/compiler versions and the compile target, for run.json."""
        ...

    def timer(self, device: int, changes: int) -> TimerRaw: ...

    def pingpong(self, config: PingPongConfig) -> PingPongRaw: ...

    def chase(self, config: ChaseConfig) -> ChaseRaw: ...

    def close(self) -> None: ...
