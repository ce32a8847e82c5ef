"""The `serve` engine: one writer task for the queue, runs started by `plan.pick` and watched, leases renewed;
crashed runs are recovered by its `crash_recovery` part."""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import logging
import os
import secrets
import signal
import socket
from collections.abc import Callable, Iterator
from datetime import tzinfo
from pathlib import Path
from typing import Any, TypeVar

from labctl.core.errors import InputError, LabctlError
from labctl.scheduler.backends import open_store
from labctl.scheduler.crash_recovery import RunRecovery
from labctl.scheduler.results import headline, headline_text
from labctl.scheduler.store import (
    DEFAULT_LEASE_S,
    TRANSITIONS,
    RunRow,
    Store,
    StoreUnavailable,
)
from labctl.scheduler.store_sqlite import QueueStore
from labctl.scheduler.timing import Clock, SystemClock
from labctl.scheduler.worker import Executor, SubprocessExecutor

log = logging.getLogger("labctl.scheduler")

STOP_GRACE_S = 60.0  # a stopping run restores its baseline: one switch operation, well under a minute
OUTAGE_RETRY_MAX_S = (
    5.0  # while the queue's database is out of reach, a pass is retried at most this far apart
)

T = TypeVar("T")


class Outage:
    """The queue's database out of this serve's reach: one log line when that starts (what failed, which
    database, that the serve keeps retrying) and one when it ends (how long it lasted), whatever number of
    passes and lease renewals failed in between. The passes meanwhile back off, doubling up to
    `OUTAGE_RETRY_MAX_S` apart."""

    def __init__(self, db_label: str) -> None:
        self.db_label = db_label
        self.since: float | None = None  # loop time of the first failure
        self.failures = 0

    def failed(self, error: StoreUnavailable, now: float, retry_s: float) -> None:
        self.failures += 1
        if self.since is not None:
            return
        self.since = now
        log.warning(
            "queue database out of reach: %s; this serve keeps retrying (at most %g s apart) and logs "
            "when it is back",
            error,
            max(retry_s, OUTAGE_RETRY_MAX_S),
            extra={"db": self.db_label, "outage": "started", "error": str(error)},
        )

    def ended(self, now: float) -> None:
        if self.since is None:
            return
        lasted = now - self.since
        log.warning(
            "queue database %s reachable again: the outage lasted %.1f s (%d failed attempt(s))",
            self.db_label,
            lasted,
            self.failures,
            extra={
                "db": self.db_label,
                "outage": "ended",
                "outage_s": round(lasted, 3),
                "failures": self.failures,
            },
        )
        self.since = None
        self.failures = 0

    def retry_in(self, poll_s: float) -> float:
        """How long the next pass waits: the poll, doubled per failed attempt up to OUTAGE_RETRY_MAX_S."""
        if self.since is None:
            return poll_s
        backoff: float = poll_s * 2.0 ** min(self.failures - 1, 16)
        return min(backoff, max(poll_s, OUTAGE_RETRY_MAX_S))


def _owner_id() -> str:
    """This serve as a lease holder: `host:pid:token` (the token tells a restarted serve with the same pid
    from the one before it)."""
    return f"{socket.gethostname()}:{os.getpid()}:{secrets.token_hex(4)}"


