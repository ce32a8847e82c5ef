"""How a run's numbers are said on a terminal: the breakdown table, its CI caption, the agents' clocks, and
the lines on what limits the marks, as `labctl run`, `report` and `compare` print them."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from rich.table import Table


UNIT_LABELS = {"switch command": "sw cmd", "circuit end": "circ. end"}

STAT_COLUMNS = ("min", "median", "p95", "max")


def summary_table(summary: dict[str, Any], title: str) -> Table:
    """One row per phase: its unit and n (flagged values are not in n), the spread, and the median with
    its 95% confidence interval (the caption says what the interval resampled). Each time column is in one
    unit, chosen for its values and named in its header; the CI is in the median's unit."""
    from rich.table import Table

    from labctl.core.units import UnitColumn

    phases = summary.get("phases", {})
    units = {stat: UnitColumn.of(s.get(stat) for s in phases.values()) for stat in STAT_COLUMNS}
    table = Table(title=title, title_justify="left", caption=ci_caption(summary), caption_justify="left")
    headers = (
        "phase",
        "unit",
        "n",
        units["min"].header("min"),
        units["median"].header("median"),
        units["median"].header("95% CI"),
        units["p95"].header("p95"),
        units["max"].header("max"),
        "flagged",
    )
    for col in headers:
        table.add_column(col, justify="left" if col in ("phase", "unit") else "right", no_wrap=True)
    for name, stats in phases.items():
        flagged = (stats.get("impossible") or 0) + (stats.get("unresolved") or 0)
        unit = stats.get("unit", "port row")
        table.add_row(
            name,
            UNIT_LABELS.get(unit, unit),
            str(stats.get("n", stats.get("count", 0))),
            units["min"].cell(stats["min"]),
            units["median"].cell(stats["median"]),
            units["median"].interval(stats.get("median_ci"), stats["median"]),
            units["p95"].cell(stats["p95"]),
            units["max"].cell(stats["max"]),
            f"[red]{flagged}[/]" if flagged else "0",
        )
    return table


def ci_caption(summary: dict[str, Any]) -> str | None:
    """What the table's 95% CI resampled and how many of it: reconfigurations, not port rows (decision
    0042). A summary written before that says only its own `ci` text."""
    counts = [
        stats["median_ci_clusters"]
        for stats in summary.get("phases", {}).values()
        if stats.get("n") and "median_ci_clusters" in stats
    ]
    if not counts:
        return f"95% CI: {summary['ci']}" if summary.get("ci") else None
    if max(counts) < 2:
        return "95% CI: none (one reconfiguration: how the next would differ cannot be estimated)"
    n = str(max(counts)) if min(counts) == max(counts) else f"{min(counts)}–{max(counts)}"
    pooled = " of the runs" if summary.get("runs") else ""  # aggregate(): each run's are its own
    return (
        f"95% CI: bootstrap resampling {n} reconfigurations{pooled} (a reconfiguration's ports move together)"
    )


def clock_table(meta: dict[str, Any]) -> Table | None:
    """Per agent host: which source set its clock offset (shared-clock, exchange, chrony/ptp4l), the offset
    removed from its stamps and the uncertainty that bounds every phase crossing from the controller's clock
    to it, its drift, and the exchange-based estimate beside it (decision 0040). None without agents. Each
    time column in one unit (its header names it)."""
    offsets = meta.get("clock_offsets") or {}
    if not offsets:
        return None
    from rich.table import Table

    from labctl.core.units import UnitColumn

    records = [rec for _, rec in sorted(offsets.items())]
    fields = {
        "offset": "offset_ns",
        "± uncertainty": "uncertainty_ns",
        "exchange ±": "exchange_uncertainty_ns",
        "fastest RTT": "rtt_min_ns",
    }
    units = {name: UnitColumn.of(rec.get(key) for rec in records) for name, key in fields.items()}
    table = Table(title="agent clocks (offset: agent − controller)", title_justify="left")
    for name in ("host", "source", *fields, "drift", "via"):
        header = units[name].header(name) if name in units else name
        table.add_column(header, justify="left" if name in ("host", "source", "via") else "right")
    for host, rec in sorted(offsets.items()):
        drift = rec.get("drift_ppb")
        cells = {
            # a shared clock's offset and uncertainty are 0, not unknown; the exchange's are blank without one
            name: units[name].cell(rec.get(key) or 0)
            if name in ("offset", "± uncertainty")
            else (units[name].cell(rec[key]) if rec.get(key) else "")
            for name, key in fields.items()
        }
        table.add_row(
            host,
            str(rec.get("source", "exchange")),
            *cells.values(),
            "" if drift is None else f"{drift / 1000:+.2f} ppm",
            str(rec.get("exchange_via", "")),  # udp: straight to the agent; broker: through MQTT
        )
    return table


