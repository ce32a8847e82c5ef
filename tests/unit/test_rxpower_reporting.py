"""The Rx-power poller's reporting over arrays of lanes: on change, threshold crossings, the dense window
while light moves, each report's bracket (`prev_ns`), a model's ports read in one batch, and the module
update-interval estimate."""

from __future__ import annotations

import math

import numpy as np
import pytest

from labctl.core.events import Event, Kind
from labctl.models.module_eeprom import EmulatedQsfp28
from labctl.probes import rxpower
from labctl.probes.rxpower import RxPowerProbe
from labctl.probes.rxpower_lanes import UPDATE_MIN_CHANGES, Lanes
from labctl.probes.rxpower_ports import ModulePort

MS = 1_000_000


@pytest.fixture(autouse=True, params=["lane by lane", "arrays"])
def _path(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> None:
    """Every test on both of the poller's paths (a few lanes, one at a time; many, as arrays)."""
    monkeypatch.setattr(rxpower, "SCALAR_LANES", 10**6 if request.param == "lane by lane" else 0)


class FakeBatch:
    """A model's batch read with values set by the test."""

    def __init__(self, n: int) -> None:
        self.mw = np.full(n, 0.5)
        self.reads = 0

    def rx_power_mw(self, slots: np.ndarray, t_ns: int) -> np.ndarray:
        self.reads += 1
        return self.mw[slots].copy()


def _probe(n: int = 2, threshold_dbm: float | None = -10.0) -> tuple[RxPowerProbe, Lanes, FakeBatch]:
    batch = FakeBatch(n)
    ports = [ModulePort(f"nic:h1/p{i}", "h1", EmulatedQsfp28, (1,), (batch, i)) for i in range(n)]
    probe = RxPowerProbe(ports, hz=1000, report_interval_ns=100 * MS, threshold_dbm=threshold_dbm)
    probe.polled = [probe._open(port) for port in ports]
    lanes = Lanes(probe.polled)
    probe._lanes = lanes
    return probe, lanes, batch


def _feed(probe: RxPowerProbe, lanes: Lanes, samples: list[tuple[int, list[float]]]) -> list[Event]:
    """Report each sample (time, mW per lane) and return what was emitted."""
    for t, mw in samples:
        probe._report(lanes, np.full(lanes.n, t, np.int64), np.array(mw, dtype=float))
    out = list(probe.queue._items)
    probe.queue._items.clear()
    return out


def test_a_model_is_read_once_per_tick_for_all_its_ports() -> None:
    probe, lanes, batch = _probe(n=64)
    assert all(p.batched for p in probe.polled) and len(lanes.batches) == 1
    assert probe._tick(lanes) and batch.reads == 1 and probe.samples == 64
    assert len(probe.queue) == 64  # first sample of every lane is reported


def test_steady_ports_are_quiet_until_their_heartbeat_and_changes_carry_the_previous_sample() -> None:
    probe, lanes, _ = _probe(n=1)
    lit, dark = 0.5, 0.0
    assert [e.t_ns for e in _feed(probe, lanes, [(MS, [lit])])] == [MS]
    assert _feed(probe, lanes, [(t * MS, [lit]) for t in range(2, 50)]) == []
    # Dark, then light back: each change is reported with the time of the sample before it.
    events = _feed(probe, lanes, [(50 * MS, [dark]), (51 * MS, [dark]), (52 * MS, [lit])])
    assert [(e.t_ns, e.value is None, e.meta["prev_ns"]) for e in events] == [
        (50 * MS, True, 49 * MS),
        (52 * MS, False, 51 * MS),
    ]
    assert [e.t_ns for e in _feed(probe, lanes, [(t * MS, [lit]) for t in range(53, 160)])] == [152 * MS]


def test_crossing_the_threshold_is_always_reported_however_small_the_step() -> None:
    probe, lanes, _ = _probe(n=1, threshold_dbm=-10.0)
    below, above = 10 ** (-10.2 / 10), 10 ** (-9.9 / 10)  # 0.3 dB apart: inside the 0.5 dB deadband
    _feed(probe, lanes, [(MS, [below])])
    events = _feed(probe, lanes, [(2 * MS, [above])])
    assert len(events) == 1 and events[0].value is not None and events[0].value >= -10.0
    assert events[0].meta["prev_ns"] == MS
    # Without a threshold the same step is inside the deadband and not a change.
    probe, lanes, _ = _probe(n=1, threshold_dbm=None)
    _feed(probe, lanes, [(MS, [below])])
    assert _feed(probe, lanes, [(2 * MS, [above])]) == []


def test_the_window_reports_densely_until_the_light_is_seen_gone_and_back() -> None:
    probe, lanes, _ = _probe(n=2)
    lit = 0.5
    _feed(probe, lanes, [(0, [lit, lit])])
    lanes.open_window(["nic:h1/p0"], 50 * MS)  # only p0's light moves
    dense = _feed(probe, lanes, [(t * MS, [lit, lit]) for t in range(1, 10)])
    assert {e.source for e in dense} == {"nic:h1/p0"}
    assert [e.t_ns for e in dense] == [2 * MS, 4 * MS, 6 * MS, 8 * MS]  # every 2 ms, not on change
    seen = _feed(probe, lanes, [(10 * MS, [0.0, lit]), (11 * MS, [lit, lit])])
    assert [e.t_ns for e in seen] == [10 * MS, 11 * MS]
    assert _feed(probe, lanes, [(t * MS, [lit, lit]) for t in range(12, 40)]) == []  # window closed
    # A window that never sees the light go closes at its deadline.
    lanes.open_window(None, 60 * MS)
    dense = _feed(probe, lanes, [(t * MS, [lit, lit]) for t in range(40, 100)])
    assert dense and max(e.t_ns for e in dense) < 60 * MS


def test_the_module_update_interval_is_estimated_from_value_changes() -> None:
    probe, lanes, _ = _probe(n=2)
    # Lane 0 changes value every 10 samples (a module refreshing every 10 ms), lane 1 every sample.
    samples = []
    for t in range(1, 1200):
        slow = 0.5 + 0.001 * (t // 10 % 2)
        fast = 0.5 + 0.001 * (t % 2)
        samples.append((t * MS, [slow, fast]))
    events = [e for e in _feed(probe, lanes, samples) if e.kind == Kind.RX_UPDATE]
    by_port = {e.source: e.value for e in events}
    assert set(by_port) == {"nic:h1/p0", "nic:h1/p1"}
    assert math.isclose(by_port["nic:h1/p0"], 10 * MS, rel_tol=0.05)
    assert math.isclose(by_port["nic:h1/p1"], MS, rel_tol=0.05)
    stats = probe.stats()
    assert stats["module_update_estimated"] == 2 and stats["module_update_ns_max"] >= 9 * MS


def test_a_constant_value_gives_no_update_estimate() -> None:
    probe, lanes, _ = _probe(n=1)
    events = _feed(probe, lanes, [(t * MS, [0.5]) for t in range(1, 3000)])
    assert not [e for e in events if e.kind == Kind.RX_UPDATE]
    assert lanes.value_changes[0] < UPDATE_MIN_CHANGES


def test_the_switch_ack_forces_the_next_sample_only_where_the_dark_gap_went_unseen() -> None:
    probe, lanes, _ = _probe(n=2)
    probe.expect_switch_acks()  # in-process: acknowledgements will come, no dense window
    lit = 0.5
    _feed(probe, lanes, [(0, [lit, lit])])
    probe.open_window(None)
    # p0's light is seen gone (a change: reported); p1's dark gap falls between two samples.
    assert [e.source for e in _feed(probe, lanes, [(MS, [0.0, lit])])] == ["nic:h1/p0"]
    assert _feed(probe, lanes, [(t * MS, [0.0, lit]) for t in range(2, 5)]) == []  # no dense reports
    probe.switched(["nic:h1/p0", "nic:h1/p1"])
    events = _feed(probe, lanes, [(5 * MS, [lit, lit])])
    # p0: light back is a change; p1: forced, the first sample after the acknowledgement.
    assert sorted(e.source for e in events) == ["nic:h1/p0", "nic:h1/p1"]
    assert _feed(probe, lanes, [(6 * MS, [lit, lit])]) == []  # forced once only


def test_without_a_threshold_the_window_closes_when_the_light_is_seen_gone_and_back() -> None:
    probe, lanes, _ = _probe(n=1, threshold_dbm=None)
    lit = 0.5
    _feed(probe, lanes, [(0, [lit])])
    probe.open_window(None)
    _feed(probe, lanes, [(MS, [0.0]), (2 * MS, [lit])])
    assert _feed(probe, lanes, [(t * MS, [lit]) for t in range(3, 60)]) == []  # closed: no dense reports


def test_a_dark_lane_is_reported_once_with_or_without_a_threshold() -> None:
    for threshold in (-10.0, None):
        probe, lanes, _ = _probe(n=1, threshold_dbm=threshold)
        first = _feed(probe, lanes, [(MS, [0.0])])
        assert [e.value for e in first] == [None]
        # unchanged darkness is news only at the heartbeat (100 ms), not every tick
        assert _feed(probe, lanes, [(t * MS, [0.0]) for t in range(2, 50)]) == [], threshold
        (back,) = _feed(probe, lanes, [(50 * MS, [0.5])])
        assert back.value is not None and round(back.value, 2) == -3.01
