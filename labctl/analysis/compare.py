"""Across runs: one breakdown from several runs (same experiment, other seeds or days), and two sets of runs
compared phase by phase, each median with its bootstrap interval and the difference with its own.

Values are pooled over each phase's unit (labctl.analysis.breakdown.UNITS) across the runs; rows flagged
impossible
or unresolved stay out, as in a single run's summary. Intervals resample whole reconfigurations, each run's
its own (the ports of one reconfiguration move together: decision 0042). Each run's own median is kept too,
so run-to-run spread is visible beside the pooled interval (a slow day moves every reconfiguration of a run,
which even the cluster bootstrap does not see).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from labctl.analysis.breakdown import (
    DURATIONS,
    POOLED_CLUSTER,
    UNITS,
    bootstrap_medians,
    ci_text,
    describe,
    percentile_interval,
    phase_clustered,
    phase_values,
    summarize,
)
from labctl.analysis.store import load_run
from labctl.core.errors import InputError


def load_runs(paths: Sequence[Path | str]) -> tuple[pd.DataFrame, list[dict[str, Any]]]:
    """The measured rows of every run (a `run_id` column added) and each run's identity."""
    frames, runs = [], []
    seen: set[Path] = set()
    for path in paths:
        run = load_run(path)
        if run.path in seen:
            raise InputError(f"{path}: the run {run.path.name} is given twice")
        seen.add(run.path)
        run_id = str(run.meta.get("run_id") or run.path.name)
        frame = run.breakdown.copy()
        frame.insert(0, "run_id", run_id)
        frames.append(frame[frame["reconfig"] > 0])
        runs.append(
            {
                "run_id": run_id,
                "path": str(run.path),
                "status": run.status,
                "experiment": (run.meta.get("experiment") or {}).get("name"),
                "seed": run.meta.get("seed"),
                "profile": (run.meta.get("profile") or {}).get("name"),
            }
        )
    if not frames:
        raise InputError("no run given")
    return pd.concat(frames, ignore_index=True), runs


def aggregate(paths: Sequence[Path | str]) -> dict[str, Any]:
    """One summary over several runs: pooled per phase (n, spread, median and its CI) and each run's
    median."""
    rows, runs = load_runs(paths)
    names = {r["experiment"] for r in runs if r["experiment"]}
    summary = summarize(rows, exclude_setup=False)
    for col in DURATIONS:
        name = col.removesuffix("_ns")
        per_run = []
        for run in runs:
            values = phase_values(rows[rows["run_id"] == run["run_id"]], col)
            per_run.append(int(np.median(values)) if values.size else None)
        summary["phases"][name]["run_medians"] = per_run
    summary["runs"] = runs
    summary["experiments"] = sorted(names)
    return summary


def compare(a_paths: Sequence[Path | str], b_paths: Sequence[Path | str]) -> dict[str, Any]:
    """Set B against set A, per phase: each set's pooled statistics and the difference of medians (B - A)
    with a bootstrap interval (each set resampled on its own, by whole reconfigurations of its runs; no
    interval where a set has fewer than two)."""
    a_rows, a_runs = load_runs(a_paths)
    b_rows, b_runs = load_runs(b_paths)
    overlap = {r["path"] for r in a_runs} & {r["path"] for r in b_runs}
    if overlap:
        raise InputError(f"run(s) in both sets: {', '.join(sorted(overlap))}")
    phases: dict[str, Any] = {}
    for col in DURATIONS:
        (a, a_clusters), (b, b_clusters) = phase_clustered(a_rows, col), phase_clustered(b_rows, col)
        entry: dict[str, Any] = {
            "unit": UNITS[col],
            "a": describe(a, UNITS[col], clusters=a_clusters, cluster=POOLED_CLUSTER),
            "b": describe(b, UNITS[col], clusters=b_clusters, cluster=POOLED_CLUSTER),
        }
        if a.size >= 2 and b.size >= 2:
            entry["difference"] = round(float(np.median(b) - np.median(a)))
            entry["difference_ci"] = None  # one reconfiguration on a side: how it varies is unknown
            if entry["a"]["median_ci_clusters"] >= 2 and entry["b"]["median_ci_clusters"] >= 2:
                diffs = bootstrap_medians(b, seed=1, clusters=b_clusters) - bootstrap_medians(
                    a, seed=0, clusters=a_clusters
                )
                entry["difference_ci"] = percentile_interval(diffs)
            entry["ratio"] = round(float(np.median(b) / np.median(a)), 4) if np.median(a) else None
        phases[col.removesuffix("_ns")] = entry
    return {
        "unit": "ns",
        "ci": ci_text(POOLED_CLUSTER) + "; the difference's: each set resampled on its own",
        "a": {"runs": a_runs},
        "b": {"runs": b_runs},
        "phases": phases,
    }


def split_sets(args: Sequence[str], separator: str = "vs") -> tuple[list[str], list[str]]:
    """`A1 A2 vs B1 B2` → ([A1, A2], [B1, B2]); one line naming what is missing otherwise."""
    if args.count(separator) != 1:
        raise InputError(f"give two sets of runs separated by one '{separator}': RUN... {separator} RUN...")
    i = list(args).index(separator)
    a, b = list(args[:i]), list(args[i + 1 :])
    if not a or not b:
        raise InputError(f"both sides of '{separator}' need at least one run")
    return a, b
