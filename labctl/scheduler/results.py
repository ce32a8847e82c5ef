"""A finished run's headline numbers, from its run directory's summary.json: what `labctl history` shows per
run and `serve` logs when a run finishes. Reads one small JSON file; imports nothing heavy."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from labctl.core.units import fmt_ns

SUMMARY = "summary.json"


def headline(run_dir: str | Path | None) -> dict[str, Any] | None:
    """{"reconfigurations": n, "phases": {phase: {"median_ns", "unit", "n"}}} for every phase measured at
    least once (each over its own unit, as summary.json counts it); None without a readable summary.json."""
    if not run_dir:
        return None
    try:
        summary = json.loads((Path(run_dir) / SUMMARY).read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(summary, dict):
        return None
    phases: dict[str, dict[str, Any]] = {}
    for name, phase in (summary.get("phases") or {}).items():
        if isinstance(phase, dict) and phase.get("n"):
            phases[name] = {"median_ns": phase.get("median"), "unit": phase.get("unit"), "n": phase.get("n")}
    out: dict[str, Any] = {"reconfigurations": summary.get("reconfigurations"), "phases": phases}
    if summary.get("timed_out"):
        out["timed_out"] = summary["timed_out"]
    return out


def headline_text(results: dict[str, Any] | None) -> str:
    """`4 reconfigurations; switch 25.0 ms (n=4 switch command), total 6.102 s (n=16 port)`; '' for None."""
    if results is None:
        return ""
    n = results.get("reconfigurations")
    parts = [f"{n} reconfiguration{'' if n == 1 else 's'}" if n is not None else "reconfigurations: ?"]
    for name, p in results.get("phases", {}).items():
        parts.append(f"{name} {fmt_ns(p['median_ns'])} (n={p['n']} {p['unit'] or ''})".replace(" )", ")"))
    if not results.get("phases"):
        parts.append("no link-up measured")
    if results.get("timed_out"):
        parts.append(f"{results['timed_out']} timed out")
    return parts[0] + "; " + ", ".join(parts[1:])
