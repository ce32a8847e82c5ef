"""The breakdown's statistics: each phase's values over its own unit (UNITS), flagged rows left out, and
per phase n, min/p5/median/p95/max and a cluster-bootstrap confidence interval of the median (`summarize`:
summary.json's numbers; decision 0042)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import pandas as pd

from labctl.analysis.breakdown_table import DURATIONS, FLAG_COLUMNS

STAT_NAMES = ("n", "min", "p5", "median", "p95", "max")

UNITS: dict[str, str] = {
    "switch_ns": "switch command",
    "optical_ns": "port",
    "firmware_ns": "port",
    "carrier_ns": "port",
    "transport_ns": "circuit end",
    "total_ns": "circuit end",
    "carrier_down_ns": "port",
    "traffic_lost_ns": "port",
}
"""What one value of each phase is: a switch command moves all its ports at once, the ports of every rail
it carries (one switching time per command, however many ports or rails: decision 0054); optical,
firmware and carrier are each port's own; transport and total are per end of a new circuit (a port going
dark has none)."""

BOOTSTRAP_RESAMPLES = 2000
CI_LEVEL = 0.95
CLUSTER = "reconfiguration"
"""What the median's bootstrap resamples: the ports of one reconfiguration move together (one command,
one switch, one host's scheduling), so they are one draw, not many (decision 0042)."""
POOLED_CLUSTER = "run × reconfiguration"
"""The same over several runs: reconfiguration n of one run and of another are different draws."""


def cluster_keys(rows: pd.DataFrame) -> list[str]:
    """The columns naming a row's cluster: its reconfiguration, within its run where rows are pooled."""
    return ["run_id", "reconfig"] if "run_id" in rows else ["reconfig"]


def cluster_name(rows: pd.DataFrame) -> str:
    return POOLED_CLUSTER if "run_id" in rows else CLUSTER


def _keep(rows: pd.DataFrame, column: str) -> pd.Series:
    """The rows that give one value of a phase over its own unit, flagged rows left out."""
    name = column.removesuffix("_ns")
    keep = rows[column].notna() & ~_flagged_for(rows, name)
    if UNITS[column] == "switch command":
        # a command is its (t0, t1): rails it carried together share them, separate commands never do
        # (rows without the marks, as a hand-made frame may come: one command per rail, as before 0054)
        marks = ["t0_command_ns", "t1_switch_done_ns"] if "t0_command_ns" in rows else ["rail"]
        command = ["reconfig", *marks]
        keep &= ~rows.duplicated(["run_id", *command] if "run_id" in rows else command)
    elif UNITS[column] == "circuit end":
        keep &= rows["peer"].fillna("") != ""
    return keep


def phase_values(rows: pd.DataFrame, column: str) -> np.ndarray:
    """The values of one phase over its own unit, flagged rows left out (integer ns)."""
    values: np.ndarray = rows.loc[_keep(rows, column), column].to_numpy(dtype=np.int64)
    return values


def phase_clustered(rows: pd.DataFrame, column: str) -> tuple[np.ndarray, np.ndarray]:
    """phase_values and, aligned with them, each value's cluster (0..k-1: its reconfiguration, within its
    run where rows carry `run_id`)."""
    keep = _keep(rows, column)
    kept = rows.loc[keep]
    keys = cluster_keys(rows)
    clusters = kept.groupby(keys, sort=True, dropna=False).ngroup().to_numpy(dtype=np.int64)
    return kept[column].to_numpy(dtype=np.int64), clusters


def _has(rows: pd.DataFrame, flag: str, phase: str) -> pd.Series:
    """Rows whose flag column (a comma-separated list of phase names) names `phase`."""
    if flag not in rows:
        return pd.Series(False, index=rows.index)
    return rows[flag].fillna("").str.split(",").apply(lambda names: phase in names).astype(bool)


def _flagged_for(rows: pd.DataFrame, phase: str) -> pd.Series:
    return _has(rows, "impossible", phase) | _has(rows, "unresolved", phase)


