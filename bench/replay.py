"""The replay's control path: what a replayed step stalls beyond a zero-overhead model, per switch.

    python3 bench/replay.py [--runs 5] [--switching-ms 25,0] [--steps 5]

Each run is `labctl run experiments/replay-opus-testbed.yaml --profile fast --no-plots` in a fresh process
on the simulated lab, once per mode (provisioning, on-demand) and switching time. Its summary.json holds,
for the same run, the measured stall per step and the zero-overhead model's (`ideal_stall_ns`: switches of
exactly the configured time and no control path; a provisioned switch exposes max(0, T - window), one on
demand all of T), and `overhead_per_switch_ns` = (measured - model) / switches per step. That overhead is
labctl's own path between an operation's due time and the switch command, and from the switch's
acknowledgement to the next operation's release. Goal (issue 25): at most 1 ms a switch in both modes.
Prints each run, then per mode and switching time the medians over runs.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
EXPERIMENT = REPO / "experiments/replay-opus-testbed.yaml"
MODES = ("provisioning", "on-demand")

sys.path.insert(0, str(REPO / "bench"))  # bench/ is not a package
from _table import record  # noqa: E402


def variant(directory: Path, mode: str, switching_ms: float, steps: int) -> Path:
    """The replay experiment with another mode, switching time and step count (the rest as shipped)."""
    lines = []
    for line in EXPERIMENT.read_text().splitlines():
        key = line.split(":", 1)[0]
        if key in ("mode", "switching_ms", "steps", "name"):
            continue
        lines.append(line)
    lines += [
        f"name: replay-bench-{mode}-{switching_ms:g}ms",
        f"mode: {mode}",
        f"switching_ms: {switching_ms:g}",
        f"steps: {steps}",
    ]
    path = directory / f"{mode}-{switching_ms:g}.yaml"
    path.write_text("\n".join(lines) + "\n")
    return path


def one_run(experiment: Path, out: Path, seed: int) -> dict[str, float]:
    cmd = [sys.executable, "-m", "labctl.cli", "run", str(experiment), "-i", str(REPO / "inventory.yaml"),
           "--profile", "fast", "--no-plots", "--out", str(out), "--seed", str(seed)]  # fmt: skip
    done = subprocess.run(cmd, capture_output=True, text=True, env={**os.environ, "PYTHONPATH": str(REPO)})
    run_dirs = list(out.glob("*/"))
    if done.returncode != 0 or not run_dirs:
        raise SystemExit(f"labctl run failed ({done.returncode}): {done.stderr.strip()[-500:]}")
    replay = json.loads((run_dirs[0] / "summary.json").read_text())["replay"]
    return {
        "stall_ms": replay["stall_ns"] / 1e6,
        "ideal_ms": replay["ideal_stall_ns"] / 1e6,
        "switches": replay["switches_per_step"],
        "overhead_ms": replay["overhead_per_switch_ns"] / 1e6,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--runs", type=int, default=5, help="runs per mode and switching time (default 5)")
    ap.add_argument("--switching-ms", default="25,0", help="switching times to replay (default 25,0)")
    ap.add_argument("--steps", type=int, default=5, help="replayed steps per run (default 5)")
    args = ap.parse_args()
    times = [float(t) for t in args.switching_ms.split(",") if t.strip()]
    results: dict[tuple[str, float], list[dict[str, float]]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        for switching_ms in times:
            for mode in MODES:
                experiment = variant(Path(tmp), mode, switching_ms, args.steps)
                for n in range(args.runs):
                    r = one_run(experiment, Path(tmp) / f"{mode}-{switching_ms:g}-{n}", seed=n + 1)
                    results.setdefault((mode, switching_ms), []).append(r)
                    print(f"{mode:>12} {switching_ms:g} ms, run {n + 1}: stall {r['stall_ms']:.1f} ms a step "
                          f"(model {r['ideal_ms']:.1f} ms, {r['switches']:g} switches a step): "
                          f"{r['overhead_ms']:.2f} ms a switch", flush=True)  # fmt: skip
    print(f"\nmedians over {args.runs} runs of {args.steps} steps (overhead = (stall - model) / switches per step;"
          " goal <= 1 ms a switch):")  # fmt: skip
    for (mode, switching_ms), rows in results.items():
        stall = statistics.median(r["stall_ms"] for r in rows)
        ideal = statistics.median(r["ideal_ms"] for r in rows)
        over = [r["overhead_ms"] for r in rows]
        print(f"  {mode:>12} at {switching_ms:g} ms: stall {stall:.1f} ms a step vs model {ideal:.1f} ms; "
              f"overhead {statistics.median(over):.2f} ms a switch (min {min(over):.2f}, max {max(over):.2f})")  # fmt: skip
        record("replay", f"{mode} at {switching_ms:g} ms: stall a step, median of {len(rows)}", stall, "ms",
               peer="zero-overhead model, same runs", peer_value=ideal)  # fmt: skip
        record("replay", f"{mode} at {switching_ms:g} ms: overhead a switch, median", statistics.median(over),
               "ms", goal="<= 1 ms")  # fmt: skip


if __name__ == "__main__":
    main()
