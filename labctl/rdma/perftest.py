"""Latency statistics the way perftest's `ib_write_lat`/`ib_send_lat` report them, so the RDMA probe's
figures sit beside perftest's on the same host (linux-rdma/perftest `print_report_lat`).

perftest takes each full round trip (successive post times of a ping-pong), halves it (`rtt_factor` 2 for
SEND and WRITE), sorts, drops the top 2 (`LAT_MEASURE_TAIL`), and prints t_min, t_max, t_typical (the
median of the rest), t_avg, t_stdev, and the 99% and 99.9% values as `delta[ceil(n · 0.99)]` over the
remaining n (indexing the sorted array, whose dropped tail is still behind it).

`parse_latency_table` reads that table back from a perftest latency tool's output (`ib_send_lat`,
`ib_write_lat`: a header line naming `t_typical[usec]`, then one line of numbers), and `run_latency_tool`
runs one as server and client on one device (loopback through the NIC), as bench/rdma.py and
bench/device_check.py compare labctl's verbs-rc probe with it.
"""

from __future__ import annotations

import math
import shutil
import statistics
import subprocess
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

LAT_MEASURE_TAIL = 2


@dataclass(frozen=True)
class LatencyReport:
    """One-way latency (round trip / rtt_factor), ns, over `n` samples after the tail was dropped."""

    n: int
    t_min: float
    t_max: float
    t_typical: float
    t_avg: float
    t_stdev: float
    p99: float
    p999: float

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def latency_report(round_trips_ns: Sequence[int], rtt_factor: int = 2) -> LatencyReport:
    if len(round_trips_ns) <= LAT_MEASURE_TAIL:
        raise ValueError(
            f"{len(round_trips_ns)} round trips: perftest's report needs more than {LAT_MEASURE_TAIL}"
        )
    delta = sorted(v / rtt_factor for v in round_trips_ns)
    n = len(delta) - LAT_MEASURE_TAIL
    kept = delta[:n]
    typical = (kept[n // 2 - 1] + kept[n // 2]) / 2 if n % 2 == 0 else kept[n // 2]
    return LatencyReport(
        n=n,
        t_min=kept[0],
        t_max=kept[-1],
        t_typical=typical,
        t_avg=statistics.fmean(kept),
        t_stdev=statistics.pstdev(kept),
        p99=delta[min(math.ceil(n * 0.99), len(delta) - 1)],
        p999=delta[min(math.ceil(n * 0.999), len(delta) - 1)],
    )


def parse_latency_table(text: str) -> dict[str, float] | None:
    """The first latency row under perftest's `#bytes #iterations t_min[usec] ... t_typical[usec] ...`
    header: median (t_typical) and 99th percentile in µs, with t_min, t_max, t_avg and the iterations;
    None when the output holds no such table."""
    lines = text.splitlines()
    for i, line in enumerate(lines):
        if "t_typical" in line and i + 1 < len(lines):
            try:
                values = [float(v) for v in lines[i + 1].split()]
            except ValueError:
                return None
            if len(values) >= 8:  # #bytes #iterations t_min t_max t_typical t_avg t_stdev 99% [99.9%]
                return {
                    "bytes": values[0],
                    "iterations": values[1],
                    "min_us": values[2],
                    "max_us": values[3],
                    "median_us": values[4],
                    "avg_us": values[5],
                    "p99_us": values[7],
                }
    return None


def run_latency_tool(
    tool: str, device: str, gid_index: int, iterations: int, timeout_s: float = 60.0
) -> dict[str, float] | str:
    """Run perftest's `tool` as server and client on `device` (loopback); its table (parse_latency_table),
    or why not, in one line."""
    if shutil.which(tool) is None:
        return f"{tool} not installed (apt install perftest)"
    args = [tool, "-d", device, "-x", str(gid_index), "-n", str(iterations), "-p", "18515"]
    server = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        time.sleep(1.0)
        client = subprocess.run([*args, "127.0.0.1"], capture_output=True, text=True, timeout=timeout_s)
    except subprocess.TimeoutExpired:
        return f"{tool}: no answer within {timeout_s:g} s"
    finally:
        server.kill()
        server.wait()
    table = parse_latency_table(client.stdout)
    if table is None:
        return f"{tool}: no latency table in its output ({(client.stderr or client.stdout).strip()[-160:]})"
    return table
