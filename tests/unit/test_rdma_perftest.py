"""perftest's latency report (labctl.rdma.perftest) on known samples."""

from __future__ import annotations

import pytest

from labctl.rdma.perftest import latency_report


def test_round_trips_are_halved_sorted_and_the_top_two_dropped() -> None:
    rtts = [2_000 * k for k in range(1, 101)] + [10**9, 2 * 10**9]  # 100 samples + 2 outliers
    report = latency_report(rtts)
    assert report.n == 100
    assert report.t_min == 1_000 and report.t_max == 100_000  # outliers gone, one way
    assert report.t_typical == (50_000 + 51_000) / 2  # median of an even count
    assert report.t_avg == pytest.approx(50_500)
    assert report.p99 == 100_000  # delta[ceil(100 * 0.99)] = the 100th value
    assert report.p999 == 10**9 / 2  # delta[ceil(99.9)] = delta[100]: perftest indexes into the tail


def test_read_latency_is_not_halved_and_too_few_samples_is_an_error() -> None:
    assert latency_report([10, 20, 30, 40], rtt_factor=1).t_typical == 15
    with pytest.raises(ValueError, match="needs more than 2"):
        latency_report([1, 2])
