"""`labctl serve`: a queue of experiment runs in SQLite, started by priority, due date and cron schedule.

- The queue is a SQLite file in WAL mode. Inside `serve`, one writer task makes every state change in a
  short transaction; the CLI clients (`submit`, `cancel`) make single-statement inserts/updates, so no
  transaction ever waits on a run (the QCoDeS lock complaints came from long-lived writers).
- Each run declares what it touches: the OCS ports of its rails (every fiber of the rail, as
  `topology.rail_scope`) and the hosts of its plan. Runs on disjoint resources run at the same time.
- Order: priority (high first), then due time, then submission order. A run that waits for resources
  reserves them against every lower-priority run (conservative backfill, decision 0015), so a lower
  priority run never delays it; priority never preempts a running run.
- Every run executes in its own worker process through `labctl.controller.run_experiment`, the same path
  as `labctl run`. A crashed worker, or a `serve` killed while runs were going, leaves rows in `running`;
  the next `serve` (or the monitor of a crashed worker) re-applies the run's baseline through the
  inventory's switch drivers, records that in `recovery.jsonl`, marks the row `interrupted` and queues one
  retry (decision 0016).
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import fcntl
import importlib
import json
import logging
import os
import random
import re
import signal
import sqlite3
import sys
import time
from collections.abc import Awaitable, Callable, Iterable, Iterator
from dataclasses import dataclass
from datetime import datetime, tzinfo
from pathlib import Path
from typing import Any, Protocol, TypeVar

from labctl.errors import InputError, LabctlError

log = logging.getLogger("labctl.scheduler")

DEFAULT_DB = Path("labctl-queue.sqlite")
MAX_ATTEMPTS = 2  # an interrupted run is retried once, then left for a human
RECOVERY_EVENTS = "recovery.jsonl"

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

T = TypeVar("T")


# -- clocks ----------------------------------------------------------------------------------------------
class Clock(Protocol):
    """Wall-clock time for due dates and cron (users schedule in wall time); injectable for tests."""

    def wall_ns(self) -> int: ...


class SystemClock:
    def wall_ns(self) -> int:
        return time.time_ns()


# -- what a run touches ----------------------------------------------------------------------------------
@dataclass(frozen=True)
class Resources:
    """OCS ports (switch, port) and hosts a run holds exclusively while it runs."""

    ports: frozenset[tuple[str, int]]
    hosts: frozenset[str]

    def overlaps(self, other: Resources) -> bool:
        return bool(self.ports & other.ports) or bool(self.hosts & other.hosts)

    def to_json(self) -> dict[str, Any]:
        return {"ports": sorted([list(p) for p in self.ports]), "hosts": sorted(self.hosts)}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Resources:
        return cls(frozenset((str(s), int(p)) for s, p in data["ports"]), frozenset(data["hosts"]))

    @classmethod
    def union(cls, items: Iterable[Resources]) -> Resources:
        ports: set[tuple[str, int]] = set()
        hosts: set[str] = set()
        for r in items:
            ports |= r.ports
            hosts |= r.hosts
        return cls(frozenset(ports), frozenset(hosts))


@dataclass(frozen=True)
class Declaration:
    """What an experiment on an inventory will touch, and the baseline to restore if its run dies."""

    name: str
    resources: Resources
    baseline: dict[str, dict[str, list[Any]]]  # switch → {"mapping": [[in, out]...], "scope": [...]}


def declare(experiment: Path, inventory_path: Path) -> Declaration:
    """Validate the experiment against the inventory (InputError on bad input) and derive its resources."""
    from labctl.experiment import build_plan, load_experiment
    from labctl.labs import load
    from labctl.topology import rail_scope

    inventory = load(inventory_path)
    spec, src = load_experiment(experiment)
    plan = build_plan(spec, inventory, src)
    ports: set[tuple[str, int]] = set()
    mappings: dict[str, set[tuple[int, int]]] = {}
    scopes: dict[str, set[int]] = {}
    for rail, rp in plan.phases[spec.baseline].items():
        scope = rail_scope(inventory, rail)
        ports |= {(rp.switch, p) for p in scope}
        mappings.setdefault(rp.switch, set()).update(rp.mapping)
        scopes.setdefault(rp.switch, set()).update(scope)
    return Declaration(
        name=spec.name,
        resources=Resources(frozenset(ports), frozenset(plan.hosts)),
        baseline={
            sw: {"mapping": [[a, b] for a, b in sorted(mappings[sw])], "scope": sorted(scopes[sw])}
            for sw in mappings
        },
    )


# -- time parsing ----------------------------------------------------------------------------------------
_RELATIVE = re.compile(r"^\+(\d+(?:\.\d+)?)([smhd])$")
_UNIT_S = {"s": 1, "m": 60, "h": 3600, "d": 86400}
STOP_GRACE_S = 60.0  # a stopping run restores its baseline: one switch operation, well under a minute
_AT_HORIZON_NS = 10 * 366 * 86_400 * 10**9  # ten years: beyond that it is a typo (and overflows SQLite)


def parse_at(text: str, now_wall_ns: int) -> int:
    """`--at`: ISO 8601 (local time when no zone is given) or relative `+30s`, `+10m`, `+2h`, `+1d`."""
    m = _RELATIVE.match(text.strip())
    if m:
        at = now_wall_ns + round(float(m[1]) * _UNIT_S[m[2]] * 1e9)
    else:
        try:
            dt = datetime.fromisoformat(text.strip())
            if dt.tzinfo is None:
                dt = dt.astimezone()  # naive = local time
            at = round(dt.timestamp() * 1e9)
        except (ValueError, OverflowError, OSError):
            raise InputError(
                f"--at {text!r}: not a time; use ISO 8601 (2026-12-01T02:00, 2026-12-01 02:00+01:00) "
                "or a delay like +30s, +10m, +2h"
            ) from None
    if not 0 <= at - now_wall_ns <= _AT_HORIZON_NS:
        raise InputError(
            f"--at {text!r}: must be between now and {_AT_HORIZON_NS // 86_400_000_000_000} days ahead"
        )
    return at


def _croniter() -> Any:
    """croniter ships no type information (and its stubs are not a runtime dependency)."""
    return importlib.import_module("croniter").croniter


def validate_cron(expr: str) -> str:
    """Five fields only (croniter would read a sixth as seconds), and one that can actually fire."""
    croniter = _croniter()
    if len(expr.split()) != 5 or not croniter.is_valid(expr):
        raise InputError(f"--cron {expr!r}: not a cron expression (five fields: min hour day month weekday)")
    try:
        croniter(expr, datetime.now().astimezone()).get_next(datetime)
    except Exception:  # croniter's CroniterBadDateError and friends: e.g. '0 0 31 2 *' never fires
        raise InputError(f"--cron {expr!r}: never fires (no such date)") from None
    return expr


def next_fire_ns(expr: str, after_wall_ns: int, tz: tzinfo | None) -> int:
    """The first time strictly after `after_wall_ns` that `expr` fires, evaluated in `tz` (None: local)."""
    croniter = _croniter()
    base = datetime.fromtimestamp(after_wall_ns / 1e9, tz=tz or datetime.now().astimezone().tzinfo)
    nxt: datetime = croniter(expr, base).get_next(datetime)
    return round(nxt.timestamp() * 1e9)


def fmt_wall(ns: int | None) -> str:
    if ns is None:
        return "—"
    return datetime.fromtimestamp(ns / 1e9).astimezone().strftime("%Y-%m-%d %H:%M:%S")


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


class QueueStore:
    """The queue file. Clients and `serve` each open their own; every write is one short transaction."""

    def __init__(self, path: Path) -> None:
        self.path = Path(path)
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
        return queued


def pick(due: list[RunRow], running: list[RunRow]) -> list[RunRow]:
    """Which due runs to start now. `due` is in start order (priority, due time, submission).

    Conservative backfill: walking down the order, a run starts if its resources are free of every running
    run and of every run ahead of it that is still waiting; a waiting run reserves its resources against
    everything behind it. So a lower-priority run only ever uses resources no higher-priority run wants.
    """
    claimed = Resources.union(r.resources for r in running)
    start: list[RunRow] = []
    for row in due:
        if not row.resources.overlaps(claimed):
            start.append(row)
        claimed = Resources.union([claimed, row.resources])
    return start


# -- executing one run -----------------------------------------------------------------------------------
def _set_pdeathsig() -> None:
    """In the worker, before exec: get SIGTERM when `serve` dies, so the controller restores the baseline."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):  # not Linux: recovery on the next `serve` is the backstop
        pass


