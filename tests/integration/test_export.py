"""`labctl export RUN --format perfetto` on a real run: every measured row's recovery is a slice on its
port's track at its own stamps, every switch command is one, nothing is negative, and the CLI refuses an
unknown format in one line."""

from __future__ import annotations

import asyncio
import json
import math
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pandas as pd
import pytest

from labctl.analysis.breakdown import DEFAULT_THRESHOLD_DBM
from labctl.analysis.store import load_run
from labctl.run.lifecycle import RunOutcome, run_experiment
from tests.helpers.trace_format import trace_format_problems

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def outcome(tmp_path_factory: pytest.TempPathFactory) -> RunOutcome:
    """One fast run of the main experiment, exported both ways."""
    experiment = REPO / "experiments" / "reconfig-timeline.yaml"
    root = tmp_path_factory.mktemp("export")
    out = root / "runs"
    # The fast profile's dark gap (2-3 ms) is a few 1 kHz samples: on a loaded machine a sampler that stalls
    # over it misses whole reconfigurations. A 20-25 ms gap (still fast) is seen whatever the machine does.
    inventory = root / "inventory.yaml"
    inventory.write_text(
        (REPO / "inventory.yaml")
        .read_text()
        .replace(
            "profile: opus-testbed",
            "profile: opus-testbed\nprofiles:\n  fast-dark: {extends: fast, switching_ms: [20.0, 25.0]}",
        )
    )
    done = asyncio.run(
        run_experiment(experiment, inventory, profile="fast-dark", out_dir=out, seed=5, plots=False)
    )
    assert done.status == "completed"
    return done


def test_the_perfetto_trace_is_the_run(outcome: RunOutcome) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "labctl.cli", "export", str(outcome.run_dir)], capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr
    trace = json.loads((outcome.run_dir / "trace.perfetto.json").read_text())["traceEvents"]
    run = load_run(outcome.run_dir)
    origin = run.meta["timebase"]["mono0_ns"]
    tracks = {(e["pid"], e["tid"]): e["args"]["name"] for e in trace if e["name"] == "thread_name"}
    hosts = {e["pid"]: e["args"]["name"] for e in trace if e["name"] == "process_name"}
    recoveries = {
        (hosts[e["pid"]], tracks[(e["pid"], e["tid"])], e["args"]["reconfig"]): e
        for e in trace
        if e["ph"] == "X" and e["cat"] == "recovery"
    }
    rows = run.breakdown.dropna(subset=["t0_command_ns", "t5_traffic_ns"])
    assert len(rows) == 9 * 16  # the baseline and 8 reconfigurations, 16 ports each
    for row in rows.itertuples():
        e = recoveries[(row.host, row.port, row.reconfig)]
        assert e["ts"] == (row.t0_command_ns - origin) / 1e3
        assert e["dur"] == (row.t5_traffic_ns - row.t0_command_ns) / 1e3
    assert all(e["dur"] >= 0 for e in trace if e["ph"] == "X")
    # The trace-event format's rules: ph/pid/tid on every event, ts on every timed one, complete slices
    # nest on their track, time moves forward on each track (tests/helpers/trace_format.py).
    assert trace_format_problems(trace) == []
    completes = run.events[run.events["kind"] == "ocs.complete"]
    assert len([e for e in trace if e["ph"] == "X" and e["cat"] == "switch"]) == len(completes) == 9
    bad = subprocess.run(
        [sys.executable, "-m", "labctl.cli", "export", str(outcome.run_dir), "--format", "svg"],
        capture_output=True,
        text=True,
    )
    assert bad.returncode == 2 and bad.stderr.strip() == "error: --format svg: not one of perfetto, vcd"


