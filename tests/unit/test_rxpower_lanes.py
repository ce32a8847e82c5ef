"""The per-lane paths (a few ports, as on an agent's host) decide exactly as the array paths (hundreds of
ports in one process): the Rx-power poller's reports and lane state, the model's Rx power readings and
the model traffic probe's pings, over random sequences of light, windows and switch notices."""

from __future__ import annotations

import copy
import math
import random
from pathlib import Path

import numpy as np
import pytest

from labctl.core.events import Event
from labctl.inventory.profiles import resolve_profile
from labctl.inventory.schema import load_inventory
from labctl.models import fabric_reads
from labctl.models.fabric import SimFabric
from labctl.models.module_eeprom import EmulatedQsfp28
from labctl.models.port_arrays import NEVER, PortArrays
from labctl.models.switch import SwitchModel
from labctl.probes import model as model_probes
from labctl.probes import rxpower
from labctl.probes.model import SimTrafficProbe
from labctl.probes.rxpower import RxPowerProbe
from labctl.probes.rxpower_lanes import Lanes
from labctl.probes.rxpower_ports import ModulePort

MS = 1_000_000
REPO = Path(__file__).resolve().parents[2]
LANE_STATE = (
    "live", "reported", "reported_t", "last_dbm", "last_mw", "sampled_t", "window_until", "seen_dark", "force",
    "moving", "dark_seen", "steady_ns", "value_changes",
)  # fmt: skip


def _probe(n: int, threshold_dbm: float | None) -> tuple[RxPowerProbe, Lanes]:
    ports = [ModulePort(f"nic:h1/p{i}", "h1", EmulatedQsfp28, (1,), None) for i in range(n)]
    probe = RxPowerProbe(ports, hz=1000, report_interval_ns=20 * MS, threshold_dbm=threshold_dbm)
    probe.polled = [probe._open(port) for port in ports]
    probe._lanes = lanes = Lanes(probe.polled)
    return probe, lanes


def _same(a: np.ndarray, b: np.ndarray) -> bool:
    """Exactly equal, but for floats within an ulp or two: math.log10 per lane and numpy's SIMD log10
    over an array may round the last bit differently (numpy 2.4 on this machine)."""
    if a.dtype.kind == "f":
        return bool(np.allclose(a, b, rtol=1e-13, atol=0.0, equal_nan=True))
    return bool(np.array_equal(a, b))


def _drain(probe: RxPowerProbe) -> list[tuple[int, str, str, object, dict[str, object]]]:
    out = [(e.t_ns, e.kind, e.source, e.value, e.meta) for e in probe.queue._items]
    probe.queue._items.clear()
    return out


@pytest.mark.parametrize("threshold_dbm", [-10.0, None])
@pytest.mark.parametrize("seed", range(6))
def test_rx_power_reports_lane_by_lane_as_with_arrays(
    monkeypatch: pytest.MonkeyPatch, seed: int, threshold_dbm: float | None
) -> None:
    rng = random.Random(seed)
    n = 4
    by_lane, lanes_a = _probe(n, threshold_dbm)
    by_array, lanes_b = _probe(n, threshold_dbm)
    sources = [f"nic:h1/p{i}" for i in range(n)]
    mw = [0.5] * n
    for step in range(1, 600):
        t = step * MS
        for k in range(n):  # light goes, comes back, wobbles around the deadband, a read fails
            r = rng.random()
            if r < 0.03:
                mw[k] = 0.0
            elif r < 0.06:
                mw[k] = rng.choice([0.5, 0.08, 0.1, 0.11, 6.5535])
            elif r < 0.5 and mw[k] > 0:
                mw[k] = round(mw[k] * (1 + rng.uniform(-0.03, 0.03)), 4)
        read = [m if rng.random() > 0.02 else math.nan for m in mw]
        if rng.random() < 0.02:
            lanes_a.live[rng.randrange(n)] = False
            lanes_b.live[:] = lanes_a.live
        action = rng.random()
        chosen = rng.sample(sources, rng.randint(1, n))
        until = t + rng.randint(1, 30) * MS
        for probe in (by_lane, by_array):
            if action < 0.03:
                probe._lanes.open_window(chosen, until)  # type: ignore[union-attr]
            elif action < 0.05:
                probe.switched(chosen)
            elif action < 0.06:
                probe.close_window()
        times = np.array([t + k for k in range(n)], np.int64)  # each lane read at its own instant
        monkeypatch.setattr(rxpower, "SCALAR_LANES", n)
        by_lane._report(lanes_a, times.copy(), np.array(read))
        monkeypatch.setattr(rxpower, "SCALAR_LANES", 0)
        by_array._report(lanes_b, times.copy(), np.array(read))
        assert _drain(by_lane) == _drain(by_array), f"step {step}"
        if step % 7 == 0:  # between, the lane-by-lane state stays in lists from tick to tick
            for name in LANE_STATE:
                assert _same(getattr(lanes_a, name), getattr(lanes_b, name)), (step, name)
    for name in LANE_STATE:
        assert _same(getattr(lanes_a, name), getattr(lanes_b, name)), name


