"""The real CUDA backend on a real GPU (skipped without one; bench/gpu_device_check.py is the full run)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from labctl.probes.gpu.errors import NoGpuError
from labctl.probes.gpu.runner import CudaBackend, open_backend
from labctl.probes.gpu.suite import SuiteConfig, run_suite


@pytest.fixture
def cuda() -> Iterator[CudaBackend]:
    try:
        backend = open_backend()
    except NoGpuError as e:
        pytest.skip(f"needs a CUDA GPU: {e}")
    try:
        yield backend
    finally:
        backend.close()


def test_real_gpu_runs_every_benchmark_briefly(cuda: CudaBackend, tmp_path: Path) -> None:
    report = run_suite(cuda, SuiteConfig(iterations=200, warmup=20, chase_trials=4, timer_changes=100))
    assert report.timers[0].granularity_ns > 0 and report.timers[0].sm_clock_ghz > 0.1
    for r in report.pingpong:
        assert r.round_trip_ns.n == 200 and r.round_trip_ns.min > 0
        assert r.scope == "inter-gpu" or r.sm_ping != r.sm_pong
    levels = {c.level: c.cycles_per_hop.median for c in report.chase}
    assert levels["shared"] < levels["L2"] < levels["HBM"] and levels["L1"] < levels["L2"]