@dataclass
class WorkerResult:
    status: str
    error: str | None
    run_dir: str | None


class Executor(Protocol):
    """Starts one run and reports its outcome; the scheduler never knows how runs are carried out."""

    async def start(self, row: RunRow, on_started: Callable[[int, str | None], Awaitable[None]]) -> None: ...

    async def wait(self, run_id: int) -> WorkerResult: ...

    def stop(self, run_id: int) -> None:
        """Ask the run to stop (it restores its baseline)."""

    def kill(self, run_id: int) -> None:
        """Stop it now: the run ignored `stop` for too long (the next serve recovers its baseline)."""


class SubprocessExecutor:
    """One worker process per run: a crashing run (or a wedged driver) cannot take `serve` down."""

    def __init__(self, out_dir: Path, log_dir: Path, *, plots: bool = True) -> None:
        self.out_dir = out_dir
        self.log_dir = log_dir
        self.plots = plots
        self._procs: dict[int, asyncio.subprocess.Process] = {}
        self._readers: dict[int, asyncio.Task[WorkerResult]] = {}

    def _log_file(self, run_id: int) -> int:
        """The worker's stderr (tracebacks of a crashing run land here, not in serve's output)."""
        self.log_dir.mkdir(parents=True, exist_ok=True)
        return os.open(self.log_dir / f"run-{run_id}.log", os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)

    async def start(self, row: RunRow, on_started: Callable[[int, str | None], Awaitable[None]]) -> None:
        args = {
            "experiment": row.experiment,
            "inventory": row.inventory,
            "profile": row.profile,
            "out_dir": str(self.out_dir),
            "plots": self.plots,
            "run_id": row.id,
        }
        stderr = self._log_file(row.id)
        try:
            proc = await asyncio.create_subprocess_exec(
                sys.executable,
                "-m",
                "labctl.scheduler",
                "worker",
                json.dumps(args),
                stdout=asyncio.subprocess.PIPE,
                stderr=stderr,
                stdin=asyncio.subprocess.DEVNULL,
                preexec_fn=_set_pdeathsig,
            )
        finally:
            os.close(stderr)
        self._procs[row.id] = proc
        await on_started(proc.pid, None)
        self._readers[row.id] = asyncio.create_task(
            self._read(row.id, proc, on_started), name=f"run:{row.id}"
        )

    async def _read(
        self,
        run_id: int,
        proc: asyncio.subprocess.Process,
        on_started: Callable[[int, str | None], Awaitable[None]],
    ) -> WorkerResult:
        assert proc.stdout is not None
        final: dict[str, Any] | None = None
        run_dir: str | None = None
        async for line in proc.stdout:
            try:
                msg = json.loads(line)
            except json.JSONDecodeError:
                continue
            if msg.get("event") == "started":
                run_dir = msg.get("run_dir")
                await on_started(proc.pid, run_dir)
            elif msg.get("event") == "finished":
                final = msg
                run_dir = msg.get("run_dir") or run_dir
        code = await proc.wait()
        if final is None:
            return WorkerResult("crashed", f"worker exited with code {code} before reporting", run_dir)
        return WorkerResult(str(final["status"]), final.get("error"), run_dir)

    async def wait(self, run_id: int) -> WorkerResult:
        try:
            return await self._readers[run_id]
        finally:
            self._readers.pop(run_id, None)
            self._procs.pop(run_id, None)

    def stop(self, run_id: int) -> None:
        proc = self._procs.get(run_id)
        if proc is not None and proc.returncode is None:
            proc.send_signal(signal.SIGTERM)

    def kill(self, run_id: int) -> None:
        proc = self._procs.get(run_id)
        if proc is not None and proc.returncode is None:
            proc.kill()


