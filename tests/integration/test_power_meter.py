"""The power-meter probe (Keysight N77xx over SCPI with pyvisa) against its emulator over real TCP, and t2
taken from a meter in a run. The emulator's SCPI and averaging in-process are
tests/unit/test_power_meter.py."""

from __future__ import annotations

import asyncio
import contextlib
import random
import threading
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from pathlib import Path

import pandas as pd
import pytest

from labctl.analysis.store import read_run_json
from labctl.core.errors import HardwareError
from labctl.core.events import Event, Kind, read_events
from labctl.emulators.power_meter import N77xxEmulator, meter_emulator
from labctl.inventory.schema import Inventory, load_inventory
from labctl.models.fabric import SimFabric
from labctl.models.switch import INSERTION_LOSS_DB, SwitchModel
from labctl.ocs.drivers.sim.switch import SimSwitch
from labctl.probes.base import MeterSite, ProbeContext, probe_kinds
from labctl.probes.power_meter import NO_LIGHT_DBM, PowerMeterProbe
from labctl.probes.sampling import ProbeSettings
from labctl.run.lifecycle import run_experiment
from tests.helpers.power_meter import MS, SETTINGS, write_inventory

WITHIN_S = 10.0  # generous: a loaded machine still gets there


async def until(condition: Callable[[], bool], what: str, within_s: float = WITHIN_S) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + within_s
    while not condition():
        if loop.time() > deadline:
            pytest.fail(f"not within {within_s} s: {what}")
        await asyncio.sleep(0.01)


def meter_threads() -> list[str]:
    return [t.name for t in threading.enumerate() if t.name.startswith("power-meter:")]


@dataclass
class World:
    """The switch model lighting the NIC models, a driver session on it, and the meter's emulator."""

    inventory: Inventory
    model: SwitchModel
    control: SimSwitch
    emulator: N77xxEmulator
    site: MeterSite

    def probe(self, settings: ProbeSettings = SETTINGS) -> PowerMeterProbe:
        probe = probe_kinds.get("power-meter").build(ProbeContext(settings, meters=[self.site]))
        assert isinstance(probe, PowerMeterProbe)
        return probe


@contextlib.asynccontextmanager
async def world(tmp_path: Path, averaging: float = 2.0, quantum_ns: int = 1_000) -> AsyncIterator[World]:
    inv = load_inventory(write_inventory(tmp_path, averaging=averaging))
    rng = random.Random(3)
    models = SwitchModel.many({n: s.space for n, s in inv.switches.items()}, inv.profile(), rng)
    fabric = SimFabric(inv, models, inv.profile(), rng)  # the NICs' transmitters light the switch
    control = SimSwitch(models["ocs1"], lambda _e: None)
    channels = inv.meter_channels("pm1")
    emulator = meter_emulator("pm1", channels, models, quantum_ns=quantum_ns)
    site = MeterSite("pm1", inv.model.power_meters["pm1"], channels, lambda: emulator.address)
    await control.connect()
    await emulator.start()
    try:
        yield World(inv, models["ocs1"], control, emulator, site)
    finally:
        await emulator.close()
        await control.close()
        fabric.cancel_pending()
        models["ocs1"].cancel_pending()
    assert meter_threads() == [], "a meter's worker thread outlived its probe"


class Reader:
    def __init__(self, probe: PowerMeterProbe) -> None:
        self.seen: list[Event] = []
        self.task = asyncio.create_task(self._pump(probe))

    async def _pump(self, probe: PowerMeterProbe) -> None:
        async for event in probe.events():
            self.seen.append(event)

    def readings(self, source: str) -> list[Event]:
        return [e for e in self.seen if e.kind == Kind.RX_POWER and e.source == source]


@contextlib.asynccontextmanager
async def running(probe: PowerMeterProbe) -> AsyncIterator[Reader]:
    async with probe:
        reader = Reader(probe)
        try:
            yield reader
        finally:
            await asyncio.sleep(0)
    await asyncio.wait_for(reader.task, WITHIN_S)  # the stream ends once the probe has stopped


