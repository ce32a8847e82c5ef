"""Crash recovery: a run whose worker or serve died made consistent again. Its lab's baseline re-applied
through the switch drivers, its link settings put back, its run.json told why, its row `interrupted`, one
retry queued; or, where the run ended by itself before its serve could say so, its end recorded as it was."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import random
import signal
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

from labctl.core.errors import LabctlError
from labctl.scheduler.results import headline, headline_text
from labctl.scheduler.store import RunRow, Store
from labctl.scheduler.timing import Clock
from labctl.scheduler.worker import _pid_alive

log = logging.getLogger("labctl.scheduler")

MAX_ATTEMPTS = 2  # an interrupted run is retried once, then left for a human
RECOVERY_EVENTS = "recovery.jsonl"

T = TypeVar("T")


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


async def restore_link_settings(row: RunRow, run_dir: Path) -> dict[str, Any] | None:
    """Put back every port a dead run's link settings sweep saved (its `link-settings-before.json`, decision
    0079) through the LinkControl of its lab (an agents lab: the agents hold the settings the dead process
    set). None where the run saved none; else `ok`, a line per port put back, and the error naming each
    port not put back and what it holds."""
    from labctl.core.clock import Timebase
    from labctl.core.events import EventLog
    from labctl.labs import load
    from labctl.run.tune import NotRestored, restore_run_link_settings, saved_ports

    try:
        if saved_ports(run_dir) is None:
            return None
    except LabctlError as e:
        return {"ok": False, "ports": [], "error": str(e)}
    events = EventLog(None, Timebase.capture())
    try:
        inventory = load(row.inventory)
        lines = await restore_run_link_settings(
            run_dir, inventory, inventory.profile(row.profile), events.record
        )
    except NotRestored as e:
        log.error("run %d: link settings NOT restored: %s", row.id, e, extra={"run_id": row.id})
        return {"ok": False, "ports": e.restored, "error": str(e)}
    except Exception as e:  # whatever broke, the row must still end consistent, saying so
        log.error("run %d: link settings NOT restored: %s", row.id, e, extra={"run_id": row.id})
        return {"ok": False, "ports": [], "error": f"{type(e).__name__}: {e}"}
    finally:
        events.close()
    log.info(
        "run %d: link settings restored on %d port(s)",
        row.id,
        len(lines),
        extra={"run_id": row.id, "link_settings": lines},
    )
    return {"ok": True, "ports": lines}


def _only_in_process_switches(row: RunRow) -> bool:
    """Whether every switch of the run's lab lived inside its process (the `sim` driver, or a driver whose
    emulator the lab served itself), so a crash took the switch state with it."""
    from labctl.labs import load

    try:
        switches = load(row.inventory).switches.values()
    except Exception:  # the recovery itself already succeeded; this is only a remark on it
        return False
    return all(sw.over_model for sw in switches)


class RunRecovery:
    """The part of the `serve` engine (`service.Scheduler`) that recovers rows left `running` by a dead
    worker or serve. It uses the engine's store, identity, clock and its one writer task (`write`)."""

    store: Store
    owner: str
    """This serve as a lease holder: `host:pid:token`."""
    host: str
    out_dir: Path
    clock: Clock
    _recovering: dict[int, asyncio.Task[None]]
    _wake: asyncio.Event

    async def write(self, fn: Callable[[], T]) -> T:
        """Run `fn` (a store write) in the engine's one writer task: `service.Scheduler.write`."""
        raise NotImplementedError

    async def recover(self, row: RunRow, reason: str) -> None:
        """Make a dead run's row consistent: wait for its worker to be gone (where it ran on this machine),
        restore the baseline, mark it interrupted, update its run.json, queue a retry. A run that ended by
        itself before its serve could record it (run.json says completed or failed) is recorded as it
        ended instead: it is never run a second time."""
        local = row.owner_host in (None, self.host)
        for _ in range(300 if local else 0):  # the worker may still be restoring the baseline itself
            if not _pid_alive(row.pid):
                break
            await asyncio.sleep(0.1)
        else:
            if local and row.pid is not None:
                with contextlib.suppress(OSError):
                    os.kill(row.pid, signal.SIGKILL)
        if await self._record_if_ended(row):
            return
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
        if run_dir is not None:
            link_settings = await restore_link_settings(row, run_dir)
            if link_settings is not None:
                recovery["link_settings"] = link_settings
                recovery["ok"] = recovery["ok"] and link_settings["ok"]
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
        retry = await self.write(
            lambda: self.store.interrupt(
                row,
                self.owner,
                now_ns=now,
                reason=reason,
                recovery=rec_json,
                retry=row.attempt < MAX_ATTEMPTS,
            )
        )
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
                "attempt": row.attempt,
            },
        )

    async def _record_if_ended(self, row: RunRow) -> bool:
        """Whether the run's own record (run.json) says it ended by itself (completed, failed, or aborted on
        a cancel): then that is what the queue records, with no baseline to restore and no retry."""
        if not row.run_dir:
            return False
        try:
            meta = json.loads((Path(row.run_dir) / "run.json").read_text())
        except (OSError, ValueError):
            return False
        status = meta.get("status")
        if not (status in ("completed", "failed") or (status == "aborted" and row.cancel_requested)):
            return False
        finished = meta.get("finished_wall_ns")
        now = int(finished) if isinstance(finished, int) else self.clock.wall_ns()
        error = meta.get("error")
        recorded = await self.write(
            lambda: self.store.finish(row.id, self.owner, status, finished_ns=now, error=error)
        )
        if recorded:
            results = headline(row.run_dir)
            text = headline_text(results)
            log.warning(
                "run %d finished: %s (recorded on recovery: its serve ended before it could)%s",
                row.id,
                status,
                f"; {text}" if text else "",
                extra={"run_id": row.id, "status": status, "run_dir": row.run_dir, "results": results},
            )
        return True

    def _recover_in_background(self, row: RunRow, reason: str) -> None:
        async def go() -> None:
            try:
                await self.recover(row, reason)
            except LabctlError as e:  # another serve holds it now, or the queue went away: it stays `running`
                log.error("run %d: recovery not recorded: %s", row.id, e, extra={"run_id": row.id})
            finally:
                self._recovering.pop(row.id, None)
                self._wake.set()

        self._recovering[row.id] = asyncio.create_task(go(), name=f"recover:{row.id}")