class Scheduler(RunRecovery):
    """The `serve` engine. All database writes go through one writer task.

    On a shared queue (PostgreSQL) a heartbeat task renews the leases of this serve's runs every third of
    `lease_s`, and each pass takes over the runs of serves that stopped renewing theirs (recovered as a
    crashed run is: baseline restored, `interrupted`, one retry).

    `max_runs` is how many runs this serve runs at once (None: as many as the lab's resources allow). A serve
    with no free slot claims nothing, and on a shared queue a serve leaves a due run to a freer live serve
    (fewer runs, or as many and a longer wait since its last claim): runs spread over the serves."""

    def __init__(
        self,
        db: Path | str | Store,
        *,
        executor: Executor | None = None,
        out_dir: Path = Path("runs"),
        clock: Clock | None = None,
        tz: tzinfo | None = None,
        poll_s: float = 0.5,
        plots: bool = True,
        lease_s: float = DEFAULT_LEASE_S,
        max_runs: int | None = None,
    ) -> None:
        if max_runs is not None and max_runs < 1:
            raise InputError(f"max_runs must be at least 1, not {max_runs}")
        self.store: Store = open_store(db) if isinstance(db, str | Path) else db
        self.db_label = self.store.label
        self.out_dir = out_dir = out_dir.resolve()  # run_dir in the queue must not depend on serve's cwd
        if isinstance(self.store, QueueStore):
            log_dir = self.store.path.with_name(self.store.path.name + ".logs")
        else:
            log_dir = out_dir.with_name(out_dir.name + ".logs")
        self.executor: Executor = executor or SubprocessExecutor(out_dir, log_dir, plots=plots)
        self.clock = clock or SystemClock()
        self.tz = tz
        self.poll_s = poll_s
        self.lease_s = lease_s
        self.max_runs = max_runs
        self.outage = Outage(self.db_label)
        self.host = socket.gethostname()
        self.owner = _owner_id()
        self._writes: asyncio.Queue[tuple[Callable[[], Any], asyncio.Future[Any]]] = asyncio.Queue()
        self._wake = asyncio.Event()
        self._monitors: dict[int, asyncio.Task[None]] = {}
        self._recovering: dict[int, asyncio.Task[None]] = {}
        self._ending: set[int] = set()  # runs whose end is being written (their leases go with it)
        self._lost: set[int] = set()  # runs another serve took over from this one
        self._fenced: set[int] = set()  # runs stopped because their leases could not be renewed
        self._launching: set[int] = set()  # claimed, worker not started yet
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

    # -- leases ---------------------------------------------------------------------------------------------
    async def _heartbeat(self) -> None:
        """Renew this serve's leases every third of `lease_s`. A run another serve took over meanwhile has its
        worker killed; a run still held with nothing running it (its end could not be recorded) is recovered.
        When renewals fail for two thirds of the lease (the database is out of reach), this serve stops its
        runs before their leases expire, so that another serve's takeover never meets a live worker."""
        loop = asyncio.get_running_loop()
        renewed = loop.time()
        while True:
            await asyncio.sleep(self.lease_s / 3)

            def renew() -> set[int]:
                self.store.register_serve(self.owner, self.max_runs, self.lease_s)
                return self.store.renew(self.owner, self.lease_s)

            try:
                held = await self.write(renew)
            except StoreUnavailable as e:
                self.outage.failed(e, loop.time(), self.poll_s)
                if loop.time() - renewed > self.lease_s * 2 / 3:
                    for run_id in list(self._monitors):
                        if run_id in self._fenced or run_id in self._ending or run_id in self._lost:
                            continue
                        self._fenced.add(run_id)
                        log.error(
                            "run %d: its leases were not renewed for %.1f s: stopping it before they expire",
                            run_id,
                            loop.time() - renewed,
                            extra={"run_id": run_id, "owner": self.owner},
                        )
                        self.executor.stop(run_id)
                continue
            renewed = loop.time()
            self.outage.ended(renewed)
            busy = {*self._monitors, *self._recovering, *self._launching, *self._ending}
            for run_id in list(self._monitors):
                if run_id in held or run_id in self._ending or run_id in self._lost:
                    continue
                self._lost.add(run_id)
                log.error(
                    "run %d: another serve took it over (this one did not renew its lease in time): "
                    "stopping its worker",
                    run_id,
                    extra={"run_id": run_id, "owner": self.owner},
                )
                self.executor.kill(run_id)
            for run_id in sorted(held - busy):
                try:
                    row = self.store.run(run_id)
                except LabctlError:
                    continue
                if row.state == "running":
                    self._recover_in_background(row, "its serve could not record how it ended")

    # -- running one row ------------------------------------------------------------------------------------
    async def _launch(self, row: RunRow) -> bool:
        """Start the worker of a run this serve has claimed (its row is `running` already: if serve dies
        before the worker exists, the run is recovered like any other)."""

        async def on_started(pid: int, run_dir: str | None) -> None:
            fields: dict[str, Any] = {"pid": pid}
            if run_dir is not None:
                fields["run_dir"] = run_dir
            await self.write(lambda: self.store.set_fields(row.id, **fields))

        try:
            await self.executor.start(row, on_started)
        except OSError as e:
            error = f"cannot start the worker: {e}"
            log.error(
                "run %d: %s", row.id, error, extra={"run_id": row.id, "status": "failed", "error": error}
            )
            await self.write(
                lambda: self.store.finish(
                    row.id, self.owner, "failed", finished_ns=self.clock.wall_ns(), error=error
                )
            )
            return False
        self._monitors[row.id] = asyncio.create_task(self._monitor(row.id), name=f"monitor:{row.id}")
        log.info(
            "run %d started: %s (%s)",
            row.id,
            row.name,
            row.experiment,
            extra={
                "run_id": row.id,
                "run_name": row.name,
                "experiment": row.experiment,
                "inventory": row.inventory,
                "priority": row.priority,
                "attempt": row.attempt,
                "retry_of": row.retry_of,
                "schedule_id": row.schedule_id,
                "owner": self.owner,
            },
        )
        return True

    async def _monitor(self, run_id: int) -> None:
        try:
            result = await self.executor.wait(run_id)
            now = self.clock.wall_ns()
            if run_id in self._lost:
                log.error(
                    "run %d ended here as %s after another serve took it over: not recorded",
                    run_id,
                    result.status,
                    extra={"run_id": run_id, "status": result.status, "run_dir": result.run_dir},
                )
                return
            if run_id in self._fenced:
                try:
                    await self.recover(self.store.run(run_id), "its serve lost the queue database")
                except LabctlError as e:  # still unreachable: the heartbeat or another serve recovers it
                    log.error("run %d: stopped, not recorded yet: %s", run_id, e, extra={"run_id": run_id})
                return
            if result.status == "crashed":
                row = self.store.run(run_id)
                if result.run_dir and not row.run_dir:
                    await self.write(lambda: self.store.set_fields(run_id, run_dir=result.run_dir))
                    row = self.store.run(run_id)
                await self.recover(row, result.error or "worker crashed")
                return
            state = result.status if result.status in TRANSITIONS["running"] else "failed"
            self._ending.add(run_id)
            recorded = await self.write(
                lambda: self.store.finish(
                    run_id, self.owner, state, finished_ns=now, error=result.error, run_dir=result.run_dir
                )
            )
            if not recorded:
                log.error(
                    "run %d ended as %s but another serve holds it now: not recorded",
                    run_id,
                    state,
                    extra={"run_id": run_id, "status": state, "run_dir": result.run_dir},
                )
                return
            results = headline(result.run_dir)
            text = headline_text(results)
            (log.info if state == "completed" else log.warning)(
                "run %d finished: %s%s%s",
                run_id,
                state,
                f" ({result.error})" if result.error else "",
                f"; {text}" if text else "",
                extra={
                    "run_id": run_id,
                    "status": state,
                    "run_dir": result.run_dir,
                    "error": result.error,
                    "results": results,
                },
            )
        finally:
            self._monitors.pop(run_id, None)
            self._ending.discard(run_id)
            self._lost.discard(run_id)
            self._fenced.discard(run_id)
            self._wake.set()

    async def step(self) -> list[int]:
        """One scheduling pass: fire cron schedules, take over runs of dead serves (shared queue), stop
        cancelled runs, claim and start what may start."""
        now = self.clock.wall_ns()
        await self.write(lambda: self.store.fire_schedules(now, self.tz))
        if self.store.shared:
            for row in await self.write(lambda: self.store.take_over_lost(self.owner, self.lease_s)):
                log.warning(
                    "run %d: its serve (%s) stopped renewing its lease: recovering it",
                    row.id,
                    row.owner,
                    extra={"run_id": row.id, "lost_owner": row.owner, "owner": self.owner},
                )
                self._recover_in_background(row, f"lost: its serve {row.owner} stopped renewing its lease")
        for row in self.store.runs("state='running' AND cancel_requested=1"):
            if row.id not in self._stopping_ids and row.id in self._monitors:
                self._stopping_ids.add(row.id)
                log.info("run %d: cancelled, stopping it", row.id, extra={"run_id": row.id})
                self.executor.stop(row.id)

        def claim() -> list[RunRow]:
            rows = self.store.claim(now, self.owner, self.lease_s, self.max_runs)
            self._launching.update(r.id for r in rows)
            return rows

        started: list[int] = []
        if not self.has_free_slot():
            return (
                started  # busy: what is due is left to a serve with a free slot, or to this one's next pass
            )
        for row in await self.write(claim):
            try:
                if await self._launch(row):
                    started.append(row.id)
            finally:
                self._launching.discard(row.id)
        return started

    def has_free_slot(self) -> bool:
        """Whether this serve may start one more run: what it runs, starts, recovers or is still stopping
        (a worker another serve took over, one stopped for lost leases) all take a slot."""
        if self.max_runs is None:
            return True
        busy = {*self._monitors, *self._launching, *self._recovering}
        return len(busy) < self.max_runs

    def idle(self) -> bool:
        return (
            not self._monitors
            and not self._recovering
            and not self.store.active()
            and not self.store.schedules()
        )

    async def serve(self, *, exit_when_idle: bool = False, ready: Callable[[], None] | None = None) -> None:
        writer = asyncio.create_task(self._writer(), name="queue-writer")
        heartbeat = (
            asyncio.create_task(self._heartbeat(), name="queue-heartbeat") if self.store.shared else None
        )
        log.info(
            "serving queue %s (runs in %s)",
            self.db_label,
            self.out_dir,
            extra={
                "db": self.db_label,
                "out_dir": str(self.out_dir),
                "poll_s": self.poll_s,
                "shared": self.store.shared,
                "owner": self.owner,
                "lease_s": self.lease_s if self.store.shared else None,
                "max_runs": self.max_runs,
            },
        )
        loop = asyncio.get_running_loop()
        try:
            await self.write(lambda: self.store.register_serve(self.owner, self.max_runs, self.lease_s))
            for row in await self.write(lambda: self.store.orphans_at_start(self.owner, self.lease_s)):
                await self.recover(row, "interrupted: serve stopped while the run was going")
            if ready is not None:
                ready()
            while True:
                try:
                    await self.step()
                    done = exit_when_idle and self.idle()
                except StoreUnavailable as e:
                    self.outage.failed(e, loop.time(), self.poll_s)
                    wait_s = self.outage.retry_in(self.poll_s)
                else:
                    self.outage.ended(loop.time())
                    if done:
                        break
                    wait_s = self.poll_s
                self._wake.clear()
                # asyncio.timeout, not wait_for: on Python 3.11 wait_for swallows a cancellation that lands
                # as the wake event is set, and `serve` then never stopped (its test hung 1 time in 3).
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(wait_s):
                        await self._wake.wait()
        finally:
            # Stop our workers (each restores its baseline) and record how they ended; the heartbeat keeps
            # their leases meanwhile.
            for run_id in list(self._monitors):
                self.executor.stop(run_id)
            pending = [*self._monitors.values(), *self._recovering.values()]
            if pending:
                _, late = await asyncio.wait(pending, timeout=STOP_GRACE_S)
                for run_id in [r for r, task in self._monitors.items() if task in late]:
                    log.error("run %d did not stop within %g s: killed", run_id, STOP_GRACE_S)
                    self.executor.kill(run_id)
                for task in self._recovering.values():
                    if task in late:
                        task.cancel()
                await asyncio.gather(*pending, return_exceptions=True)
            if heartbeat is not None:
                heartbeat.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await heartbeat
            writer.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await writer
            with contextlib.suppress(LabctlError):  # out of reach: its registration expires by itself
                self.store.unregister_serve(self.owner)
            self.store.close()
            log.info("serve stopped", extra={"db": self.db_label})


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


