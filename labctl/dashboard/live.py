"""The live page's feed: one reader task per watched run (however many pages watch it), tailing its
events.jsonl every POLL_S, folding new events into its `LiveView` and publishing Server-Sent Events frames to
the run's `Fanout`. The reader starts with the first page and stops with the last one (or the server), so no
task outlives its watchers; a run that has ended is read to its end once and kept for pages that come later.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from pathlib import Path
from typing import Any

from labctl.dashboard.fanout import Fanout
from labctl.dashboard.tail import LiveView, Tail, planned_reconfigurations
from labctl.probes.sampling import tick_counts

POLL_S = 0.05
"""How often a watched run's log is read: well inside the 1 s from an event in the log to the page (the run
flushes its log every 0.5 s)."""
ROWS_PER_FRAME = 64


def frame(event: str, data: Any, ident: int | None = None) -> bytes:
    """One Server-Sent Events message."""
    head = f"event: {event}\n" + (f"id: {ident}\n" if ident is not None else "")
    return (head + "data: " + json.dumps(data, separators=(",", ":")) + "\n\n").encode()


def _experiment_of(run_dir: Path) -> dict[str, Any]:
    try:
        meta = json.loads((run_dir / "run.json").read_text())
    except (OSError, ValueError):
        return {}
    experiment = meta.get("experiment") if isinstance(meta, dict) else None
    return experiment if isinstance(experiment, dict) else {}


def run_summary(run_dir: Path) -> dict[str, Any]:
    """What run.json says once the run has ended: each probe's skipped ticks, the loop lag's p99/max."""
    try:
        meta = json.loads((run_dir / "run.json").read_text())
    except (OSError, ValueError):
        return {}
    if not isinstance(meta, dict):
        return {}
    probes: dict[str, Any] = meta["probes"] if isinstance(meta.get("probes"), dict) else {}
    skipped = {
        part: counts["ticks_skipped"]
        for name, stats in probes.items()
        if isinstance(stats, dict)
        for part, counts in tick_counts(name, stats).items()
    }
    lag = meta.get("loop_lag_ns") if isinstance(meta.get("loop_lag_ns"), dict) else {}
    return {"status": meta.get("status"), "ticks_skipped": skipped, "loop_lag": lag}


class LiveRun:
    def __init__(self, run_dir: Path, maxsize: int) -> None:
        self.run_dir = run_dir
        experiment = _experiment_of(run_dir)
        self.view = LiveView(run_dir.name, planned_reconfigurations(experiment))
        self.tail = Tail(run_dir / "events.jsonl")
        self.fanout = Fanout(maxsize)
        self.task: asyncio.Task[None] | None = None
        self.final: dict[str, Any] | None = None

    def snapshot(self) -> list[bytes]:
        """What a new page gets first: the state, every row so far, and the end if the run has ended."""
        out = [frame("state", self.view.state(), self.view.last_seq)]
        rows = self.view.rows
        for i in range(0, len(rows), ROWS_PER_FRAME):
            out.append(frame("rows", rows[i : i + ROWS_PER_FRAME]))
        if self.final is not None:
            out.append(frame("end", self.final))
        return out

    def poll(self) -> bool:
        """Read what was appended and publish it; True once the run has ended and been read to its end."""
        lines = self.tail.read()
        if lines:
            before = len(self.view.rows)
            self.view.fold_lines(lines)
            new = self.view.rows[before:]
            self.fanout.publish(frame("state", self.view.state(), self.view.last_seq))
            for i in range(0, len(new), ROWS_PER_FRAME):
                self.fanout.publish(frame("rows", new[i : i + ROWS_PER_FRAME]))
            return False
        if self.view.ended and self.final is None:
            self.final = run_summary(self.run_dir)
            self.fanout.publish(frame("end", self.final))
        return self.view.ended

    async def pump(self) -> None:
        # Polling, not a notification: the run's process must not know that a page reads its log.
        while not self.poll():  # noqa: ASYNC110
            await asyncio.sleep(POLL_S)


class LiveRuns:
    """The watched runs of one server."""

    def __init__(self, maxsize: int) -> None:
        self.maxsize = maxsize
        self.runs: dict[Path, LiveRun] = {}

    def watch(self, run_dir: Path) -> tuple[LiveRun, Any]:
        live = self.runs.get(run_dir)
        if live is None:
            live = self.runs[run_dir] = LiveRun(run_dir, self.maxsize)
        if live.task is None and live.final is None:
            live.poll()  # a page opened on a run shows everything logged so far at once
            if live.final is None:
                live.task = asyncio.create_task(live.pump(), name=f"dashboard-live-{run_dir.name}")
        return live, live.fanout.subscribe(live.snapshot())

    def unwatch(self, live: LiveRun, client: Any) -> None:
        """A page left. Synchronous: it runs in the stream's `finally`, where the request's cancellation
        would interrupt any await; a cancelled reader task ends at its next loop turn."""
        live.fanout.unsubscribe(client)
        if live.fanout.clients:
            return
        # the last page left: stop reading (a run still going is read anew by the next page)
        if live.task is not None and not live.task.done():
            live.task.cancel()
        live.task = None
        if live.final is None:
            self.runs.pop(live.run_dir, None)

    @property
    def dropped(self) -> int:
        return sum(r.fanout.dropped for r in self.runs.values())

    async def close(self) -> None:
        for live in list(self.runs.values()):
            live.fanout.close()
            if live.task is not None:
                live.task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await live.task
                live.task = None
        self.runs.clear()
