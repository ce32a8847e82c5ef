"""Across runs: one breakdown from several runs (same experiment, other seeds or days), and two sets of runs
compared phase by phase, each median with its bootstrap interval and the difference with its own.

The rows come from the runs' breakdown.parquet files, read in one DuckDB scan
(labctl.analysis.catalog_breakdowns; never events.jsonl, but for a run that has no usable Parquet file,
named in `notes`). Values are pooled over each phase's unit (labctl.analysis.phase_stats.UNITS) across
the runs; rows flagged impossible or unresolved stay out, as in a single run's summary. Intervals resample
whole reconfigurations, each run's its own (the ports of one reconfiguration move together: decision
0042). Each run's own median is kept too, so run-to-run spread is visible beside the pooled interval (a
slow day moves every reconfiguration of a run, which even the cluster bootstrap does not see).

The numbers equal those of labctl.analysis.phase_stats.summarize over the same rows pooled in pandas (a test
holds them equal); only the way there is cheaper: the selection in SQL, and the cluster bootstrap through
the few ranks where a resample's median can fall (`cluster_bootstrap_medians`, decision 0058).
"""

from __future__ import annotations

import functools
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from labctl.analysis.breakdown_table import DURATIONS
from labctl.analysis.catalog import iso, select_runs
from labctl.analysis.catalog_breakdowns import load_breakdowns
from labctl.analysis.catalog_filters import Filters
from labctl.analysis.phase_stats import (
    BOOTSTRAP_RESAMPLES,
    POOLED_CLUSTER,
    UNITS,
    ci_text,
    percentile_interval,
)
from labctl.analysis.phase_stats import describe as describe_phase
from labctl.analysis.settings import PHASES as SETTING_PHASES
from labctl.analysis.settings import difference as setting_difference
from labctl.analysis.settings import reference_of, section
from labctl.core.errors import InputError

if TYPE_CHECKING:
    import duckdb


# --- the cluster bootstrap, by the ranks that matter ------------------------------------------------------


@functools.lru_cache(maxsize=3)
def _cluster_draws(k: int, seed: int) -> np.ndarray:
    """How often each of k clusters is drawn in each resample (BOOTSTRAP_RESAMPLES × k, int32): the draws
    of breakdown._cluster_bootstrap_medians, the same numbers for the same seed. Every phase of a pool has
    the same clusters as a rule, so they are drawn once (cached)."""
    rng = np.random.default_rng(seed)
    drawn = rng.integers(0, k, (BOOTSTRAP_RESAMPLES, k))
    drawn += np.arange(BOOTSTRAP_RESAMPLES)[:, None] * k
    counts = np.bincount(drawn.ravel(), minlength=BOOTSTRAP_RESAMPLES * k).reshape(BOOTSTRAP_RESAMPLES, k)
    small = counts.astype(np.int32)  # a count is at most k
    small.flags.writeable = False
    return small


PILOT = 64
"""Resamples whose medians' ranks, found first, place the band for all of them."""


