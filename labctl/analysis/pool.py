"""A run's analysis and figures in two worker processes started while its experiment runs (issue 25).

matplotlib and pandas take ~0.7 s to import and the two PNGs ~1.3 s to draw on this machine kind, all of it
after the last reconfiguration, where the user waits. So `labctl run` starts two workers at the beginning of
the run, niced (labctl.core.sched.background), each importing the analysis and warming matplotlib's fonts
on the other core while the experiment runs; at the end each computes the breakdown from
events.jsonl (~0.1 s), one writes breakdown.csv/.parquet and summary.json and the headline and the timeline,
the other draws the distributions, at the same time (WORKER_FIGURES). The figures are exactly those
`labctl.analysis.plots.plot_run` draws in one process.

No figure needs the end of the run: the headline and the timeline show the first reconfiguration after the
baseline and nothing past the next one's command, the distributions the measured reconfigurations, all done
before the last hold, and so is the summary. So the run asks the workers to work them out ahead (`ahead`:
the timeline, and the headline with it, after the second reconfiguration, the distributions and the summary
after the last), in memory,
while the run goes on. At the end a worker works the data out again from the whole run and writes what it
drew (`labctl.analysis.figures_ahead.DrawnFigure`) or summarized (`labctl.analysis.summary.Summarized`) if
they are the same, and draws or summarizes again if not (events that reached the file late): the files are
those working them out at the end gives, either way, and nothing is written for a run that ends aborted.

A worker that did not start, died, or failed is not trusted with anything: the run analyses in its own
process instead, where an error surfaces as it always did. Workers read their job from stdin (after any
requests to draw ahead), answer one line and exit; closing the pool (always, also for an aborted run that
draws nothing) kills whatever is still running, a figure being drawn ahead too.
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib
import json
import os
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from labctl.analysis.figures import DRAWN_WITH, FIGURES, WORKER_FIGURES
from labctl.core.sched import background, foreground

if TYPE_CHECKING:
    from labctl.analysis.figures_ahead import DrawnFigure
    from labctl.analysis.summary import Summarized

_PACKAGE_ROOT = str(Path(__file__).resolve().parents[2])
WRITER = 0
"""The worker that writes the breakdown and the summary besides its figure."""
AHEAD = (*FIGURES, "summary")
"""What the workers can work out ahead (`FigureWorkers.ahead`)."""
WORKER_TIMEOUT_S = 300.0
"""How long the run waits for its figures before it draws them itself (a figure of a long run is seconds)."""


def _worker_of(what: str) -> int:
    """The worker that works out `what` (one of AHEAD): the one drawing that figure; the summary's writer."""
    return next((n for n, figures in enumerate(WORKER_FIGURES) if what in figures), WRITER)


