"""The whole GPU benchmark pipeline (suite → events → tables → plot → run directory) on the behavioural
GPU model, and the one prepared device-check script's printing path."""

from __future__ import annotations

import importlib.util
import json
import re
from pathlib import Path
from types import ModuleType

import pandas as pd
import pytest

import labctl
from labctl.core.clock import Timebase
from labctl.core.events import KINDS, EventLog, read_events
from labctl.probes.gpu.bench import run_bench
from labctl.probes.gpu.errors import GpuBenchError, NoGpuError
from labctl.probes.gpu.pingpong import pick_peer
from labctl.probes.gpu.record import GPU_CSV, GPU_PARQUET, GPU_SAMPLES, emit_report, write_tables
from labctl.probes.gpu.sim import SimModel, SimulatedGpu
from labctl.probes.gpu.suite import SuiteConfig, run_suite

QUICK = SuiteConfig(iterations=500, warmup=10, chase_trials=8, timer_changes=200)


def test_suite_on_one_gpu_runs_every_benchmark_and_notes_the_missing_peer() -> None:
    gpu = SimulatedGpu(1)
    report = run_suite(gpu, QUICK)
    assert [r.variant for r in report.pingpong] == [
        "flip-volatile",
        "flip-atomic",
        "rwlr-volatile",
        "rwlr-atomic",
    ]
    assert all(r.scope == "intra-gpu" and not r.same_sm for r in report.pingpong)
    assert [c.level for c in report.chase] == ["shared", "L1", "L2", "HBM"]
    assert report.timers[0].granularity_ns == 32
    assert report.notes == ["only one GPU: inter-GPU ping-pong skipped"]
    assert all(r.round_trip_ns.n == 500 for r in report.pingpong)


def test_suite_on_two_gpus_adds_inter_gpu_runs() -> None:
    report = run_suite(SimulatedGpu(2), QUICK)
    inter = [r for r in report.pingpong if r.scope == "inter-gpu"]
    assert len(inter) == 4 and {(r.device, r.peer_device) for r in inter} == {(0, 1)}
    rwlr = next(r for r in inter if r.variant == "rwlr-volatile")
    flip = next(r for r in inter if r.variant == "flip-volatile")
    assert rwlr.round_trip_ns.median < flip.round_trip_ns.median  # local polling beats remote polling
    assert report.notes == []


def test_peer_choice_and_its_reasons() -> None:
    assert pick_peer(SimulatedGpu(2), 0, None) == (1, None)
    peer, why = pick_peer(SimulatedGpu(2, peer_access=False), 0, None)
    assert peer is None and why is not None and "peer access" in why
    assert pick_peer(SimulatedGpu(3), 0, 2) == (2, None)
    assert pick_peer(SimulatedGpu(2), 0, 0)[0] is None
    assert "does not exist" in (pick_peer(SimulatedGpu(2), 0, 5)[1] or "")


def test_pong_block_moves_until_the_sms_differ() -> None:
    gpu = SimulatedGpu(1, model=SimModel(same_sm_blocks=frozenset({1, 2})))
    report = run_suite(
        gpu, SuiteConfig(iterations=50, warmup=1, variants=("flip-atomic",), pointer_chase=False)
    )
    r = report.pingpong[0]
    assert r.pong_block == 3 and r.sm_ping != r.sm_pong and not r.same_sm
    stuck = SimulatedGpu(1, model=SimModel(same_sm_blocks=frozenset(range(1, 9))))
    report = run_suite(
        stuck, SuiteConfig(iterations=50, warmup=1, variants=("flip-atomic",), pointer_chase=False)
    )
    assert report.pingpong[0].same_sm and "both blocks ran on SM 0" in report.notes[0]


def test_bad_device_and_bad_variant() -> None:
    with pytest.raises(NoGpuError, match=r"^no CUDA GPU available: device 3 does not exist"):
        run_suite(SimulatedGpu(1), SuiteConfig(device=3))
    with pytest.raises(ValueError, match="unknown ping-pong variant"):
        SuiteConfig(variants=("flip-sideways",))


def test_events_carry_distributions_and_sm_ids(tmp_path: Path) -> None:
    report = run_suite(SimulatedGpu(2), QUICK)
    log = EventLog(tmp_path / "events.jsonl", Timebase.capture())
    emit_report(log.emit, report, host="h1", stage="before")
    log.close()
    events = list(read_events(tmp_path / "events.jsonl"))
    kinds = [e.kind for e in events]
    assert (
        kinds.count("gpu.timer") == 1
        and kinds.count("gpu.pingpong") == 8
        and kinds.count("gpu.pointer_chase") == 4
    )
    assert set(kinds) <= KINDS
    pp = [e for e in events if e.kind == "gpu.pingpong"]
    first = pp[0]
    assert first.source == "gpu:h1/0" and first.host == "h1" and isinstance(first.t_ns, int)
    assert first.meta["stage"] == "before" and first.meta["sm_ping"] != first.meta["sm_pong"]
    assert set(first.meta["round_trip_ns"]) == {"n", "min", "median", "p99", "max", "mean"}
    assert first.value == first.meta["round_trip_ns"]["median"]
    assert first.meta["one_way_ns"]["median"] == first.meta["round_trip_ns"]["median"] / 2
    assert pp[-1].source == "gpu:h1/0-1" and pp[-1].meta["scope"] == "inter-gpu"
    chase = {e.meta["level"]: e for e in events if e.kind == "gpu.pointer_chase"}
    assert chase["L1"].meta["published"]["verdict"] == "within"
    assert chase["HBM"].meta["published"] is None