# -- the probe against the emulator over TCP ------------------------------------------------------------------
async def test_scpi_transcript(tmp_path: Path) -> None:
    async with world(tmp_path) as w:
        probe = w.probe()
        async with running(probe) as reader:
            await until(lambda: len(reader.readings("pm:pm1/ch1")) >= 1, "a first reading")
        transcript = list(w.emulator.transcript)
    lines = [line for line, _ in transcript]
    replies = dict(transcript)
    setup = ["*IDN?", "*CLS"]
    for n in (1, 2, 3):
        setup += [
            f"SENS{n}:POW:WAV 1310NM",
            f"SENS{n}:POW:UNIT 0",
            f"SENS{n}:POW:ATIM 2MS",
            f"SENS{n}:POW:RANG:AUTO 1",
            f"INIT{n}:CHAN1:CONT 1",
        ]
    setup.append("SYST:ERR?")
    for n in (1, 2, 3):
        setup += [f"SENS{n}:POW:ATIM?", f"SENS{n}:POW:WAV?", f"SENS{n}:POW:UNIT?"]
    setup.append("SYST:ERR?")
    assert lines[: len(setup)] == setup
    assert str(replies["*IDN?"]).startswith("Keysight Technologies,N7744A,")
    assert replies["SYST:ERR?"] == '+0,"No error"'
    assert replies["SENS1:POW:ATIM?"] == "+2.000000E-03" and replies["SENS1:POW:WAV?"] == "+1.310000E-06"
    polls = lines[len(setup) :]
    assert polls and set(polls) == {"FETC1:CHAN1:POW?;:FETC2:CHAN1:POW?;:FETC3:CHAN1:POW?"}
    assert all(reply is not None and len(reply.split(";")) == 3 for _, reply in transcript[len(setup) :])


async def test_averaging_time_is_honoured_and_recorded(tmp_path: Path) -> None:
    """The meter sets its averaging time in 100 us steps here: 0.26 ms asked, 0.3 ms set, and 0.3 ms is what
    the probe records and brackets its marks with."""
    async with world(tmp_path, averaging=0.26, quantum_ns=100_000) as w:
        probe = w.probe()
        async with running(probe) as reader:
            await w.control.apply([(2, 9)])
            await until(lambda: len(reader.readings("pm:pm1/ch1")) >= 3, "three readings of ch1")
        stats = probe.stats()
    assert stats["pm1.averaging_ns"] == 300_000 and stats["pm1.averaging_ns_requested"] == 260_000
    assert stats["pm1.poll_period_ns"] == 1_000_000  # one fetch per averaging time, at most 1 kHz
    (instrument,) = [e for e in reader.seen if e.kind == Kind.INSTRUMENT]
    assert instrument.source == "pm:pm1" and instrument.value is not None
    assert instrument.meta["averaging_ns"] == {1: 300_000, 2: 300_000, 3: 300_000}
    assert instrument.meta["channels"] == {1: "h1/e0", 2: "ocs1/10", 3: "ocs1/16"}
    bracketed = [e for e in reader.seen if e.kind == Kind.RX_POWER and "prev_ns" in e.meta]
    assert bracketed and all(e.meta["averaging_ns"] == 300_000 for e in bracketed)
    # The change happened after the previous poll was sent, less two averaging times.
    assert all(e.t_ns - e.meta["prev_ns"] >= 2 * 300_000 for e in bracketed)