def test_the_vcd_is_well_formed_and_follows_the_run(outcome: RunOutcome) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "labctl.cli", "export", str(outcome.run_dir), "--format", "vcd"],
        capture_output=True,
        text=True,
    )
    assert done.returncode == 0, done.stderr
    lines = (outcome.run_dir / "timeline.vcd").read_text(encoding="ascii").splitlines()
    end = lines.index("$enddefinitions $end")
    declared, depth, scopes = {}, 0, []
    for line in lines[:end]:
        words = line.split()
        if words[0] == "$scope":
            depth += 1
            scopes.append(words[2])
        elif words[0] == "$upscope":
            depth -= 1
            scopes.pop()
        elif words[0] == "$var":
            assert words[1:3] == ["wire", "1"] and words[-1] == "$end"
            declared[words[3]] = (scopes[-2], scopes[-1], words[4])
    assert depth == 0 and len(declared) == 16 * 4  # 16 ports x light, firmware, carrier, traffic
    times, levels = [], {}
    for line in lines[end + 1 :]:
        if line.startswith("#"):
            times.append(int(line[1:]))
        elif line[0] in "01x" and line[1:] in declared:
            levels[declared[line[1:]]] = line[0]
        else:
            assert line in ("$dumpvars", "$end"), line
    assert times == sorted(times) and len(set(times)) == len(times)  # time moves forward, once per stamp
    # After the last reconfiguration every port carries light, link, carrier and traffic again.
    assert set(levels.values()) == {"1"} and len(levels) == 64


def test_an_independent_vcd_reader_reads_it(outcome: RunOutcome) -> None:
    """pyvcd's tokenizer (another project's reading of IEEE 1364) takes the whole file without a parse
    error: a 1 ns timescale, 16 port scopes under their hosts, 64 one-bit wires, and every port's wires at 1
    after the last reconfiguration."""
    from vcd.reader import TokenKind, tokenize

    path = outcome.run_dir / "timeline.vcd"
    if not path.exists():
        subprocess.run(
            [sys.executable, "-m", "labctl.cli", "export", str(outcome.run_dir), "--format", "vcd"],
            check=True,
        )
    wires: dict[str, str] = {}
    final: dict[str, int | str] = {}
    scopes: list[str] = []
    times: list[int] = []
    with path.open("rb") as f:
        for token in tokenize(f):
            if token.kind is TokenKind.TIMESCALE:
                assert (int(token.timescale.magnitude), token.timescale.unit.value) == (1, "ns")
            elif token.kind is TokenKind.SCOPE:
                scopes.append(token.scope.ident)
            elif token.kind is TokenKind.VAR:
                assert token.var.size == 1
                wires[token.var.id_code] = token.var.reference
            elif token.kind is TokenKind.CHANGE_TIME:
                times.append(token.time_change)
            elif token.kind is TokenKind.CHANGE_SCALAR:
                final[token.scalar_change.id_code] = token.scalar_change.value
    assert len(wires) == 64 and sorted(set(wires.values())) == ["carrier", "firmware", "light", "traffic"]
    assert {"h1", "h2", "h3", "h4"} <= set(scopes) and len(scopes) == 4 + 16
    assert times == sorted(times)
    assert set(final) == set(wires) and set(final.values()) == {"1"}


def _export(run_dir: Path, fmt: str) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "labctl.cli", "export", str(run_dir), "--format", fmt],
        capture_output=True,
        text=True,
    )
    assert done.returncode == 0, done.stderr


def _outages(outcome: RunOutcome) -> tuple[list[Any], set[tuple[int, str]], int, float]:
    """The run's recovered rows (the breakdown: its reconfigurations and the ports each moved), which of
    them the receiver's own samples saw dark ((reconfig, source): a sample below the threshold or of no light
    at all from the command to t2, or since before the command for a port that had no light), the run's
    origin and its threshold."""
    run = load_run(outcome.run_dir)
    start = run.events[run.events["kind"] == "run.start"]["meta"].iloc[0]
    threshold = float(start.get("rx_power_threshold_dbm", DEFAULT_THRESHOLD_DBM))
    rx = run.events[run.events["kind"] == "rx_power"]
    dark_seen = set()
    rows = list(
        run.breakdown.dropna(subset=["t0_command_ns", "t2_rx_power_ns", "t5_traffic_ns"]).itertuples()
    )
    for row in rows:
        samples = rx[rx["source"] == row.source]
        dark = [v is None or v < threshold for v in samples["value"]]
        t = samples["t_ns"].to_numpy()
        before = [d for d, ts in zip(dark, t, strict=True) if ts < row.t0_command_ns]
        within = [d for d, ts in zip(dark, t, strict=True) if row.t0_command_ns <= ts < row.t2_rx_power_ns]
        if any(within) or (row.reconfig == 0 and before and before[-1]):
            dark_seen.add((row.reconfig, row.source))
    return rows, dark_seen, int(run.meta["timebase"]["mono0_ns"]), threshold


