"""The run catalogue at lab scale (issue 27): 1,000 small runs in a runs directory; `labctl runs
--experiment X --since DATE` and `labctl report` with the same filters (the catalogue and the runs'
breakdown.parquet through DuckDB), against the JSONL path `labctl report RUN...` took before it (each run
read back with load_run, events.jsonl parsed, the rows pooled in pandas), in the same run.

The runs: a few real ones (`--templates`, the fast profile, a 4-reconfiguration experiment), then copies
of them under new run ids, written the way a run writes its directory: run.json rewritten (experiment
name out of three, lab out of two, start dates over 30 days, ~2% failed, ~1% aborted, ~1% crashed: status
running, its pid dead, killed before its analysis), the other files linked, and the catalogue record
written by labctl's own `write_record` (none for a crashed one). Every figure is the wall time of a fresh
process (Python start-up and imports included), the median of `--repeat`; the JSONL path is timed once
(`--old-repeat`), over the same runs the filters pick. The goals: `runs` <= 1 s, `report` <= 3 s.

Where PYTHONDONTWRITEBYTECODE is set and labctl has no cached bytecode, every process compiles labctl's
modules from source (~0.1-0.2 s more); `--bytecode` compiles them first, as an installed labctl has them.

    python3 bench/catalog.py                  # 1,000 runs
    python3 bench/catalog.py --runs 20 --repeat 1   # quick
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "bench"))  # bench/ is not a package

from _table import record  # noqa: E402

LABCTL = [sys.executable, "-m", "labctl.cli"]
EXPERIMENT = """\
name: {name}
phases:
  dp: {{pairs: [[h1, h2], [h3, h4]]}}
  pp: {{pairs: [[h1, h3], [h2, h4]]}}
baseline: dp
cycle: [pp, dp, pp, dp]
hold_s: 0.05
recovery_timeout_s: 5
"""
EXPERIMENTS = ("reconfig-timeline",) * 3 + ("fig10-sweep", "ring-ocs")  # X is the common one
LABS = ("opus-testbed", "opus-testbed-b")
LINKED = ("events.jsonl", "breakdown.csv", "breakdown.parquet", "summary.json")
DAY_NS = 86_400 * 10**9


def make_templates(root: Path, count: int) -> list[Path]:
    """`count` real runs of a small experiment (fast profile, 4 reconfigurations, 64 port rows)."""
    from labctl.run.lifecycle import run_experiment

    exp = root / "small.yaml"
    exp.write_text(EXPERIMENT.format(name="reconfig-timeline"))

    async def go() -> list[Path]:
        made = []
        for seed in range(count):
            outcome = await run_experiment(
                exp,
                REPO / "inventory.yaml",
                profile="fast",
                out_dir=root / "templates",
                seed=seed,
                plots=False,
            )
            if outcome.status != "completed":
                raise SystemExit(f"template run failed: {outcome.error}")
            made.append(outcome.run_dir)
        return made

    return asyncio.run(go())


def dead_pid() -> int:
    proc = subprocess.Popen(["true"])
    proc.wait()
    return proc.pid


def make_runs(templates: list[Path], runs: Path, count: int, now_ns: int) -> None:
    """`count` run directories from the templates, as described above."""
    from labctl.analysis.catalog_record import write_record

    rng = random.Random(27)
    metas = [json.loads((t / "run.json").read_text()) for t in templates]
    gone = dead_pid()
    runs.mkdir(parents=True)
    for i in range(count):
        n = i % len(templates)
        meta = json.loads(json.dumps(metas[n]))
        started = now_ns - rng.randrange(30 * DAY_NS)
        experiment = rng.choice(EXPERIMENTS)
        stamp = time.strftime("%Y%m%d-%H%M%S", time.gmtime(started / 1e9))
        run_id = f"{stamp}-{experiment}-{i:04x}"
        roll = rng.random()
        status = "failed" if roll < 0.02 else "aborted" if roll < 0.03 else "crashed" if roll < 0.04 else ""
        meta["run_id"] = run_id
        meta["experiment"]["name"] = experiment
        meta["inventory"]["lab"] = rng.choice(LABS)
        meta["seed"] = rng.randrange(2**32)
        meta["started_wall_ns"] = started
        meta["finished_wall_ns"] = started + (metas[n]["finished_wall_ns"] - metas[n]["started_wall_ns"])
        run = runs / run_id
        run.mkdir()
        if status == "crashed":  # killed mid-run: no end, no analysis, no record
            meta.update(status="running", pid=gone)
            for key in ("finished_wall_ns", "events", "error"):
                meta.pop(key, None)
            shutil.copy(templates[n] / "events.jsonl", run / "events.jsonl")
        else:
            if status:
                meta.update(status=status, error="bench: as if it had " + status)
            for name in LINKED:
                os.link(templates[n] / name, run / name)
        (run / "run.json").write_text(json.dumps(meta))
        if status != "crashed":
            write_record(run)


def old_report(paths: list[str]) -> dict[str, Any]:
    """`labctl report RUN...` before the catalogue (labctl.analysis.compare.aggregate as it was): each run
    read back with load_run (events.jsonl parsed, breakdown.csv read), the rows pooled in pandas, each
    run's median by filtering the pooled frame."""
    import numpy as np
    import pandas as pd

    from labctl.analysis.breakdown_table import DURATIONS
    from labctl.analysis.phase_stats import phase_values, summarize
    from labctl.analysis.store import load_run

    frames, runs = [], []
    for path in paths:
        run = load_run(path)
        run_id = str(run.meta.get("run_id") or run.path.name)
        frame = run.breakdown.copy()
        frame.insert(0, "run_id", run_id)
        frames.append(frame[frame["reconfig"] > 0])
        runs.append(run_id)
    rows = pd.concat(frames, ignore_index=True)
    summary = summarize(rows, exclude_setup=False)
    for col in DURATIONS:
        per_run = []
        for run_id in runs:
            values = phase_values(rows[rows["run_id"] == run_id], col)
            per_run.append(int(np.median(values)) if values.size else None)
        summary["phases"][col.removesuffix("_ns")]["run_medians"] = per_run
    return summary