async def test_readings_follow_the_switch_models_light(tmp_path: Path) -> None:
    async with world(tmp_path) as w:
        a, b = w.inventory.ports[0], w.inventory.ports[1]
        probe = w.probe()
        async with running(probe) as reader:

            def latest(source: str) -> float | None:
                got = reader.readings(source)
                return None if not got else (None if got[-1].value is None else float(got[-1].value))

            def lit(source: str) -> bool:
                value = latest(source)
                return value is not None and value > -10

            await until(lambda: bool(reader.readings("pm:pm1/ch1")), "a first reading")
            assert latest("pm:pm1/ch1") is None  # nothing patched: no light
            await w.control.apply([(a.tx, b.rx), (b.tx, a.rx)])
            await until(lambda: lit("pm:pm1/ch1") and lit("pm:pm1/ch2"), "light on both tapped fibers")
            level = w.model.transmitting[b.tx] - INSERTION_LOSS_DB
            # Light comes back on a ramp: a reading taken on it lies below the level; the meter must settle
            # at the model's level (through the fiber's insertion loss), however late this loop looks.
            await until(lambda: (latest("pm:pm1/ch1") or -99.0) >= level - 0.1, "ch1 at the model's level")
            assert latest("pm:pm1/ch1") == pytest.approx(level, abs=0.1)
            await w.control.disconnect([a.tx, b.tx, a.rx, b.rx])
            await until(lambda: latest("pm:pm1/ch1") is None, "ch1 dark after the disconnect")
            await w.control.apply([(a.tx, b.rx), (b.tx, a.rx)])
            await until(lambda: lit("pm:pm1/ch1"), "ch1 lit again")
    ch1 = reader.readings("pm:pm1/ch1")
    assert all(e.host == "" and e.meta["channel"] == 1 for e in ch1)
    assert all(e.meta["nic"] == "nic:h1/e0" and e.meta["port"] == "h1/e0" for e in ch1)
    assert all(e.meta["switch"] == "ocs1" and e.meta["switch_port"] == a.rx for e in ch1)
    assert all(e.meta["prev_ns"] < e.t_ns for e in ch1[1:])
    ch2 = reader.readings("pm:pm1/ch2")
    assert ch2 and all(e.meta["port"] == "ocs1/10" and e.meta["nic"] == "nic:h2/e0" for e in ch2)
    ch3 = reader.readings("pm:pm1/ch3")  # an egress no NIC listens on: no light, and no NIC named
    assert ch3 and all(e.value is None and "nic" not in e.meta for e in ch3)
    assert all(e.meta["mw"] < 10 ** (NO_LIGHT_DBM / 10) for e in ch3)
    values = [e.value for e in ch1]
    first_dark = values.index(None, values.index(next(v for v in values if v is not None)))
    assert any(v is not None for v in values[first_dark:])  # lit, dark, lit again, in that order


async def test_a_lost_meter_is_reported_and_the_probe_stops_cleanly(tmp_path: Path) -> None:
    async with world(tmp_path) as w:
        probe = PowerMeterProbe([w.site], report_interval_ns=50 * MS, max_error_streak_s=0.2)
        async with running(probe) as reader:
            await until(lambda: bool(reader.readings("pm:pm1/ch1")), "a first reading")
            await w.emulator.close()
            await until(lambda: bool(probe.failures), "the meter given up on")
        errors = [e for e in reader.seen if e.kind == Kind.SAMPLER_ERROR]
        assert errors and errors[-1].source == "pm:pm1" and "no longer polled" in str(errors[-1].value)
        assert probe.stats()["read_errors"] >= 1


async def test_something_that_is_not_an_n77xx_is_refused_in_one_line(tmp_path: Path) -> None:
    async with world(tmp_path) as w:
        w.emulator.idn = "Acme Optics,PM-9,1,1.0"
        probe = w.probe()
        with pytest.raises(HardwareError, match=r"power meter pm1 .*: \*IDN\? answered .*not an N77xx$"):
            async with probe:
                pass


async def test_an_unreachable_meter_is_one_line(tmp_path: Path) -> None:
    async with world(tmp_path) as w:
        await w.emulator.close()  # the port is closed: the connection is refused
        probe = w.probe()
        with pytest.raises(HardwareError) as caught:
            async with probe:
                pass
        assert "power meter pm1 (TCPIP0::127.0.0.1::" in str(caught.value)
        assert "\n" not in str(caught.value)


# -- a run on the simulated lab ------------------------------------------------------------------------------
EXPERIMENT = """\
name: pm-run
rails: [0]
phases:
  a: {{pairs: [[h1, h2], [h3, h4]]}}
  b: {{pairs: [[h1, h3], [h2, h4]]}}
baseline: a
cycle: [b, a]
repeat: 1
recovery_timeout_s: 10
hold_s: 0.05
probes: {{rx_power_hz: 200, traffic_interval_us: 2000}}
analysis: {{rx_power_threshold_dbm: -10, t2_source: {t2_source}}}
"""