def quality_lines(summary: dict[str, Any], probes: dict[str, Any] | None = None) -> list[str]:
    """What limits the numbers above: flagged rows (never silently in the statistics), each sampled
    mark's resolution, and the modules' DOM update interval where the poller measured one. Two durations
    said together share one unit, and each statistic says how many it is over."""
    from labctl.core.units import fmt_pair
    from labctl.probes.sampling import flat_probe_stats

    lines = []
    flagged = summary.get("flagged_rows") or 0
    if flagged:
        per_phase = ", ".join(
            f"{name}: {stats.get('impossible', 0)} impossible, {stats.get('unresolved', 0)} unresolved"
            for name, stats in summary.get("phases", {}).items()
            if stats.get("impossible") or stats.get("unresolved")
        )
        lines.append(
            f"[red]{flagged} port rows flagged: a phase ends before it starts ({per_phase}); left out of "
            "the statistics (breakdown.csv columns impossible/unresolved name them)[/]"
        )
    names = {"t2": "optical (t2)", "t3": "firmware (t3)", "t4": "carrier (t4)", "t5": "traffic (t5)"}
    marks = []
    for mark, r in summary.get("resolution", {}).items():
        if not r.get("max"):
            continue
        typical, worst, unit = fmt_pair(r["median"], r["max"])
        over = f" over {r['n']} port rows" if r.get("n") else ""
        marks.append(f"{names.get(mark, mark)} median {typical} {unit}, worst {worst} {unit}{over}")
    if marks:
        lines.append("mark resolution (previous sample to mark): " + "; ".join(marks))
    rx = [
        stats
        for name, stats in flat_probe_stats(probes or {})
        if name.rsplit("/", 1)[-1] == "rx-power" and stats.get("module_update_estimated")
    ]
    if rx:
        lanes = sum(r["module_update_estimated"] for r in rx)
        longest = max(r["module_update_ns_max"] for r in rx)
        median = rx[0]["module_update_ns_median"] if len(rx) == 1 else None
        median_text, longest_text, unit = fmt_pair(median, longest)
        where = f"median {median_text} {unit}, " if median is not None else ""
        lines.append(
            f"module DOM update interval: {where}longest {longest_text} {unit} over {lanes} lanes (where "
            "longer than the sampling period it widens the optical mark's resolution)"
        )
    lines += stall_lines(probes or {})
    return lines


STALL_MEANINGS = {
    "busy": "the loop's thread on a core: its own work, or the kernel's in its name",
    "runnable": "waiting for a core other processes or kernel threads held; --rt-priority outranks processes",
    "asleep": "neither running nor waiting for a core: a late timer, a blocking call or the machine",
}


def stall_lines(probes: dict[str, Any]) -> list[str]:
    """One line per sampler that gave up ticks after stalls of the loop: how many, the longest, and whose
    the stalls were (labctl.linux.schedstat), so a thinned sampler is never read as a quiet signal."""
    from labctl.core.units import fmt_ns
    from labctl.probes.sampling import flat_probe_stats

    lines = []
    for name, stats in flat_probe_stats(probes):
        skipped, stalls = stats.get("ticks_skipped") or 0, stats.get("stalls") or 0
        if not skipped or not stalls:
            continue
        causes = [
            f"{stats[f'stalls_{cause}']} {cause} ({meaning})"
            for cause, meaning in STALL_MEANINGS.items()
            if stats.get(f"stalls_{cause}")
        ]
        longest = stats.get("stall_longest_ns")
        lines.append(
            f"{name}: {skipped} ticks skipped in {stalls} stall{'s' if stalls != 1 else ''}"
            + (f", longest {fmt_ns(longest)}" if longest else "")
            + (f": {'; '.join(causes)}" if causes else "")
        )
    return lines