async def serve_main(
    db: Path | str,
    out_dir: Path,
    *,
    plots: bool,
    exit_when_idle: bool,
    poll_s: float,
    lease_s: float = DEFAULT_LEASE_S,
    from_env: bool = False,
    max_runs: int | None = None,
) -> None:
    """`labctl serve`: runs until SIGINT/SIGTERM, then stops running runs (baselines restored) and exits.
    A SQLite queue has one serve (a file lock next to it); a PostgreSQL queue any number."""
    store = open_store(db, from_env=from_env)
    try:
        with contextlib.ExitStack() as stack:
            if isinstance(store, QueueStore):
                stack.enter_context(exclusive_serve(store.path))
            await _serve(
                store,
                out_dir,
                plots=plots,
                exit_when_idle=exit_when_idle,
                poll_s=poll_s,
                lease_s=lease_s,
                max_runs=max_runs,
            )
    except BaseException:
        store.close()  # serve() closes it once started; closing twice is harmless
        raise


async def _serve(
    store: Store,
    out_dir: Path,
    *,
    plots: bool,
    exit_when_idle: bool,
    poll_s: float,
    lease_s: float,
    max_runs: int | None,
) -> None:
    sched = Scheduler(store, out_dir=out_dir, plots=plots, poll_s=poll_s, lease_s=lease_s, max_runs=max_runs)
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
