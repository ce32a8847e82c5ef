"""Event-log append throughput and breakdown time over 1M events, each against a named peer in the same run.

- append: labctl.core.events.EventLog.emit (msgspec, batched whole-line writes) vs the obvious stdlib way
  (json.dumps of a dict per event + file.write), both to a file in a temp dir.
- breakdown: labctl.analysis.breakdown (EventIndex.from_file + compute_breakdown) over a 1M-event run vs just
  loading the same file with pandas.read_json(lines=True).
Goals (issue 2): append ≥ 200k events/s; breakdown over 1M events ≤ 5 s. Prints medians of repeated runs.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path

import pandas as pd

from labctl.analysis.breakdown import compute_breakdown
from labctl.analysis.event_index import EventIndex
from labctl.core.clock import Timebase
from labctl.core.events import EventLog

sys.path.insert(0, str(Path(__file__).resolve().parent))  # bench/ is not a package
from _table import record

PORTS = [f"nic:h{h}/ens{r}f{p}np{p}" for h in range(1, 5) for r in (1, 2) for p in (0, 1)]
MS = 1_000_000


def synthetic_run(log: EventLog, n_events: int, seed: int = 0) -> int:
    """A realistic stream: per reconfiguration a phase event, two OCS commands, then per port the
    recovery sequence, padded with Rx-power and traffic heartbeats until n_events are written."""
    rng = random.Random(seed)
    t = 0
    n = 0
    reconfig = 0
    per_reconfig = 2_000
    while n < n_events:
        log.reconfig = reconfig
        t0 = t + 10 * MS
        log.emit(
            t0 - 1000,
            "phase",
            "controller",
            "pp" if reconfig % 2 else "dp",
            meta={
                "step": reconfig // 4,
                "measured": True,
                "rails": [0, 1],
                "ports": [
                    {
                        "source": s,
                        "host": s[4:6],
                        "port": s.split("/")[1],
                        "rail": int(s[10]) - 1,
                        "peer": None,
                    }
                    for s in PORTS
                ],
            },
        )
        for rail in (0, 1):
            log.emit(t0, "ocs.command", "ocs:ocs1", 8, meta={"rail": rail})
            log.emit(t0 + 25 * MS, "ocs.complete", "ocs:ocs1", 25 * MS, meta={"rail": rail})
        n += 5
        for s in PORTS:
            fw = t0 + 6_000 * MS + rng.randrange(300 * MS)
            for dt, kind, value in (
                (MS, "rx_power", None),
                (MS, "traffic.lost", None),
                (2 * MS, "carrier", 0),
                (27 * MS, "rx_power", -2.5),
                (fw - t0, "link.firmware", 1),
                (fw - t0 + 75_000, "carrier", 1),
                (fw - t0 + 150 * MS, "traffic.ok", 9000),
            ):
                log.emit(t0 + dt, kind, s, value, host=s[4:6])
                n += 1
        for i in range(per_reconfig - 5 - 7 * len(PORTS)):
            s = PORTS[i % len(PORTS)]
            kind = "rx_power" if i % 2 else "traffic.ok"
            log.emit(
                t0 + 6_500 * MS + i * 100_000,
                kind,
                s,
                -2.5 if kind == "rx_power" else 9000,
                host=s[4:6],
                meta={"n": 100},
            )
            n += 1
        t = t0 + 7_000 * MS
        reconfig += 1
    return n


def bench_append(path: Path, n: int) -> float:
    log = EventLog(path, Timebase(0, 0))
    start = time.perf_counter()
    for i in range(n):
        log.emit(i, "rx_power", "nic:h1/ens1f0np0", -2.5, host="h1", meta={"lane": 1})
    log.close()
    return n / (time.perf_counter() - start)


def bench_append_stdlib(path: Path, n: int) -> float:
    start = time.perf_counter()
    with open(path, "w") as f:
        for i in range(n):
            f.write(
                json.dumps(
                    {
                        "seq": i,
                        "t_ns": i,
                        "wall_ns": i,
                        "host": "h1",
                        "source": "nic:h1/ens1f0np0",
                        "kind": "rx_power",
                        "value": -2.5,
                        "reconfig": None,
                        "meta": {"lane": 1},
                    }
                )
                + "\n"
            )
    return n / (time.perf_counter() - start)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--events", type=int, default=1_000_000, help="events in the breakdown run")
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        d = Path(tmp)
        ours, peer = [], []
        for _ in range(args.repeat):
            ours.append(bench_append(d / "a.jsonl", 200_000))
            peer.append(bench_append_stdlib(d / "b.jsonl", 200_000))
            (d / "a.jsonl").unlink()
            (d / "b.jsonl").unlink()
        m_ours, m_peer = statistics.median(ours), statistics.median(peer)
        print(f"append, 200k events x {args.repeat} runs (median):")
        print(f"  labctl EventLog.emit        {m_ours:12,.0f} events/s   (goal >= 200,000)")
        print(f"  stdlib json.dumps + write   {m_peer:12,.0f} events/s")
        print(f"  ratio ours/stdlib           {m_ours / m_peer:12.2f}x")
        record(
            "events",
            "EventLog.emit append, 200k events",
            m_ours,
            "events/s",
            peer="stdlib json.dumps + write",
            peer_value=m_peer,
            goal=">= 200,000 events/s",
        )

        path = d / "events.jsonl"
        log = EventLog(path, Timebase(0, 0))
        written = synthetic_run(log, args.events)
        log.close()
        size_mb = path.stat().st_size / 1e6
        times, rows = [], 0
        for _ in range(3):
            start = time.perf_counter()
            frame = compute_breakdown(EventIndex.from_file(path))
            times.append(time.perf_counter() - start)
            rows = len(frame)
        start = time.perf_counter()
        pd.read_json(path, lines=True)
        t_pandas = time.perf_counter() - start
        t_ours = statistics.median(times)
        print(f"breakdown over {written:,} events ({size_mb:.0f} MB, {rows} rows), 3 runs (median):")
        print(f"  labctl load + breakdown     {t_ours:8.2f} s   (goal <= 5 s)")
        print(f"  pandas.read_json(lines) only{t_pandas:8.2f} s")
        print(f"  ratio ours/pandas-load      {t_ours / t_pandas:8.2f}x")
        record(
            "events",
            f"load + breakdown, {written:,} events",
            t_ours,
            "s",
            peer="pandas.read_json(lines) only",
            peer_value=t_pandas,
            goal="<= 5 s at 1M events",
        )


if __name__ == "__main__":
    main()