def bootstrap_medians(values: np.ndarray, *, seed: int = 0, clusters: np.ndarray | None = None) -> np.ndarray:
    """BOOTSTRAP_RESAMPLES medians of resamples of `values` (a fixed seed: the same data gives the same
    interval). Without `clusters` each value is drawn on its own, with replacement; with them (one label
    per value), as many whole clusters as there are are drawn with replacement and each resample's median
    is that of every value in the clusters drawn (a cluster drawn twice counts twice)."""
    if clusters is not None:
        return _cluster_bootstrap_medians(values, clusters, seed)
    rng = np.random.default_rng(seed)
    medians = np.empty(BOOTSTRAP_RESAMPLES)
    chunk = max(1, 4_000_000 // max(values.size, 1))  # bound the resample matrix's memory
    for i in range(0, BOOTSTRAP_RESAMPLES, chunk):
        k = min(chunk, BOOTSTRAP_RESAMPLES - i)
        medians[i : i + k] = np.median(rng.choice(values, (k, values.size)), axis=1)
    return medians


def _cluster_bootstrap_medians(values: np.ndarray, clusters: np.ndarray, seed: int) -> np.ndarray:
    """The cluster bootstrap without building the resampled arrays: a resample is a count per cluster, so
    its median is a weighted median of the values sorted once (weight: how often the value's cluster was
    drawn), the same number np.median gives for the values written out."""
    if values.shape != clusters.shape:
        raise ValueError(f"{values.size} values but {clusters.size} cluster labels")
    _, labels = np.unique(clusters, return_inverse=True)
    k = int(labels.max()) + 1 if labels.size else 0
    if k == 0:
        return np.full(BOOTSTRAP_RESAMPLES, np.nan)
    rng = np.random.default_rng(seed)
    # All draws at once (BOOTSTRAP_RESAMPLES × k cluster indices): chunking below cannot change them.
    drawn = rng.integers(0, k, (BOOTSTRAP_RESAMPLES, k))
    offsets = np.arange(BOOTSTRAP_RESAMPLES)[:, None] * k
    counts = np.bincount((drawn + offsets).ravel(), minlength=BOOTSTRAP_RESAMPLES * k)
    counts = counts.reshape(BOOTSTRAP_RESAMPLES, k)
    order = np.argsort(values, kind="stable")
    ranked, ranked_labels = values[order].astype(np.float64), labels[order]
    medians = np.empty(BOOTSTRAP_RESAMPLES)
    chunk = max(1, 4_000_000 // values.size)  # bound the (resamples × values) matrices' memory
    for i in range(0, BOOTSTRAP_RESAMPLES, chunk):
        cum = np.cumsum(counts[i : i + chunk][:, ranked_labels], axis=1)  # resampled values ≤ each
        total = cum[:, -1:]
        # The two middle positions of each resample written out sorted (equal when its size is odd), and
        # the value at each: the first whose cumulative count passes the position.
        lo = (cum <= (total - 1) // 2).sum(axis=1)
        hi = (cum <= total // 2).sum(axis=1)
        medians[i : i + chunk] = (ranked[lo] + ranked[hi]) / 2
    return medians


def percentile_interval(samples: np.ndarray) -> tuple[int, int]:
    tail = (1 - CI_LEVEL) / 2 * 100
    lo, hi = np.percentile(samples, [tail, 100 - tail])
    return round(float(lo)), round(float(hi))


def median_ci(
    values: np.ndarray, *, seed: int = 0, clusters: np.ndarray | None = None
) -> tuple[int, int] | None:
    """A percentile-bootstrap confidence interval (CI_LEVEL) for the median: resampling whole clusters
    where `clusters` labels each value (None for fewer than two clusters: one reconfiguration says nothing
    about how the next would differ), else values independently (None for fewer than two values)."""
    if values.size < 2 or (clusters is not None and np.unique(clusters).size < 2):
        return None
    return percentile_interval(bootstrap_medians(values, seed=seed, clusters=clusters))


MedianCi = Callable[[np.ndarray, "np.ndarray | None"], "tuple[int, int] | None"]
"""How a median's CI is made from (values, clusters): `median_ci` here, or the pooled-runs bootstrap of
labctl.analysis.compare (same draws, cheaper over many runs)."""


def describe(
    values: np.ndarray,
    unit: str,
    *,
    clusters: np.ndarray | None = None,
    cluster: str = CLUSTER,
    ci: MedianCi | None = None,
) -> dict[str, Any]:
    """n, min/p5/median/p95/max and the median's CI of one phase's values (integer ns), and what the CI
    resampled: `cluster` (clusters labelling each value) and how many, else the values themselves."""
    stats: dict[str, Any] = {"unit": unit, "n": int(values.size), "count": int(values.size)}
    resampling = {
        "median_ci_resampling": cluster if clusters is not None else unit,
        "median_ci_clusters": int(np.unique(clusters).size) if clusters is not None else int(values.size),
    }
    if values.size == 0:
        return stats | dict.fromkeys(("min", "p5", "median", "p95", "max", "median_ci")) | resampling
    p5, median, p95 = np.percentile(values, [5, 50, 95], method="linear")
    return (
        stats
        | {
            "min": int(values.min()),
            "p5": round(float(p5)),
            "median": round(float(median)),
            "p95": round(float(p95)),
            "max": int(values.max()),
            "median_ci": (ci(values, clusters) if ci is not None else median_ci(values, clusters=clusters)),
        }
        | resampling
    )


def ci_text(cluster: str = CLUSTER) -> str:
    """summary.json's `ci`: how every phase's median_ci was made."""
    what = "reconfigurations" if cluster == CLUSTER else "reconfigurations of each run"
    return (
        f"{CI_LEVEL:.0%} percentile bootstrap of the median, resampling {what} (clusters), "
        f"{BOOTSTRAP_RESAMPLES} resamples"
    )


def summarize(frame: pd.DataFrame, *, exclude_setup: bool = True) -> dict[str, Any]:
    """Per phase, over its own unit (UNITS): n, min/p5/median/p95/max (integer ns), a bootstrap CI of the
    median resampling reconfigurations (with how many there were), and how many rows were left out as
    impossible or unresolved."""
    rows = frame[frame["reconfig"] > 0] if exclude_setup else frame
    cluster = cluster_name(rows)
    phases: dict[str, dict[str, Any]] = {}
    for col in DURATIONS:
        name = col.removesuffix("_ns")
        values, clusters = phase_clustered(rows, col)
        phases[name] = describe(values, UNITS[col], clusters=clusters, cluster=cluster)
        for flag in FLAG_COLUMNS:
            phases[name][flag] = int(_has(rows, flag, name).sum())
    flagged = pd.Series(False, index=rows.index)
    for flag in FLAG_COLUMNS:
        if flag in rows:
            flagged |= rows[flag].fillna("") != ""
    return {
        "unit": "ns",
        "ci": ci_text(cluster),
        "reconfigurations": int(rows["reconfig"].nunique()),
        "rows": len(rows),
        "timed_out": int(rows["timed_out"].sum()),
        "incomplete": int(rows["t5_traffic_ns"].isna().sum()),
        "flagged_rows": int(flagged.sum()),
        "resolution": _resolution(rows),
        "phases": phases,
        "t2_source": _t2_sources(rows),
    }


def _t2_sources(rows: pd.DataFrame) -> dict[str, int]:
    """How many rows took their t2 from each source (dom, power-meter)."""
    if "t2_source" not in rows:
        return {}
    counts = rows["t2_source"].fillna("").value_counts()
    return {str(name): int(n) for name, n in counts.items() if name}


def _resolution(rows: pd.DataFrame) -> dict[str, Any]:
    """The median and worst bracket of each sampled mark (ns), over the rows that have it."""
    out: dict[str, Any] = {}
    for col in ("t2_resolution_ns", "t3_resolution_ns", "t4_resolution_ns", "t5_resolution_ns"):
        if col not in rows:
            continue
        values = rows[col].dropna().to_numpy(dtype=np.int64)
        if values.size:
            mark = col.removesuffix("_resolution_ns")
            out[mark] = {"n": int(values.size), "median": int(np.median(values)), "max": int(values.max())}
    return out
