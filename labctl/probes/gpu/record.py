"""GPU results into the run: `gpu.*` events (summaries in meta) and the gpu table (CSV + parquet).

Files in the run directory: gpu.csv / gpu.parquet (one row per benchmark × metric: n, min, median, p99,
max, mean) and gpu_samples.parquet (every round trip and every chase trial, for re-plotting).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pandas as pd

from labctl.core.events import Kind

from .pingpong import VARIANTS, PingPongResult
from .pointer_chase import ChaseResult, compare
from .stats import Distribution
from .suite import SuiteReport
from .timer import TimerResult

GPU_CSV = "gpu.csv"
GPU_PARQUET = "gpu.parquet"
GPU_SAMPLES = "gpu_samples.parquet"
TABLE_COLUMNS = [
    "stage",
    "benchmark",
    "scope",
    "variant",
    "level",
    "device",
    "peer_device",
    "sm_a",
    "sm_b",
    "metric",
    "unit",
    "n",
    "min",
    "median",
    "p99",
    "max",
    "mean",
]

# emit(t_ns, kind, source, value, host=..., meta=...), i.e. EventLog.emit
Emit = Callable[..., Any]


def _source(host: str, device: int, peer: int | None = None) -> str:
    return f"gpu:{host}/{device}" if peer is None else f"gpu:{host}/{device}-{peer}"


def emit_timer(emit: Emit, t: TimerResult, *, host: str, stage: str | None) -> None:
    emit(
        t.host_end_ns,
        Kind.GPU_TIMER,
        _source(host, t.device),
        t.granularity_ns,
        host=host,
        meta={
            "stage": stage,
            "device": t.device,
            "sm": t.sm,
            "granularity_ns": t.granularity_ns,
            "step_ns": t.step_ns.as_dict(),
            "sm_clock_ghz": t.sm_clock_ghz,
            "read_cycles": t.read_cycles.as_dict(),
            "started_ns": t.host_start_ns,
        },
    )


def emit_pingpong(emit: Emit, r: PingPongResult, *, host: str, stage: str | None) -> None:
    ops, placement = VARIANTS[r.variant]
    emit(
        r.host_end_ns,
        Kind.GPU_PINGPONG,
        _source(host, r.device, r.peer_device),
        r.round_trip_ns.median,
        host=host,
        meta={
            "stage": stage,
            "scope": r.scope,
            "variant": r.variant,
            "flag_ops": ops,
            "placement": placement,
            "device": r.device,
            "peer_device": r.peer_device,
            "sm_ping": r.sm_ping,
            "sm_pong": r.sm_pong,
            "same_sm": r.same_sm,
            "iterations": r.iterations,
            "warmup": r.warmup,
            "round_trip_ns": r.round_trip_ns.as_dict(),
            "one_way_ns": r.one_way_ns.as_dict(),
            "round_trip_cycles": r.round_trip_cycles.as_dict(),
            "timer_granularity_ns": r.timer_granularity_ns,
            "quantized": r.quantized,
            "started_ns": r.host_start_ns,
        },
    )


def emit_chase(emit: Emit, c: ChaseResult, *, host: str, stage: str | None) -> None:
    cmp = compare(c.level, c.cycles_per_hop.median)
    emit(
        c.host_end_ns,
        Kind.GPU_POINTER_CHASE,
        _source(host, c.device),
        c.cycles_per_hop.median,
        host=host,
        meta={
            "stage": stage,
            "level": c.level,
            "kernel": c.kernel,
            "device": c.device,
            "sm": c.sm,
            "footprint_bytes": c.footprint_bytes,
            "stride_bytes": c.stride_bytes,
            "hops": c.hops,
            "trials": c.trials,
            "cycles_per_hop": c.cycles_per_hop.as_dict(),
            "ns_per_hop": c.ns_per_hop.as_dict(),
            "published": None
            if cmp.published is None
            else {
                "low_cycles": cmp.published.low_cycles,
                "high_cycles": cmp.published.high_cycles,
                "nominal_cycles": cmp.published.nominal_cycles,
                "verdict": cmp.verdict,
            },
            "started_ns": c.host_start_ns,
        },
    )


def emit_report(emit: Emit, report: SuiteReport, *, host: str, stage: str | None = None) -> None:
    for t in report.timers:
        emit_timer(emit, t, host=host, stage=stage)
    for r in report.pingpong:
        emit_pingpong(emit, r, host=host, stage=stage)
    for c in report.chase:
        emit_chase(emit, c, host=host, stage=stage)


def _row(base: dict[str, Any], metric: str, unit: str, d: Distribution) -> dict[str, Any]:
    return {**base, "metric": metric, "unit": unit, **d.as_dict()}


def table_rows(report: SuiteReport, stage: str | None = None) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = []
    blank = {"stage": stage or "", "scope": "", "variant": "", "level": "", "peer_device": None}
    for t in report.timers:
        base = {**blank, "benchmark": "timer", "device": t.device, "sm_a": t.sm, "sm_b": None}
        rows.append(_row(base, "globaltimer_step_ns", "ns", t.step_ns))
        rows.append(_row(base, "timer_read_cycles", "cycles", t.read_cycles))
    for r in report.pingpong:
        base = {
            **blank,
            "benchmark": "pingpong",
            "scope": r.scope,
            "variant": r.variant,
            "device": r.device,
            "peer_device": r.peer_device,
            "sm_a": r.sm_ping,
            "sm_b": r.sm_pong,
        }
        rows.append(_row(base, "round_trip_ns", "ns", r.round_trip_ns))
        rows.append(_row(base, "one_way_ns", "ns", r.one_way_ns))
        rows.append(_row(base, "round_trip_cycles", "cycles", r.round_trip_cycles))
    for c in report.chase:
        base = {
            **blank,
            "benchmark": "pointer_chase",
            "level": c.level,
            "device": c.device,
            "sm_a": c.sm,
            "sm_b": None,
        }
        rows.append(_row(base, "cycles_per_hop", "cycles", c.cycles_per_hop))
        rows.append(_row(base, "ns_per_hop", "ns", c.ns_per_hop))
    return rows


def samples_frame(report: SuiteReport, stage: str | None = None) -> pd.DataFrame:
    parts = []
    for r in report.pingpong:
        parts.append(
            pd.DataFrame(
                {
                    "stage": stage or "",
                    "benchmark": "pingpong",
                    "name": f"{r.scope} {r.variant}",
                    "sample": range(len(r.samples_ns)),
                    "round_trip_ns": r.samples_ns.astype("int64"),
                    "round_trip_cycles": r.samples_cycles.astype("int64"),
                    "cycles_per_hop": float("nan"),
                }
            )
        )
    for c in report.chase:
        parts.append(
            pd.DataFrame(
                {
                    "stage": stage or "",
                    "benchmark": "pointer_chase",
                    "name": c.level,
                    "sample": range(len(c.samples_cycles_per_hop)),
                    "round_trip_ns": pd.array([None] * len(c.samples_cycles_per_hop), dtype="Int64"),
                    "round_trip_cycles": pd.array([None] * len(c.samples_cycles_per_hop), dtype="Int64"),
                    "cycles_per_hop": c.samples_cycles_per_hop,
                }
            )
        )
    if not parts:
        return pd.DataFrame(
            columns=[
                "stage",
                "benchmark",
                "name",
                "sample",
                "round_trip_ns",
                "round_trip_cycles",
                "cycles_per_hop",
            ]
        )
    frame = pd.concat(parts, ignore_index=True)
    frame["round_trip_ns"] = frame["round_trip_ns"].astype("Int64")
    frame["round_trip_cycles"] = frame["round_trip_cycles"].astype("Int64")
    return frame


def table_frame(rows: list[dict[str, Any]]) -> pd.DataFrame:
    frame = pd.DataFrame(rows, columns=TABLE_COLUMNS)
    for col in ("device", "peer_device", "sm_a", "sm_b", "n"):
        frame[col] = frame[col].astype("Int64")
    for col in ("min", "median", "p99", "max", "mean"):
        frame[col] = frame[col].astype("float64")
    return frame


def write_tables(run_dir: Path, reports: list[tuple[str | None, SuiteReport]]) -> list[Path]:
    """(Re)write gpu.csv, gpu.parquet and gpu_samples.parquet from every stage's report so far."""
    rows = [row for stage, report in reports for row in table_rows(report, stage)]
    frame = table_frame(rows)
    frame.to_csv(run_dir / GPU_CSV, index=False)
    frame.to_parquet(run_dir / GPU_PARQUET, index=False)
    samples = (
        pd.concat([samples_frame(r, s) for s, r in reports], ignore_index=True)
        if reports
        else samples_frame(SuiteReport([], {}))
    )
    samples.to_parquet(run_dir / GPU_SAMPLES, index=False)
    return [run_dir / GPU_CSV, run_dir / GPU_PARQUET, run_dir / GPU_SAMPLES]


def read_table(run_dir: Path) -> pd.DataFrame:
    return pd.read_parquet(run_dir / GPU_PARQUET)