def test_tables_round_trip_through_csv_and_parquet(tmp_path: Path) -> None:
    before, after = run_suite(SimulatedGpu(1), QUICK), run_suite(SimulatedGpu(1, seed=1), QUICK)
    write_tables(tmp_path, [("before", before), ("after", after)])
    csv = pd.read_csv(tmp_path / GPU_CSV)
    pq = pd.read_parquet(tmp_path / GPU_PARQUET)
    assert len(csv) == len(pq) == 2 * (2 + 4 * 3 + 4 * 2)
    assert list(pq.columns)[:2] == ["stage", "benchmark"] and set(pq["stage"]) == {"before", "after"}
    rt = pq[(pq.metric == "round_trip_ns") & (pq.variant == "flip-volatile") & (pq.stage == "before")].iloc[0]
    r = before.pingpong[0]
    assert (rt["min"], rt["median"], rt["p99"], rt["max"], rt["n"]) == (
        r.round_trip_ns.min,
        r.round_trip_ns.median,
        r.round_trip_ns.p99,
        r.round_trip_ns.max,
        500,
    )
    assert rt["sm_a"] == r.sm_ping and rt["sm_b"] == r.sm_pong and pd.isna(rt["peer_device"])
    assert csv["median"].tolist() == pytest.approx(pq["median"].tolist())
    samples = pd.read_parquet(tmp_path / GPU_SAMPLES)
    pp = samples[samples.benchmark == "pingpong"]
    assert len(pp) == 2 * 4 * 500 and str(pp["round_trip_ns"].dtype) == "Int64"
    assert (
        pp[pp.stage == "before"].groupby("name")["round_trip_ns"].median().loc["intra-gpu flip-volatile"]
        == r.round_trip_ns.median
    )


def test_bench_run_directory_has_events_tables_and_plot(tmp_path: Path) -> None:
    gpu = SimulatedGpu(2)
    outcome = run_bench(gpu, QUICK, tmp_path)
    run_dir = outcome.run_dir
    assert run_dir.parent == tmp_path and "bench-gpu" in run_dir.name
    for name in ("run.json", "events.jsonl", GPU_CSV, GPU_PARQUET, GPU_SAMPLES, "gpu_pingpong.png"):
        assert (run_dir / name).stat().st_size > 0, name
    assert (run_dir / "gpu_pingpong.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    meta = json.loads((run_dir / "run.json").read_text())
    assert meta["status"] == "completed" and meta["config"]["iterations"] == 500
    assert len(meta["devices"]) == 2
    run = labctl.load_run(run_dir)
    assert run.status == "completed"
    kinds = run.events["kind"].astype(str).tolist()
    assert kinds[0] == "run.start" and kinds[-1] == "run.end" and kinds.count("gpu.pingpong") == 8


def test_a_peer_that_never_answers_fails_the_bench_run_and_keeps_it_readable(tmp_path: Path) -> None:
    gpu = SimulatedGpu(1, model=SimModel(unresponsive_peer=True))
    with pytest.raises(GpuBenchError, match="stopped answering"):
        run_bench(gpu, QUICK, tmp_path)
    (run_dir,) = tmp_path.iterdir()
    meta = json.loads((run_dir / "run.json").read_text())
    assert meta["status"] == "failed" and "stopped answering" in meta["error"]
    kinds = [e.kind for e in read_events(run_dir / "events.jsonl")]
    assert kinds == ["run.start", "run.end"]


def _device_check_script() -> ModuleType:
    path = Path(__file__).resolve().parents[2] / "bench" / "gpu_device_check.py"
    spec = importlib.util.spec_from_file_location("gpu_device_check", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_device_check_prints_figures_and_flags_a_large_difference(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    script = _device_check_script()
    model = SimModel(
        cycles_per_hop={"chase_shared": 20.0, "chase_global_ca": 34.0, "chase_global_cg": 280.0, "hbm": 600.0}
    )
    gpu = SimulatedGpu(2, model=model)
    assert script.check(gpu, QUICK, tmp_path) == 0
    assert gpu.closed
    out = capsys.readouterr().out
    assert "update step 32 ns" in out
    assert "intra-gpu flip-volatile" in out and "inter-gpu rwlr-atomic" in out
    assert re.search(r"shared:\s+(19|20)\.\d cycles/hop  published 28\.6-30\.1 .* LARGE DIFFERENCE", out)
    assert re.search(r"L1:\s+3\d\.\d cycles/hop .* within", out)
    assert "large differences: shared" in out
    assert "why it may differ" in out


def test_device_check_reports_a_failed_benchmark(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    script = _device_check_script()
    assert script.check(SimulatedGpu(1, model=SimModel(unresponsive_peer=True)), QUICK, tmp_path) == 3
    assert "benchmark failed: GpuBenchError" in capsys.readouterr().out
