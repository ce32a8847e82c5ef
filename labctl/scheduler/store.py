"""The queue's store: one interface (`Store`), two backends. The rows, the run state machine, leases.

- `QueueStore` (here): a SQLite file in WAL mode, embedded, the default. One `serve` per file
  (`service.exclusive_serve`), so the serve that runs a queue holds every resource of its runs by itself.
- `PostgresStore` (`store_pg`, psycopg 3, the `[postgres]` extra): one queue several `serve`s share, on one
  or several machines. Runs are claimed with row locks (`FOR UPDATE SKIP LOCKED`) in the transaction that
  also takes their resource leases; a lease expires unless the serve holding it renews it (decision 0061).

`labctl.scheduler.backends.open_store(db)` picks the backend from `--db`/$LABCTL_QUEUE_DB: a `postgresql://`
URL or a file path.
The SQL both share is written once here with `?` placeholders (the PostgreSQL backend rewrites them).
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
import os
import re
import sqlite3
from collections import Counter
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from datetime import tzinfo
from pathlib import Path
from typing import Any, Protocol, runtime_checkable
from urllib.parse import urlsplit, urlunsplit

from labctl.core.errors import InputError, LabctlError
from labctl.scheduler.plan import Declaration, Resources, declare, pick
from labctl.scheduler.timing import next_fire_ns

log = logging.getLogger("labctl.scheduler")

QUEUE_DB_ENV = "LABCTL_QUEUE_DB"
LEGACY_DB = Path("labctl-queue.sqlite")  # where releases before 0.3 put it: in whatever directory serve ran
DEFAULT_LEASE_S = 10.0
"""How long a resource lease lives without renewal (the serve holding it renews it every third of that)."""


def default_queue_db() -> Path:
    """$LABCTL_QUEUE_DB, else $XDG_DATA_HOME/labctl/queue.sqlite (~/.local/share/labctl/queue.sqlite): one
    queue per user wherever labctl is started, never a stray file in a clone."""
    explicit = os.environ.get(QUEUE_DB_ENV)
    if explicit and not is_url(explicit):
        return Path(explicit)
    data_home = os.environ.get("XDG_DATA_HOME") or str(Path.home() / ".local" / "share")
    return Path(data_home) / "labctl" / "queue.sqlite"


def resolve_db(db: Path | None) -> Path:
    """The SQLite queue file to use (the default's folder is created)."""
    if db is not None:
        return Path(db)
    path = default_queue_db()
    path.parent.mkdir(parents=True, exist_ok=True)
    return path


# -- where the queue is: a file or a PostgreSQL URL --------------------------------------------------------
URL_SCHEMES = ("postgresql", "postgres")


def is_url(db: str | Path) -> bool:
    return isinstance(db, str) and re.match(r"^[A-Za-z][A-Za-z0-9+.-]*://", db) is not None


def mask_url(url: str) -> str:
    """The URL with its password (if any) replaced by ***: the only form a URL is printed or logged in."""
    try:
        parts = urlsplit(url)
        if parts.password is None:
            return url
        host = parts.hostname or ""
        netloc = f"{parts.username or ''}:***@{host}"
        if parts.port is not None:
            netloc += f":{parts.port}"
    except ValueError:
        return re.sub(r"(//[^:/@]*:)[^@]*@", r"\1***@", url)
    return urlunsplit((parts.scheme, netloc, parts.path, parts.query, parts.fragment))


def check_url(url: str, *, from_env: bool) -> str:
    """A `postgresql://user@host:port/db` URL, validated (InputError, exit 2, on a malformed one). A password
    belongs in $PGPASSWORD or ~/.pgpass (libpq reads both), not on a command line: one in --db is refused;
    one in $LABCTL_QUEUE_DB is accepted (the environment is where secrets live) and never shown."""
    shown = mask_url(url)
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError as e:
        raise InputError(f"--db {shown}: not a valid PostgreSQL URL ({e})") from None
    if parts.scheme not in URL_SCHEMES:
        raise InputError(
            f"--db {shown}: unknown scheme {parts.scheme!r}: "
            "use postgresql://USER@HOST:PORT/DB or a file path"
        )
    if not parts.hostname and "host=" not in parts.query:
        raise InputError(f"--db {shown}: no host: use postgresql://USER@HOST:PORT/DB")
    if not parts.path.strip("/"):
        raise InputError(f"--db {shown}: no database name: use postgresql://USER@HOST:PORT/DB")
    if port is not None and not 0 < port < 65536:
        raise InputError(f"--db {shown}: port {port} out of range")
    if parts.password is not None and not from_env:
        raise InputError(
            f"--db {shown}: a password on the command line is visible to every user of this machine: "
            "put it in $PGPASSWORD or ~/.pgpass (or the URL in $LABCTL_QUEUE_DB)"
        )
    return url


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


class StoreUnavailable(LabctlError):
    """The queue's server cannot be reached or gave up a transaction (a lost connection, a deadlock victim):
    `serve` says so and tries again at its next pass; a client exits with code 1."""


# -- rows ------------------------------------------------------------------------------------------------
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
    owner: str | None = None
    """The serve that runs (or last ran) it: `host:pid:token`."""

    @classmethod
    def from_sql(cls, r: Any) -> RunRow:
        d = dict(r)
        d["resources"] = Resources.from_json(json.loads(d["resources"]))
        d["baseline"] = json.loads(d["baseline"])
        d["cancel_requested"] = bool(d["cancel_requested"])
        return cls(**d)

    @property
    def owner_host(self) -> str | None:
        return self.owner.rsplit(":", 2)[0] if self.owner else None


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


@dataclass(frozen=True)
class ServeSlot:
    """A live serve of a shared queue, as a claim sees it: how many runs it may run at once (None: as many as
    the resources allow) and when it last claimed one (epoch seconds on the database's clock; None: never)."""

    owner: str
    max_runs: int | None
    last_claim: float | None


def freer_serve(others: Sequence[ServeSlot], load: Counter[str], mine: int, my_last: float) -> str | None:
    """Another live serve that should take the next due run instead of the claiming one: it has a free slot
    and runs fewer runs, or as many and has waited longer since its last claim (never claimed: longest).
    None when the claiming serve is (one of) the freest."""
    me = (mine, my_last)
    for other in others:
        n = load[other.owner]
        if other.max_runs is not None and n >= other.max_runs:
            continue
        if (n, -math.inf if other.last_claim is None else other.last_claim) < me:
            return other.owner
    return None


def resource_keys(resources: Resources) -> list[str]:
    """The lease keys of what a run holds: `host:<name>` and `port:<switch>/<port>` (an OCS port). Names are
    global to a queue: two labs that name the same switch or host share its keys (and so wait on each
    other); the run's own key `run:<id>` is added by the store."""
    keys = [f"host:{h}" for h in resources.hosts]
    keys += [f"port:{sw}/{p}" for sw, p in resources.ports]
    return sorted(keys)


# -- the interface -----------------------------------------------------------------------------------------
@runtime_checkable
class Store(Protocol):
    """What `serve` and the CLI clients need from a queue. Every write is one short transaction."""

    label: str
    """Where the queue is, safe to print (a file path, or a URL with its password masked)."""
    shared: bool
    """Whether several `serve`s may run this queue at once (PostgreSQL), or only one (SQLite)."""

    def close(self) -> None: ...

    # clients
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
    ) -> int: ...

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
    ) -> int: ...

    def cancel(self, ident: str) -> list[str]: ...

    # reads
    def runs(self, where: str = "TRUE", args: tuple[Any, ...] = (), order: str = "id") -> list[RunRow]: ...

    def run(self, run_id: int) -> RunRow: ...

    def schedules(self, enabled_only: bool = True) -> list[ScheduleRow]: ...

    def due(self, now_ns: int) -> list[RunRow]: ...

    def active(self) -> list[RunRow]: ...

    def leases(self) -> list[dict[str, Any]]: ...

    # serve
    def transition(self, run_id: int, new: str, **fields: Any) -> None: ...

    def set_fields(self, run_id: int, **fields: Any) -> None: ...

    def fire_schedules(self, now_ns: int, tz: tzinfo | None) -> list[int]: ...

    def claim(self, now_ns: int, owner: str, lease_s: float, max_runs: int | None = None) -> list[RunRow]:
        """Start what may start now: mark those runs `running` for `owner` and lease their resources, in one
        transaction. Returns the claimed rows (state still as read: `queued`). `owner` takes at most enough to
        be running `max_runs` (None: no limit), and on a shared queue none that a freer live serve
        (`register_serve`) should take instead (`freer_serve`): due runs go to whichever serve is free."""
        ...

    def register_serve(self, owner: str, max_runs: int | None, lease_s: float) -> None:
        """Say that serve `owner` lives (for `lease_s`) and runs at most `max_runs` runs at once, so that the
        other serves' claims leave it its share (shared queue; a no-op where one serve runs the queue)."""
        ...

    def unregister_serve(self, owner: str) -> None:
        """Serve `owner` stops: it takes no more runs."""
        ...

    def renew(self, owner: str, lease_s: float) -> set[int]:
        """Extend every lease `owner` holds; the ids of the runs it still holds (a missing one was taken)."""
        ...

    def finish(self, run_id: int, owner: str, state: str, **fields: Any) -> bool:
        """End `owner`'s run in `state` and release its leases; False when `owner` no longer holds it."""
        ...

    def orphans_at_start(self, owner: str, lease_s: float) -> list[RunRow]:
        """Runs left `running` that a starting serve must recover at once (only where one serve runs a queue),
        now held by `owner`."""
        ...

    def take_over_lost(self, owner: str, lease_s: float) -> list[RunRow]:
        """Runs whose serve stopped renewing their lease (it died), now held by `owner` for recovery. The rows
        as they were, so `owner` is still the dead serve."""
        ...

    def interrupt(
        self, row: RunRow, owner: str, *, now_ns: int, reason: str, recovery: str, retry: bool
    ) -> int | None:
        """Mark a recovered run interrupted, queue its retry (if `retry`), release its leases: one
        transaction. The retry's id, or None."""
        ...


