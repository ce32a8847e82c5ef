"""The `serve` engine: one writer task for the queue, runs started by `plan.pick`, crashed runs recovered."""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import json
import logging
import os
import random
import signal
from collections.abc import Callable, Iterator
from datetime import tzinfo
from pathlib import Path
from typing import Any, TypeVar

from labctl.core.errors import InputError, LabctlError
from labctl.scheduler.plan import Declaration, pick
from labctl.scheduler.store import TRANSITIONS, QueueStore, RunRow
from labctl.scheduler.timing import Clock, SystemClock
from labctl.scheduler.worker import Executor, SubprocessExecutor, _pid_alive

log = logging.getLogger("labctl.scheduler")

MAX_ATTEMPTS = 2  # an interrupted run is retried once, then left for a human
RECOVERY_EVENTS = "recovery.jsonl"
STOP_GRACE_S = 60.0  # a stopping run restores its baseline: one switch operation, well under a minute

T = TypeVar("T")


# -- recovery --------------------------------------------------------------------------------------------
async def restore_baseline(row: RunRow, events_path: Path) -> dict[str, Any]:
    """Re-apply an interrupted run's baseline through the inventory's switch drivers (read back, verified),
    writing the driver events to `events_path`. Returns what the switches hold afterwards."""
    from labctl.core.clock import Timebase, now_ns
    from labctl.core.events import EventLog, Kind
    from labctl.labs import build_lab, load
    from labctl.labs.base import LabContext
    from labctl.ocs.protocol import send_mapping
    from labctl.probes.sampling import ProbeSettings

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
        # Only the switches: each connects on its own (an emulated one serves its emulator while connected);
        # the lab's own services (a kernel fabric, an agents' hub) are not needed to restore patches.
        for switch, entry in row.baseline.items():
            sw = lab.switches[switch]
            await sw.connect()
            try:
                mapping = [(int(a), int(b)) for a, b in entry["mapping"]]
                await send_mapping(sw, mapping, scope=entry["scope"], context={"recovery": row.id})
                got = await sw.get_mapping()
                scope = set(entry["scope"])
                held[switch] = sorted([a, b] for a, b in got.value if a in scope or b in scope)
                log.info(
                    "run %d: baseline restored on switch %s (%d ports)",
                    row.id,
                    switch,
                    len(scope),
                    extra={"run_id": row.id, "switch": switch, "ports": len(scope), "held": held[switch]},
                )
            finally:
                await sw.close()
    finally:
        lab.close()
        events.close()
    return held


def _only_in_process_switches(row: RunRow) -> bool:
    """Whether every switch of the run's lab lived inside its process (the `sim` driver, or a driver whose
    emulator the lab served itself), so a crash took the switch state with it."""
    from labctl.labs import load

    try:
        switches = load(row.inventory).switches.values()
    except Exception:  # the recovery itself already succeeded; this is only a remark on it
        return False
    return all(sw.over_model for sw in switches)


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
            if _only_in_process_switches(row):
                recovery["note"] = (
                    "every switch of this lab was a model in the crashed run's process and ended with it: "
                    "the baseline was applied to fresh models; no physical switch needed restoring"
                )
        except Exception as e:  # whatever broke, the row must still end consistent
            recovery = {"ok": False, "events": str(events_path), "error": f"{type(e).__name__}: {e}"}
            log.error("run %d: baseline NOT restored: %s", row.id, recovery["error"])
        if run_dir is not None and (run_dir / "run.json").is_file():
            from labctl.core.fileio import write_json_atomic

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
            "run %d interrupted (%s); baseline restored: %s; retry: %s",
            row.id,
            reason,
            recovery["ok"],
            retry,
            extra={
                "run_id": row.id,
                "status": "interrupted",
                "error": reason,
                "baseline_restored": recovery["ok"],
                "retry_id": retry,
            },
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
            log.error(
                "run %d: %s", row.id, error, extra={"run_id": row.id, "status": "failed", "error": error}
            )
            await self.write(
                lambda: self.store.transition(row.id, "failed", finished_ns=self.clock.wall_ns(), error=error)
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
                "schedule_id": row.schedule_id,
            },
        )
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
                (log.info if state == "completed" else log.warning)(
                    "run %d finished: %s%s",
                    run_id,
                    state,
                    f" ({result.error})" if result.error else "",
                    extra={
                        "run_id": run_id,
                        "status": state,
                        "run_dir": result.run_dir,
                        "error": result.error,
                    },
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
                log.info("run %d: cancelled, stopping it", row.id, extra={"run_id": row.id})
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
        log.info(
            "serving queue %s (runs in %s)",
            self.db_path,
            self.out_dir,
            extra={"db": str(self.db_path), "out_dir": str(self.out_dir), "poll_s": self.poll_s},
        )
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
                # asyncio.timeout, not wait_for: on Python 3.11 wait_for swallows a cancellation that lands
                # as the wake event is set, and `serve` then never stopped (its test hung 1 time in 3).
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(self.poll_s):
                        await self._wake.wait()
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
            log.info("serve stopped", extra={"db": str(self.db_path)})


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
