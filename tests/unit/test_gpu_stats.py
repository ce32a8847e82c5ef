"""Host-side statistics of the GPU benchmarks on synthetic and recorded device output."""

from __future__ import annotations

import numpy as np
import pytest

from labctl.probes.gpu.backend import ChaseConfig, ChaseRaw, PingPongConfig, PingPongRaw, TimerRaw
from labctl.probes.gpu.pingpong import VARIANTS, pingpong_result
from labctl.probes.gpu.pointer_chase import (
    PUBLISHED,
    LevelSpec,
    chase_config,
    compare,
    default_levels,
)
from labctl.probes.gpu.sim import SimulatedGpu
from labctl.probes.gpu.stats import Distribution, cycle_length, deltas, granularity_ns, single_cycle
from labctl.probes.gpu.timer import timer_result


def test_distribution_nearest_rank_p99_is_an_observed_sample() -> None:
    d = Distribution.of(list(range(1, 101)))  # 1..100
    assert (d.n, d.min, d.median, d.p99, d.max, d.mean) == (100, 1, 50.5, 99, 100, 50.5)
    d = Distribution.of([5.0, 1.0, 3.0])
    assert (d.min, d.median, d.p99, d.max) == (1.0, 3.0, 5.0, 5.0)
    assert Distribution.of([7]).p99 == 7
    half = Distribution.of([2, 4, 1000]).scaled(0.5)
    assert (half.min, half.median, half.max) == (1, 2, 500)
    with pytest.raises(ValueError, match="no samples"):
        Distribution.of([])
    with pytest.raises(ValueError, match="finite"):
        Distribution.of([1.0, float("nan")])


def test_deltas_reject_stamps_that_go_backwards() -> None:
    assert deltas(np.array([10, 13, 20], dtype=np.uint64)).tolist() == [3, 7]
    with pytest.raises(ValueError, match="index 2"):
        deltas(np.array([10, 13, 12]))
    with pytest.raises(ValueError, match="two stamps"):
        deltas(np.array([10]))


def _recorded_pingpong(ts: list[int], cycles: list[int], *, peer: int | None = None) -> PingPongRaw:
    cfg = PingPongConfig(
        device=0,
        ops="acqrel",
        placement="rwlr",
        iterations=len(ts) - 1,
        warmup=5,
        peer_device=peer,
        pong_block=1,
    )
    return PingPongRaw(cfg, np.array(ts, np.uint64), np.array(cycles, np.uint64), 4, 10, 9, 9, 100, 200)


def test_round_trips_come_from_consecutive_ping_stamps() -> None:
    # recorded shape: globaltimer stamps at 32 ns steps, clock64 at ~1.98 cycles/ns
    ts = [1_000_000_000, 1_000_000_736, 1_000_001_472, 1_000_002_240, 1_000_006_016]
    cyc = [50_000, 51_457, 52_914, 54_435, 61_912]
    r = pingpong_result(_recorded_pingpong(ts, cyc), timer_granularity_ns=32.0)
    assert r.variant == "rwlr-atomic" and r.scope == "intra-gpu"
    assert r.samples_ns.tolist() == [736, 736, 768, 3776]
    assert r.round_trip_ns.min == 736 and r.round_trip_ns.max == 3776 and r.round_trip_ns.median == 752
    assert r.one_way_ns.median == 376
    assert r.round_trip_cycles.median == (1457 + 1521) / 2
    assert r.round_trip_ns.mean == (ts[-1] - ts[0]) / 4  # the mean is exact despite quantization
    assert (r.sm_ping, r.sm_pong, r.same_sm, r.quantized) == (4, 10, False, False)
    coarse = pingpong_result(_recorded_pingpong(ts, cyc), timer_granularity_ns=1000.0)
    assert coarse.quantized


def test_same_sm_only_counts_within_one_gpu() -> None:
    ts, cyc = [0, 100, 200], [0, 10, 20]
    raw = _recorded_pingpong(ts, cyc)
    same = PingPongRaw(raw.config, raw.ts_ns, raw.ts_cycles, 3, 3, 0, 0, 0, 0)
    assert pingpong_result(same, None).same_sm
    inter = _recorded_pingpong(ts, cyc, peer=1)
    inter = PingPongRaw(inter.config, inter.ts_ns, inter.ts_cycles, 3, 3, 0, 0, 0, 0)
    r = pingpong_result(inter, None)
    assert r.scope == "inter-gpu" and not r.same_sm


def test_pingpong_result_rejects_a_short_stamp_array() -> None:
    raw = _recorded_pingpong([0, 100, 200], [0, 10, 20])
    bad = PingPongRaw(raw.config, raw.ts_ns[:2], raw.ts_cycles, 0, 1, 0, 0, 0, 0)
    with pytest.raises(ValueError, match="expected 3 stamps"):
        pingpong_result(bad, None)


