"""The agents' clock model (labctl.agents.clock): offset and drift from exchanges, the bound it states,
shared clocks, synthetic host clocks."""

from __future__ import annotations

import random

import pytest

from labctl.agents.clock import (
    ClockIdentity,
    HostClock,
    HostClockModel,
    OffsetSample,
    fit_clock,
)
from labctl.core.errors import HardwareError


def exchanges(
    rng: random.Random,
    clock: HostClock,
    bursts: int,
    per_burst: int,
    *,
    every_ns: int = 250_000_000,
    floor_ns: int = 60_000,
    queue_ns: int = 3_000_000,
) -> list[list[OffsetSample]]:
    """Ping/pong bursts against an agent whose clock is `clock` (the controller's is the raw one). Each leg
    takes a floor plus, most of the time, queueing; now and then a leg meets no queue at all."""
    out = []
    t = 1_000_000_000
    for _ in range(bursts):
        burst = []
        for _ in range(per_burst):
            up = floor_ns + (0 if rng.random() < 0.2 else rng.randrange(queue_ns))
            down = floor_ns + (0 if rng.random() < 0.2 else rng.randrange(queue_ns))
            t1 = t
            t2 = clock.local(t1 + up)
            t3 = t2 + 20_000
            t4 = clock.raw(t3) + down
            burst.append(OffsetSample(t1, t2, t3, t4))
            t = t4 + 1_000
        out.append(burst)
        t += every_ns
    return out


def truth(clock: HostClock, t_ns: int) -> int:
    return clock.local(t_ns) - t_ns


@pytest.mark.parametrize(
    ("offset_ns", "drift_ppb"), [(0, 0), (2_500_000_000, 50_000), (-1_700_000_000, -30_000), (40_000_000, 0)]
)
def test_offset_and_drift_are_recovered_within_the_stated_bound(offset_ns: int, drift_ppb: int) -> None:
    rng = random.Random(offset_ns ^ drift_ppb)
    clock = HostClock(offset_ns, drift_ppb, ref_ns=0)
    bursts = exchanges(rng, clock, bursts=40, per_burst=8)
    fit = fit_clock(bursts)
    for t in range(fit.first_ns, fit.last_ns, (fit.last_ns - fit.first_ns) // 50):
        assert abs(fit.at(t) - truth(clock, t)) <= fit.uncertainty_ns, t
    # The queueing (up to 3 ms a leg) was filtered out: the bound is set by the fastest round trips.
    assert fit.uncertainty_ns < 200_000, fit
    span_s = (fit.last_ns - fit.first_ns) / 1e9
    assert abs(fit.drift_ppb - drift_ppb) <= 2 * fit.uncertainty_ns / span_s
    # Extrapolated past the last exchange, the bound widens with the drift's own error and still holds.
    later = fit.last_ns + 2_000_000_000
    assert fit.uncertainty_at(later) > fit.uncertainty_ns
    assert abs(fit.at(later) - truth(clock, later)) <= fit.uncertainty_at(later)


def test_the_bound_is_honest_when_every_round_trip_queued() -> None:
    """No leg ever met an empty queue: the bound is wide, and still contains the truth."""
    rng = random.Random(5)
    clock = HostClock(123_456_789, 20_000, ref_ns=0)
    bursts = exchanges(rng, clock, bursts=10, per_burst=4, floor_ns=400_000, queue_ns=8_000_000)
    for k in range(len(bursts)):
        bursts[k] = [s for s in bursts[k] if s.rtt_ns > 1_000_000] or bursts[k]
    fit = fit_clock(bursts)
    assert fit.uncertainty_ns > 400_000
    for t in (fit.first_ns, (fit.first_ns + fit.last_ns) // 2, fit.last_ns):
        assert abs(fit.at(t) - truth(clock, t)) <= fit.uncertainty_ns


def test_no_exchange_is_a_clear_error() -> None:
    with pytest.raises(HardwareError, match="no ping/pong"):
        fit_clock([[], []])


def test_a_synthetic_clock_round_trips() -> None:
    clock = HostClock(-1_700_000_000, 75_000, ref_ns=5_000_000_000)
    assert clock.synthetic and not HostClock().synthetic
    for raw in (0, 5_000_000_000, 123_456_789_012, 10**15):
        assert abs(clock.raw(clock.local(raw)) - raw) <= 2


def test_shared_clock_needs_one_boot_one_namespace_and_no_synthetic_clock() -> None:
    here = ClockIdentity("b1aafdef", 0)
    assert here.shares(ClockIdentity("b1aafdef", 0))
    assert not here.shares(ClockIdentity("other", 0))  # another machine (or a reboot)
    assert not here.shares(ClockIdentity("b1aafdef", 5_000_000_000))  # a time namespace shifts MONOTONIC
    assert not here.shares(ClockIdentity("b1aafdef", 0, synthetic=True))  # a test's skewed clock
    assert not ClockIdentity(None, 0).shares(ClockIdentity(None, 0))  # unknown is not the same
    assert ClockIdentity.from_dict(here.as_dict()) == here
    real = ClockIdentity.here()
    assert real.boot_id and real.shares(ClockIdentity.here())


def test_the_model_says_which_source_set_the_uncertainty() -> None:
    rng = random.Random(3)
    clock = HostClock(0, 0, ref_ns=0)
    model = HostClockModel()
    for burst in exchanges(rng, clock, bursts=6, per_burst=8):
        model.add_burst(burst)
    assert model.source == "exchange" and model.fit is not None
    assert model.uncertainty_at(model.fit.last_ns) == model.fit.uncertainty_ns
    # A daemon pair (both hosts disciplined to one reference) is used only where it is the tighter bound.
    model.daemon = {"source": "chrony", "offset_ns": 10, "uncertainty_ns": model.fit.uncertainty_ns * 10}
    assert model.source == "exchange"
    model.daemon["uncertainty_ns"] = 1_000
    assert model.source == "chrony" and model.offset_at(0) == 10 and model.uncertainty_at(0) == 1_000
    # One kernel's clock: exactly 0, whatever the exchanges said; they stay in the record beside it.
    model.shared = True
    assert model.source == "shared-clock" and model.offset_at(123) == 0 and model.uncertainty_at(123) == 0
    assert len(model.history) == 6
