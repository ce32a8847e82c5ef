"""labctl.analysis.perfetto on hand-made rows: slices are never negative (a flagged phase is left out, its
flag kept on the recovery slice), marks keep their ns and resolution, switch commands pair up."""

from __future__ import annotations

import math

import pandas as pd

from labctl.analysis.perfetto import trace_events

MS = 1_000_000


def _row(**marks: float) -> dict[str, object]:
    base: dict[str, object] = {
        "reconfig": 1,
        "phase": "pp",
        "host": "h1",
        "port": "eth0",
        "peer": "nic:h2/eth0",
    }
    base.update({f"t{i}_resolution_ns": math.nan for i in (2, 3, 4, 5)})
    base.update({"impossible": None, "unresolved": None})
    return {**base, **marks}


def test_slices_marks_and_a_flagged_phase() -> None:
    good = _row(t0_command_ns=10 * MS, t1_switch_done_ns=35 * MS, t2_rx_power_ns=36 * MS, t3_firmware_up_ns=86 * MS,
                t4_carrier_up_ns=86 * MS + 75_000, t5_traffic_ns=100 * MS, t2_resolution_ns=1 * MS)  # fmt: skip
    bad = _row(t0_command_ns=10 * MS, t1_switch_done_ns=35 * MS, t2_rx_power_ns=40 * MS, t3_firmware_up_ns=20 * MS,
               t4_carrier_up_ns=math.nan, t5_traffic_ns=90 * MS, port="eth1", impossible="firmware")  # fmt: skip
    events = pd.DataFrame(
        [
            {
                "kind": "ocs.command",
                "source": "ocs:ocs1",
                "t_ns": 10 * MS,
                "value": 16,
                "meta": {"rails": [0, 1]},
            },
            {"kind": "ocs.complete", "source": "ocs:ocs1", "t_ns": 35 * MS, "value": 25 * MS, "meta": {}},
            {
                "kind": "rx_power",
                "source": "nic:h1/eth0",
                "host": "h1",
                "t_ns": 36 * MS,
                "value": -float("inf"),
                "meta": {},
            },
            {"kind": "loop.lag", "source": "controller", "t_ns": 101 * MS, "value": 2 * MS, "meta": {}},
        ]
    )
    trace = trace_events(events, pd.DataFrame([good, bad]), origin_ns=0)
    slices = [e for e in trace if e["ph"] == "X"]
    assert all(e["dur"] >= 0 for e in slices)
    names = {(e["tid"], e["name"]) for e in slices}
    eth0, eth1 = (
        next(e["tid"] for e in trace if e["ph"] == "M" and e["args"]["name"] == p) for p in ("eth0", "eth1")
    )
    assert {n for t, n in names if t == eth0} == {
        "reconfig 1", "optical", "firmware", "carrier", "transport", "t2_rx_power bracket"
    }  # fmt: skip
    bracket = next(e for e in slices if e["name"] == "t2_rx_power bracket")
    assert (bracket["ts"], bracket["dur"], bracket["cat"]) == (35_000.0, 1_000.0, "bracket")  # 1 ms before t2
    assert {n for t, n in names if t == eth1} == {"reconfig 1", "optical"}  # firmware < 0: no slice; no t4
    flagged = next(e for e in slices if e["tid"] == eth1 and e["name"] == "reconfig 1")
    assert flagged["args"]["flags"] == "firmware" and flagged["ts"] == 10_000.0 and flagged["dur"] == 80_000.0
    t2 = next(e for e in trace if e["ph"] == "i" and e["tid"] == eth0 and e["name"] == "t2_rx_power")
    assert t2["args"]["t_ns"] == 36 * MS and t2["args"]["resolution_ns"] == 1 * MS and t2["ts"] == 36_000.0
    (command,) = [e for e in slices if e["cat"] == "switch"]
    assert command["dur"] == 25_000.0 and command["args"]["rails"] == [0, 1]
    counters = {e["name"]: e["args"] for e in trace if e["ph"] == "C"}
    assert counters["rx eth0 dBm"] == {"dBm": -100.0} and counters["loop lag ms"] == {"ms": 2.0}


def test_the_trace_keeps_the_formats_rules_where_the_rows_do_not() -> None:
    """A phase that would start inside the one before it (t3 before t2 flagged, t4 after t2) is left out
    rather than drawn overlapping; a recovery that starts before the port's previous one ended goes on a
    second track of that port; every event has ph/pid/tid, and time moves forward on every track."""
    from tests.helpers.trace_format import trace_format_problems

    crossing = _row(t0_command_ns=10 * MS, t2_rx_power_ns=40 * MS, t3_firmware_up_ns=20 * MS,
                    t4_carrier_up_ns=60 * MS, t5_traffic_ns=90 * MS, impossible="firmware")  # fmt: skip
    late = _row(t0_command_ns=80 * MS, t2_rx_power_ns=85 * MS, t5_traffic_ns=120 * MS, reconfig=2)
    trace = trace_events(pd.DataFrame(columns=["kind", "source", "t_ns", "value", "meta"]),
                         pd.DataFrame([crossing, late]), origin_ns=0)  # fmt: skip
    assert trace_format_problems(trace) == []
    tracks = {e["args"]["name"]: e["tid"] for e in trace if e["name"] == "thread_name"}
    assert set(tracks) == {"eth0", "eth0 #2"}
    first = {e["name"] for e in trace if e["ph"] == "X" and e["tid"] == tracks["eth0"]}
    # firmware is negative and carrier (t3 → t4) would start inside optical: both left out
    assert first == {"reconfig 1", "optical", "transport"}
    second = [e["name"] for e in trace if e["ph"] == "X" and e["tid"] == tracks["eth0 #2"]]
    assert second == ["reconfig 2", "optical"]  # t3, t4 unknown: the later phases are not drawn


def test_the_format_check_catches_what_it_should() -> None:
    """The check itself fails a trace that breaks each rule (a check that cannot fail proves nothing)."""
    from tests.helpers.trace_format import trace_format_problems

    ok = {"ph": "X", "name": "a", "pid": 1, "tid": 1, "ts": 0.0, "dur": 10.0}
    assert trace_format_problems([ok]) == []
    assert "no tid" in trace_format_problems([{k: v for k, v in ok.items() if k != "tid"}])[0]
    crossing = {**ok, "name": "b", "ts": 5.0, "dur": 10.0}
    assert "without nesting" in trace_format_problems([ok, crossing])[0]
    assert "before the track's previous" in trace_format_problems([{**ok, "ts": 20.0}, ok])[0]
    assert "dur" in trace_format_problems([{**ok, "dur": -1.0}])[0]