def test_every_variant_maps_to_distinct_flag_ops_and_placement() -> None:
    assert len(set(VARIANTS.values())) == len(VARIANTS) == 4


def test_timer_granularity_drops_the_partial_first_step() -> None:
    raw = TimerRaw(
        device=0,
        step_ns=np.array([7, 32, 32, 32, 64, 32], np.uint64),
        step_cycles=np.array([14, 64, 64, 64, 128, 64], np.uint64),
        reads=np.array([2, 8, 8, 8, 16, 8], np.uint64),
        sm=5,
        host_start_ns=0,
        host_end_ns=1,
    )
    assert granularity_ns(raw.step_ns) == 32
    t = timer_result(raw)
    assert t.granularity_ns == 32 and t.step_ns.n == 5 and t.step_ns.max == 64
    assert t.sm_clock_ghz == pytest.approx(2.0)
    assert t.read_cycles.median == 8


def test_single_cycle_visits_every_slot_once() -> None:
    rng = np.random.default_rng(3)
    for n in (1, 2, 3, 100, 4096):
        nxt = single_cycle(n, rng)
        assert sorted(nxt.tolist()) == list(range(n))
        assert cycle_length(nxt, start=n // 2) == n
    sequential = [*range(1, 1000), 0]
    assert single_cycle(1000, np.random.default_rng(1)).tolist() != sequential
    with pytest.raises(ValueError, match="at least one slot"):
        single_cycle(0, rng)


def test_level_footprints_fit_their_level() -> None:
    dev = SimulatedGpu().devices()[0]
    levels = {lv.level: lv for lv in default_levels(dev)}
    assert set(levels) == {"shared", "L1", "L2", "HBM"}
    assert levels["shared"].kernel == "chase_shared" and levels["shared"].footprint_bytes <= 48 * 1024
    assert levels["L1"].kernel == "chase_global_ca" and levels["L1"].footprint_bytes <= 32 * 1024
    assert levels["L2"].kernel == "chase_global_cg" and levels["L2"].footprint_bytes < dev.l2_bytes / 4
    assert levels["HBM"].kernel == "chase_global_cg" and levels["HBM"].footprint_bytes >= 8 * dev.l2_bytes


def test_chase_config_builds_one_cycle_and_validates() -> None:
    rng = np.random.default_rng(0)
    cfg = chase_config(0, LevelSpec("L1", "chase_global_ca", 16 * 1024, 128, 4096, 8, 2), rng)
    assert len(cfg.next_slot) == 128 and cfg.warm_hops == 256 and cycle_length(cfg.next_slot) == 128
    with pytest.raises(ValueError, match="exceeds"):
        chase_config(0, LevelSpec("shared", "chase_shared", 64 * 1024, 64, 10, 1, 1), rng)
    with pytest.raises(ValueError, match="multiple"):
        chase_config(0, LevelSpec("L2", "chase_global_cg", 4096, 12, 10, 1, 1), rng)
    with pytest.raises(ValueError, match="fewer than two"):
        chase_config(0, LevelSpec("L2", "chase_global_cg", 128, 128, 10, 1, 1), rng)


def test_chase_per_hop_figures_from_recorded_trials() -> None:
    from labctl.probes.gpu.pointer_chase import run_level

    class Recorded:
        """Replays recorded per-trial spans for one level (the GpuBackend.chase shape)."""

        def chase(self, config: ChaseConfig) -> ChaseRaw:
            cycles = np.array([135_168, 135_400, 136_000, 140_000], np.uint64)  # 4096 hops each
            ns = np.array([68_266, 68_380, 68_700, 70_700], np.uint64)
            return ChaseRaw(config, cycles, ns, sm=7, host_start_ns=1, host_end_ns=2)

    spec = LevelSpec("L1", "chase_global_ca", 16 * 1024, 128, 4096, 4, 2)
    r = run_level(Recorded(), 0, spec, np.random.default_rng(0))  # type: ignore[arg-type]
    assert r.cycles_per_hop.min == pytest.approx(33.0)
    assert r.cycles_per_hop.max == pytest.approx(140_000 / 4096)
    assert r.ns_per_hop.min == pytest.approx(68_266 / 4096)
    assert r.sm == 7 and r.trials == 4


def test_compare_against_published_ranges() -> None:
    assert compare("L1", 35.0).verdict == "within"
    assert compare("L1", 45.0).verdict == "near"  # 9.5 % above 41.1
    big = compare("shared", 20.0)
    assert big.verdict == "LARGE DIFFERENCE" and big.relative == pytest.approx((28.6 - 20) / 28.6)
    assert compare("L2", 700.0).verdict == "LARGE DIFFERENCE"
    assert compare("HBM", 600.0).verdict == "no published value"
    assert "published 28.6-30.1" in big.line() and "LARGE DIFFERENCE" in big.line()
    assert PUBLISHED["L1"].high_cycles == 41.1 and PUBLISHED["shared"].nominal_cycles == 29.0