def timed(cmd: list[str], repeat: int) -> tuple[float, float, list[float], subprocess.CompletedProcess[str]]:
    """The median wall time and median CPU time (user + system) of `repeat` fresh processes, every wall
    time, and the last one's output. CPU time moves less than wall time with what else the machine runs."""
    walls, cpus = [], []
    proc: subprocess.CompletedProcess[str] | None = None
    for _ in range(repeat):
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        t0 = time.perf_counter()
        proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
        walls.append(time.perf_counter() - t0)
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        cpus.append(after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime)
        if proc.returncode != 0:
            raise SystemExit(f"{' '.join(cmd)} failed:\n{proc.stderr[-2000:]}")
    assert proc is not None
    return statistics.median(walls), statistics.median(cpus), walls, proc


def bytecode_cached() -> bool:
    return all(
        any((path.parent / "__pycache__").glob(f"{path.stem}.*.pyc"))
        for path in (REPO / "labctl").rglob("*.py")
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--runs", type=int, default=1000, help="run directories to make (default 1000)")
    ap.add_argument("--templates", type=int, default=4, help="real runs to copy them from (default 4)")
    ap.add_argument("--repeat", type=int, default=5, help="timed processes per figure, median (default 5)")
    ap.add_argument(
        "--old-repeat", type=int, default=1, help="timed processes of the JSONL path (default 1, >= 1)"
    )
    ap.add_argument("--since-days", type=float, default=14, help="--since: this many days ago (default 14)")
    ap.add_argument("--bytecode", action="store_true", help="compile labctl's modules first (see above)")
    ap.add_argument("--keep", type=Path, help="make the runs here and keep them (default: a temporary dir)")
    ap.add_argument("--old-path", type=Path, help=argparse.SUPPRESS)  # internal: time the JSONL path
    args = ap.parse_args()
    if min(args.runs, args.templates, args.repeat, args.old_repeat) < 1:
        ap.error("--runs, --templates, --repeat and --old-repeat are at least 1")
    if args.old_path is not None:  # one process of the JSONL path, over the runs listed in the file
        summary = old_report(json.loads(args.old_path.read_text()))
        print(json.dumps({name: s["median"] for name, s in summary["phases"].items()}))
        return
    if args.bytecode:
        subprocess.run([sys.executable, "-m", "compileall", "-q", str(REPO / "labctl")], check=True)
    with tempfile.TemporaryDirectory() as tmp:
        root = args.keep or Path(tmp)
        root.mkdir(parents=True, exist_ok=True)
        t0 = time.perf_counter()
        templates = make_templates(root, args.templates)
        runs = root / "runs"
        now_ns = time.time_ns()
        make_runs(templates, runs, args.runs, now_ns)
        made_s = time.perf_counter() - t0
        since = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(now_ns / 1e9 - args.since_days * 86400))
        query = ["--experiment", "reconfig-timeline", "--since", since]
        print(f"{args.runs} runs in {runs} (made in {made_s:.1f} s from {args.templates} real runs); "
              f"filters: {' '.join(query)}")  # fmt: skip

        every = ["--since", time.strftime("%Y-%m-%d", time.gmtime(now_ns / 1e9 - 31 * 86400))]
        figures: list[tuple[str, float, float]] = []

        def figure(name: str, cmd: list[str], repeat: int) -> subprocess.CompletedProcess[str]:
            wall, cpu, walls, proc = timed(cmd, repeat)
            figures.append((name, wall, cpu))
            spread[name] = walls
            return proc

        spread: dict[str, list[float]] = {}
        figure("labctl runs (first call: builds the cache)", [*LABCTL, "runs", str(runs), *query], 1)
        listed = figure(
            "labctl runs --experiment X --since DATE --json",
            [*LABCTL, "runs", str(runs), *query, "--json"],
            args.repeat,
        )
        picked = json.loads(listed.stdout)
        figure(
            "labctl runs --experiment X --since DATE (table)",
            [*LABCTL, "runs", str(runs), *query],
            args.repeat,
        )
        figure(
            "labctl runs ... --rebuild (every record read)",
            [*LABCTL, "runs", str(runs), *query, "--rebuild"],
            args.repeat,
        )
        figure(
            f"labctl report --experiment X --since DATE ({len(picked)} runs)",
            [*LABCTL, "report", str(runs), *query, "--json"],
            args.repeat,
        )
        reported = figure(
            f"labctl report, every run ({args.runs})",
            [*LABCTL, "report", str(runs), *every, "--json"],
            args.repeat,
        )
        new = json.loads(reported.stdout)
        listing = root / "every.json"
        listing.write_text(json.dumps([r["path"] for r in new["runs"]]))
        old = figure(
            f"JSONL path, every run ({len(new['runs'])}): load_run + pandas",
            [sys.executable, __file__, "--old-path", str(listing)],
            args.old_repeat,
        )
        old_medians = json.loads(old.stdout)
        same = all(new["phases"][name]["median"] == m for name, m in old_medians.items())

    cached = bytecode_cached()
    crashed = sum(r["status"] == "crashed" for r in new["runs"])
    print(f"{len(picked)} runs match the filters; every run: {len(new['runs'])} ({crashed} crashed, their "
          f"breakdowns computed from their events), {new['rows']} port rows pooled")  # fmt: skip
    print(f"{'figure':<62} {'wall':>7} {'cpu':>7}  wall min-max")
    for name, wall, cpu in figures:
        walls = spread[name]
        print(f"{name:<62} {wall:6.2f}s {cpu:6.2f}s  {min(walls):.2f}-{max(walls):.2f} s (x{len(walls)})")
    report_s, old_s = figures[-2][1], figures[-1][1]
    print(f"report, every run: JSONL path / Parquet path = {old_s / report_s:.1f}x wall, "
          f"{figures[-1][2] / figures[-2][2]:.1f}x cpu; same pooled medians: {'yes' if same else 'NO'}")  # fmt: skip
    print(f"wall and cpu (user + system): medians of fresh processes; load average "
          f"{' '.join(f'{x:.1f}' for x in os.getloadavg())} on {os.cpu_count()} CPUs; labctl bytecode "
          f"{'cached' if cached else 'compiled in every process'}; goals: runs <= 1 s, report <= 3 s")  # fmt: skip
    record(
        "catalog", f"labctl runs --experiment --since ({args.runs} runs)", figures[1][1], "s", goal="<= 1 s"
    )
    record(
        "catalog",
        f"labctl report, every run ({args.runs} runs)",
        report_s,
        "s",
        peer="JSONL path (load_run + pandas)",
        peer_value=old_s,
        goal="<= 3 s",
    )
    if not same:
        raise SystemExit("the Parquet path's pooled medians differ from the JSONL path's")


if __name__ == "__main__":
    main()
