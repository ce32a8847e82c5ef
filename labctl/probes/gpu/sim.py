"""A behavioural model of CUDA GPUs behind the GpuBackend Protocol, for CPU-only tests and dry runs.

It produces raw device output the way the kernels do (ping-side stamps quantized to the globaltimer step,
cycle counts at the SM clock, SM placement of blocks, per-trial pointer-chase spans), so the host-side
code under test is exactly what runs on a GPU. Its latencies are model parameters chosen to be of the
published order of magnitude; they are not measurements and never reach a real run.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import numpy as np

from .backend import ChaseConfig, ChaseRaw, DeviceInfo, PingPongConfig, PingPongRaw, TimerRaw
from .errors import GpuBenchError, NoGpuError


@dataclass
class SimModel:
    """Model parameters (ns unless named otherwise)."""

    timer_step_ns: int = 32
    clock_ghz: float = 1.98
    read_cycles: int = 6
    # round-trip latency by (scope, ops, placement)
    round_trip_ns: dict[tuple[str, str, str], float] = field(
        default_factory=lambda: {
            ("intra", "volatile", "flip"): 700.0,
            ("intra", "acqrel", "flip"): 820.0,
            ("intra", "volatile", "rwlr"): 690.0,
            ("intra", "acqrel", "rwlr"): 800.0,
            ("inter", "volatile", "flip"): 2900.0,
            ("inter", "acqrel", "flip"): 3100.0,
            ("inter", "volatile", "rwlr"): 1600.0,
            ("inter", "acqrel", "rwlr"): 1700.0,
        }
    )
    jitter_fraction: float = 0.04
    spike_probability: float = 0.002
    spike_ns: float = 3000.0
    cycles_per_hop: dict[str, float] = field(
        default_factory=lambda: {
            "chase_shared": 29.0,
            "chase_global_ca": 33.0,
            "chase_global_cg": 270.0,
            "hbm": 640.0,
        }
    )
    # blocks whose pong lands on the same SM as block 0 (to exercise the placement check)
    same_sm_blocks: frozenset[int] = frozenset()
    unresponsive_peer: bool = False


class SimulatedGpu:
    """GpuBackend over SimModel. `devices` simulated H100-like GPUs; `peer_access` between all of them."""

    def __init__(
        self, devices: int = 1, *, peer_access: bool = True, seed: int = 0, model: SimModel | None = None
    ) -> None:
        if devices < 1:
            raise NoGpuError("the simulated machine has no devices")
        self.model = model or SimModel()
        self.peer_access = peer_access
        self._rng = np.random.default_rng(seed)
        self._devices = [
            DeviceInfo(
                index=i,
                name="Simulated H100-class GPU",
                capability=(9, 0),
                sm_count=132,
                sm_clock_khz=int(self.model.clock_ghz * 1e6),
                l2_bytes=50 * 2**20,
                memory_bytes=80 * 2**30,
                pci_bus_id=f"0000:{0x18 + i:02x}:00.0",
            )
            for i in range(devices)
        ]
        self.closed = False
        self.launches: list[str] = []

    def devices(self) -> list[DeviceInfo]:
        return list(self._devices)

    def _check(self, device: int) -> None:
        if not 0 <= device < len(self._devices):
            raise NoGpuError(f"device {device} does not exist (this machine has {len(self._devices)})")

    def can_access_peer(self, device: int, peer: int) -> bool:
        self._check(device)
        self._check(peer)
        return self.peer_access and device != peer

    def describe(self) -> dict[str, str]:
        return {"backend": "simulated (behavioural model, not a measurement)"}

    def timer(self, device: int, changes: int) -> TimerRaw:
        self._check(device)
        self.launches.append("timer_steps")
        m = self.model
        t0 = time.monotonic_ns()
        steps = np.full(changes, m.timer_step_ns, dtype=np.uint64)
        steps[0] = int(self._rng.integers(1, m.timer_step_ns + 1))
        cycles = np.round(steps.astype(np.float64) * m.clock_ghz).astype(np.uint64)
        reads = np.maximum(cycles // m.read_cycles, 1).astype(np.uint64)
        return TimerRaw(device, steps, cycles, reads, sm=0, host_start_ns=t0, host_end_ns=time.monotonic_ns())

    def _sm_of_block(self, device: int, block: int) -> int:
        if block in self.model.same_sm_blocks:
            return 0
        return (2 * block) % self._devices[device].sm_count  # round-robin over TPCs

    def pingpong(self, config: PingPongConfig) -> PingPongRaw:
        self._check(config.device)
        inter = config.peer_device is not None
        if inter:
            assert config.peer_device is not None
            self._check(config.peer_device)
            if not self.can_access_peer(config.device, config.peer_device):
                raise GpuBenchError(f"GPU {config.device} cannot access GPU {config.peer_device}'s memory")
        self.launches.append(f"pingpong_{config.ops}")
        m = self.model
        if m.unresponsive_peer:
            total = config.warmup + config.iterations
            raise GpuBenchError(
                f"pingpong_{config.ops} ({config.placement}): peer stopped answering (ping 0/{total})"
            )
        t0 = time.monotonic_ns()
        base = m.round_trip_ns[("inter" if inter else "intra", config.ops, config.placement)]
        n = config.iterations
        true_rt = base * (1.0 + self._rng.exponential(m.jitter_fraction, n))
        spikes = self._rng.random(n) < m.spike_probability
        true_rt[spikes] += m.spike_ns
        device_t = (
            1_000_000_000.0
            + float(self._rng.uniform(0, m.timer_step_ns))
            + np.concatenate(([0.0], np.cumsum(true_rt)))
        )
        ts_ns = (np.floor(device_t / m.timer_step_ns) * m.timer_step_ns).astype(np.uint64)
        ts_cycles = np.round(device_t * m.clock_ghz).astype(np.uint64)
        sm_ping = self._sm_of_block(config.device, 0)
        sm_pong = 0 if inter else self._sm_of_block(config.device, config.pong_block)
        polls = int(true_rt.sum() / 40.0)
        return PingPongRaw(
            config=config,
            ts_ns=ts_ns,
            ts_cycles=ts_cycles,
            sm_ping=sm_ping,
            sm_pong=sm_pong,
            polls_ping=polls,
            polls_pong=polls,
            host_start_ns=t0,
            host_end_ns=time.monotonic_ns(),
        )

    def chase(self, config: ChaseConfig) -> ChaseRaw:
        self._check(config.device)
        self.launches.append(config.kernel)
        m = self.model
        t0 = time.monotonic_ns()
        beyond_l2 = config.footprint_bytes > self._devices[config.device].l2_bytes
        per_hop = m.cycles_per_hop["hbm" if beyond_l2 and config.kernel != "chase_shared" else config.kernel]
        lat = per_hop * (1.0 + self._rng.normal(0.0, 0.01, config.trials))
        cycles = np.round(lat * config.hops).astype(np.uint64)
        ns = np.round(cycles / m.clock_ghz).astype(np.uint64)
        return ChaseRaw(config, cycles, ns, sm=0, host_start_ns=t0, host_end_ns=time.monotonic_ns())

    def close(self) -> None:
        self.closed = True