async def _worker_main(args: dict[str, Any]) -> int:
    """The worker process: one `run_experiment`, reported as JSON lines on stdout."""
    from labctl.controller import NullProgress, run_experiment

    def say(**msg: Any) -> None:
        sys.stdout.write(json.dumps(msg) + "\n")
        sys.stdout.flush()

    class Progress(NullProgress):
        def started(self, run_dir: Path, total: int) -> None:
            say(event="started", run_dir=str(run_dir))

    loop = asyncio.get_running_loop()
    task = asyncio.ensure_future(
        run_experiment(
            Path(args["experiment"]),
            Path(args["inventory"]),
            profile=args.get("profile"),
            out_dir=Path(args["out_dir"]),
            progress=Progress(),
            plots=bool(args.get("plots", True)),
        )
    )
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, task.cancel)
    try:
        outcome = await task
    except asyncio.CancelledError:
        say(event="finished", status="aborted", error="stopped before the run started", run_dir=None)
        return 130
    except LabctlError as e:
        say(event="finished", status="failed", error=str(e), run_dir=None)
        return 1
    say(event="finished", status=outcome.status, error=outcome.error, run_dir=str(outcome.run_dir))
    return 0


# -- recovery --------------------------------------------------------------------------------------------
async def restore_baseline(row: RunRow, events_path: Path) -> dict[str, Any]:
    """Re-apply an interrupted run's baseline through the inventory's switch drivers (read back, verified),
    writing the driver events to `events_path`. Returns what the switches hold afterwards."""
    from labctl.clock import Timebase, now_ns
    from labctl.events import EventLog, Kind
    from labctl.labs import build_lab, load
    from labctl.labs.base import LabContext
    from labctl.sampling import ProbeSettings

    inventory = load(row.inventory)
    events = EventLog(events_path, Timebase.capture())
    events.emit(
        now_ns(), Kind.PHASE, "scheduler", "recovery", meta={"queue_id": row.id, "baseline": row.baseline}
    )
    lab = build_lab(
        LabContext(inventory, inventory.profile(row.profile), random.Random(), events.record, ProbeSettings())
    )
    held: dict[str, Any] = {}
    try:
        await lab.start()  # whatever the lab hosts for its switches (emulators) serves from here
        for switch, entry in row.baseline.items():
            sw = lab.switches[switch]
            await sw.connect()
            try:
                mapping = [(int(a), int(b)) for a, b in entry["mapping"]]
                await sw.apply(mapping, scope=entry["scope"], context={"recovery": row.id})
                got = await sw.get_mapping()
                scope = set(entry["scope"])
                held[switch] = sorted([a, b] for a, b in got.value if a in scope or b in scope)
            finally:
                await sw.close()
    finally:
        await lab.aclose()
        lab.close()
        events.close()
    return held