class FigureWorkers:
    """Two pre-warmed analysis processes for one run (`start`, then `analyse` once, `close` always): each
    draws its figures of WORKER_FIGURES."""

    def __init__(self, command: tuple[str, ...] = (sys.executable, "-m", "labctl.analysis.pool")) -> None:
        self.command = command
        self._procs: list[asyncio.subprocess.Process] = []
        self._ahead: set[str] = set()
        self.replies: list[dict[str, Any]] = []
        """What each worker answered to its job (`ahead`: what became of what it worked out ahead, by name:
        kept, drawn again, worked out again, not on record, failed: ...)."""

    async def start(self) -> None:
        """Start both workers; they import while the run goes on (nothing here waits for them)."""
        path = os.pathsep.join(filter(None, [_PACKAGE_ROOT, os.environ.get("PYTHONPATH")]))
        env = {**os.environ, "PYTHONPATH": path}  # the child imports the labctl this process runs
        for _ in WORKER_FIGURES:
            try:
                proc = await asyncio.create_subprocess_exec(
                    *self.command,
                    stdin=asyncio.subprocess.PIPE,
                    stdout=asyncio.subprocess.PIPE,
                    stderr=asyncio.subprocess.DEVNULL,
                    env=env,
                )
            except OSError:
                return  # no workers: the run draws its figures itself
            self._procs.append(proc)

    def ahead(self, what: str, run_dir: Path, threshold_dbm: float | None, formats: Sequence[str]) -> None:
        """Ask a worker to work out `what` (one of AHEAD) now, from the events on record, and keep it in
        memory until `analyse`: a figure, by its worker; the summary, by the worker that writes it.
        Returns at once (a progress callback calls it); once each; nothing without workers."""
        if len(self._procs) != len(WORKER_FIGURES):
            return
        for name in (what, *DRAWN_WITH.get(what, ())):  # the headline with the timeline: the same moment
            if name in self._ahead:
                continue
            self._ahead.add(name)
            proc = self._procs[_worker_of(name)]
            if proc.stdin is None or proc.returncode is not None:
                continue
            job = {
                "ahead": name,
                "run_dir": str(run_dir),
                "threshold_dbm": threshold_dbm,
                "formats": list(formats),
            }
            with contextlib.suppress(OSError, RuntimeError):  # a worker gone: `analyse` finds out and draws
                proc.stdin.write((json.dumps(job) + "\n").encode())

    async def analyse(
        self, run_dir: Path, threshold_dbm: float | None, formats: Sequence[str]
    ) -> dict[str, Any]:
        """The run's summary, its breakdown files and figures written by the workers; if any worker is
        missing or fails, everything is done again here (errors surface from this process, as before)."""
        if len(self._procs) == len(WORKER_FIGURES):
            # The run is over and waits on them: their priority back now, where allowed (a figure still being
            # drawn ahead would finish niced otherwise; a worker raises its own on reading its
            # job).
            mine = os.getpriority(os.PRIO_PROCESS, 0)
            for proc in self._procs:
                foreground(proc.pid, mine)
            job = {"run_dir": str(run_dir), "threshold_dbm": threshold_dbm, "formats": list(formats)}
            asks = [
                self._ask(
                    proc, {**job, "figures": list(figures), "write": n == WRITER}
                )  # one writes the files
                for n, (proc, figures) in enumerate(zip(self._procs, WORKER_FIGURES, strict=True))
            ]
            try:
                async with asyncio.timeout(WORKER_TIMEOUT_S):
                    replies = await asyncio.gather(*asks)
            except TimeoutError:
                replies = []
            self.replies = list(replies)
            if replies and all(r.get("ok") for r in replies):
                text = await asyncio.to_thread((run_dir / "summary.json").read_text)
                summary: dict[str, Any] = json.loads(text)
                return summary
        from labctl.analysis.summary import analyse

        return analyse(run_dir, threshold_dbm, plot_formats=formats)

    @staticmethod
    async def _ask(proc: asyncio.subprocess.Process, job: dict[str, Any]) -> dict[str, Any]:
        assert proc.stdin is not None and proc.stdout is not None
        try:
            proc.stdin.write((json.dumps(job) + "\n").encode())
            await proc.stdin.drain()
            proc.stdin.close()
            line = await proc.stdout.readline()
        except (OSError, ConnectionError):
            return {"ok": False}
        try:
            reply: dict[str, Any] = json.loads(line) if line else {"ok": False}
        except ValueError:
            reply = {"ok": False}
        return reply

    async def close(self) -> None:
        """Stop every worker (finished ones exit by themselves; one still importing is killed)."""
        for proc in self._procs:
            if proc.returncode is None:
                with contextlib.suppress(ProcessLookupError):
                    proc.kill()
        for proc in self._procs:
            await proc.wait()
        self._procs.clear()


