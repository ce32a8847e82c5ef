"""A tune run's breakdown by link setting (the `link_setting` column): each setting's median firmware and
total link-up with its 95% CI, the difference to a reference setting with its own CI, and a ranking that says
which settings cannot be told apart.

The CIs are the breakdown's bootstrap over whole reconfigurations (decision 0042): a setting's medians
resample its reconfigurations; a difference resamples each setting's on its own and takes the percentile
interval of the differences. Two settings cannot be told apart when that interval includes 0.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd

from labctl.analysis.breakdown import (
    UNITS,
    bootstrap_medians,
    cluster_name,
    describe,
    percentile_interval,
    phase_clustered,
)

__all__ = ["PHASES", "by_setting", "difference", "recommendation_lines"]

PHASES = ("firmware_ns", "total_ns")
"""What each setting is summarised and ranked by (ranked by the last: total link-up)."""


def difference(
    a: tuple[np.ndarray, np.ndarray], b: tuple[np.ndarray, np.ndarray], seed: int = 0
) -> dict[str, Any] | None:
    """median(b) − median(a) with a 95% interval (each side's reconfigurations resampled on its own); None
    where a side has fewer than two reconfigurations."""
    (va, ca), (vb, cb) = a, b
    if min(np.unique(ca).size, np.unique(cb).size) < 2:
        return None
    diff = bootstrap_medians(vb, seed=seed + 1, clusters=cb) - bootstrap_medians(va, seed=seed, clusters=ca)
    lo, hi = percentile_interval(diff)
    return {
        "median": round(float(np.median(vb)) - float(np.median(va))),
        "ci": [lo, hi],
        "includes_0": lo <= 0 <= hi,
    }


def by_setting(frame: pd.DataFrame, reference: str | None = None) -> dict[str, Any] | None:
    """summary.json's `by_link_setting`: per setting (in the order first measured) n, median and CI of each
    of PHASES, the difference to `reference` (default: the first setting measured), and the ranking by
    median total link-up, each neighbour's difference said. None where no row has a setting."""
    if "link_setting" not in frame:
        return None
    rows = frame[(frame["reconfig"] > 0) & (frame["link_setting"].fillna("") != "")]
    if rows.empty:
        return None
    labels = list(dict.fromkeys(rows.sort_values("reconfig")["link_setting"].tolist()))
    reference = reference if reference in labels else labels[0]
    assert reference is not None
    cluster = cluster_name(rows)
    data: dict[str, dict[str, tuple[np.ndarray, np.ndarray]]] = {
        label: {col: phase_clustered(rows[rows["link_setting"] == label], col) for col in PHASES}
        for label in labels
    }
    settings: dict[str, Any] = {}
    for label in labels:
        entry: dict[str, Any] = {
            "reconfigurations": int(rows.loc[rows["link_setting"] == label, "reconfig"].nunique())
        }
        for col in PHASES:
            values, clusters = data[label][col]
            name = col.removesuffix("_ns")
            entry[name] = describe(values, UNITS[col], clusters=clusters, cluster=cluster)
            if label != reference:
                entry[name]["vs_reference"] = difference(data[reference][col], data[label][col])
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
            item["vs_previous"] = difference(data[ranked[i - 1]][PHASES[-1]], data[label][PHASES[-1]])
        ranking.append(item)
    return {
        "unit": "ns",
        "reference": reference,
        "ranked_by": ranked_by,
        "settings": settings,
        "ranking": ranking,
    }


def _ms(ns: float | None) -> str:
    return "?" if ns is None else f"{ns / 1e6:.4g}"


def _ci(ci: list[int] | tuple[int, int] | None) -> str:
    return "no CI" if ci is None else f"[{_ms(ci[0])}, {_ms(ci[1])}]"


def recommendation_lines(section: dict[str, Any] | None) -> list[str]:
    """What `labctl run`/`report` print of `by_link_setting`: a line per setting, then the ranking, each
    setting that cannot be told apart from the one above it said so."""
    if not section:
        return []
    lines = [f"link settings (reference {section['reference']}; ms, 95% CI over reconfigurations):"]
    for label, entry in section["settings"].items():
        fw, total = entry["firmware"], entry["total"]
        text = (
            f"  {label}: firmware {_ms(fw['median'])} {_ci(fw['median_ci'])}, total {_ms(total['median'])} "
            f"{_ci(total['median_ci'])}, {entry['reconfigurations']} reconfigurations"
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