def _pid_alive(pid: int | None) -> bool:
    if pid is None:
        return False
    try:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        try:
            os.kill(pid, 0)
        except OSError:
            return False
        return True
    return b"labctl.scheduler" in cmdline and b"worker" in cmdline


# -- serve -----------------------------------------------------------------------------------------------
class Scheduler:
    """The `serve` engine. All database writes go through one writer task."""

    def __init__(
        self,
        db_path: Path,
        *,
        executor: Executor | None = None,
        out_dir: Path = Path("runs"),
        clock: Clock | None = None,
        tz: tzinfo | None = None,
        poll_s: float = 0.5,
        plots: bool = True,
    ) -> None:
        self.db_path = db_path
        self.store = QueueStore(db_path)
        self.out_dir = out_dir = out_dir.resolve()  # run_dir in the queue must not depend on serve's cwd
        self.executor: Executor = executor or SubprocessExecutor(
            out_dir, db_path.with_name(db_path.name + ".logs"), plots=plots
        )
        self.clock = clock or SystemClock()
        self.tz = tz
        self.poll_s = poll_s
        self._writes: asyncio.Queue[tuple[Callable[[], Any], asyncio.Future[Any]]] = asyncio.Queue()
        self._wake = asyncio.Event()
        self._monitors: dict[int, asyncio.Task[None]] = {}
        self._stopping_ids: set[int] = set()

    async def write(self, fn: Callable[[], T]) -> T:
        fut: asyncio.Future[T] = asyncio.get_running_loop().create_future()
        await self._writes.put((fn, fut))
        return await fut

    async def _writer(self) -> None:
        while True:
            fn, fut = await self._writes.get()
            try:
                result = fn()
            except Exception as e:
                if not fut.done():
                    fut.set_exception(e)
            else:
                if not fut.done():
                    fut.set_result(result)

    # -- recovery of rows left `running` -------------------------------------------------------------------
    async def recover(self, row: RunRow, reason: str) -> None:
        """Make a dead run's row consistent: wait for its worker to be gone, restore the baseline, mark it
        interrupted, update its run.json, queue a retry."""
        for _ in range(300):  # the worker may still be restoring the baseline itself (SIGTERM on our death)
            if not _pid_alive(row.pid):
                break
            await asyncio.sleep(0.1)
        else:
            assert row.pid is not None
            with contextlib.suppress(OSError):
                os.kill(row.pid, signal.SIGKILL)
        run_dir = Path(row.run_dir) if row.run_dir else None
        events_path = (
            run_dir / RECOVERY_EVENTS
            if run_dir and run_dir.is_dir()
            else self.out_dir / f"recovery-{row.id}.jsonl"
        )
        events_path.parent.mkdir(parents=True, exist_ok=True)
        try:
            held = await restore_baseline(row, events_path)
            recovery: dict[str, Any] = {"ok": True, "events": str(events_path), "held": held}
        except Exception as e:  # whatever broke, the row must still end consistent
            recovery = {"ok": False, "events": str(events_path), "error": f"{type(e).__name__}: {e}"}
            log.error("run %d: baseline NOT restored: %s", row.id, recovery["error"])
        if run_dir is not None and (run_dir / "run.json").is_file():
            from labctl.store import write_json_atomic

            try:
                meta = json.loads((run_dir / "run.json").read_text())
                if meta.get("status") == "running":
                    meta["status"] = "aborted"
                    meta["error"] = reason
                meta["recovery"] = {**recovery, "reason": reason}
                write_json_atomic(run_dir / "run.json", meta)
            except (OSError, ValueError) as e:
                log.error("run %d: cannot update %s: %s", row.id, run_dir / "run.json", e)
        now = self.clock.wall_ns()
        rec_json = json.dumps(recovery)

        def finish() -> int | None:
            self.store.transition(row.id, "interrupted", finished_ns=now, error=reason, recovery=rec_json)
            if row.attempt >= MAX_ATTEMPTS:
                return None
            return self.store.submit(
                Path(row.experiment),
                Path(row.inventory),
                Declaration(row.name, row.resources, row.baseline),
                now_ns=now,
                priority=row.priority,
                due_ns=row.due_ns,
                name=row.name,
                profile=row.profile,
                schedule_id=row.schedule_id,
                attempt=row.attempt + 1,
                retry_of=row.id,
            )

        retry = await self.write(finish)
        log.warning(
            "run %d interrupted (%s); baseline restored: %s; retry: %s", row.id, reason, recovery["ok"], retry
        )

    # -- running one row ------------------------------------------------------------------------------------
    async def _launch(self, row: RunRow) -> bool:
        started = self.clock.wall_ns()
        # Mark running before the worker exists: if serve dies in between, the next serve recovers the row.
        try:
            await self.write(lambda: self.store.transition(row.id, "running", started_ns=started, pid=None))
        except LabctlError as e:  # cancelled by a client since this pass read the queue: skip it
            log.info("run %d not started: %s", row.id, e)
            return False

        async def on_started(pid: int, run_dir: str | None) -> None:
            fields: dict[str, Any] = {"pid": pid}
            if run_dir is not None:
                fields["run_dir"] = run_dir
            await self.write(lambda: self.store.set_fields(row.id, **fields))

        try:
            await self.executor.start(row, on_started)
        except OSError as e:
            error = f"cannot start the worker: {e}"
            await self.write(
                lambda: self.store.transition(row.id, "failed", finished_ns=self.clock.wall_ns(), error=error)
            )
            return False
        self._monitors[row.id] = asyncio.create_task(self._monitor(row.id), name=f"monitor:{row.id}")
        return True

    async def _monitor(self, run_id: int) -> None:
        try:
            result = await self.executor.wait(run_id)
            now = self.clock.wall_ns()
            if result.status == "crashed":
                row = self.store.run(run_id)
                if result.run_dir and not row.run_dir:
                    await self.write(lambda: self.store.set_fields(run_id, run_dir=result.run_dir))
                    row = self.store.run(run_id)
                await self.recover(row, result.error or "worker crashed")
            else:
                state = result.status if result.status in TRANSITIONS["running"] else "failed"
                await self.write(
                    lambda: self.store.transition(
                        run_id, state, finished_ns=now, error=result.error, run_dir=result.run_dir
                    )
                )
        finally:
            self._monitors.pop(run_id, None)
            self._wake.set()

    async def step(self) -> list[int]:
        """One scheduling pass: fire cron schedules, stop cancelled runs, start what may start."""
        now = self.clock.wall_ns()
        await self.write(lambda: self.store.fire_schedules(now, self.tz))
        running = self.store.runs("state='running'")
        for row in running:
            if row.cancel_requested and row.id not in self._stopping_ids and row.id in self._monitors:
                self._stopping_ids.add(row.id)
                self.executor.stop(row.id)
        started = []
        for row in pick(self.store.due(now), running):
            if await self._launch(row):
                started.append(row.id)
        return started

    def idle(self) -> bool:
        return not self._monitors and not self.store.active() and not self.store.schedules()

    async def serve(self, *, exit_when_idle: bool = False, ready: Callable[[], None] | None = None) -> None:
        writer = asyncio.create_task(self._writer(), name="queue-writer")
        try:
            for row in self.store.runs("state='running'"):
                await self.recover(row, "interrupted: serve stopped while the run was going")
            if ready is not None:
                ready()
            while True:
                await self.step()
                if exit_when_idle and self.idle():
                    break
                self._wake.clear()
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._wake.wait(), self.poll_s)
        finally:
            # Stop our workers (each restores its baseline) and record how they ended.
            for run_id in list(self._monitors):
                self.executor.stop(run_id)
            monitors = list(self._monitors.values())
            if monitors:
                _, late = await asyncio.wait(monitors, timeout=STOP_GRACE_S)
                for run_id in [r for r, task in self._monitors.items() if task in late]:
                    log.error("run %d did not stop within %g s: killed", run_id, STOP_GRACE_S)
                    self.executor.kill(run_id)
                await asyncio.gather(*monitors, return_exceptions=True)
            writer.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await writer
            self.store.close()


