"""The queue in SQL, written once for both backends with `?` placeholders (the PostgreSQL backend rewrites
them): submissions, reads, state changes, claims with their lease keys, schedules firing."""

from __future__ import annotations

import contextlib
import json
import logging
import math
import re
from collections import Counter
from collections.abc import Sequence
from datetime import tzinfo
from pathlib import Path
from typing import Any

from labctl.core.errors import InputError, LabctlError
from labctl.scheduler.plan import Declaration, Resources, declare, pick
from labctl.scheduler.store import TRANSITIONS, RunRow, ScheduleRow, ServeSlot
from labctl.scheduler.timing import next_fire_ns

log = logging.getLogger("labctl.scheduler")


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
