"""One stand-alone GPU benchmark run (`labctl bench gpu`, bench/gpu_device_check.py): a run directory
with run.json, events.jsonl, the gpu table and the plot, written like a reconfiguration run's."""

from __future__ import annotations

import socket
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

from labctl.analysis.store import RunDir, new_run_id, versions
from labctl.core.clock import Timebase, now_ns
from labctl.core.errors import LabctlError
from labctl.core.events import EventLog, Kind

from .backend import GpuBackend
from .plot import plot_reports
from .record import emit_report, write_tables
from .suite import SuiteConfig, SuiteReport, run_suite


@dataclass
class BenchOutcome:
    run_dir: Path
    report: SuiteReport
    files: list[Path]


def run_bench(
    backend: GpuBackend,
    config: SuiteConfig,
    out_dir: Path,
    *,
    progress: Callable[[str], None] | None = None,
    plots: bool = True,
) -> BenchOutcome:
    """Run the suite on an opened backend and write runs/<id>-bench-gpu-<x>/. A failure mid-way marks the
    run failed (events so far are kept) and re-raises."""
    host = socket.gethostname()
    timebase = Timebase.capture()
    run = RunDir.create(
        out_dir,
        new_run_id("bench-gpu"),
        {
            "benchmark": "gpu",
            "config": asdict(config),
            "devices": [asdict(d) for d in backend.devices()],
            "backend": backend.describe(),
            "host": host,
            "timebase": {
                "clock": "CLOCK_MONOTONIC",
                "mono0_ns": timebase.mono0_ns,
                "wall0_ns": timebase.wall0_ns,
            },
            "versions": versions(),
            "started_wall_ns": timebase.wall0_ns,
        },
    )
    events = EventLog(run.events_path, timebase)
    events.emit(now_ns(), Kind.RUN_START, "bench", "bench-gpu", meta={"run_id": run.meta["run_id"]})
    status: str = "failed"
    error: str | None = "benchmark did not finish"
    try:
        report = run_suite(backend, config, progress)
        emit_report(events.emit, report, host=host)
        files = write_tables(run.path, [(None, report)])
        if plots:
            files.append(plot_reports(run.path, [(None, report)]))
        status, error = "completed", None
    except (LabctlError, ValueError) as e:
        error = f"{type(e).__name__}: {e}"
        raise
    finally:
        events.emit(now_ns(), Kind.RUN_END, "bench", status, meta={"error": error})
        events.close()
        run.update(
            status=status, error=error, events=events.count, finished_wall_ns=Timebase.capture().wall0_ns
        )
    run.update(notes=report.notes)
    return BenchOutcome(run.path, report, files)
