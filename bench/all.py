"""Every bench script in turn, and their headline figures as one table (issue 25).

    python3 bench/all.py                    # --quick: each script with its quickest honest settings
    python3 bench/all.py --full             # each script with its own defaults (the figures of record)
    python3 bench/all.py --only tl1,events  # a subset; --skip a,b leaves some out
    python3 bench/all.py --json             # the rows (and what was skipped or failed) as JSON

Runs each bench/*.py (not this one, not the `_` helpers) as its own `python3 bench/X.py` process, one at a
time, with LABCTL_BENCH_TABLE naming a temporary file: each script appends a row there per headline figure
it prints (bench/_table.py's `record`), beside what it prints as always. Each script gets a timeout (SIGTERM,
so the ones that make namespaces clean up; SIGKILL to its process group 15 s later). A script is skipped,
with a one-line reason, when it needs root and this is not root (carrier, traffic, rdma), a GPU
(gpu_device_check), or a tool that is not on PATH (mosquitto for mqtt and agents; ip, and ethtool for the
root rows of dom). A script fails when it exits non-zero, times out, or records no row.

The table: bench, figure, value and unit, the named peer measured in the same run (or a published
reference) and its value (times in s, ms or µs, whichever reads best), ratio = value / peer value (so < 1
means less than the peer: faster for times, slower for rates), and the goal as the script states it. Then the skipped and failed
scripts with why, and the total wall time. The figures are one run's on whatever else the machine is
doing: noisy, and with --quick fewer repeats than the scripts' defaults. Progress goes to stderr, the table
(or the JSON) to stdout; a script's own output goes to stderr with --verbose, otherwise only a failed one's
tail is shown. Exit status 1 if a script failed, 130 after Ctrl-C (what ran so far is still reported).
`--dry-run` prints each script's command line (or why it would be skipped) and runs nothing.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

BENCH = Path(__file__).resolve().parent
REPO = BENCH.parent
GRACE_S = 15.0


@dataclass(frozen=True)
class Settings:
    """How all.py runs one script: `quick` arguments (and environment) for --quick, `full` for --full
    (empty: the script's defaults); `{tmp}` in an argument is a scratch directory of the run's own."""

    quick: tuple[str, ...] = ()
    quick_env: dict[str, str] = field(default_factory=dict)
    full: tuple[str, ...] = ()
    root: bool = False
    gpu: bool = False
    tools: tuple[str, ...] = ()
    root_tools: tuple[str, ...] = ()  # needed only when run as root (the rows that need root use them)
    quick_timeout_s: float = 300.0


SCRIPTS: dict[str, Settings] = {
    "agents": Settings(quick=("--runs", "2"), tools=("mosquitto",)),
    "catalog": Settings(quick=("--runs", "20", "--repeat", "1")),
    "carrier": Settings(
        quick_env={"BENCH_CYCLES": "50", "BENCH_MANY_CYCLES": "20"}, root=True, tools=("ip",)
    ),
    "dashboard": Settings(quick=("--rounds", "1")),
    # the lent device machine's read-only check: a report, not a file, from here (the GPU part records rows)
    "device_check": Settings(quick=("--dry-run",), full=("--dry-run",), gpu=True),
    "dom": Settings(quick=("--rounds", "3", "--seconds", "0.2"), root_tools=("ip", "ethtool")),
    "events": Settings(quick=("--repeat", "3")),
    "gpu_device_check": Settings(
        quick=("--out", "{tmp}", "--iterations", "2000", "--warmup", "500"), full=("--out", "{tmp}"), gpu=True
    ),
    "inputs": Settings(quick=("--runs", "1")),
    "interrupt": Settings(quick=("--tries", "1")),
    "mqtt": Settings(quick=("--seconds", "1"), tools=("mosquitto",)),
    "overhead": Settings(quick=("--runs", "2")),
    "plans": Settings(quick=("--repeat", "1")),
    "protocols": Settings(quick=("--rounds", "2", "--remaps", "10")),
    "rdma": Settings(root=True),
    "replay": Settings(quick=("--runs", "2", "--switching-ms", "25", "--steps", "3")),
    "scale": Settings(quick=("--ports", "16,512", "--rounds", "1")),
    "tl1": Settings(quick=("--n", "200", "--remaps", "10")),
    "traffic": Settings(root=True),
}


@dataclass
class Outcome:
    name: str
    argv: list[str]
    env: dict[str, str]
    rows: list[dict[str, Any]] = field(default_factory=list)
    skipped: str | None = None
    failed: str | None = None
    wall_s: float = 0.0


def discover() -> list[str]:
    """bench/*.py but this file and the `_` helpers; a script not in SCRIPTS runs with its defaults."""
    me = Path(__file__).resolve().name
    return sorted(p.stem for p in BENCH.glob("*.py") if p.name != me and not p.name.startswith("_"))


def have_gpu() -> bool:
    smi = shutil.which("nvidia-smi")
    if smi is None:
        return False
    try:
        out = subprocess.run([smi, "-L"], capture_output=True, text=True, timeout=30, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return False
    return out.returncode == 0 and "GPU" in out.stdout


def skip_reason(s: Settings, is_root: bool) -> str | None:
    if s.root and not is_root:
        return "needs root (network namespaces)"
    if s.gpu and not have_gpu():
        return "needs a CUDA GPU (no nvidia-smi GPU here)"
    missing = [t for t in (*s.tools, *(s.root_tools if is_root else ())) if shutil.which(t) is None]
    if missing:
        return f"needs {', '.join(missing)} on PATH"
    return None


def names_of(text: str) -> list[str]:
    return [n.strip().removesuffix(".py") for n in text.split(",") if n.strip()]


def command(name: str, s: Settings, quick: bool, tmp: Path) -> tuple[list[str], dict[str, str]]:
    args = s.quick if quick else s.full
    return (
        [sys.executable, str(BENCH / f"{name}.py"), *(a.replace("{tmp}", str(tmp)) for a in args)],
        dict(s.quick_env) if quick else {},
    )


def shown(argv: list[str], env: dict[str, str]) -> str:
    """The command as one would type it from the repository root."""
    words = [f"{k}={v}" for k, v in env.items()] + ["python3", os.path.relpath(argv[1], REPO), *argv[2:]]
    return " ".join(words)


def run_one(o: Outcome, table: Path, timeout_s: float, verbose: bool, log: Path) -> None:
    env = {**os.environ, **o.env, "LABCTL_BENCH_TABLE": str(table), "PYTHONUNBUFFERED": "1"}
    # This checkout's labctl, whether or not it is the one installed.
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO), os.environ.get("PYTHONPATH")) if p)
    t0 = time.monotonic()
    with log.open("wb") as out:
        proc = subprocess.Popen(
            o.argv,
            cwd=REPO,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=sys.stderr if verbose else out,  # stdout stays the table's (or the JSON's)
            stderr=subprocess.STDOUT,
            start_new_session=True,  # its own process group: what it leaves behind is ended with it
        )
        code: int | None = None
        try:
            code = proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            stop(proc)
        except BaseException:  # Ctrl-C here: its own session did not get the SIGINT
            stop(proc)
            raise
        finally:
            with contextlib.suppress(ProcessLookupError):  # what it left behind (emulators, brokers...)
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    o.wall_s = time.monotonic() - t0
    if table.exists():
        o.rows = [json.loads(line) for line in table.read_text(encoding="utf-8").splitlines() if line.strip()]
    if code is None:
        o.failed = f"timed out after {timeout_s:.0f} s ({len(o.rows)} rows before)"
    elif code != 0:
        o.failed = f"exit {code}: {last_line(log) or '(no output)'}"
    elif not o.rows:
        o.failed = f"exit 0 but recorded no row: {last_line(log) or '(no output)'}"


def stop(proc: subprocess.Popen[bytes]) -> None:
    """SIGTERM (the scripts that make namespaces unwind on it and remove them), GRACE_S to exit."""
    proc.send_signal(signal.SIGTERM)
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(timeout=GRACE_S)


def last_line(log: Path) -> str:
    lines = [ln.strip() for ln in log.read_text(errors="replace").splitlines() if ln.strip()]
    return lines[-1][:200] if lines else ""


def number(v: float | None) -> str:
    if v is None or not math.isfinite(v):
        return "-"
    a = abs(v)
    if isinstance(v, int):  # a count
        return f"{v:,}"
    if a >= 1000:
        return f"{v:,.0f}"
    if a >= 100:
        return f"{v:.1f}"
    if a >= 1:
        return f"{v:.2f}"
    return f"{v:.3g}"


SECONDS = {"s": 1.0, "ms": 1e-3, "µs": 1e-6, "us": 1e-6, "ns": 1e-9}


def readable(value: float | None, unit: str) -> str:
    """The value and its unit, a time in the unit that puts it in 1-999 (0.00035 s -> 350 µs); "-" for none."""
    if value is None or not math.isfinite(value):
        return "-"
    if unit in SECONDS and value != 0:
        secs = abs(value) * SECONDS[unit]
        to = next((u for u in ("s", "ms", "µs") if secs >= SECONDS[u]), "ns")
        value, unit = value * SECONDS[unit] / SECONDS[to], to
    return f"{number(value)} {unit}".rstrip()


def ratio(r: float | None) -> str:
    if r is None or not math.isfinite(r):
        return ""
    return f"{r:,.0f}x" if abs(r) >= 100 else f"{r:.2f}x" if abs(r) >= 0.1 else f"{r:.3g}x"


def table(rows: list[dict[str, Any]]) -> list[str]:
    head = ("bench", "figure", "value", "peer", "peer value", "ratio", "goal")
    body = []
    for r in rows:
        unit = r.get("unit") or ""
        body.append(
            (
                str(r.get("bench", "")),
                str(r.get("figure", "")),
                readable(r.get("value"), unit),
                r.get("peer") or "",
                readable(r.get("peer_value"), unit) if r.get("peer_value") is not None else "",
                ratio(r.get("ratio")),
                r.get("goal") or "",
            )
        )
    widths = [max(len(c[i]) for c in [head, *body]) for i in range(len(head))]
    right = {2, 4, 5}  # numbers right-aligned

    def line(cells: tuple[str, ...]) -> str:
        padded = (
            c.rjust(w) if i in right else c.ljust(w)
            for i, (c, w) in enumerate(zip(cells, widths, strict=True))
        )
        return "  ".join(padded).rstrip()

    return [line(head), "  ".join("-" * w for w in widths), *(line(c) for c in body)]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    mode = ap.add_mutually_exclusive_group()
    mode.add_argument(
        "--quick", dest="quick", action="store_true", default=True, help="quickest honest settings (default)"
    )
    mode.add_argument("--full", dest="quick", action="store_false", help="each script's own defaults")
    ap.add_argument("--only", default="", help="comma-separated scripts to run (e.g. tl1,events)")
    ap.add_argument("--skip", default="", help="comma-separated scripts to leave out")
    ap.add_argument("--json", action="store_true", help="print the rows (and skips, failures) as JSON")
    ap.add_argument("--timeout", type=float, help="per-script timeout in s (default: 300 quick, 3600 full)")
    ap.add_argument("--verbose", "-v", action="store_true", help="let each script's output through (stderr)")
    ap.add_argument("--dry-run", action="store_true", help="print what would run or be skipped, run nothing")
    args = ap.parse_args()

    known = discover()
    only, skip = names_of(args.only), names_of(args.skip)
    unknown = sorted(set(only + skip) - set(known))
    if unknown:
        ap.error(f"no such bench script: {', '.join(unknown)} (there are: {', '.join(known)})")
    chosen = [n for n in known if (not only or n in only) and n not in skip]
    is_root = os.geteuid() == 0
    started = time.monotonic()
    outcomes: list[Outcome] = []
    interrupted = False
    err = sys.stderr
    with tempfile.TemporaryDirectory(prefix="labctl-bench-all-") as tmp_dir:
        tmp = Path(tmp_dir)
        for i, name in enumerate(chosen, 1):
            s = SCRIPTS.get(name, Settings())
            scratch = tmp / name
            scratch.mkdir()
            argv, env = command(name, s, args.quick, scratch)
            o = Outcome(name, argv, env)
            outcomes.append(o)
            o.skipped = skip_reason(s, is_root)
            tag = f"[{i}/{len(chosen)}] {shown(argv, env)}"
            if o.skipped or args.dry_run:
                print(f"{tag}: {'skipped, ' + o.skipped if o.skipped else 'would run'}", file=err, flush=True)
                continue
            timeout_s = args.timeout or (s.quick_timeout_s if args.quick else 3600.0)
            print(f"{tag} ...", file=err, flush=True)
            try:
                run_one(o, tmp / f"{name}.jsonl", timeout_s, args.verbose, tmp / f"{name}.log")
            except (
                KeyboardInterrupt
            ):  # the script was stopped (SIGTERM, then its group killed): report so far
                o.failed = "interrupted (Ctrl-C); the scripts after it did not run"
                print(f"    FAILED: {o.failed}", file=err, flush=True)
                interrupted = True
                break
            status = f"FAILED: {o.failed}" if o.failed else "ok"
            print(f"    {o.wall_s:.1f} s, {len(o.rows)} rows, {status}", file=err, flush=True)
            if o.failed and not args.verbose:
                for ln in (tmp / f"{name}.log").read_text(errors="replace").splitlines()[-8:]:
                    print(f"    | {ln}", file=err)
    wall = time.monotonic() - started
    if args.dry_run:
        return 0
    rows = [r for o in outcomes for r in o.rows]
    skipped = {o.name: o.skipped for o in outcomes if o.skipped}
    failed = {o.name: o.failed for o in outcomes if o.failed}
    if args.json:
        doc = {
            "mode": "quick" if args.quick else "full",
            "rows": rows,
            "skipped": skipped,
            "failed": failed,
            "commands": {o.name: shown(o.argv, o.env) for o in outcomes if not o.skipped},
            "wall_s": round(wall, 1),
        }
        print(json.dumps(doc, indent=2, ensure_ascii=False))
    else:
        print("\n".join(table(rows)) if rows else "(no rows)")
        print()
        for name, why in skipped.items():
            print(f"skipped {name}: {why}")
        for name, why in failed.items():
            print(f"FAILED  {name}: {why}")
        ran = sum(1 for o in outcomes if not o.skipped)
        print(
            f"{'quick' if args.quick else 'full'} mode: {ran} ran, {len(skipped)} skipped, {len(failed)} failed; "
            f"total wall time {wall:.0f} s"
        )
    return 130 if interrupted else 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
