"""Figure 10 on a lab: one replay experiment at each switching delay, on demand and with provisioning.

Each point is an ordinary replay run (its own run directory under the sweep's, its experiment file written
beside it); the sweep writes step_time_vs_delay.csv (one row per delay and mode: the replayed step time,
the stall model from the trace's windows at that delay, the estimate T_native + T × N) and
step_time_vs_delay.png/.svg/.pdf.
"""

from __future__ import annotations

import csv
import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from labctl.analysis.store import new_run_id
from labctl.core.errors import InputError
from labctl.workload.builtin import TRACES
from labctl.workload.experiment import load_replay
from labctl.workload.stall import model_rows

CSV_NAME = "step_time_vs_delay.csv"
PLOT_NAME = "step_time_vs_delay"
COLUMNS = (
    "switching_ms",
    "mode",
    "steps",
    "native_ns",
    "step_ns",
    "stall_ns",
    "model_ns",
    "estimate_ns",
    "switches_per_step",
    "status",
    "run",
)


@dataclass
class SweepOutcome:
    path: Path
    rows: list[dict[str, Any]]
    plots: list[Path]


def _write_csv(path: Path, rows: list[dict[str, Any]]) -> None:
    with open(path, "w", newline="", encoding="utf-8") as f:
        writer = csv.DictWriter(f, fieldnames=list(COLUMNS))
        writer.writeheader()
        writer.writerows(rows)


async def run_sweep(
    experiment: Path,
    inventory: Path,
    *,
    switching_ms: Sequence[float] | None = None,
    profile: str | None = None,
    out_dir: Path = Path("runs"),
    seed: int | None = None,
    plots: bool = True,
    on_point: Callable[[dict[str, Any]], None] | None = None,
) -> SweepOutcome:
    from labctl.run.lifecycle import run_experiment

    spec, src, trace = load_replay(experiment)
    delays = list(switching_ms) if switching_ms else (spec.sweep.switching_ms if spec.sweep else None)
    if not delays:
        raise InputError(f"{experiment}: no switching delays: give sweep.switching_ms or --switching-ms")
    if any(not 0 <= d <= 3_600_000 for d in delays):
        raise InputError(f"switching delays must be 0..3600000 ms, got {delays}")
    modes = spec.sweep.modes if spec.sweep else ["on-demand", "provisioning"]
    base = {k: v for k, v in src.data.items() if k != "sweep"}
    if spec.trace not in TRACES:  # a trace file: the point files live elsewhere
        path = Path(spec.trace)
        base["trace"] = str(path if path.is_absolute() else (experiment.parent / path).resolve())
    sweep_dir = out_dir / new_run_id(f"{spec.name}-sweep")
    (sweep_dir / "points").mkdir(parents=True)
    model = {r.switch_ns: r for r in model_rows(trace, [round(d * 1e6) for d in delays])}
    rows: list[dict[str, Any]] = []
    for mode in modes:
        for delay in delays:
            name = f"{spec.name}-{mode}-{delay:g}ms"
            point = {**base, "name": name, "mode": mode, "switching_ms": delay}
            point_path = sweep_dir / "points" / f"{name}.yaml"
            point_path.write_text(json.dumps(point, indent=1) + "\n", encoding="utf-8")
            outcome = await run_experiment(
                point_path, inventory, profile=profile, out_dir=sweep_dir / "runs", seed=seed, plots=False
            )
            replay = outcome.summary.get("replay") or {}
            m = model[round(delay * 1e6)]
            row = {
                "switching_ms": delay,
                "mode": mode,
                "steps": replay.get("steps", 0),
                "native_ns": replay.get("native_ns", m.native_ns),
                "step_ns": replay.get("step_ns", ""),
                "stall_ns": replay.get("stall_ns", ""),
                "model_ns": m.provisioning_ns if mode == "provisioning" else m.on_demand_ns,
                "estimate_ns": m.estimate_ns,
                "switches_per_step": replay.get("switches_per_step", m.switches_per_step),
                "status": outcome.status,
                "run": str(outcome.run_dir),
            }
            rows.append(row)
            if on_point is not None:
                on_point(row)
    _write_csv(sweep_dir / CSV_NAME, rows)
    paths: list[Path] = []
    done = [r for r in rows if r["status"] == "completed" and r["step_ns"] != ""]
    if plots and done:
        from labctl.analysis.sweep_plot import plot_step_time_vs_delay

        paths = plot_step_time_vs_delay(
            done, sweep_dir / PLOT_NAME, title=f"{trace.name}: step time vs switching delay"
        )
    return SweepOutcome(sweep_dir, rows, paths)
