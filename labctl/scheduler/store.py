"""The queue on disk: a SQLite file in WAL mode, its rows, and the run state machine."""

from __future__ import annotations

import contextlib
import json
import logging
import os
import re
import sqlite3
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import tzinfo
from pathlib import Path
from typing import Any

from labctl.core.errors import InputError, LabctlError
from labctl.scheduler.plan import Declaration, Resources, declare
from labctl.scheduler.timing import next_fire_ns

log = logging.getLogger("labctl.scheduler")

QUEUE_DB_ENV = "LABCTL_QUEUE_DB"
LEGACY_DB = Path("labctl-queue.sqlite")  # where releases before 0.3 put it: in whatever directory serve ran


def default_queue_db() -> Path:
    """$LABCTL_QUEUE_DB, else $XDG_DATA_HOME/labctl/queue.sqlite (~/.local/share/labctl/queue.sqlite): one
    queue per user wherever labctl is started, never a stray file in a clone."""
    explicit = os.environ.get(QUEUE_DB_ENV)
    if explicit:
        return Path(explicit)
    data_home = os.environ.get("XDG_DATA_HOME") or str(Path.home() / ".local" / "share")
    return Path(data_home) / "labctl" / "queue.sqlite"


def resolve_db(db: Path | None) -> Path:
    """The queue database to use (the default's folder is created)."""
    if db is not None:
        return Path(db)
    path = default_queue_db()
    path.parent.mkdir(parents=True, exist_ok=True)
    return path


# The run state machine as data: every transition the scheduler makes is checked against it.
TRANSITIONS: dict[str, frozenset[str]] = {
    "queued": frozenset({"running", "cancelled"}),
    "running": frozenset({"completed", "failed", "aborted", "interrupted"}),
    "completed": frozenset(),
    "failed": frozenset(),
    "aborted": frozenset(),
    "cancelled": frozenset(),
    "interrupted": frozenset(),
}
ACTIVE = ("queued", "running")


# -- the queue on disk -----------------------------------------------------------------------------------
SCHEMA = """
CREATE TABLE IF NOT EXISTS runs (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    name TEXT NOT NULL,
    experiment TEXT NOT NULL,
    inventory TEXT NOT NULL,
    profile TEXT,
    priority INTEGER NOT NULL DEFAULT 0,
    due_ns INTEGER NOT NULL,
    submitted_ns INTEGER NOT NULL,
    state TEXT NOT NULL DEFAULT 'queued',
    resources TEXT NOT NULL,
    baseline TEXT NOT NULL,
    schedule_id INTEGER,
    missed_fires INTEGER NOT NULL DEFAULT 0,
    attempt INTEGER NOT NULL DEFAULT 1,
    retry_of INTEGER,
    cancel_requested INTEGER NOT NULL DEFAULT 0,
    pid INTEGER,
    started_ns INTEGER,
    finished_ns INTEGER,
    run_dir TEXT,
    error TEXT,
    recovery TEXT
);
CREATE INDEX IF NOT EXISTS runs_state ON runs(state);
CREATE TABLE IF NOT EXISTS schedules (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    name TEXT NOT NULL,
    experiment TEXT NOT NULL,
    inventory TEXT NOT NULL,
    profile TEXT,
    priority INTEGER NOT NULL DEFAULT 0,
    cron TEXT NOT NULL,
    next_fire_ns INTEGER NOT NULL,
    enabled INTEGER NOT NULL DEFAULT 1,
    created_ns INTEGER NOT NULL
);
"""


@dataclass(frozen=True)
class RunRow:
    id: int
    name: str
    experiment: str
    inventory: str
    profile: str | None
    priority: int
    due_ns: int
    submitted_ns: int
    state: str
    resources: Resources
    baseline: dict[str, dict[str, list[Any]]]
    schedule_id: int | None
    missed_fires: int
    attempt: int
    retry_of: int | None
    cancel_requested: bool
    pid: int | None
    started_ns: int | None
    finished_ns: int | None
    run_dir: str | None
    error: str | None
    recovery: str | None

    @classmethod
    def from_sql(cls, r: sqlite3.Row) -> RunRow:
        d = dict(r)
        d["resources"] = Resources.from_json(json.loads(d["resources"]))
        d["baseline"] = json.loads(d["baseline"])
        d["cancel_requested"] = bool(d["cancel_requested"])
        return cls(**d)


@dataclass(frozen=True)
class ScheduleRow:
    id: int
    name: str
    experiment: str
    inventory: str
    profile: str | None
    priority: int
    cron: str
    next_fire_ns: int
    enabled: bool
    created_ns: int