def _warm_up() -> None:
    """What the first figure of a process pays for: the font cache, the Agg renderer's text path, mathtext
    (a log axis's labels), and the first box plot, CDF and log locators (~0.1 s of a first distributions
    figure, for ~0.15 s here while the run goes on)."""
    import matplotlib.pyplot as plt
    import numpy as np

    from labctl.analysis.plot_files import render_files
    from labctl.analysis.plot_style import styled

    # Every figure's module (~20 ms), imported here while the run goes on rather than when the figure is due.
    importlib.import_module("labctl.analysis.plots")
    with styled(None):
        fig = plt.figure(figsize=(2, 1), layout="constrained")
        box, cdf = fig.subplots(1, 2)
        values = np.array([0.05, 0.5, 5.0, 50.0])
        box.boxplot([values], orientation="horizontal", tick_labels=["ms µs (n=4)"], showfliers=False)
        box.scatter(values, np.ones(values.size), s=8, alpha=0.5, color="C1")
        box.set_xscale("log")
        box.grid(axis="x", which="both")
        cdf.ecdf(values, lw=1.4)
        cdf.set_xscale("log")
        cdf.annotate("median 1 ms", (1, 0.04), xycoords=("data", "axes fraction"), fontsize="x-small")
        cdf.set_title("x (n=4)", loc="left", fontsize="medium")
        fig.suptitle("warm")
        render_files(fig, ("png",))
        plt.close(fig)


_NICE_BEFORE = os.getpriority(os.PRIO_PROCESS, 0)
_T_START = time.perf_counter()


def _worker() -> int:
    # Never real-time, whatever started it, and behind the experiment's own process while both run
    # (nice 10: labctl.core.sched).
    background()
    from labctl.analysis.summary import analyse, draw, draw_ahead, summarize_ahead  # pandas, numpy, msgspec

    with contextlib.suppress(Exception):  # a broken style or font is the job's error, not the warm-up's
        _warm_up()
    drawn: list[DrawnFigure] = []
    summarized: Summarized | None = None
    ahead: dict[str, str] = {}
    ahead_s = 0.0
    while True:
        line = sys.stdin.readline()
        if not line:
            return 0  # no job: the run was aborted, or drew its figures itself
        job = json.loads(line)
        if "ahead" not in job:
            break
        t = time.perf_counter()
        what, run_dir = job["ahead"], Path(job["run_dir"])
        try:  # still niced: the run goes on
            if what == "summary":
                summarized = summarize_ahead(run_dir, job["threshold_dbm"])
            elif figure := draw_ahead(run_dir, job["threshold_dbm"], what, plot_formats=job["formats"]):
                drawn.append(figure)
            else:
                ahead[what] = "not on record"
        except Exception as e:  # worked out again at the end, where an error surfaces
            ahead[what] = f"failed: {type(e).__name__}: {e}"
        ahead_s += time.perf_counter() - t
    t0 = time.perf_counter()
    foreground(0, _NICE_BEFORE)  # now the run waits on this: back to its priority where allowed
    try:
        # One worker writes the breakdown, the summary and its figure; the other draws its figure only.
        run_dir, threshold = Path(job["run_dir"]), job["threshold_dbm"]
        if job["write"]:
            analyse(
                run_dir,
                threshold,
                plot_formats=job["formats"],
                figures=job["figures"],
                drawn=drawn,
                summarized=summarized,
            )
        else:
            draw(run_dir, threshold, plot_formats=job["formats"], figures=job["figures"], drawn=drawn)
    except Exception as e:  # the run does it again in its own process, where the error surfaces
        reply: dict[str, Any] = {"ok": False, "error": f"{type(e).__name__}: {e}"}
    else:
        reply = {"ok": True, "job_s": round(time.perf_counter() - t0, 3), "ready_s": round(t0 - _T_START, 3)}
    for figure in drawn:
        ahead[figure.figure] = "kept" if figure.kept else "drawn again"
    if summarized is not None:
        ahead["summary"] = "kept" if summarized.kept else "worked out again"
    reply.update(ahead=ahead, ahead_s=round(ahead_s, 3))
    sys.stdout.write(json.dumps(reply) + "\n")
    sys.stdout.flush()
    # Done: the run waits for this process to end (FigureWorkers.close), and an interpreter holding
    # matplotlib and pandas takes tens of ms to tear down. Every file it wrote is closed and renamed.
    os._exit(0)


if __name__ == "__main__":
    sys.exit(_worker())
