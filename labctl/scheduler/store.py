"""The queue's store interface and what it holds: `Store` (the one interface both backends give), the run
state machine, the rows.

- `QueueStore` (`store_sqlite`): a SQLite file in WAL mode, embedded, the default. One `serve` per file
  (`service.exclusive_serve`), so the serve that runs a queue holds every resource of its runs by itself.
- `PostgresStore` (`store_pg`, psycopg 3, the `[postgres]` extra): one queue several `serve`s share, on one
  or several machines. Runs are claimed with row locks (`FOR UPDATE SKIP LOCKED`) in the transaction that
  also takes their resource leases; a lease expires unless the serve holding it renews it (decision 0061).

Both are `SqlStore` (`store_sql`: the SQL they share). `labctl.scheduler.backends.open_store(db)` picks the
backend from `--db`/$LABCTL_QUEUE_DB (`location`): a `postgresql://` URL or a file path.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import tzinfo
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

from labctl.core.errors import LabctlError
from labctl.scheduler.plan import Declaration, Resources

DEFAULT_LEASE_S = 10.0
"""How long a resource lease lives without renewal (the serve holding it renews it every third of that)."""


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