def _check_outages(
    rows: list[Any],
    dark_seen: set[tuple[int, str]],
    out: Callable[[Any], bool],
    back: Callable[[Any], bool],
) -> None:
    """Every recovered row's port goes dark after its command (or was dark since before the baseline's) and
    its light comes back at the row's t2. A row whose samples never read the dark (a sampler stalled over the
    whole gap: the breakdown brackets its t2 back to t0) cannot show it; such rows stay few."""
    assert len(rows) == 9 * 16  # the baseline and 8 reconfigurations, 16 ports each
    shown = {(row.reconfig, row.source) for row in rows if out(row)}
    assert shown == dark_seen
    assert len(dark_seen) > len(rows) // 2, f"the samples saw only {len(dark_seen)} outages"
    missing = [
        (row.reconfig, row.source)
        for row in rows
        if (row.reconfig, row.source) in dark_seen and not back(row)
    ]
    assert missing == []


def test_every_outage_is_dark_in_the_vcd(outcome: RunOutcome) -> None:
    """Read by pyvcd's tokenizer: on every recovered reconfiguration each moved port's `light` wire was 1
    before the command (0 before the baseline's), goes to 0 after it, and is 1 again exactly at the row's t2.
    A sample of no light (None) is dark: before issue 45 the wire never left 1."""
    from vcd.reader import TokenKind, tokenize

    _export(outcome.run_dir, "vcd")
    rows, dark_seen, origin, _ = _outages(outcome)
    names: dict[str, tuple[str, str, str]] = {}  # id code → (host, port, wire)
    scopes: list[str] = []
    changes: dict[tuple[str, str, str], list[tuple[int, str]]] = {}
    t = 0
    with (outcome.run_dir / "timeline.vcd").open("rb") as f:
        for token in tokenize(f):
            if token.kind is TokenKind.SCOPE:
                scopes.append(token.scope.ident)
            elif token.kind is TokenKind.UPSCOPE:
                scopes.pop()
            elif token.kind is TokenKind.VAR:
                names[token.var.id_code] = (scopes[-2], scopes[-1], token.var.reference)
            elif token.kind is TokenKind.CHANGE_TIME:
                t = token.time_change
            elif token.kind is TokenKind.CHANGE_SCALAR:
                change = token.scalar_change
                changes.setdefault(names[change.id_code], []).append((t, str(change.value)))
    lights = [w for w in changes if w[2] == "light"]
    assert len(lights) == 16 and all("0" in {v for _, v in changes[w]} for w in lights)

    def light(row: Any) -> list[tuple[int, str]]:
        return changes[(row.host, row.port, "light")]

    def out(row: Any) -> bool:
        t0, t2 = row.t0_command_ns - origin, row.t2_rx_power_ns - origin
        was = next((v for t, v in reversed(light(row)) if t < t0), "x")
        went_out = any(v == "0" for t, v in light(row) if t0 <= t < t2)
        # The baseline's ports may have had no light before its command: dark since then is the outage.
        return (went_out and was == "1") or (row.reconfig == 0 and (went_out or was == "0"))

    def back(row: Any) -> bool:
        return (row.t2_rx_power_ns - origin, "1") in light(row)

    _check_outages(rows, dark_seen, out, back)


