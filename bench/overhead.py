"""What `labctl run --profile fast` costs beyond its experiment: the command's wall time against the
experiment's own time in the same run (its holds plus the recoveries it measured: for each reconfiguration,
the baseline's included, from its `phase` event to the last moved port's first `traffic.ok`).

The goal (issue 25) is at most 1.5 s beyond the experiment, median of 5, every run file present. Each run
is a fresh `python3 -m labctl.cli run` process (start-up, imports, analysis and figures all count). The
summary gives the median (min-max) of each part beyond the experiment: start-up (process start to
run.start), in the run (run.start to run.end beyond the experiment's own time) and after run.end, with the
load average before and after (the parts move with the machine's load).

Where PYTHONDONTWRITEBYTECODE is set (as in the project's sandboxes) and labctl has no cached bytecode,
every run compiles labctl's modules from source: ~0.15 s of start-up an installed labctl does not pay.
`--bytecode` compiles them first (`python -m compileall labctl`, into labctl/__pycache__, git-ignored);
the summary says which way it measured.

    python3 bench/overhead.py --runs 5 [--bytecode]
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
FILES = ("events.jsonl", "run.json", "summary.json", "breakdown.csv", "breakdown.parquet", "timeline.png",
         "distributions.png")  # fmt: skip

sys.path.insert(0, str(REPO / "bench"))  # bench/ is not a package
from _table import record  # noqa: E402


def own_time_s(run_dir: Path) -> tuple[float, int, int]:
    """(holds + recoveries in seconds, run.start and run.end in CLOCK_MONOTONIC ns), from the run's files."""
    events = [json.loads(line) for line in (run_dir / "events.jsonl").read_text().splitlines()]
    meta = json.loads((run_dir / "run.json").read_text())
    holds = meta["experiment"]["hold_s"] * sum(
        1 for e in events if e["kind"] == "phase" and e["meta"].get("measured")
    )
    # A reconfiguration's recovery ends at its last port's first ok with the new peer: the breakdown's t5.
    last_t5: dict[int, float] = {}
    with (run_dir / "breakdown.csv").open() as f:
        for row in csv.DictReader(f):
            if row.get("total_ns"):
                n = int(row["reconfig"])
                last_t5[n] = max(last_t5.get(n, 0.0), float(row["total_ns"]))
    ends = {e["kind"]: e["t_ns"] for e in events if e["kind"] in ("run.start", "run.end")}
    return holds + sum(last_t5.values()) / 1e9, ends["run.start"], ends["run.end"]


def spread(values: Sequence[float]) -> str:
    return f"{statistics.median(values):.2f} s ({min(values):.2f}-{max(values):.2f})"


def bytecode_cached() -> bool:
    """Whether labctl's modules have bytecode the runs can load (else each run compiles them)."""
    return all(
        any((path.parent / "__pycache__").glob(f"{path.stem}.*.pyc"))
        for path in (REPO / "labctl").rglob("*.py")
    )


def load() -> str:
    return " ".join(f"{x:.2f}" for x in os.getloadavg())


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--experiment", default=str(REPO / "experiments/reconfig-timeline.yaml"))
    ap.add_argument("--bytecode", action="store_true", help="compile labctl's modules first (see above)")
    args = ap.parse_args()
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    if args.bytecode:
        subprocess.run([sys.executable, "-m", "compileall", "-q", str(REPO / "labctl")], check=True, env=env)
    cached = bytecode_cached()
    load_before = load()
    beyond, walls, owns, befores, afters, ins = [], [], [], [], [], []
    with tempfile.TemporaryDirectory() as tmp:
        for n in range(args.runs):
            out = Path(tmp) / str(n)
            cmd = [sys.executable, "-m", "labctl.cli", "run", args.experiment, "-i", str(REPO / "inventory.yaml"),
                   "--profile", "fast", "--out", str(out), "--seed", str(n + 1)]  # fmt: skip
            t0 = time.monotonic_ns()  # CLOCK_MONOTONIC, as the run's events
            done = subprocess.run(cmd, capture_output=True, text=True, env=env, check=False)
            t1 = time.monotonic_ns()
            wall = (t1 - t0) / 1e9
            run_dir = next(out.glob("*/"))
            missing = [f for f in FILES if not (run_dir / f).is_file()]
            own, start_ns, end_ns = own_time_s(run_dir)
            span = (end_ns - start_ns) / 1e9
            before, after = (start_ns - t0) / 1e9, (t1 - end_ns) / 1e9
            beyond.append(wall - own)
            walls.append(wall)
            owns.append(own)
            befores.append(before)
            afters.append(after)
            ins.append(span - own)
            print(f"run {n + 1}: wall {wall:.2f} s, experiment {own:.2f} s (run.start→end {span:.2f} s; start-up "
                  f"{before:.2f} s, after run.end {after:.2f} s), beyond {wall - own:.2f} s, exit {done.returncode}{', missing ' + ', '.join(missing) if missing else ''}",
                  flush=True)  # fmt: skip
    print(f"\nover {args.runs} runs: wall median {statistics.median(walls):.2f} s; experiment's own time median "
          f"{statistics.median(owns):.2f} s; beyond it median {statistics.median(beyond):.2f} s "
          f"(min {min(beyond):.2f}, max {max(beyond):.2f}); goal <= 1.5 s")  # fmt: skip
    print(f"beyond it: start-up {spread(befores)}, in the run {spread(ins)}, after run.end {spread(afters)}; "
          f"labctl bytecode {'cached' if cached else 'compiled in every run'}; "
          f"load average {load_before} before, {load()} after")  # fmt: skip
    record("overhead", f"labctl run --profile fast wall time, median of {args.runs}", statistics.median(walls),
           "s", peer="the experiment's own time (holds + recoveries)", peer_value=statistics.median(owns))  # fmt: skip
    record("overhead", "beyond the experiment's own time, median", statistics.median(beyond), "s",
           goal="<= 1.5 s")  # fmt: skip


if __name__ == "__main__":
    main()
