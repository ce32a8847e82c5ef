"""Runs every GPU microbenchmark once: timer granularity, ping-pong (within a GPU and, with a peer-capable
second GPU, between two), pointer chasing at each memory level. Blocking: callers on an event loop run it
in a thread."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from .backend import DeviceInfo, GpuBackend
from .errors import NoGpuError
from .pingpong import VARIANTS, PingPongResult, pick_peer, run_inter, run_intra
from .pointer_chase import ChaseResult, default_levels, run_level
from .timer import TimerResult, measure_timer


@dataclass(frozen=True)
class SuiteConfig:
    device: int = 0
    peer_device: int | None = None  # None: the first other GPU with peer access both ways
    inter_gpu: bool = True
    iterations: int = 10_000
    warmup: int = 2_000
    variants: tuple[str, ...] = tuple(VARIANTS)
    pointer_chase: bool = True
    chase_trials: int = 32
    timer_changes: int = 2_000
    seed: int = 0

    def __post_init__(self) -> None:
        unknown = [v for v in self.variants if v not in VARIANTS]
        if unknown:
            raise ValueError(f"unknown ping-pong variant(s) {unknown} (known: {', '.join(VARIANTS)})")
        if self.iterations < 1 or self.warmup < 0:
            raise ValueError("iterations must be >= 1 and warmup >= 0")


@dataclass
class SuiteReport:
    devices: list[DeviceInfo]
    backend: dict[str, str]
    timers: list[TimerResult] = field(default_factory=list)
    pingpong: list[PingPongResult] = field(default_factory=list)
    chase: list[ChaseResult] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)


def run_suite(
    backend: GpuBackend, config: SuiteConfig, progress: Callable[[str], None] | None = None
) -> SuiteReport:
    say = progress or (lambda _text: None)
    devices = backend.devices()
    if not 0 <= config.device < len(devices):
        raise NoGpuError(f"device {config.device} does not exist (this machine has {len(devices)} GPU(s))")
    report = SuiteReport(devices=devices, backend=backend.describe())
    say(f"GPU{config.device}: %globaltimer granularity")
    timer = measure_timer(backend, config.device, config.timer_changes)
    report.timers.append(timer)
    for variant in config.variants:
        say(f"GPU{config.device}: ping-pong between two SMs, {variant}")
        result = run_intra(
            backend,
            config.device,
            variant,
            iterations=config.iterations,
            warmup=config.warmup,
            timer_granularity_ns=timer.granularity_ns,
        )
        if result.same_sm:
            report.notes.append(
                f"{result.label}: both blocks ran on SM {result.sm_ping} after every placement"
            )
        report.pingpong.append(result)
    if config.inter_gpu:
        peer, why = pick_peer(backend, config.device, config.peer_device)
        if peer is None:
            report.notes.append(why or "inter-GPU ping-pong skipped")
        else:
            for variant in config.variants:
                say(f"GPU{config.device}<->GPU{peer}: ping-pong, {variant}")
                report.pingpong.append(
                    run_inter(
                        backend,
                        config.device,
                        peer,
                        variant,
                        iterations=config.iterations,
                        warmup=config.warmup,
                        timer_granularity_ns=timer.granularity_ns,
                    )
                )
    if config.pointer_chase:
        rng = np.random.default_rng(config.seed)
        for spec in default_levels(devices[config.device], config.chase_trials):
            say(f"GPU{config.device}: pointer chase, {spec.level} ({spec.footprint_bytes // 1024} KiB)")
            report.chase.append(run_level(backend, config.device, spec, rng))
    return report
