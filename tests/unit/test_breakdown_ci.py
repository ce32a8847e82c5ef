"""The median's interval resamples reconfigurations, not port rows (decision 0042): the ports of one
reconfiguration move together, so a row bootstrap counts one draw many times and comes out too narrow."""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd

from labctl.analysis.breakdown_table import COLUMNS, DURATIONS
from labctl.analysis.phase_stats import (
    BOOTSTRAP_RESAMPLES,
    bootstrap_medians,
    median_ci,
    percentile_interval,
    summarize,
)
from labctl.cli.tables import ci_caption

MS = 1_000_000


def _frame(per_reconfig: list[int], ports: int = 64, run_id: str | None = None) -> pd.DataFrame:
    """A breakdown whose every phase of every port in reconfiguration n (1, 2, ...) is per_reconfig[n-1]:
    ports perfectly correlated within a reconfiguration; one rail command per reconfiguration."""
    rows: list[dict[str, Any]] = []
    for n, value in enumerate(per_reconfig, start=1):
        for p in range(ports):
            row: dict[str, Any] = dict.fromkeys(COLUMNS)
            row |= {"reconfig": n, "rail": 0, "port": f"eth{p}", "peer": f"peer{p}", "timed_out": False}
            row |= {"impossible": "", "unresolved": "", "t2_source": "dom", "t5_traffic_ns": 1}
            row |= dict.fromkeys(DURATIONS, value)
            rows.append(row)
    frame = pd.DataFrame(rows, columns=COLUMNS)
    if run_id is not None:
        frame.insert(0, "run_id", run_id)
    return frame


def _reconfig_values_bootstrap(values: np.ndarray, seed: int = 0) -> tuple[int, int]:
    """The interval written out by hand: resample the reconfigurations' own values, take each median."""
    rng = np.random.default_rng(seed)
    drawn = rng.integers(0, values.size, (BOOTSTRAP_RESAMPLES, values.size))
    return percentile_interval(np.median(values[drawn], axis=1))


def test_correlated_ports_the_row_interval_is_too_narrow_the_cluster_one_resamples_reconfigurations() -> None:
    per_reconfig = np.array([21, 24, 25, 26, 27, 29, 33, 38]) * MS
    summary = summarize(_frame(list(per_reconfig)))
    optical = summary["phases"]["optical"]
    assert optical["n"] == 8 * 64 and optical["median"] == 26_500_000
    # 8 draws, each repeated 64 times: the cluster interval is exactly a bootstrap of the 8 values.
    expected = _reconfig_values_bootstrap(per_reconfig)
    assert tuple(optical["median_ci"]) == expected
    assert expected[1] - expected[0] >= 4 * MS
    # Treating the 512 rows as independent pretends to 64 times the data: a much narrower interval.
    rows = np.repeat(per_reconfig, 64)
    row_lo, row_hi = median_ci(rows)  # type: ignore[misc]
    assert row_hi - row_lo < (expected[1] - expected[0]) / 2
    # The rail command (one per reconfiguration) gets the same interval: it is the same 8 draws.
    assert tuple(summary["phases"]["switch"]["median_ci"]) == expected


def test_a_row_interval_misses_the_true_median_a_cluster_interval_covers_it() -> None:
    # Many small labs: 8 reconfigurations × 16 ports, a reconfiguration's own delay (sd 10) shared by its
    # ports, each port's jitter (sd 1) its own; the true median is 100.
    rng = np.random.default_rng(7)
    clusters = np.repeat(np.arange(8), 16)
    covered = {"rows": 0, "clusters": 0}
    trials = 100
    for _ in range(trials):
        values = np.round(100 + rng.normal(0, 10, 8)[clusters] + rng.normal(0, 1, clusters.size))
        values = values.astype(np.int64)
        for name, labels in (("rows", None), ("clusters", clusters)):
            lo, hi = median_ci(values, clusters=labels)  # type: ignore[misc]
            covered[name] += lo <= 100 <= hi
    assert covered["rows"] / trials < 0.6
    assert covered["clusters"] / trials > 0.8


def test_the_cluster_median_counts_a_cluster_drawn_twice_twice() -> None:
    # Unequal clusters: each resample's median is that of the drawn clusters' values written out.
    rng = np.random.default_rng(1)
    labels = np.repeat([5, 9, 2, 7], [1, 3, 2, 4])
    values = rng.integers(0, 50, labels.size)
    got = bootstrap_medians(values, clusters=labels, seed=3)
    drawn = np.random.default_rng(3).integers(0, 4, (BOOTSTRAP_RESAMPLES, 4))
    names = np.unique(labels)
    written_out = [np.median(np.concatenate([values[labels == names[c]] for c in row])) for row in drawn]
    assert np.array_equal(got, written_out)
    again = bootstrap_medians(values, clusters=labels, seed=3)
    assert np.array_equal(got, again)  # a fixed seed: the same data gives the same interval


def test_the_summary_says_what_was_resampled_and_how_many() -> None:
    summary = summarize(_frame([20 * MS, 22 * MS, 23 * MS, 30 * MS]))
    assert summary["ci"] == (
        "95% percentile bootstrap of the median, resampling reconfigurations (clusters), 2000 resamples"
    )
    for stats in summary["phases"].values():
        assert stats["median_ci_resampling"] == "reconfiguration"
        assert stats["median_ci_clusters"] == 4
        assert stats["median_ci"] is not None and stats["count"] == stats["n"]  # the old keys stay
    assert ci_caption(summary) == (
        "95% CI: bootstrap resampling 4 reconfigurations (a reconfiguration's ports move together)"
    )


def test_one_reconfiguration_gives_no_interval() -> None:
    summary = summarize(_frame([20 * MS], ports=64))
    optical = summary["phases"]["optical"]
    assert optical["n"] == 64 and optical["median"] == 20 * MS
    assert optical["median_ci"] is None and optical["median_ci_clusters"] == 1
    assert median_ci(np.arange(64), clusters=np.zeros(64, dtype=np.int64)) is None
    assert "none" in (ci_caption(summary) or "")


def test_pooled_runs_cluster_on_run_and_reconfiguration() -> None:
    # Two runs with the same reconfiguration numbers: 2 × 3 clusters, not 3.
    rows = pd.concat(
        [_frame([20 * MS, 21 * MS, 22 * MS], run_id="a"), _frame([30 * MS, 31 * MS, 32 * MS], run_id="b")],
        ignore_index=True,
    )
    summary = summarize(rows, exclude_setup=False)
    optical = summary["phases"]["optical"]
    assert optical["median_ci_clusters"] == 6 and optical["median_ci_resampling"] == "run × reconfiguration"
    assert "reconfigurations of each run" in summary["ci"]
    per_cluster = np.array([20, 21, 22, 30, 31, 32]) * MS
    assert tuple(optical["median_ci"]) == _reconfig_values_bootstrap(per_cluster)
