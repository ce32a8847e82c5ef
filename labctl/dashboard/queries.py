"""The pages' data, read through the functions the command line reads through: the queue store's `active`,
`schedules`, `leases` and `runs` (`labctl queue`, `labctl history`) with `labctl.scheduler.results.headline`,
and the run catalogue (`labctl runs`: `Catalog.rows` with the same filters, `row_of_run`, `public`). Nothing
here knows SQL or Parquet; each function opens what it reads and closes it (a SQLite connection belongs to
its thread: the app calls these in worker threads).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from labctl.analysis.catalog import Catalog, phase_summaries, public, row_of_run
from labctl.analysis.catalog_filters import FILTER_KEYS, filters_from
from labctl.scheduler.backends import open_store
from labctl.scheduler.results import headline, headline_text
from labctl.scheduler.timing import fmt_wall

HISTORY_LIMIT = 20
"""Finished jobs on the queue page: `labctl history`'s default."""
FIGURES = ("headline.png", "timeline.png", "distributions.png")
"""A run's figures, in the order its page shows them (those it has)."""


def queue_view(db: str | Path, *, from_env: bool = False) -> dict[str, Any]:
    """The queue page: `labctl queue` (queued and running jobs, schedules, leases on a shared queue) and
    `labctl history` (the newest finished jobs with their headline results)."""
    store = open_store(db, from_env=from_env)
    try:
        rows, schedules = store.active(), store.schedules()
        leases = store.leases() if store.shared else []
        done = store.runs("state NOT IN ('queued','running')", (), f"id DESC LIMIT {HISTORY_LIMIT}")
    finally:
        store.close()
    held: dict[int, list[str]] = {}
    for lease in leases:
        held.setdefault(lease["run_id"], []).append(str(lease["resource"]))

    def job(r: Any) -> dict[str, Any]:
        results = headline(r.run_dir) if r.state not in ("queued", "running") else None
        return {
            "id": r.id,
            "name": r.name,
            "state": r.state,
            "cancel_requested": r.cancel_requested,
            "priority": r.priority,
            "due": fmt_wall(r.due_ns),
            "started": fmt_wall(r.started_ns),
            "finished": fmt_wall(r.finished_ns),
            "hosts": sorted(r.resources.hosts),
            "ports": len(r.resources.ports),
            "leases": sorted(held.get(r.id, [])),
            "run": Path(r.run_dir).name if r.run_dir else None,
            "attempt": r.attempt,
            "serve": r.owner if r.state == "running" else None,
            "error": r.error,
            "results": headline_text(results),
            "schedule": r.schedule_id,
        }

    return {
        "shared": store.shared,
        "jobs": [job(r) for r in rows],
        "done": [job(r) for r in done],
        "schedules": [
            {
                "id": f"c{s.id}",
                "name": s.name,
                "cron": s.cron,
                "priority": s.priority,
                "next": fmt_wall(s.next_fire_ns),
            }
            for s in schedules
        ],
    }


def running_run(db: str | Path, *, from_env: bool = False) -> str | None:
    """The run directory name of the running job started last, if any."""
    store = open_store(db, from_env=from_env)
    try:
        rows = [r for r in store.active() if r.state == "running" and r.run_dir]
    finally:
        store.close()
    rows.sort(key=lambda r: r.started_ns or 0)
    return Path(rows[-1].run_dir).name if rows and rows[-1].run_dir else None


def job_run(db: str | Path, job_id: int, *, from_env: bool = False) -> tuple[str, str | None]:
    """(a job's state, its run directory name once it has one); InputError for no such job."""
    store = open_store(db, from_env=from_env)
    try:
        row = store.run(job_id)  # InputError: no such job
    finally:
        store.close()
    return row.state, (Path(row.run_dir).name if row.run_dir else None)


def cancel(db: str | Path, ident: str, *, from_env: bool = False) -> list[str]:
    """`labctl cancel ID`: a queued run cancelled, a running one stopped, a schedule (`c3`) disabled."""
    store = open_store(db, from_env=from_env)
    try:
        return store.cancel(ident)
    finally:
        store.close()


def resubmit(db: str | Path, job_id: int, *, from_env: bool = False) -> int:
    """`labctl submit` again with a job's experiment, inventory, profile, priority and name, due now."""
    from labctl.scheduler.plan import declare
    from labctl.scheduler.timing import SystemClock

    store = open_store(db, from_env=from_env)
    try:
        row = store.run(job_id)
        decl = declare(Path(row.experiment), Path(row.inventory))
        now = SystemClock().wall_ns()
        return store.submit(
            Path(row.experiment),
            Path(row.inventory),
            decl,
            now_ns=now,
            priority=row.priority,
            due_ns=now,
            name=row.name,
            profile=row.profile,
        )
    finally:
        store.close()


def filters_of(params: Mapping[str, str]) -> dict[str, str]:
    """The catalogue filters a page's query string gives (`labctl runs`'s options, same names)."""
    return {key: params[key] for key in FILTER_KEYS if params.get(key)}


def catalogue(runs_dir: Path, params: Mapping[str, str]) -> list[dict[str, Any]]:
    """`labctl runs RUNS_DIR --experiment … --since …` as `--json` prints it, newest first; a bad filter
    is an InputError (one line)."""
    chosen = filters_from(**{key: params.get(key) or None for key in FILTER_KEYS})
    if not runs_dir.is_dir():
        return []
    rows = Catalog(runs_dir).rows(chosen)
    return [
        {**public(r), "dir": r["dir"], "total_median_ns": r.get("total_median_ns")} for r in reversed(rows)
    ]


def run_view(run_dir: Path) -> dict[str, Any]:
    """A run's page: its catalogue row (status worked out: a run recorded running whose process is gone is
    `crashed`), summary.json's phase table and counts, its figures and files."""
    row = row_of_run(run_dir)
    try:
        summary = json.loads((run_dir / "summary.json").read_text())
    except (OSError, ValueError):
        summary = None
    phases = []
    if isinstance(summary, dict):
        for name, phase in (summary.get("phases") or {}).items():
            if isinstance(phase, dict):
                phases.append(
                    {
                        "phase": name,
                        **{
                            k: phase.get(k) for k in ("unit", "n", "min", "median", "median_ci", "p95", "max")
                        },
                    }
                )
    return {
        "row": public(row),
        "dir": run_dir.name,
        "status": row["status"],
        "summary": summary if isinstance(summary, dict) else None,
        "phases": phases,
        "phase_summaries": phase_summaries(row),
        "figures": [f for f in FIGURES if (run_dir / f).is_file()],
        "files": sorted(p.name for p in run_dir.iterdir() if p.is_file() and not p.name.startswith(".")),
    }


def trend(runs_dir: Path) -> dict[str, list[tuple[int, int]]]:
    """Per experiment, (started wall ns, median total link-up ns) of each run that measured one, oldest
    first: the history page's trend."""
    out: dict[str, list[tuple[int, int]]] = {}
    if not runs_dir.is_dir():
        return out
    for r in Catalog(runs_dir).rows():
        if r.get("started_ns") and r.get("total_median_ns") is not None:
            out.setdefault(str(r["experiment"]), []).append((int(r["started_ns"]), int(r["total_median_ns"])))
    return out