@pytest.fixture(params=["lists", "gathers"])
def optics(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """The model's few-port readers on the lab's optics kept as lists (a small lab), or gathering from the
    arrays per read (a large one, `fabric_reads.LIST_PORTS`)."""
    if request.param == "gathers":
        monkeypatch.setattr(fabric_reads, "LIST_PORTS", 0)
    return str(request.param)


def _fabric(seed: int) -> SimFabric:
    inv = load_inventory(REPO / "inventory.yaml")
    profile = resolve_profile("fast")
    model = SwitchModel("ocs1", inv.switches["ocs1"].space, profile, random.Random(seed))
    return SimFabric(inv, {"ocs1": model}, profile, random.Random(seed))


def _scramble(fabric: SimFabric, rng: random.Random, t: int) -> None:
    """Random optical and link state: lit or dark, settling or settled, modules refreshing or not."""
    a = fabric.arrays
    n = a.lit_from.size
    for slot in range(n):
        a.lit_from[slot] = rng.choice([-1, rng.randrange(n)])
        a.level_dbm[slot] = rng.uniform(-12, 9)
        a.light_t_ns[slot] = t - rng.randint(-2 * MS, 4 * MS)
        a.settle_ns[slot] = rng.choice([0, rng.randint(1, 3 * MS)])
        a.update_ns[slot] = rng.choice([0, 0, rng.randint(MS // 2, 5 * MS)])
        a.update_phase_ns[slot] = rng.randint(0, 5 * MS)
        a.before_mw[slot] = rng.choice([0.0, 0.3])
        a.transport[slot] = rng.random() < 0.7
        a.link_t_ns[slot] = t - rng.randint(-MS, 4 * MS)
        a.transport_up_ns[slot] = rng.choice([NEVER, a.link_t_ns[slot] + rng.randint(0, 2 * MS)])


def _slots(kind: str, n: int, rng: random.Random) -> np.ndarray:
    """Which ports a read asks for: a few (an agent's host), every port in slot order (a poller of the
    whole lab: no gather), every port out of order, or one port twice."""
    if kind == "few":
        return np.array(sorted(rng.sample(range(n), 4)), np.int64)
    if kind == "whole":
        return np.arange(n)
    if kind == "shuffled":
        return np.array(rng.sample(range(n), n), np.int64)
    few = rng.sample(range(n), 3)
    return np.array([few[0], few[1], few[0], few[2]], np.int64)


@pytest.mark.parametrize("kind", ["few", "whole", "shuffled", "repeated"])
@pytest.mark.parametrize("seed", range(4))
@pytest.mark.usefixtures("optics")
def test_model_rx_power_port_by_port_as_with_arrays(
    monkeypatch: pytest.MonkeyPatch, seed: int, kind: str
) -> None:
    rng = random.Random(seed)
    one = _fabric(seed)
    other = copy.deepcopy(one)
    slots = _slots(kind, one.arrays.lit_from.size, rng)
    assert slots.size <= fabric_reads.SCALAR_SLOTS
    for step in range(200):
        t = 10**12 + step * 300_000
        if step % 20 == 0:
            state = random.Random(seed * 1000 + step)
            _scramble(one, state, t)
            _scramble(other, random.Random(seed * 1000 + step), t)
        monkeypatch.setattr(fabric_reads, "SCALAR_SLOTS", 16)
        each = one.rx_power_mw(slots, t)
        monkeypatch.setattr(fabric_reads, "SCALAR_SLOTS", 0)
        arrays = other.rx_power_mw(slots, t)
        assert each.tolist() == arrays.tolist(), f"step {step}"
        if step % 7 == 0 or step == 199:  # between, a small lab's optics stay lists from read to read
            assert np.array_equal(one.arrays.noise_db, other.arrays.noise_db)  # the same noise, in order
            assert np.array_equal(one.arrays.noise_t_ns, other.arrays.noise_t_ns)


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.usefixtures("optics")
def test_model_traffic_pings_circuit_by_circuit_as_with_arrays(
    monkeypatch: pytest.MonkeyPatch, seed: int
) -> None:
    rng = random.Random(seed)
    one = _fabric(seed)
    other = copy.deepcopy(one)
    ports = one.port_at[:8]
    probes = [SimTrafficProbe(fabric, fabric.port_at, report_interval_ns=15 * MS) for fabric in (one, other)]
    peers = [p.source for p in one.port_at[8:16]]
    for probe in probes:
        probe.set_circuits(dict(zip([p.source for p in ports], peers, strict=True)))
    out: list[list[Event]] = [[], []]
    for step in range(400):
        t = 10**12 + step * MS
        if step % 25 == 0:
            _scramble(one, random.Random(seed * 1000 + step), t)
            _scramble(other, random.Random(seed * 1000 + step), t)
        if rng.random() < 0.02:  # a circuit moves, or goes
            change = {ports[rng.randrange(8)].source: rng.choice([None, *peers])}
            for probe in probes:
                probe.set_circuits(change)
        for k, (probe, scalar) in enumerate(zip(probes, (16, 0), strict=True)):
            monkeypatch.setattr(model_probes, "SCALAR_SLOTS", scalar)
            probe._ping_all(t)
            out[k].extend(probe.queue._items)
            probe.queue._items.clear()
    assert [(e.t_ns, e.kind, e.source, e.value, e.meta) for e in out[0]] == [
        (e.t_ns, e.kind, e.source, e.value, e.meta) for e in out[1]
    ]
    assert len(out[0]) > 50  # changes and heartbeats happened
    assert probes[0].pings == probes[1].pings


@pytest.mark.parametrize("scalar", [16, 0])
def test_a_new_circuits_first_ping_has_no_bracket_from_the_old_circuits(
    monkeypatch: pytest.MonkeyPatch, scalar: int
) -> None:
    """A ping's report names the ping before it (`prev_ns`: the bracket of a traffic mark) only where that
    ping was of the same circuit: the first ping after a re-target to another peer has none (a first ping
    that gets through says traffic flows, not since when), as a UDP probe's new circuit; a re-target to the
    same peer keeps the circuit's pings."""
    monkeypatch.setattr(model_probes, "SCALAR_SLOTS", scalar)
    fabric = _fabric(0)
    port, old_peer, new_peer = (p.source for p in fabric.port_at[:3])
    probe = SimTrafficProbe(fabric, fabric.port_at, report_interval_ns=15 * MS)

    def ping(t: int) -> list[Event]:
        probe._ping_all(t)
        reports = [e for e in probe.queue._items if e.source == port]
        probe.queue._items.clear()
        return reports

    t = 10**12
    probe.set_circuits({port: old_peer})
    assert [e.meta["peer"] for e in ping(t)] == [old_peer]
    ping(t + MS)  # the old circuit's last ping
    probe.set_circuits({port: new_peer})
    [first] = ping(t + 2 * MS)
    assert first.meta["peer"] == new_peer and "prev_ns" not in first.meta, first.meta
    probe.set_circuits({port: new_peer})  # told again, the same circuit: its pings go on
    [again] = ping(t + 3 * MS)
    assert again.meta["prev_ns"] == t + 2 * MS, again.meta


@pytest.mark.parametrize("pairs", [1, 3, 8, 16])
@pytest.mark.parametrize("seed", range(4))
@pytest.mark.usefixtures("optics")
def test_model_passes_pair_by_pair_as_traffic_ok(seed: int, pairs: int) -> None:
    """`passes_each` reads a few pairs' ends (a gather) or, for as many ends as the lab has ports, the rows
    whole: either way as `traffic_ok` decides with arrays."""
    rng = random.Random(seed)
    fabric = _fabric(seed)
    n = fabric.arrays.lit_from.size
    for step in range(100):
        t = 10**12 + step * 200_000
        if step % 10 == 0:
            _scramble(fabric, random.Random(seed * 1000 + step), t)
            a = fabric.arrays
            for slot in rng.sample(range(n), n // 2):  # some circuits both ways, up, to pass
                peer = int(a.lit_from[slot])
                if peer >= 0:
                    a.lit_from[peer] = slot
                    a.light_t_ns[[slot, peer]] = t - MS
                    a.link_t_ns[[slot, peer]] = t - MS
                    a.transport_up_ns[[slot, peer]] = t + rng.randint(-MS, MS)
        chosen = [(rng.randrange(n), rng.randrange(n)) for _ in range(pairs)]
        src = np.array([s for s, _ in chosen], np.int64)
        dst = np.array([d for _, d in chosen], np.int64)
        assert fabric.passes_each(chosen, t) == fabric.traffic_ok(src, dst, t).tolist(), f"step {step}"
    assert any(fabric.passes_each([(s, int(fabric.arrays.lit_from[s]))], t)[0] for s in range(n))


def test_port_arrays_fields_are_rows_of_their_blocks_in_a_copy_too() -> None:
    """The fields a reader takes in one gather (`PortArrays.ints`, `.floats`) stay views of the blocks'
    rows in a copy of the model (copy.deepcopy, pickle), so a write to a field is what the block reads."""
    import pickle

    fabric = _fabric(0)
    copies = (fabric.arrays, copy.deepcopy(fabric).arrays, pickle.loads(pickle.dumps(fabric.arrays)))
    for k, arrays in enumerate(copies):
        arrays.light_t_ns[3] = 12345 + k
        arrays.noise_db[2] = 0.25 + k
        assert arrays.ints[PortArrays.INT_ROWS.index("light_t_ns"), 3] == 12345 + k
        assert arrays.floats[PortArrays.FLOAT_ROWS.index("noise_db"), 2] == 0.25 + k
        assert arrays.lit_from.base is arrays.ints and arrays.level_dbm.base is arrays.floats
    assert [int(arrays.light_t_ns[3]) for arrays in copies] == [12345, 12346, 12347]  # copies, not shared


@pytest.mark.parametrize("batches", [1, 2])
@pytest.mark.parametrize("seed", range(4))
@pytest.mark.usefixtures("optics")
def test_rx_power_ticks_in_lists_as_with_arrays(
    monkeypatch: pytest.MonkeyPatch, seed: int, batches: int
) -> None:
    """A tick of a few lanes all read in model batches works in Python lists (`_tick_lanes`): the same
    reads, reports and lane state as the tick over arrays, lanes dying, windows and switch notices; with
    one model (its read is the tick's column) or two whose lanes alternate."""
    rng = random.Random(seed)
    one, second = _fabric(seed), _fabric(seed + 100)
    other, other_second = copy.deepcopy(one), copy.deepcopy(second)
    probes: list[RxPowerProbe] = []
    for fabric, fabric_b in ((one, second), (other, other_second)):
        if batches == 1:
            sites = model_probes.model_sites(fabric, fabric.port_at[:8])
        else:
            a = model_probes.model_sites(fabric, fabric.port_at[:4])
            b = model_probes.model_sites(fabric_b, fabric_b.port_at[4:8])
            sites = [site for pair in zip(a, b, strict=True) for site in pair]
        ports = [
            ModulePort(site.port.source, site.port.host, site.open_eeprom, site.rx_lanes, site.rx_batch)
            for site in sites
        ]
        probe = RxPowerProbe(ports, hz=1000, report_interval_ns=20 * MS, threshold_dbm=-10.0)
        probe.polled = [probe._open(port) for port in ports]
        probe._lanes = Lanes(probe.polled)
        assert not probe._lanes.unbatched and len(probe._lanes.batches) == batches
        assert probe._lanes.one_batch == (batches == 1)
        probes.append(probe)
    by_lists, by_arrays = probes
    sources = [port.source for port in by_lists.ports]
    reported = 0
    for step in range(400):
        t = 10**12 + step * MS
        if step % 25 == 0:
            for fabric in (one, other, second, other_second):
                _scramble(fabric, random.Random(seed * 1000 + step + (fabric in (second, other_second))), t)
        if rng.random() < 0.01:
            dead = rng.randrange(8)
            for probe in probes:
                probe._lanes.live[dead] = False  # type: ignore[union-attr]
        action = rng.random()
        chosen = rng.sample(sources, rng.randint(1, 8))
        until = t + rng.randint(1, 30) * MS
        for probe in probes:
            if action < 0.03:
                probe._lanes.open_window(chosen, until)  # type: ignore[union-attr]
            elif action < 0.05:
                probe.switched(chosen)
        monkeypatch.setattr(rxpower, "SCALAR_LANES", 16)
        kept = by_lists._tick(by_lists._lanes, t)  # type: ignore[arg-type]
        monkeypatch.setattr(rxpower, "SCALAR_LANES", 0)
        assert by_arrays._tick(by_arrays._lanes, t) == kept  # type: ignore[arg-type]
        reports = _drain(by_lists)
        assert reports == _drain(by_arrays), f"step {step}"
        reported += len(reports)
        if step % 7 == 0:  # between, the lane-by-lane state stays in lists from tick to tick
            for name in LANE_STATE:
                assert _same(getattr(by_lists._lanes, name), getattr(by_arrays._lanes, name)), (step, name)
    for name in LANE_STATE:
        assert _same(getattr(by_lists._lanes, name), getattr(by_arrays._lanes, name)), name
    assert by_lists.samples == by_arrays.samples > 0
    assert reported > 100  # changes, heartbeats and windows happened


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.usefixtures("optics")
def test_model_traffic_pings_as_with_arrays_switching_paths_between_ticks(
    monkeypatch: pytest.MonkeyPatch, seed: int
) -> None:
    """`_ping_each` keeps the per-slot state in lists between its ticks; a tick over arrays, or a change of
    circuits, in between finds the arrays current: the same reports as a probe that only uses arrays."""
    rng = random.Random(seed)
    one = _fabric(seed)
    other = copy.deepcopy(one)
    ports = one.port_at[:8]
    peers = [p.source for p in one.port_at[8:16]]
    probes = [SimTrafficProbe(fabric, fabric.port_at, report_interval_ns=15 * MS) for fabric in (one, other)]
    for probe in probes:
        probe.set_circuits(dict(zip([p.source for p in ports], peers, strict=True)))
    out: list[list[Event]] = [[], []]
    for step in range(400):
        t = 10**12 + step * MS
        if step % 25 == 0:
            _scramble(one, random.Random(seed * 1000 + step), t)
            _scramble(other, random.Random(seed * 1000 + step), t)
        if rng.random() < 0.03:
            change = {ports[rng.randrange(8)].source: rng.choice([None, *peers])}
            for probe in probes:
                probe.set_circuits(change)
        scalar = rng.choice([16, 16, 16, 0])  # mostly one by one, now and then arrays
        for k, (probe, limit) in enumerate(zip(probes, (scalar, 0), strict=True)):
            monkeypatch.setattr(model_probes, "SCALAR_SLOTS", limit)
            probe._ping_all(t)
            out[k].extend(probe.queue._items)
            probe.queue._items.clear()
    assert [(e.t_ns, e.kind, e.source, e.value, e.meta) for e in out[0]] == [
        (e.t_ns, e.kind, e.source, e.value, e.meta) for e in out[1]
    ]
    assert len(out[0]) > 50 and probes[0].pings == probes[1].pings
    probes[0]._arrays()
    for name in ("_was_ok", "_count", "_pinged_t", "_reported_t"):
        assert np.array_equal(getattr(probes[0], name), getattr(probes[1], name)), name


@pytest.mark.usefixtures("optics")
@pytest.mark.parametrize("seed", range(6))
def test_model_read_by_few_port_and_array_readers_in_turn_as_by_arrays_alone(
    monkeypatch: pytest.MonkeyPatch, seed: int
) -> None:
    """One model read in turn by few-port readers (Rx power of a few ports or all, pings) and by the array
    readers, its light moved between (an agent mirror's port setters, a light batch, an attenuator): every
    reading as a copy read by the array readers alone, and the same arrays after."""
    rng = random.Random(seed)
    one = _fabric(seed)
    for timeline in (one.timeline, *one._switch_timelines):
        timeline.pull = True  # run when read: no loop
    other = copy.deepcopy(one)
    n = one.arrays.lit_from.size
    t = 10**12
    _scramble(one, random.Random(seed), t)
    _scramble(other, random.Random(seed), t)
    for step in range(300):
        t += rng.randint(0, 3) * 250_000
        action = rng.random()
        slot, peer, dark = rng.randrange(n), rng.randrange(n), rng.random() < 0.2
        for fabric in (one, other):
            st = fabric._states[slot]
            if action < 0.05:  # an agent mirror applies a light change through the port's state
                st.light_from = None if dark else fabric.port_at[peer]
                st.light_t_ns, st.settle_ns, st.rx_level_dbm = t, 200_000, -3.0 + step % 5 * 0.1
            elif action < 0.08:  # the switch moves light (a batch through the fabric's listener)
                port, source = fabric.port_at[slot], fabric.port_at[peer]
                fabric._on_light(port.switch, port.rx, source.tx, t)
            elif action < 0.1:  # an attenuator on the port's receive fiber
                fabric.arrays.atten_db[slot] = step % 7 * 0.5
        kind = rng.choice(["few", "whole", "repeated"])
        slots = _slots(kind, n, rng)
        pairs = [(rng.randrange(n), rng.randrange(n)) for _ in range(rng.randint(1, 8))]
        src = np.array([s for s, _ in pairs], np.int64)
        dst = np.array([d for _, d in pairs], np.int64)
        few = rng.random() < 0.8  # one reads through its few-port readers, now and then through arrays
        monkeypatch.setattr(fabric_reads, "SCALAR_SLOTS", 16 if few else 0)
        got = (one.rx_power_mw(slots, t).tolist(), one.passes_each(pairs, t) if few else None)
        monkeypatch.setattr(fabric_reads, "SCALAR_SLOTS", 0)
        want = (other.rx_power_mw(slots, t).tolist(), other.traffic_ok(src, dst, t).tolist() if few else None)
        assert got == want, f"step {step}"
    for name in (*PortArrays.INT_ROWS, *PortArrays.FLOAT_ROWS, "transport"):
        assert np.array_equal(getattr(one.arrays, name), getattr(other.arrays, name)), name