async def test_simulated_run_takes_t2_from_the_power_meter(tmp_path: Path) -> None:
    all_ports = "".join(f"      {n}: {{host: h{n}, nic: e0}}\n" for n in (1, 2, 3, 4))
    inventory = write_inventory(tmp_path, all_ports, averaging=1.0)
    experiment = tmp_path / "experiment.yaml"
    experiment.write_text(EXPERIMENT.format(t2_source="power-meter"))
    outcome = await run_experiment(
        experiment, inventory, profile="fast", out_dir=tmp_path / "runs", seed=5, plots=False
    )
    assert outcome.status == "completed", outcome.error
    events = list(read_events(outcome.run_dir / "events.jsonl"))
    meter = [e for e in events if e.kind == Kind.RX_POWER and e.source.startswith("pm:pm1/ch")]
    assert {e.source for e in meter} == {f"pm:pm1/ch{n}" for n in (1, 2, 3, 4)}
    start = next(e for e in events if e.kind == Kind.RUN_START)
    assert start.meta["t2_source"] == "power-meter"
    frame = pd.read_csv(outcome.run_dir / "breakdown.csv")
    assert "t2_source" in frame.columns
    measured = frame[frame["reconfig"] > 0]
    assert len(measured) == 2 * 4
    lit_times = {(e.meta["nic"], e.t_ns) for e in meter if e.value is not None and float(e.value) >= -10.0}
    # t2 is the first lit reading after the light was seen lost: a meter poll that a loaded machine held up
    # through a port's whole outage saw no dark reading, and that row has no t2 (and no source), by design.
    # Every other row's t2 is the meter's.
    dark = [(e.meta["nic"], e.t_ns) for e in meter if e.value is None or float(e.value) < -10.0]
    with_t2 = measured[measured["t2_rx_power_ns"].notna()]
    for row in measured[measured["t2_rx_power_ns"].isna()].to_dict("records"):
        t0, t5 = int(row["t0_command_ns"]), int(row["t5_traffic_ns"])
        seen = [t for nic, t in dark if nic == row["source"] and t0 <= t <= t5]
        assert not seen, f"{row['source']}: the meter saw the outage ({len(seen)} dark readings) but no t2"
    assert len(with_t2) >= 1 and (with_t2["t2_source"] == "power-meter").all()
    for row in with_t2.to_dict("records"):
        t2, source = int(row["t2_rx_power_ns"]), str(row["source"])
        assert (source, t2) in lit_times, f"{source}: t2 {t2} is no meter reading"
        assert int(row["t2_resolution_ns"]) >= 2 * MS  # a poll period plus two averaging times
    summary = outcome.summary or {}
    assert summary["t2_source"]["power-meter"] >= len(with_t2) and "dom" not in summary["t2_source"]
    stats = read_run_json(outcome.run_dir)["probes"]["power-meter"]
    assert stats["pm1.averaging_ns"] == 1_000_000


async def test_default_t2_source_is_the_dom(tmp_path: Path) -> None:
    inventory = write_inventory(tmp_path)
    experiment = tmp_path / "experiment.yaml"
    experiment.write_text(EXPERIMENT.format(t2_source="dom").replace(", t2_source: dom", ""))
    outcome = await run_experiment(
        experiment, inventory, profile="fast", out_dir=tmp_path / "runs", seed=5, plots=False
    )
    assert outcome.status == "completed", outcome.error
    start = next(e for e in read_events(outcome.run_dir / "events.jsonl") if e.kind == Kind.RUN_START)
    assert "t2_source" not in start.meta  # nothing new recorded where nothing was asked
    frame = pd.read_csv(outcome.run_dir / "breakdown.csv", keep_default_na=False)
    measured = frame[frame["reconfig"] > 0]
    assert (measured["t2_source"] == "dom").all()
