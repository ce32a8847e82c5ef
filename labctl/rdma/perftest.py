"""Latency statistics the way perftest's `ib_write_lat`/`ib_send_lat` report them, so the RDMA probe's
figures sit beside perftest's on the same host (linux-rdma/perftest `print_report_lat`).

perftest takes each full round trip (successive post times of a ping-pong), halves it (`rtt_factor` 2 for
SEND and WRITE), sorts, drops the top 2 (`LAT_MEASURE_TAIL`), and prints t_min, t_max, t_typical (the
median of the rest), t_avg, t_stdev, and the 99% and 99.9% values as `delta[ceil(n · 0.99)]` over the
remaining n (indexing the sorted array, whose dropped tail is still behind it).
"""

from __future__ import annotations

import math
import statistics
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