def test_every_outage_is_dark_in_the_perfetto_trace(outcome: RunOutcome) -> None:
    """The Chrome trace-event JSON read with json: on every recovered reconfiguration each moved port's Rx
    power counter drops to the trace's documented dark value (metadata `rx_power_dark_dbm`, under every
    reading a source reports) after the command and reads light (≥ the threshold) again exactly at t2."""
    _export(outcome.run_dir, "perfetto")
    payload = json.loads((outcome.run_dir / "trace.perfetto.json").read_text())
    dark_dbm = payload["metadata"]["rx_power_dark_dbm"]
    assert dark_dbm == -100.0
    trace = payload["traceEvents"]
    rows, dark_seen, origin, threshold = _outages(outcome)
    hosts = {e["pid"]: e["args"]["name"] for e in trace if e["name"] == "process_name"}
    counters: dict[tuple[str, str], list[tuple[float, float]]] = {}
    for e in trace:
        if e["ph"] == "C" and e["name"].startswith("rx "):
            port = e["name"].removeprefix("rx ").removesuffix(" dBm")
            counters.setdefault((hosts[e["pid"]], port), []).append((e["ts"], e["args"]["dBm"]))
    assert all(dark_dbm in {v for _, v in c} for c in counters.values()) and len(counters) == 16
    assert all(v == dark_dbm or v > -99.99 for c in counters.values() for _, v in c)

    def us(t_ns: int) -> float:
        return (t_ns - origin) / 1e3

    def out(row: Any) -> bool:
        samples = counters[(row.host, row.port)]
        t0, t2 = us(row.t0_command_ns), us(row.t2_rx_power_ns)
        was = next((v for t, v in reversed(samples) if t < t0), None)
        went_out = any(v == dark_dbm for t, v in samples if t0 <= t < t2)
        lit = was is not None and was >= threshold
        return (went_out and lit) or (row.reconfig == 0 and (went_out or was == dark_dbm))

    def back(row: Any) -> bool:
        return any(t == us(row.t2_rx_power_ns) and v >= threshold for t, v in counters[(row.host, row.port)])

    _check_outages(rows, dark_seen, out, back)


def test_no_light_is_dark_and_nothing_measured_is_left_out() -> None:
    """A sample of no light (None, or -inf as the breakdown holds it) is `light = 0` and the counter's dark
    value; a switch port that measures nothing (`monitor: none`, also None) draws no counter sample."""
    from labctl.analysis.perfetto import FLOOR_DBM, trace_events
    from labctl.analysis.vcd import vcd_lines

    rows = [
        {"kind": "rx_power", "source": "nic:h1/p0", "host": "h1", "t_ns": 1, "value": -3.0, "meta": {}},
        {"kind": "rx_power", "source": "nic:h1/p0", "host": "h1", "t_ns": 2, "value": None, "meta": {}},
        {"kind": "rx_power", "source": "nic:h1/p0", "host": "h1", "t_ns": 3, "value": -2.0, "meta": {}},
        {"kind": "rx_power", "source": "nic:h1/p0", "host": "h1", "t_ns": 4, "value": -math.inf, "meta": {}},
        {
            "kind": "rx_power",
            "source": "ocs:s/3",
            "host": "s",
            "t_ns": 5,
            "value": None,
            "meta": {"monitor": "none"},
        },
    ]
    events = pd.DataFrame(rows)
    lines = list(vcd_lines(events, 0, -20.0, "r"))
    body = lines[lines.index("$end", lines.index("$dumpvars")) + 1 :]
    assert body == ["#1", "1!", "#2", "0!", "#3", "1!", "#4", "0!"]
    counters = [
        (e["ts"], e["args"]["dBm"]) for e in trace_events(events, pd.DataFrame(), 0) if e["ph"] == "C"
    ]
    assert counters == [(0.001, -3.0), (0.002, FLOOR_DBM), (0.003, -2.0), (0.004, FLOOR_DBM)]