def cluster_bootstrap_medians(values: np.ndarray, clusters: np.ndarray, *, seed: int = 0) -> np.ndarray:
    """The same medians as labctl.analysis.phase_stats.bootstrap_medians(values, seed=seed,
    clusters=clusters), at a fraction of the cost for many values: a resample's median is a weighted
    median of the sorted values, and only a band of ranks around the middle can hold it. The first PILOT
    resamples are worked out in a wide band (±3 N/√k ranks, doubled until it holds them), and the band for
    all is theirs widened by their own spread on each side; every resample is checked to have its two
    middle positions inside its band (all weight below the band at most the lower, all up to its end more
    than the upper), and where one has not, all are worked out again in the wide band, doubled until it
    holds: the result is exact, never an approximation."""
    if values.shape != clusters.shape:
        raise ValueError(f"{values.size} values but {clusters.size} cluster labels")
    _, labels = np.unique(clusters, return_inverse=True)
    k = int(labels.max()) + 1 if labels.size else 0
    if k == 0:
        return np.full(BOOTSTRAP_RESAMPLES, np.nan)
    counts = _cluster_draws(k, seed)
    order = np.argsort(values, kind="stable")
    ranked, ranked_labels = values[order].astype(np.float64), labels[order]
    n = values.size
    total = counts @ np.bincount(labels, minlength=k)  # each resample's size
    middle = ((total - 1) // 2, total // 2)  # the two middle positions of each resample (equal when odd)
    band = _Band(counts, ranked_labels, middle)
    half = int(3 * n / np.sqrt(k)) + 64
    pilot = slice(0, PILOT)
    while (found := band.ranks(pilot, n // 2 - half, n // 2 + half)) is None:
        half *= 2
    spread = int(found[1].max() - found[0].min()) + 16
    ranks = band.ranks(slice(None), int(found[0].min()) - spread, int(found[1].max()) + spread + 1)
    while ranks is None:
        ranks = band.ranks(slice(None), n // 2 - half, n // 2 + half)
        half *= 2
    medians: np.ndarray = (ranked[ranks[0]] + ranked[ranks[1]]) / 2
    return medians


class _Band:
    """Each resample's two middle ranks, found among the ranks start..end of the sorted values."""

    def __init__(
        self, counts: np.ndarray, ranked_labels: np.ndarray, middle: tuple[np.ndarray, np.ndarray]
    ) -> None:
        self.counts, self.ranked_labels, self.middle = counts, ranked_labels, middle
        self.k, self.n = counts.shape[1], ranked_labels.size
        self.small = np.int32 if int(middle[1].max()) < 2**31 - 1 else np.int64

    def ranks(self, rows: slice, start: int, end: int) -> tuple[np.ndarray, np.ndarray] | None:
        """(lower, upper) middle rank of each resample in `rows`, or None where one lies outside."""
        start, end = max(0, start), min(self.n, end)
        counts = self.counts[rows]
        low_pos, high_pos = self.middle[0][rows], self.middle[1][rows]
        below = counts @ np.bincount(self.ranked_labels[:start], minlength=self.k)
        if start > 0 and (below > low_pos).any():
            return None
        band = self.ranked_labels[start:end]
        low = np.empty(counts.shape[0], np.int64)
        high = np.empty(counts.shape[0], np.int64)
        chunk = max(1, 4_000_000 // max(band.size, 1))  # bound the (resamples × band) matrices' memory
        for i in range(0, counts.shape[0], chunk):
            cum: np.ndarray = np.cumsum(counts[i : i + chunk, band], axis=1, dtype=self.small)
            cum += below[i : i + chunk, None].astype(self.small)
            if end < self.n and (cum[:, -1] <= high_pos[i : i + chunk]).any():
                return None
            low[i : i + chunk] = start + (cum <= low_pos[i : i + chunk, None]).sum(axis=1)
            high[i : i + chunk] = start + (cum <= high_pos[i : i + chunk, None]).sum(axis=1)
        return low, high


def median_ci(values: np.ndarray, clusters: np.ndarray, *, seed: int = 0) -> tuple[int, int] | None:
    """As labctl.analysis.phase_stats.median_ci with clusters, through cluster_bootstrap_medians."""
    if values.size < 2 or np.unique(clusters).size < 2:
        return None
    return percentile_interval(cluster_bootstrap_medians(values, clusters, seed=seed))


def describe(values: np.ndarray, clusters: np.ndarray, unit: str) -> dict[str, Any]:
    """labctl.analysis.phase_stats.describe over pooled runs: the clusters are each run's reconfigurations and
    the median's CI comes from cluster_bootstrap_medians (the same draws, cheaper)."""

    def ci(v: np.ndarray, c: np.ndarray | None) -> tuple[int, int] | None:
        return median_ci(v, clusters if c is None else c)

    return describe_phase(values, unit, clusters=clusters, cluster=POOLED_CLUSTER, ci=ci)


# --- a pool of runs' rows --------------------------------------------------------------------------------


def _flag_test(flag: str, phase: str) -> str:
    return f"list_contains(string_split(coalesce({flag}, ''), ','), '{phase}')"


class Pool:
    """The measured rows of a set of runs (catalogue rows), read from their breakdown.parquet files into
    DuckDB (`table` in `con`); `notes` names each run read otherwise or left out."""

    def __init__(self, runs: Sequence[dict[str, Any]], con: duckdb.DuckDBPyConnection, table: str) -> None:
        if not runs:
            raise InputError("no run matches")
        self.runs = list(runs)
        self.con = con
        self.table = table
        self.notes = load_breakdowns(con, table, self.runs)
        con.execute(
            f"CREATE TEMP TABLE {table}_order AS SELECT unnest(?) AS run_id, unnest(?) AS idx",
            [[r["run_id"] for r in self.runs], list(range(len(self.runs)))],
        )

    def phase(self, column: str, setting: str | None = None) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """One phase's values over its own unit, flagged rows left out (as phase_stats.phase_clustered with
        `run_id`): the values, each one's cluster (its run × reconfiguration, numbered in (run_id,
        reconfig) order) and its run's place in `runs`. `setting`: only the rows of that link_setting."""
        name = column.removesuffix("_ns")
        keep = [
            "v IS NOT NULL",
            f"NOT {_flag_test('impossible', name)}",
            f"NOT {_flag_test('unresolved', name)}",
        ]
        params: list[Any] = []
        if setting is not None:
            keep.append("link_setting = ?")
            params.append(setting)
        if UNITS[column] == "switch command":  # one value per command: its (t0, t1) within a reconfiguration
            keep.append("nth = 1")
        elif UNITS[column] == "circuit end":
            keep.append("coalesce(peer, '') <> ''")
        found = self.con.execute(
            f"""
            WITH numbered AS (
                SELECT run_id, reconfig, {column} AS v, peer, impossible, unresolved, link_setting,
                       row_number() OVER (
                           PARTITION BY run_id, reconfig, t0_command_ns, t1_switch_done_ns ORDER BY row_number
                       ) AS nth
                FROM {self.table}
            )
            SELECT v, dense_rank() OVER (ORDER BY n.run_id, reconfig) - 1 AS cluster, o.idx AS run
            FROM numbered AS n JOIN {self.table}_order AS o USING (run_id)
            WHERE {" AND ".join(keep)}
            """,
            params,
        ).fetchnumpy()
        return (
            np.asarray(found["v"], dtype=np.int64),
            np.asarray(found["cluster"], dtype=np.int64),
            np.asarray(found["run"], dtype=np.int64),
        )

    def settings(self) -> dict[str, int]:
        """Each link_setting of the pool's rows (a tune run's) in the order first measured (runs in the
        order given, reconfigurations in order) with how many run × reconfigurations measured it; empty
        where no row has one."""
        found = self.con.execute(
            f"""SELECT link_setting, count(DISTINCT (run_id, reconfig)) AS k, min((o.idx, reconfig)) AS first
                FROM {self.table} JOIN {self.table}_order AS o USING (run_id)
                WHERE coalesce(link_setting, '') <> ''
                GROUP BY link_setting ORDER BY first"""
        ).fetchall()
        return {str(label): int(k) for label, k, _ in found}

    def totals(self) -> dict[str, Any]:
        """The counts summarize() gives beside the phases, over the pooled rows."""
        t = self.table
        reconfigs, run_reconfigs, rows, timed_out, incomplete, flagged = self.con.execute(
            f"""SELECT count(DISTINCT reconfig), count(DISTINCT (run_id, reconfig)), count(*),
                       count(*) FILTER (WHERE timed_out), count(*) FILTER (WHERE t5_traffic_ns IS NULL),
                       count(*) FILTER (WHERE coalesce(impossible, '') <> ''
                                        OR coalesce(unresolved, '') <> '')
                FROM {t}"""
        ).fetchone() or (0, 0, 0, 0, 0, 0)
        resolution: dict[str, Any] = {}
        for mark in ("t2", "t3", "t4", "t5"):
            c = f"{mark}_resolution_ns"
            n, median, worst = self.con.execute(
                f"SELECT count({c}), median({c}), max({c}) FROM {t}"
            ).fetchone() or (0, None, None)
            if n:
                resolution[mark] = {"n": int(n), "median": int(median), "max": int(worst)}
        sources = self.con.execute(
            f"SELECT t2_source, count(*) FROM {t} WHERE coalesce(t2_source, '') <> '' "
            "GROUP BY 1 ORDER BY 2 DESC"
        ).fetchall()
        return {
            "reconfigurations": int(reconfigs),
            "run_reconfigurations": int(run_reconfigs),
            "rows": int(rows),
            "timed_out": int(timed_out),
            "incomplete": int(incomplete),
            "flagged_rows": int(flagged),
            "resolution": resolution,
            "t2_source": {str(name): int(n) for name, n in sources},
        }

    def flag_counts(self) -> dict[str, dict[str, int]]:
        """Per phase, how many rows each flag names it in."""
        names = [c.removesuffix("_ns") for c in DURATIONS]
        terms = ", ".join(
            f"count(*) FILTER (WHERE {_flag_test(flag, name)})"
            for name in names
            for flag in ("impossible", "unresolved")
        )
        counts = self.con.execute(f"SELECT {terms} FROM {self.table}").fetchone() or ()
        it = iter(counts)
        return {name: {"impossible": int(next(it)), "unresolved": int(next(it))} for name in names}


def run_medians(values: np.ndarray, runs: np.ndarray, how_many: int) -> list[int | None]:
    """Each run's median of a phase (as int(np.median) of its values), None for a run without values."""
    out: list[int | None] = [None] * how_many
    if not values.size:
        return out
    order = np.lexsort((values, runs))
    sorted_values, sorted_runs = values[order], runs[order]
    starts = np.flatnonzero(np.r_[True, sorted_runs[1:] != sorted_runs[:-1]])
    ends = np.r_[starts[1:], sorted_runs.size]
    for start, end in zip(starts, ends, strict=True):
        middle = sorted_values[start + (end - start - 1) // 2], sorted_values[start + (end - start) // 2]
        out[int(sorted_runs[start])] = int((float(middle[0]) + float(middle[1])) / 2)
    return out


def identity(run: dict[str, Any]) -> dict[str, Any]:
    """What a pooled summary says of each run it pooled."""
    return {
        "run_id": run["run_id"],
        "path": run["path"],
        "status": run["status"],
        "experiment": run["experiment"],
        "seed": run["seed"],
        "profile": run["profile"],
        "lab": run["lab"],
        "labctl_version": run["labctl_version"],
        "started": iso(run.get("started_ns")),
    }


def pool_reference(runs: Sequence[dict[str, Any]], notes: list[str]) -> str | None:
    """The reference setting the pooled runs name (each run's run.json: settings.reference_of); where they
    name different ones, the first run's, said in `notes`; None where none names one."""
    from labctl.analysis.store import read_run_json

    named: list[str] = []
    for run in runs:
        try:
            reference = reference_of(read_run_json(Path(run["path"])))
        except InputError:
            reference = None
        if reference is not None:
            named.append(reference)
    if len(set(named)) > 1:
        counts = ", ".join(f"{label} ({n})" for label, n in Counter(named).items())
        notes.append(f"the runs name different reference settings: {counts}; {named[0]} is used")
    return named[0] if named else None


def pooled_by_setting(pool: Pool, reference: str | None = None) -> dict[str, Any] | None:
    """settings.by_setting over the pool's runs (None where no row has a link_setting): per setting its
    pooled firmware and total link-up, the difference to the reference (default: the runs' own, else the
    first measured) and the ranking, every interval resampling run × reconfiguration."""
    counts = pool.settings()
    if not counts:
        return None
    if reference is None:
        reference = pool_reference(pool.runs, pool.notes)
        if reference is None:
            pool.notes.append(
                f"no run names its reference setting: the first measured ({next(iter(counts))}) is used"
            )
    data = {label: {col: pool.phase(col, label)[:2] for col in SETTING_PHASES} for label in counts}
    return section(
        list(counts),
        reference,
        data,
        counts,
        describe_phase=describe,
        cluster=POOLED_CLUSTER,
        bootstrap=cluster_bootstrap_medians,
    )


def _connect() -> duckdb.DuckDBPyConnection:
    import duckdb

    return duckdb.connect()


def pooled_summary(pool: Pool) -> dict[str, Any]:
    """One summary over the pool's runs (summarize()'s keys, `exclude_setup` already applied by reading
    only measured rows): pooled per phase (n, spread, median and its CI) with each run's median, which
    runs and what was read otherwise."""
    summary: dict[str, Any] = {"unit": "ns", "ci": ci_text(POOLED_CLUSTER)}
    totals = pool.totals()
    flags = pool.flag_counts()
    phases: dict[str, Any] = {}
    for column in DURATIONS:
        name = column.removesuffix("_ns")
        values, clusters, runs = pool.phase(column)
        phases[name] = describe(values, clusters, UNITS[column]) | flags[name]
        medians = run_medians(values, runs, len(pool.runs))
        phases[name]["run_medians"] = medians
        phases[name]["runs_with_values"] = sum(m is not None for m in medians)
    summary |= {k: v for k, v in totals.items() if k not in ("resolution", "t2_source")}
    summary |= {"resolution": totals["resolution"], "phases": phases, "t2_source": totals["t2_source"]}
    summary["runs"] = [identity(r) for r in pool.runs]
    summary["experiments"] = sorted({r["experiment"] for r in pool.runs if r["experiment"]})
    settings = pooled_by_setting(pool)
    if settings is not None:  # tune runs: each link setting pooled, against the reference
        summary["by_link_setting"] = settings
    summary["notes"] = pool.notes
    return summary


def aggregate(paths: Sequence[Path | str] = (), filters: Filters | None = None) -> dict[str, Any]:
    """One summary over several runs (run directories, or runs directories with `filters`): pooled per
    phase (n, spread, median and its CI) and each run's median."""
    con = _connect()
    try:
        return pooled_summary(Pool(select_runs(paths, filters or Filters()), con, "pooled"))
    finally:
        con.close()


def compare_runs(a_runs: Sequence[dict[str, Any]], b_runs: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """Set B against set A (catalogue rows), per phase: each set's pooled statistics and the difference
    of medians (B - A) with a bootstrap interval (each set resampled on its own, by whole reconfigurations
    of its runs; no interval where a set has fewer than two), and `warnings` where the sets differ in what
    they ran on (profile, lab, labctl version)."""
    overlap = {r["path"] for r in a_runs} & {r["path"] for r in b_runs}
    if overlap:
        raise InputError(f"run(s) in both sets: {', '.join(sorted(overlap))}")
    con = _connect()
    try:
        a_pool, b_pool = Pool(a_runs, con, "set_a"), Pool(b_runs, con, "set_b")
        phases: dict[str, Any] = {}
        for col in DURATIONS:
            (a, a_clusters, _), (b, b_clusters, _) = a_pool.phase(col), b_pool.phase(col)
            entry: dict[str, Any] = {
                "unit": UNITS[col],
                "a": describe(a, a_clusters, UNITS[col]),
                "b": describe(b, b_clusters, UNITS[col]),
            }
            if a.size >= 2 and b.size >= 2:
                entry["difference"] = round(float(np.median(b) - np.median(a)))
                entry["difference_ci"] = None  # one reconfiguration on a side: how it varies is unknown
                if entry["a"]["median_ci_clusters"] >= 2 and entry["b"]["median_ci_clusters"] >= 2:
                    diffs = cluster_bootstrap_medians(b, b_clusters, seed=1) - cluster_bootstrap_medians(
                        a, a_clusters, seed=0
                    )
                    entry["difference_ci"] = percentile_interval(diffs)
                entry["ratio"] = round(float(np.median(b) / np.median(a)), 4) if np.median(a) else None
            phases[col.removesuffix("_ns")] = entry
        settings = compare_settings(a_pool, b_pool)
        notes = a_pool.notes + b_pool.notes
    finally:
        con.close()
    result = {
        "unit": "ns",
        "ci": ci_text(POOLED_CLUSTER) + "; the difference's: each set resampled on its own",
        "a": {"runs": [identity(r) for r in a_runs]},
        "b": {"runs": [identity(r) for r in b_runs]},
        "phases": phases,
        "warnings": set_differences(a_runs, b_runs),
        "notes": notes,
    }
    if settings is not None:
        result["by_link_setting"] = settings
    return result


def compare_settings(a_pool: Pool, b_pool: Pool) -> dict[str, Any] | None:
    """Two sets of tune runs by link setting: each set's pooled_by_setting (its settings, the difference
    to its reference, its ranking) and, per setting both measured, B − A of its firmware and total medians
    with a 95% CI (each set's run × reconfigurations resampled on its own). None where neither set's rows
    have a link_setting."""
    a, b = pooled_by_setting(a_pool), pooled_by_setting(b_pool)
    if a is None and b is None:
        return None
    both = [label for label in (a or {}).get("settings", {}) if label in (b or {}).get("settings", {})]
    differences: dict[str, Any] = {}
    for label in both:
        entry: dict[str, Any] = {}
        for col in SETTING_PHASES:
            entry[col.removesuffix("_ns")] = setting_difference(
                a_pool.phase(col, label)[:2],
                b_pool.phase(col, label)[:2],
                bootstrap=cluster_bootstrap_medians,
            )
        differences[label] = entry
    only = {
        side: [label for label in (s or {}).get("settings", {}) if label not in both]
        for side, s in (("a", a), ("b", b))
    }
    return {"unit": "ns", "a": a, "b": b, "differences": differences, "only_in": only}


def compare(
    a_paths: Sequence[Path | str],
    b_paths: Sequence[Path | str],
    filters: Filters | None = None,
    a_filters: Filters | None = None,
    b_filters: Filters | None = None,
) -> dict[str, Any]:
    """compare_runs over two sets given as run (or runs) directories: `filters` for both, each side's own
    narrowing them."""
    shared = filters or Filters()
    return compare_runs(
        select_runs(a_paths, shared.narrowed(a_filters or Filters())),
        select_runs(b_paths, shared.narrowed(b_filters or Filters())),
    )


WHAT_DIFFERS = {"profile": "profiles", "lab": "labs", "labctl_version": "labctl versions"}


def _tally(runs: Sequence[dict[str, Any]], key: str) -> str:
    counts = Counter(str(r.get(key)) for r in runs)
    return ", ".join(f"{value} ({n})" if len(counts) > 1 else value for value, n in sorted(counts.items()))


def _hashes(runs: Sequence[dict[str, Any]]) -> set[Any]:
    return {r.get("profile_hash") for r in runs}


def set_differences(a_runs: Sequence[dict[str, Any]], b_runs: Sequence[dict[str, Any]]) -> list[str]:
    """One line per way the two sets differ in what their runs ran on: profile (its name, or under one
    name its parameters), lab, labctl version."""
    lines = []
    for key, what in WHAT_DIFFERS.items():
        a_values, b_values = {r.get(key) for r in a_runs}, {r.get(key) for r in b_runs}
        if a_values != b_values:
            lines.append(f"the sets ran different {what}: A {_tally(a_runs, key)}; B {_tally(b_runs, key)}")
        elif key == "profile" and _hashes(a_runs) != _hashes(b_runs):
            lines.append(
                f"the sets ran profile {_tally(a_runs, key)} with different parameters (the inventory's "
                "profile changed between them)"
            )
    return lines


def split_sets(args: Sequence[str], separator: str = "vs") -> tuple[list[str], list[str]]:
    """`A1 A2 vs B1 B2` → ([A1, A2], [B1, B2]); one line naming what is missing otherwise."""
    if args.count(separator) != 1:
        raise InputError(f"give two sets of runs separated by one '{separator}': RUN... {separator} RUN...")
    i = list(args).index(separator)
    a, b = list(args[:i]), list(args[i + 1 :])
    if not a or not b:
        raise InputError(f"both sides of '{separator}' need at least one run")
    return a, b
