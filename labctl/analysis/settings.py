"""A tune run's breakdown by link setting (the `link_setting` column): each setting's median firmware and
total link-up with its 95% CI, the difference to a reference setting with its own CI, and a ranking that says
which settings cannot be told apart.

The CIs are the breakdown's bootstrap over whole reconfigurations (decision 0042): a setting's medians
resample its reconfigurations; a difference resamples each setting's on its own and takes the percentile
interval of the differences. Two settings cannot be told apart when that interval includes 0.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np
import pandas as pd

from labctl.analysis.phase_stats import (
    POOLED_CLUSTER,
    UNITS,
    bootstrap_medians,
    cluster_keys,
    cluster_name,
    describe,
    percentile_interval,
    phase_clustered,
)

__all__ = ["PHASES", "by_setting", "difference", "recommendation_lines", "reference_of", "section"]

PHASES = ("firmware_ns", "total_ns")
"""What each setting is summarised and ranked by (ranked by the last: total link-up)."""

Clustered = tuple[np.ndarray, np.ndarray]
"""One phase's values and, aligned with them, each value's cluster (a reconfiguration, or run × one)."""
Bootstrap = Callable[..., np.ndarray]
"""bootstrap_medians(values, seed=, clusters=) or a function giving the same medians for the same seed."""
Describe = Callable[[np.ndarray, np.ndarray, str], dict[str, Any]]
"""(values, clusters, unit) → phase_stats.describe's dict, the median's CI resampling the clusters."""


def _bootstrap(values: np.ndarray, *, seed: int = 0, clusters: np.ndarray | None = None) -> np.ndarray:
    return bootstrap_medians(values, seed=seed, clusters=clusters)


def difference(
    a: Clustered, b: Clustered, seed: int = 0, bootstrap: Bootstrap = _bootstrap
) -> dict[str, Any] | None:
    """median(b) − median(a) with a 95% interval (each side's clusters resampled on its own); None where
    a side has fewer than two clusters (reconfigurations)."""
    (va, ca), (vb, cb) = a, b
    if min(np.unique(ca).size, np.unique(cb).size) < 2:
        return None
    diff = bootstrap(vb, seed=seed + 1, clusters=cb) - bootstrap(va, seed=seed, clusters=ca)
    lo, hi = percentile_interval(diff)
    return {
        "median": round(float(np.median(vb)) - float(np.median(va))),
        "ci": [lo, hi],
        "includes_0": lo <= 0 <= hi,
    }


def section(
    labels: Sequence[str],
    reference: str | None,
    data: Mapping[str, Mapping[str, Clustered]],
    reconfigurations: Mapping[str, int],
    *,
    describe_phase: Describe,
    cluster: str,
    bootstrap: Bootstrap = _bootstrap,
) -> dict[str, Any]:
    """`by_link_setting` from each setting's clustered values of PHASES (`data[label][column]`), however
    they were read (one run's frame, or several runs' breakdowns pooled): per setting its reconfigurations,
    each phase described, the difference to `reference` (default: the first of `labels`), the ranking."""
    reference = reference if reference in labels else labels[0]
    assert reference is not None
    settings: dict[str, Any] = {}
    for label in labels:
        entry: dict[str, Any] = {"reconfigurations": int(reconfigurations[label])}
        for col in PHASES:
            values, clusters = data[label][col]
            name = col.removesuffix("_ns")
            entry[name] = describe_phase(values, clusters, UNITS[col])
            if label != reference:
                entry[name]["vs_reference"] = difference(
                    data[reference][col], data[label][col], bootstrap=bootstrap
                )
        settings[label] = entry
    ranked_by = PHASES[-1].removesuffix("_ns")
    ranked = sorted(
        (label for label in labels if settings[label][ranked_by]["median"] is not None),
        key=lambda label: settings[label][ranked_by]["median"],
    )
    ranking = []
    for i, label in enumerate(ranked):
        item: dict[str, Any] = {"setting": label, "median": settings[label][ranked_by]["median"]}
        if i > 0:
            item["vs_previous"] = difference(
                data[ranked[i - 1]][PHASES[-1]], data[label][PHASES[-1]], bootstrap=bootstrap
            )
        ranking.append(item)
    return {
        "unit": "ns",
        "reference": reference,
        "ranked_by": ranked_by,
        "ci_resampling": cluster,
        "settings": settings,
        "ranking": ranking,
    }


def by_setting(frame: pd.DataFrame, reference: str | None = None) -> dict[str, Any] | None:
    """summary.json's `by_link_setting`: per setting (in the order first measured) n, median and CI of each
    of PHASES, the difference to `reference` (default: the first setting measured), and the ranking by
    median total link-up, each neighbour's difference said. None where no row has a setting. Rows with
    `run_id` (several runs' breakdowns) are clustered by run × reconfiguration."""
    if "link_setting" not in frame:
        return None
    rows = frame[(frame["reconfig"] > 0) & (frame["link_setting"].fillna("") != "")]
    if rows.empty:
        return None
    labels = list(dict.fromkeys(rows.sort_values(cluster_keys(rows))["link_setting"].tolist()))
    cluster = cluster_name(rows)
    data = {
        label: {col: phase_clustered(rows[rows["link_setting"] == label], col) for col in PHASES}
        for label in labels
    }
    counts = {
        label: len(rows.loc[rows["link_setting"] == label, cluster_keys(rows)].drop_duplicates())
        for label in labels
    }

    def describe_phase(values: np.ndarray, clusters: np.ndarray, unit: str) -> dict[str, Any]:
        return describe(values, unit, clusters=clusters, cluster=cluster)

    return section(labels, reference, data, counts, describe_phase=describe_phase, cluster=cluster)


SWEPT = ("autoneg", "speed_mbps", "duplex", "link_modes", "fec")
"""A setting label's fields in their fixed order (labctl.nic.settings.LinkSettings.label), flags after."""


def _word(value: Any) -> str:
    if isinstance(value, bool):
        return "on" if value else "off"
    if isinstance(value, list | tuple):
        return "+".join(sorted({str(v) for v in value}))
    return str(value)


def default_reference(experiment: Mapping[str, Any]) -> str | None:
    """The label of the first setting a tune spec (run.json `experiment`) writes: each swept field's first
    value, labelled as LinkSettings labels it; None where the spec has no sweep."""
    sweep = experiment.get("sweep")
    if not isinstance(sweep, Mapping):  # (a replay's `sweep:` names none of the link settings: None too)
        return None
    parts = []
    for name in SWEPT:
        values = sweep.get(name)
        if isinstance(values, list) and values:
            parts.append(f"{name}={_word(values[0])}")
    flags = sweep.get("priv_flags")
    if isinstance(flags, Mapping):
        parts += [
            f"{flag}={_word(values[0])}"
            for flag, values in sorted(flags.items())
            if isinstance(values, list) and values
        ]
    return ",".join(parts) or None


def reference_of(meta: Mapping[str, Any]) -> str | None:
    """A tune run's reference setting from its run.json alone (never events.jsonl): `link_settings.
    reference` as the run recorded it at its end, else its experiment's `reference:`, else the first
    setting the experiment's sweep writes; None for a run that is not a tune run."""
    recorded = meta.get("link_settings")
    if isinstance(recorded, Mapping) and isinstance(recorded.get("reference"), str):
        return str(recorded["reference"])
    experiment = meta.get("experiment")
    if not isinstance(experiment, Mapping):
        return None
    if isinstance(experiment.get("reference"), str):
        return str(experiment["reference"])
    return default_reference(experiment)


def _ms(ns: float | None) -> str:
    return "?" if ns is None else f"{ns / 1e6:.4g}"


def _ci(ci: list[int] | tuple[int, int] | None) -> str:
    return "no CI" if ci is None else f"[{_ms(ci[0])}, {_ms(ci[1])}]"


def recommendation_lines(section: dict[str, Any] | None) -> list[str]:
    """What `labctl run`/`report` print of `by_link_setting`: a line per setting, then the ranking, each
    setting that cannot be told apart from the one above it said so."""
    if not section:
        return []
    over = "run × reconfiguration" if section.get("ci_resampling") == POOLED_CLUSTER else "reconfigurations"
    unit = "run × reconfigurations" if over != "reconfigurations" else "reconfigurations"
    lines = [f"link settings (reference {section['reference']}; ms, 95% CI resampling {over}):"]
    for label, entry in section["settings"].items():
        fw, total = entry["firmware"], entry["total"]
        text = (
            f"  {label}: firmware {_ms(fw['median'])} {_ci(fw['median_ci'])} (n={fw['n']} {fw['unit']}s), "
            f"total {_ms(total['median'])} {_ci(total['median_ci'])} (n={total['n']} {total['unit']}s), "
            f"{entry['reconfigurations']} {unit}"
        )
        diff = total.get("vs_reference")
        if label != section["reference"]:
            text += (
                f"; total vs reference {_ms(diff['median'])} {_ci(diff['ci'])}"
                if diff
                else "; vs reference: no CI"
            )
        lines.append(text)
    ranking = section["ranking"]
    if ranking:
        parts: list[str] = []
        for item in ranking:
            diff = item.get("vs_previous")
            if diff is None and parts:
                parts.append(f"{item['setting']} (no CI against the one before)")
            elif diff is not None and diff["includes_0"]:
                parts.append(
                    f"{item['setting']} (cannot be told apart from the one before: {_ci(diff['ci'])} ms)"
                )
            else:
                parts.append(item["setting"])
        lines.append(f"ranked by median {section['ranked_by']} link-up, fastest first: " + " < ".join(parts))
        best = ranking[0]["setting"]
        tied = []
        for item in ranking[1:]:
            diff = item.get("vs_previous")
            if diff is None or not diff["includes_0"]:
                break
            tied.append(item["setting"])
        lines.append(
            f"recommendation: {best}"
            + (f" (or {', '.join(tied)}: the data cannot tell them apart)" if tied else "")
        )
    return lines