# -- the SQL both backends share --------------------------------------------------------------------------
class SqlStore:
    """The queue in SQL. Subclasses supply the connection, transactions and the dialect's few differences."""

    label: str
    shared: bool = False
    LOCK_QUEUED = ""  # appended to the SELECT of due runs in `claim` (PostgreSQL: FOR UPDATE SKIP LOCKED)
    LOCK_ROW = ""  # appended to a SELECT that re-reads a row before changing it (PostgreSQL: FOR UPDATE)

    # -- dialect ------------------------------------------------------------------------------------------
    def _rows(self, sql: str, args: Sequence[Any] = ()) -> list[dict[str, Any]]:
        raise NotImplementedError

    def _exec(self, sql: str, args: Sequence[Any] = ()) -> int:
        """Run one statement; the number of rows it changed."""
        raise NotImplementedError

    def tx(self) -> contextlib.AbstractContextManager[Any]:
        raise NotImplementedError

    def _serialize_claims(self) -> None:
        """Inside `claim`'s transaction: wait for any other serve's claim to commit first."""

    def _take_leases(self, run_id: int, keys: list[str], owner: str, lease_s: float) -> bool:
        """Inside `claim`'s transaction: lease `keys` (and `run:<id>`) to `owner`; False if one is held."""
        return True

    def _held_keys(self) -> set[str]:
        return set()

    def _live_serves(self) -> list[ServeSlot]:
        """Inside `claim`'s transaction: the serves registered and alive (shared queue only)."""
        return []

    def _claimed_by(self, owner: str) -> None:
        """Inside `claim`'s transaction: remember that `owner` claimed a run now."""

    def register_serve(self, owner: str, max_runs: int | None, lease_s: float) -> None:
        pass

    def unregister_serve(self, owner: str) -> None:
        pass

    def _release(self, run_id: int) -> None:
        """Inside the transaction that ends a run: drop its leases."""

    def _insert(self, sql: str, args: Sequence[Any]) -> int:
        [row] = self._rows(sql + " RETURNING id", args)
        return int(row["id"])

    def close(self) -> None:
        raise NotImplementedError

    # -- client side --------------------------------------------------------------------------------------
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
        with self.tx():
            return self._insert(
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
        with self.tx():
            return self._insert(
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

    def cancel(self, ident: str) -> list[str]:
        """Cancel by run id (`12`), schedule id (`c3`) or name. Queued runs are cancelled at once; running
        ones are flagged and the `serve` running them stops them (the controller restores the baseline)."""
        done: list[str] = []
        with self.tx():
            if re.fullmatch(r"[cC][0-9]+", ident):
                rows = self._rows(
                    "SELECT enabled FROM schedules WHERE id=?" + self.LOCK_ROW, (int(ident[1:]),)
                )
                if rows:
                    self._exec("UPDATE schedules SET enabled=0 WHERE id=?", (int(ident[1:]),))
                    done.append(
                        f"schedule {ident} {'disabled' if rows[0]['enabled'] else 'already disabled'}"
                    )
                return done
            if re.fullmatch(r"[0-9]+", ident):
                rows = self._rows("SELECT id, state FROM runs WHERE id=?" + self.LOCK_ROW, (int(ident),))
            else:
                rows = self._rows(
                    "SELECT id, state FROM runs WHERE name=? AND state IN ('queued','running')"
                    + self.LOCK_ROW,
                    (ident,),
                )
                n = self._exec("UPDATE schedules SET enabled=0 WHERE name=? AND enabled=1", (ident,))
                if n:
                    done.append(f"{n} schedule(s) named {ident!r} disabled")
            for r in rows:
                if r["state"] == "queued":
                    self._exec("UPDATE runs SET state='cancelled' WHERE id=? AND state='queued'", (r["id"],))
                    done.append(f"run {r['id']} cancelled")
                elif r["state"] == "running":
                    self._exec("UPDATE runs SET cancel_requested=1 WHERE id=?", (r["id"],))
                    done.append(f"run {r['id']} is running: asked serve to stop it")
                else:
                    done.append(f"run {r['id']} already {r['state']}")
        return done

    # -- reads --------------------------------------------------------------------------------------------
    def runs(self, where: str = "TRUE", args: tuple[Any, ...] = (), order: str = "id") -> list[RunRow]:
        rows = self._rows(f"SELECT * FROM runs WHERE {where} ORDER BY {order}", args)
        return [RunRow.from_sql(r) for r in rows]

    def run(self, run_id: int) -> RunRow:
        rows = self.runs("id=?", (run_id,))
        if not rows:
            raise InputError(f"{self.label}: no run with id {run_id}")
        return rows[0]

    def schedules(self, enabled_only: bool = True) -> list[ScheduleRow]:
        where = "enabled=1" if enabled_only else "TRUE"
        rows = self._rows(f"SELECT * FROM schedules WHERE {where} ORDER BY id")
        return [ScheduleRow(**{**r, "enabled": bool(r["enabled"])}) for r in rows]

    def due(self, now_ns: int) -> list[RunRow]:
        """Queued runs whose due time has come, in start order: priority, due time, submission."""
        return self.runs("state='queued' AND due_ns<=?", (now_ns,), "priority DESC, due_ns, id")

    def active(self) -> list[RunRow]:
        return self.runs("state IN ('queued','running')", (), "priority DESC, due_ns, id")

    def leases(self) -> list[dict[str, Any]]:
        return []

    # -- serve side -------------------------------------------------------------------------------------
    def transition(self, run_id: int, new: str, **fields: Any) -> None:
        with self.tx():
            rows = self._rows("SELECT state FROM runs WHERE id=?" + self.LOCK_ROW, (run_id,))
            if not rows:
                raise LabctlError(f"queue: run {run_id} vanished")
            old = rows[0]["state"]
            if new not in TRANSITIONS[old]:
                raise LabctlError(f"queue: run {run_id} cannot go from {old} to {new}")
            cols = ", ".join(f"{k}=?" for k in ("state", *fields))
            self._exec(f"UPDATE runs SET {cols} WHERE id=?", (new, *fields.values(), run_id))

    def set_fields(self, run_id: int, **fields: Any) -> None:
        with self.tx():
            cols = ", ".join(f"{k}=?" for k in fields)
            self._exec(f"UPDATE runs SET {cols} WHERE id=?", (*fields.values(), run_id))

    def claim(self, now_ns: int, owner: str, lease_s: float, max_runs: int | None = None) -> list[RunRow]:
        claimed: list[RunRow] = []
        with self.tx():
            self._serialize_claims()
            running = self.runs("state='running'")
            load = Counter(r.owner for r in running if r.owner)
            mine = load[owner]
            if max_runs is not None and mine >= max_runs:
                return []  # no free slot: the due runs are left to a serve that has one
            live = self._live_serves()
            others = [s for s in live if s.owner != owner]
            my_last = next((s.last_claim for s in live if s.owner == owner), None)
            # PostgreSQL: the due rows locked (SKIP LOCKED: a row another transaction holds is not waited for)
            due = self._due_locked(now_ns) if self.LOCK_QUEUED else self.due(now_ns)
            held = self._held_keys()
            for row in pick(due, running):
                if max_runs is not None and mine >= max_runs:
                    break
                freer = freer_serve(others, load, mine, -math.inf if my_last is None else my_last)
                if freer is not None:
                    log.debug(
                        "run %d left to serve %s (it is freer)",
                        row.id,
                        freer,
                        extra={"run_id": row.id, "serve": freer},
                    )
                    break
                keys = resource_keys(row.resources)
                if held.intersection(keys):  # leased by a run still being recovered
                    continue
                # Conditional: a client may have cancelled it since it was read.
                if not self._exec(
                    "UPDATE runs SET state='running', started_ns=?, owner=?, pid=NULL "
                    "WHERE id=? AND state='queued'",
                    (now_ns, owner, row.id),
                ):
                    log.info("run %d not started: no longer queued", row.id, extra={"run_id": row.id})
                    continue
                if not self._take_leases(row.id, keys, owner, lease_s):
                    raise LabctlError(f"queue: run {row.id}: a lease was taken under the claim lock")
                held.update(keys)
                claimed.append(row)
                mine += 1
                my_last = math.inf  # just now: later than any other serve's last claim
            if claimed:
                self._claimed_by(owner)
        return claimed

    def _due_locked(self, now_ns: int) -> list[RunRow]:
        rows = self._rows(
            "SELECT * FROM runs WHERE state='queued' AND due_ns<=? ORDER BY priority DESC, due_ns, id"
            + self.LOCK_QUEUED,
            (now_ns,),
        )
        return [RunRow.from_sql(r) for r in rows]

    def renew(self, owner: str, lease_s: float) -> set[int]:
        return {
            int(r["id"])
            for r in self._rows("SELECT id FROM runs WHERE state='running' AND owner=?", (owner,))
        }

    def finish(self, run_id: int, owner: str, state: str, **fields: Any) -> bool:
        if state not in TRANSITIONS["running"]:
            raise LabctlError(f"queue: run {run_id} cannot go from running to {state}")
        cols = ", ".join(f"{k}=?" for k in ("state", *fields))
        with self.tx():
            n = self._exec(
                f"UPDATE runs SET {cols} WHERE id=? AND state='running' AND owner=?",
                (state, *fields.values(), run_id, owner),
            )
            if n:
                self._release(run_id)
        return bool(n)

    def orphans_at_start(self, owner: str, lease_s: float) -> list[RunRow]:
        return []

    def take_over_lost(self, owner: str, lease_s: float) -> list[RunRow]:
        return []

    def interrupt(
        self, row: RunRow, owner: str, *, now_ns: int, reason: str, recovery: str, retry: bool
    ) -> int | None:
        with self.tx():
            n = self._exec(
                "UPDATE runs SET state='interrupted', finished_ns=?, error=?, recovery=? "
                "WHERE id=? AND state='running' AND owner=?",
                (now_ns, reason, recovery, row.id, owner),
            )
            if not n:
                raise LabctlError(f"queue: run {row.id} is no longer held by this serve")
            self._release(row.id)
            if not retry:
                return None
            return self.submit(
                Path(row.experiment),
                Path(row.inventory),
                Declaration(row.name, row.resources, row.baseline),
                now_ns=now_ns,
                priority=row.priority,
                due_ns=row.due_ns,
                name=row.name,
                profile=row.profile,
                schedule_id=row.schedule_id,
                attempt=row.attempt + 1,
                retry_of=row.id,
            )

    def fire_schedules(self, now_ns: int, tz: tzinfo | None) -> list[int]:
        """Queue one run per schedule whose fire time has come. Fire times missed while `serve` was down
        collapse into that one run (its `missed_fires` says how many), like anacron: nothing is lost
        silently and a long outage does not flood the queue. With several serves, the one whose transaction
        advances the schedule first queues the run; the others find it advanced and skip it."""
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
            with self.tx():
                if not self._exec(
                    "UPDATE schedules SET next_fire_ns=? WHERE id=? AND next_fire_ns=? AND enabled=1",
                    (nxt, sched.id, sched.next_fire_ns),
                ):
                    continue  # another serve fired it, or a client disabled it, since it was read
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


# -- SQLite ------------------------------------------------------------------------------------------------
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
    recovery TEXT,
    owner TEXT
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


class QueueStore(SqlStore):
    """The queue in a SQLite file (WAL). Clients and `serve` each open their own connection; one `serve` per
    file (service.exclusive_serve), so leases are implicit: the one serve holds what its runs hold."""

    shared = False

    def __init__(self, path: Path | None = None) -> None:
        self.path = resolve_db(path)
        self.label = str(self.path)
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
            columns = {r["name"] for r in self.db.execute("PRAGMA table_info(runs)")}
            if "owner" not in columns:  # a queue from before the shared queue (decision 0061)
                self.db.execute("ALTER TABLE runs ADD COLUMN owner TEXT")
        except sqlite3.DatabaseError as e:
            self.db.close()
            raise InputError(f"{self.path}: not a labctl queue database ({e})") from None

    def close(self) -> None:
        self.db.close()

    def _rows(self, sql: str, args: Sequence[Any] = ()) -> list[dict[str, Any]]:
        return [dict(r) for r in self.db.execute(sql, tuple(args)).fetchall()]

    def _exec(self, sql: str, args: Sequence[Any] = ()) -> int:
        return self.db.execute(sql, tuple(args)).rowcount

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

    def orphans_at_start(self, owner: str, lease_s: float) -> list[RunRow]:
        """Every row still `running`: with one serve per file, its serve is gone."""
        with self.tx():
            rows = self.runs("state='running'")
            self._exec("UPDATE runs SET owner=? WHERE state='running'", (owner,))
        return rows
