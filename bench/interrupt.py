"""How long `labctl run` takes to stop after Ctrl-C or SIGTERM, mid-run, on the opus-testbed profile.

Each try starts the main experiment on the simulated lab, waits until a reconfiguration after the baseline
is under way (a random moment), sends the signal, and times the process's exit from the signal. A try
counts as clean when the exit code is 130, run.json says `aborted` with no "NOT restored", and the event
log ends with `run.end` after a restore of the baseline. The peer is the run's own experiment time: the
figure to beat is 1.5 s (issue 25), whatever the experiment's length.

    python3 bench/interrupt.py --tries 10          # 10 SIGINT, 10 SIGTERM
"""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
LIMIT_S = 1.5

sys.path.insert(0, str(REPO / "bench"))  # bench/ is not a package
from _table import record  # noqa: E402


def one_try(sig: signal.Signals, out: Path, rng: random.Random, profile: str) -> dict[str, object]:
    cmd = [
        sys.executable, "-m", "labctl.cli", "run", str(REPO / "experiments/reconfig-timeline.yaml"),
        "--inventory", str(REPO / "inventory.yaml"), "--profile", profile, "--out", str(out),
    ]  # fmt: skip
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env)
    # Mid-run: once the run directory has a reconfiguration after the baseline in its log, a little later.
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and proc.poll() is None:
        logs = list(out.glob("*/events.jsonl"))
        if logs and logs[0].read_text().count('"kind":"phase"') >= 2:
            break
        time.sleep(0.05)
    time.sleep(rng.uniform(0.0, 0.6))
    t0 = time.monotonic()
    proc.send_signal(sig)
    try:
        code = proc.wait(timeout=60)
    except subprocess.TimeoutExpired:
        proc.kill()
        code = proc.wait()
    exit_s = time.monotonic() - t0
    run_dir = next(out.glob("*/"), None)
    meta = json.loads((run_dir / "run.json").read_text()) if run_dir else {}
    tail = (run_dir / "events.jsonl").read_text().splitlines()[-3:] if run_dir else []
    clean = (
        code == 130
        and meta.get("status") == "aborted"
        and "NOT restored" not in str(meta.get("error"))
        and bool(tail)
        and '"kind":"run.end"' in tail[-1]
    )
    return {"signal": sig.name, "exit_s": exit_s, "code": code, "clean": clean}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--tries", type=int, default=10, help="tries per signal (SIGINT and SIGTERM)")
    ap.add_argument("--profile", default="opus-testbed")
    ap.add_argument("--seed", type=int, default=1)
    args = ap.parse_args()
    rng = random.Random(args.seed)
    results = []
    with tempfile.TemporaryDirectory() as tmp:
        for n in range(args.tries):
            for sig in (signal.SIGINT, signal.SIGTERM):
                r = one_try(sig, Path(tmp) / f"{sig.name}-{n}", rng, args.profile)
                results.append(r)
                print(f"{r['signal']:>7} try {n + 1}: exit {r['exit_s']:.2f} s after the signal, code {r['code']}"
                      f"{'' if r['clean'] else '  NOT CLEAN'}", flush=True)  # fmt: skip
    print()
    for name in ("SIGINT", "SIGTERM"):
        times = [float(r["exit_s"]) for r in results if r["signal"] == name]  # type: ignore[arg-type]
        ok = sum(1 for r in results if r["signal"] == name and r["clean"] and float(r["exit_s"]) <= LIMIT_S)  # type: ignore[arg-type]
        print(f"{name}: exit after the signal, over {len(times)} tries: median {statistics.median(times):.2f} s, "
              f"max {max(times):.2f} s; {ok}/{len(times)} clean within {LIMIT_S} s")  # fmt: skip
        record("interrupt", f"exit after {name}, median ({args.profile})", statistics.median(times), "s",
               goal=f"<= {LIMIT_S} s")  # fmt: skip
        record("interrupt", f"{name} tries clean within {LIMIT_S} s", ok, f"of {len(times)}",
               goal=f"{len(times)} of {len(times)}")  # fmt: skip


if __name__ == "__main__":
    main()
