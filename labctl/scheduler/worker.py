"""Executing one run: the `Executor` protocol, one worker process per run, and the worker process itself.

The worker runs as `python -m labctl.scheduler worker ARGS` (see `__main__`); `_pid_alive` recognises it
by that command line.
"""

from __future__ import annotations

import asyncio
import ctypes
import json
import os
import signal
import sys
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from labctl.core.errors import LabctlError
from labctl.scheduler.store import RunRow

WORKER_MODULE = "labctl.scheduler"  # `python -m WORKER_MODULE worker ARGS` starts a worker


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
                WORKER_MODULE,
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
    from labctl.run.engine import NullProgress
    from labctl.run.lifecycle import run_experiment

    def say(**msg: Any) -> None:
        try:
            sys.stdout.write(json.dumps(msg) + "\n")
            sys.stdout.flush()
        except (BrokenPipeError, ValueError):  # `serve` is gone: the run directory is the record
            # Point stdout at /dev/null, or Python's own flush at exit raises the same error again.
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())

    class Progress(NullProgress):
        def started(self, run_dir: Path, steps: int) -> None:
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


def _pid_alive(pid: int | None) -> bool:
    """Whether `pid` is still a worker: a pid since reused by another program counts as gone."""
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
    return WORKER_MODULE.encode() in cmdline and b"worker" in cmdline
