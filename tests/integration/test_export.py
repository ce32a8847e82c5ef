"""`labctl export RUN --format perfetto` on a real run: every measured row's recovery is a slice on its
port's track at its own stamps, every switch command is one, nothing is negative, and the CLI refuses an
unknown format in one line."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from pathlib import Path

import pytest

from labctl.analysis.store import load_run
from labctl.run.lifecycle import RunOutcome, run_experiment
from tests.helpers.trace_format import trace_format_problems

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def outcome(tmp_path_factory: pytest.TempPathFactory) -> RunOutcome:
    """One fast run of the main experiment, exported both ways."""
    experiment = REPO / "experiments" / "reconfig-timeline.yaml"
    out = tmp_path_factory.mktemp("export") / "runs"
    done = asyncio.run(
        run_experiment(experiment, REPO / "inventory.yaml", profile="fast", out_dir=out, seed=5, plots=False)
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