def _check_writable(path: Path) -> None:
    """SQLite would say 'attempt to write a readonly database' much later: say whose file it is, now."""
    target = path if path.exists() else path.parent
    if not os.access(target, os.W_OK) or (path.exists() and not os.access(path.parent, os.W_OK)):
        try:
            owner = f"belongs to uid {target.stat().st_uid}"
        except OSError:
            owner = "cannot be read"
        raise InputError(
            f"{path}: no write permission on the queue database (it {owner}, you are uid {os.geteuid()}): "
            "run labctl as its owner, or pass --db"
        )


class QueueStore:
    """The queue file. Clients and `serve` each open their own; every write is one short transaction."""

    def __init__(self, path: Path | None = None) -> None:
        self.path = resolve_db(path)
        _check_writable(self.path)
        try:
            self.db = sqlite3.connect(self.path, timeout=10.0, isolation_level=None)
        except sqlite3.Error as e:
            raise InputError(f"{self.path}: cannot open the queue database: {e}") from None
        self.db.row_factory = sqlite3.Row
        try:
            self.db.execute("PRAGMA journal_mode=WAL")
            self.db.execute("PRAGMA synchronous=NORMAL")
            self.db.executescript(SCHEMA)
        except sqlite3.DatabaseError as e:
            self.db.close()
            raise InputError(f"{self.path}: not a labctl queue database ({e})") from None

    def close(self) -> None:
        self.db.close()

    @contextlib.contextmanager
    def tx(self) -> Iterator[sqlite3.Connection]:
        """One short write transaction; BEGIN IMMEDIATE takes the write lock first (no upgrade deadlock).
        Nested use joins the transaction already open, so several writes can commit together."""
        if self.db.in_transaction:
            yield self.db
            return
        self.db.execute("BEGIN IMMEDIATE")
        try:
            yield self.db
        except BaseException:
            self.db.execute("ROLLBACK")
            raise
        self.db.execute("COMMIT")

    # -- client side ----------------------------------------------------------------------------------------
    def submit(
        self,
        experiment: Path,
        inventory: Path,
        decl: Declaration,
        *,
        now_ns: int,
        priority: int = 0,
        due_ns: int | None = None,
        name: str | None = None,
        profile: str | None = None,
        schedule_id: int | None = None,
        missed_fires: int = 0,
        attempt: int = 1,
        retry_of: int | None = None,
    ) -> int:
        with self.tx() as db:
            cur = db.execute(
                "INSERT INTO runs (name, experiment, inventory, profile, priority, due_ns, submitted_ns, "
                "resources, baseline, schedule_id, missed_fires, attempt, retry_of) "
                "VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?)",
                (
                    name or decl.name,
                    str(Path(experiment).resolve()),
                    str(Path(inventory).resolve()),
                    profile,
                    priority,
                    due_ns if due_ns is not None else now_ns,
                    now_ns,
                    json.dumps(decl.resources.to_json()),
                    json.dumps(decl.baseline),
                    schedule_id,
                    missed_fires,
                    attempt,
                    retry_of,
                ),
            )
            assert cur.lastrowid is not None
            return cur.lastrowid

    def add_schedule(
        self,
        experiment: Path,
        inventory: Path,
        name: str,
        cron: str,
        *,
        now_ns: int,
        tz: tzinfo | None = None,
        priority: int = 0,
        profile: str | None = None,
    ) -> int:
        with self.tx() as db:
            cur = db.execute(
                "INSERT INTO schedules (name, experiment, inventory, profile, priority, cron, next_fire_ns, "
                "created_ns) VALUES (?,?,?,?,?,?,?,?)",
                (
                    name,
                    str(Path(experiment).resolve()),
                    str(Path(inventory).resolve()),
                    profile,
                    priority,
                    cron,
                    next_fire_ns(cron, now_ns, tz),
                    now_ns,
                ),
            )
            assert cur.lastrowid is not None
            return cur.lastrowid

    def cancel(self, ident: str) -> list[str]:
        """Cancel by run id (`12`), schedule id (`c3`) or name. Queued runs are cancelled at once; running
        ones are flagged and `serve` stops them (the controller restores the baseline). Says what it did."""
        done: list[str] = []
        with self.tx() as db:
            if re.fullmatch(r"[cC]\d+", ident):
                row = db.execute("SELECT enabled FROM schedules WHERE id=?", (int(ident[1:]),)).fetchone()
                if row is not None:
                    db.execute("UPDATE schedules SET enabled=0 WHERE id=?", (int(ident[1:]),))
                    done.append(f"schedule {ident} {'disabled' if row['enabled'] else 'already disabled'}")
                return done
            if re.fullmatch(r"[0-9]+", ident):
                rows = db.execute("SELECT id, state FROM runs WHERE id=?", (int(ident),)).fetchall()
            else:
                rows = db.execute(
                    "SELECT id, state FROM runs WHERE name=? AND state IN ('queued','running')", (ident,)
                ).fetchall()
                n = db.execute("UPDATE schedules SET enabled=0 WHERE name=? AND enabled=1", (ident,))
                if n.rowcount:
                    done.append(f"{n.rowcount} schedule(s) named {ident!r} disabled")
            for r in rows:
                if r["state"] == "queued":
                    db.execute("UPDATE runs SET state='cancelled' WHERE id=? AND state='queued'", (r["id"],))
                    done.append(f"run {r['id']} cancelled")
                elif r["state"] == "running":
                    db.execute("UPDATE runs SET cancel_requested=1 WHERE id=?", (r["id"],))
                    done.append(f"run {r['id']} is running: asked serve to stop it")
                else:
                    done.append(f"run {r['id']} already {r['state']}")
        return done

    # -- reads ----------------------------------------------------------------------------------------------
    def runs(self, where: str = "1", args: tuple[Any, ...] = (), order: str = "id") -> list[RunRow]:
        rows = self.db.execute(f"SELECT * FROM runs WHERE {where} ORDER BY {order}", args).fetchall()
        return [RunRow.from_sql(r) for r in rows]

    def run(self, run_id: int) -> RunRow:
        rows = self.runs("id=?", (run_id,))
        if not rows:
            raise InputError(f"{self.path}: no run with id {run_id}")
        return rows[0]

    def schedules(self, enabled_only: bool = True) -> list[ScheduleRow]:
        where = "enabled=1" if enabled_only else "1"
        rows = self.db.execute(f"SELECT * FROM schedules WHERE {where} ORDER BY id").fetchall()
        return [ScheduleRow(**{**dict(r), "enabled": bool(r["enabled"])}) for r in rows]

    def due(self, now_ns: int) -> list[RunRow]:
        """Queued runs whose due time has come, in start order: priority, due time, submission."""
        return self.runs("state='queued' AND due_ns<=?", (now_ns,), "priority DESC, due_ns, id")

    def active(self) -> list[RunRow]:
        return self.runs("state IN ('queued','running')", (), "priority DESC, due_ns, id")

    # -- serve side (called only from the writer task) ------------------------------------------------------
    def transition(self, run_id: int, new: str, **fields: Any) -> None:
        with self.tx() as db:
            row = db.execute("SELECT state FROM runs WHERE id=?", (run_id,)).fetchone()
            if row is None:
                raise LabctlError(f"queue: run {run_id} vanished")
            old = row["state"]
            if new not in TRANSITIONS[old]:
                raise LabctlError(f"queue: run {run_id} cannot go from {old} to {new}")
            cols = ", ".join(f"{k}=?" for k in ("state", *fields))
            db.execute(f"UPDATE runs SET {cols} WHERE id=?", (new, *fields.values(), run_id))

    def set_fields(self, run_id: int, **fields: Any) -> None:
        with self.tx() as db:
            cols = ", ".join(f"{k}=?" for k in fields)
            db.execute(f"UPDATE runs SET {cols} WHERE id=?", (*fields.values(), run_id))

    def fire_schedules(self, now_ns: int, tz: tzinfo | None) -> list[int]:
        """Queue one run per schedule whose fire time has come. Fire times missed while `serve` was down
        collapse into that one run (its `missed_fires` says how many), like anacron: nothing is lost
        silently and a long outage does not flood the queue."""
        queued: list[int] = []
        for sched in self.schedules():
            if sched.next_fire_ns > now_ns:
                continue
            fire = sched.next_fire_ns
            missed = 0
            nxt = next_fire_ns(sched.cron, fire, tz)
            while nxt <= now_ns:
                missed += 1
                fire, nxt = nxt, next_fire_ns(sched.cron, nxt, tz)
            try:
                decl = declare(Path(sched.experiment), Path(sched.inventory))
                error = None
            except InputError as e:
                decl, error = None, str(e)
            # Advancing the schedule and queueing its run commit together: a crash between the two
            # would otherwise lose this fire.
            with self.tx() as db:
                db.execute("UPDATE schedules SET next_fire_ns=? WHERE id=?", (nxt, sched.id))
                if decl is None:
                    log.error("schedule c%d (%s): not queued: %s", sched.id, sched.name, error)
                    continue
                queued.append(
                    self.submit(
                        Path(sched.experiment),
                        Path(sched.inventory),
                        decl,
                        now_ns=now_ns,
                        priority=sched.priority,
                        due_ns=fire,
                        name=sched.name,
                        profile=sched.profile,
                        schedule_id=sched.id,
                        missed_fires=missed,
                    )
                )
            log.info(
                "schedule c%d (%s) fired: run %d queued%s",
                sched.id,
                sched.name,
                queued[-1],
                f" ({missed} missed fire(s) folded in)" if missed else "",
                extra={
                    "schedule_id": sched.id,
                    "schedule": sched.name,
                    "run_id": queued[-1],
                    "missed_fires": missed,
                },
            )
        return queued