@contextlib.contextmanager
def exclusive_serve(db: Path) -> Iterator[None]:
    """One `serve` per queue: a second one would take the first one's live runs for dead and recover them."""
    lock_path = db.with_name(db.name + ".serve.lock")
    try:
        fd = os.open(lock_path, os.O_CREAT | os.O_RDWR, 0o644)
    except OSError as e:
        raise InputError(f"{lock_path}: cannot create the serve lock: {e.strerror}") from None
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise InputError(f"{db}: another `labctl serve` is already running this queue") from None
        yield
    finally:
        os.close(fd)  # closing releases the lock


async def serve_main(db: Path, out_dir: Path, *, plots: bool, exit_when_idle: bool, poll_s: float) -> None:
    """`labctl serve`: runs until SIGINT/SIGTERM, then stops running runs (baselines restored) and exits."""
    with exclusive_serve(db):
        await _serve(db, out_dir, plots=plots, exit_when_idle=exit_when_idle, poll_s=poll_s)


async def _serve(db: Path, out_dir: Path, *, plots: bool, exit_when_idle: bool, poll_s: float) -> None:
    sched = Scheduler(db, out_dir=out_dir, plots=plots, poll_s=poll_s)
    loop = asyncio.get_running_loop()
    task = asyncio.ensure_future(sched.serve(exit_when_idle=exit_when_idle))
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, task.cancel)
    try:
        await task
    except asyncio.CancelledError:
        pass
    finally:
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.remove_signal_handler(sig)


if __name__ == "__main__" and len(sys.argv) == 3 and sys.argv[1] == "worker":
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr)
    sys.exit(asyncio.run(_worker_main(json.loads(sys.argv[2]))))
