"""The campaign commands: `serve` (run the queue), `submit`, `queue`, `cancel`, `history`.

Bad input is an InputError: one line, exit code 2.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from labctl.cli.common import (
    DEFAULT_INVENTORY,
    RUNS,
    ExperimentArg,
    HttpOpt,
    InventoryOpt,
    JsonOpt,
    LogFormatOpt,
    LogLevelOpt,
    NoPlotsOpt,
    OutOpt,
    ProfileOpt,
    TokenFileOpt,
    err,
    out,
    start_logging,
)
from labctl.core.errors import InputError

if TYPE_CHECKING:
    from labctl.scheduler.store import Store

DbOpt = Annotated[
    str | None,
    typer.Option(
        "--db",
        envvar="LABCTL_QUEUE_DB",
        show_default=False,
        help="The queue that `serve` and the clients share: a SQLite file (WAL; one serve runs it) or a "
        "postgresql://USER@HOST:PORT/DB URL (any number of serves, on any machines, share it; the password "
        "comes from $PGPASSWORD or ~/.pgpass, never from the command line). Default: "
        "$XDG_DATA_HOME/labctl/queue.sqlite, i.e. ~/.local/share/labctl/queue.sqlite of the user running "
        "labctl (under sudo: root's).",
    ),
]


def _queue_db(db: str | None) -> str | Path:
    """The queue to use: a PostgreSQL URL as given, else the SQLite file (the default's folder created)."""
    from labctl.scheduler.location import LEGACY_DB, is_url, resolve_db

    if db is not None and is_url(db):
        return db
    path = resolve_db(Path(db) if db is not None else None)
    if db is None and LEGACY_DB.is_file() and LEGACY_DB.resolve() != path.resolve():
        err.print(f"note: using {path}; a queue from an older labctl is at ./{LEGACY_DB} (--db {LEGACY_DB})")
    return path


def _from_env(db: str | None) -> bool:
    """Whether --db came from $LABCTL_QUEUE_DB (where a password in the URL is accepted)."""
    import os

    return db is not None and os.environ.get("LABCTL_QUEUE_DB") == db


def _open(db: str | None, where: str | Path) -> Store:
    from labctl.scheduler.backends import open_store

    return open_store(where, from_env=_from_env(db))


def _missing(where: str | Path) -> bool:
    """A SQLite queue file that does not exist (reading must not create one where a path was mistyped)."""
    return isinstance(where, Path) and not where.exists()


def _label(where: str | Path) -> str:
    from labctl.scheduler.location import mask_url

    return mask_url(where) if isinstance(where, str) else str(where)


def serve(
    db: DbOpt = None,
    out_dir: OutOpt = RUNS,
    no_plots: NoPlotsOpt = False,
    exit_when_idle: Annotated[
        bool,
        typer.Option("--exit-when-idle", help="Exit once no run is queued or running and no schedule is on."),
    ] = False,
    poll_s: Annotated[float, typer.Option("--poll", help="Seconds between queue checks.", min=0.05)] = 0.5,
    lease_s: Annotated[
        float,
        typer.Option(
            "--lease",
            help="PostgreSQL queue: seconds a run's resource leases live unless this serve renews them (it "
            "does every third of that while the run lives); a serve that dies frees them after this long.",
            min=0.5,
            max=3600,
        ),
    ] = 10.0,
    max_runs: Annotated[
        int | None,
        typer.Option(
            "--max-runs",
            help="Runs this serve runs at once (default: as many as the lab's ports and hosts allow). "
            "A serve with no free slot claims nothing; on a PostgreSQL queue a due run goes to the "
            "freest serve.",
            min=1,
        ),
    ] = None,
    log_level: LogLevelOpt = "info",
    log_format: LogFormatOpt = None,
    http: HttpOpt = None,
    token_file: TokenFileOpt = None,
) -> None:
    """Run the queue: start due runs by priority when their OCS ports and hosts are free; fire cron schedules.

    Runs on disjoint ports and hosts run at the same time, each in its own worker process. A higher
    priority never preempts a running run. Ctrl-C/SIGTERM stops running runs (each restores its baseline)
    and leaves queued ones queued. After a crash, the next `serve` restores the baseline of every run that
    was going, marks it interrupted and queues one retry.

    On a PostgreSQL queue (--db postgresql://...) several serves, on one machine or several, take runs from
    one queue: each run is claimed by one serve with a row lock, its OCS ports and hosts are leased for as
    long as that serve renews the lease, and a serve that dies has its runs recovered and retried once by
    another after the lease expires.

    With --http [ADDR:]PORT it also serves the lab dashboard (the queue, the running run live, the
    history) on the same loop: docs/dashboard.md.
    """
    import asyncio

    from labctl.scheduler.service import serve_main

    start_logging(log_level, log_format)
    where = _queue_db(db)
    if http is not None:  # the dashboard beside the loop (docs/dashboard.md)
        from labctl.cli.dashboard import serve_with_dashboard

        options: dict[str, Any] = {"plots": not no_plots, "exit_when_idle": exit_when_idle}
        options |= {"poll_s": poll_s, "lease_s": lease_s, "max_runs": max_runs}
        serve_with_dashboard(http, token_file, where, out_dir, from_env=_from_env(db), options=options)
        return
    asyncio.run(
        serve_main(
            where,
            out_dir,
            plots=not no_plots,
            exit_when_idle=exit_when_idle,
            poll_s=poll_s,
            lease_s=lease_s,
            from_env=_from_env(db),
            max_runs=max_runs,
        )
    )


def submit(
    experiment: ExperimentArg,
    inventory: InventoryOpt = DEFAULT_INVENTORY,
    priority: Annotated[int, typer.Option(help="Higher runs first.", min=-1_000_000, max=1_000_000)] = 0,
    at: Annotated[
        str | None, typer.Option("--at", help="Not before: ISO 8601 (local time) or +30s, +10m, +2h, +1d.")
    ] = None,
    cron: Annotated[
        str | None,
        typer.Option("--cron", help="Recurring: a cron expression, e.g. '0 2 * * *' (local time)."),
    ] = None,
    name: Annotated[
        str | None, typer.Option(help="Name shown in the queue (default: the experiment's).")
    ] = None,
    profile: ProfileOpt = None,
    db: DbOpt = None,
) -> None:
    """Queue a run (or, with --cron, a recurring schedule). The experiment is validated now, in full."""
    from labctl.scheduler.plan import declare
    from labctl.scheduler.timing import SystemClock, parse_at, validate_cron

    if at is not None and cron is not None:
        raise InputError("--at and --cron exclude each other (a schedule's first run is its next cron time)")
    decl = declare(experiment, inventory)
    if profile is not None:
        from labctl.labs import load

        load(inventory).profile(profile)
    now = SystemClock().wall_ns()
    store = _open(db, _queue_db(db))
    try:
        if cron is not None:
            sid = store.add_schedule(
                experiment,
                inventory,
                name or decl.name,
                validate_cron(cron),
                now_ns=now,
                priority=priority,
                profile=profile,
            )
            out.print(f"schedule c{sid} ({name or decl.name}): {cron}")
            return
        due = parse_at(at, now) if at is not None else now
        rid = store.submit(
            experiment, inventory, decl, now_ns=now, priority=priority, due_ns=due, name=name, profile=profile
        )
        out.print(
            f"run {rid} ({name or decl.name}) queued, priority {priority}; holds "
            f"{len(decl.resources.ports)} OCS ports, hosts {', '.join(sorted(decl.resources.hosts))}"
        )
    finally:
        store.close()


def queue(
    db: DbOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Show queued and running runs (in start order) and active cron schedules."""
    from rich.table import Table

    from labctl.scheduler.timing import fmt_wall

    where = _queue_db(db)
    if _missing(where):  # reading must not create a queue file where the user mistyped a path
        if as_json:
            print(json.dumps({"runs": [], "schedules": []}))
        else:
            out.print(f"no queue at {where} yet (labctl submit creates it)")
        return
    store = _open(db, where)
    try:
        rows, schedules, leases = store.active(), store.schedules(), store.leases()
    finally:
        store.close()
    if as_json:
        print(
            json.dumps(
                {
                    "runs": [
                        {
                            "id": r.id,
                            "name": r.name,
                            "state": r.state,
                            "priority": r.priority,
                            "due_ns": r.due_ns,
                            "hosts": sorted(r.resources.hosts),
                            "ports": len(r.resources.ports),
                            "run_dir": r.run_dir,
                            "attempt": r.attempt,
                            "serve": r.owner if r.state == "running" else None,
                        }
                        for r in rows
                    ],
                    "schedules": [
                        {"id": f"c{s.id}", "name": s.name, "cron": s.cron, "next_fire_ns": s.next_fire_ns}
                        for s in schedules
                    ],
                    **(
                        {
                            "leases": [
                                {
                                    "resource": lease["resource"],
                                    "run_id": lease["run_id"],
                                    "serve": lease["owner"],
                                    "expires": lease["expires_at"].isoformat(),
                                    "expired": lease["expired"],
                                }
                                for lease in leases
                            ]
                        }
                        if store.shared
                        else {}
                    ),
                },
                indent=2,
            )
        )
        return
    table = Table(title="queue", title_justify="left")
    columns = ["id", "name", "state", "prio", "due", "hosts", "ports", "run dir"]
    if store.shared:
        columns.append("serve")
    for col in columns:
        table.add_column(col)
    for r in rows:
        cells = [
            str(r.id),
            r.name,
            r.state + (" (cancel requested)" if r.cancel_requested else ""),
            str(r.priority),
            fmt_wall(r.due_ns),
            ",".join(sorted(r.resources.hosts)),
            str(len(r.resources.ports)),
            r.run_dir or "",
        ]
        if store.shared:
            cells.append((r.owner or "") if r.state == "running" else "")
        table.add_row(*cells)
    out.print(table)
    if schedules:
        st = Table(title="schedules", title_justify="left")
        for col in ("id", "name", "cron", "prio", "next"):
            st.add_column(col)
        for s in schedules:
            st.add_row(f"c{s.id}", s.name, s.cron, str(s.priority), fmt_wall(s.next_fire_ns))
        out.print(st)


def cancel(
    ident: Annotated[str, typer.Argument(metavar="ID", help="Run id (12), schedule id (c3) or name.")],
    db: DbOpt = None,
) -> None:
    """Cancel a queued run, stop a running one (its baseline is restored), or disable a schedule.

    By name, it cancels every queued or running run with that name and disables the schedules with it.
    """
    where = _queue_db(db)
    if _missing(where):
        raise InputError(f"{where}: no queue database here (labctl submit creates it)")
    store = _open(db, where)
    try:
        done = store.cancel(ident)
    finally:
        store.close()
    if not done:
        raise InputError(f"cancel {ident}: no such run, schedule or name in {_label(where)}")
    for line in done:
        out.print(line)


def history(
    db: DbOpt = None,
    limit: Annotated[int, typer.Option(help="How many of the newest runs.", min=1)] = 20,
    as_json: JsonOpt = False,
) -> None:
    """Finished runs, newest first, each with its headline results.

    State, start and end, run directory, error, and the run's headline results from its summary.json
    (reconfigurations; each measured phase's median, with its unit and n)."""
    from rich.table import Table

    from labctl.scheduler.results import headline, headline_text
    from labctl.scheduler.timing import fmt_wall

    where = _queue_db(db)
    if _missing(where):
        if as_json:
            print("[]")
        else:
            out.print(f"no queue at {where} yet (labctl submit creates it)")
        return
    store = _open(db, where)
    try:
        rows = store.runs("state NOT IN ('queued','running')", (), f"id DESC LIMIT {int(limit)}")
    finally:
        store.close()
    results = {r.id: headline(r.run_dir) for r in rows}
    if as_json:
        print(
            json.dumps(
                [
                    {
                        "id": r.id,
                        "name": r.name,
                        "state": r.state,
                        "attempt": r.attempt,
                        "retry_of": r.retry_of,
                        "started_ns": r.started_ns,
                        "finished_ns": r.finished_ns,
                        "run_dir": r.run_dir,
                        "error": r.error,
                        "recovery": json.loads(r.recovery) if r.recovery else None,
                        "results": results[r.id],
                    }
                    for r in rows
                ],
                indent=2,
            )
        )
        return
    table = Table(title="history", title_justify="left")
    for col in ("id", "name", "state", "started", "finished", "results", "run dir", "note"):
        table.add_column(col)
    for r in rows:
        note = r.error or ""
        if r.retry_of:
            note = f"retry of {r.retry_of}; {note}".rstrip("; ")
        if r.missed_fires:
            note = f"{r.missed_fires} missed cron fire(s) merged; {note}".rstrip("; ")
        table.add_row(
            str(r.id),
            r.name,
            r.state,
            fmt_wall(r.started_ns),
            fmt_wall(r.finished_ns),
            headline_text(results[r.id]),
            r.run_dir or "",
            note,
        )
    out.print(table)


def register(app: typer.Typer) -> None:
    for command in (serve, submit, queue, cancel, history):
        app.command()(command)
