"""labctl whatif (issue 40): a run's measured recovery and the Opus references replayed through the replay
engine on a virtual clock, against the stall model; reference rows pinned for the built-in opus-testbed."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from labctl.analysis.breakdown_table import write_breakdown
from labctl.core.errors import InputError
from labctl.workload.stall import model_rows, switch_points
from labctl.workload.trace import get_trace
from labctl.workload.whatif import (
    REFERENCES,
    Recovery,
    VirtualClock,
    model_stall_ns,
    replay_recovery,
    run_recoveries,
    run_virtual,
    what_if,
)

NATIVE = 2_075_666_250  # opus-testbed's mean step (every step is the same), ns


def test_reference_rows_are_pinned_for_the_opus_testbed_job() -> None:
    trace = get_trace("opus-testbed")
    result = what_if(trace, [])
    got = {
        (row.recovery.label, mode): (
            o.step_ns,
            o.stall_per_switch_ns,
            o.stall_per_step_ns,
            o.hidden,
            o.switches,
        )
        for row in result.rows
        for mode, o in row.outcomes.items()
    }
    assert got == {
        # 3 steps of 4 switches; windows 7 ms (x2), 480 ms, 1 s per step
        ("reference 25 ms", "on-demand"): (NATIVE + 100_000_000, 25_000_000, 100_000_000, 0, 12),
        ("reference 25 ms", "provisioning"): (NATIVE + 36_000_000, 9_000_000, 36_000_000, 6, 12),
        ("reference 6 s", "on-demand"): (NATIVE + 24_000_000_000, 6_000_000_000, 24_000_000_000, 0, 12),
        ("reference 6 s", "provisioning"): (NATIVE + 22_506_000_000, 5_626_500_000, 22_506_000_000, 0, 12),
        ("reference 3 s", "on-demand"): (NATIVE + 12_000_000_000, 3_000_000_000, 12_000_000_000, 0, 12),
        ("reference 3 s", "provisioning"): (NATIVE + 10_506_000_000, 2_626_500_000, 10_506_000_000, 0, 12),
    }
    # ... which is the stall model of labctl.workload.stall, computed without the engine
    for ref, row in zip(REFERENCES, result.rows, strict=True):
        (m,) = model_rows(trace, [ref.median_ns])
        assert row.outcomes["on-demand"].step_ns == m.on_demand_ns == m.estimate_ns
        assert row.outcomes["provisioning"].step_ns == m.provisioning_ns
        for o in row.outcomes.values():
            assert o.native_ns == NATIVE and o.engine_stall_ns == o.model_stall_ns
            assert o.engine_overhead_ns == 0 and o.disagreement_per_switch_ns == 0
    assert result.agrees() and result.worst_disagreement_ns() == 0
    data = result.to_json()
    assert data["windows_ns"] == [7_000_000, 480_000_000, 7_000_000, 1_000_000_000]
    assert [r["label"] for r in data["rows"]] == ["reference 25 ms", "reference 6 s", "reference 3 s"]
    json.dumps(data)  # serialisable as it is


def test_hidden_is_the_windows_at_least_as_long_as_the_recovery() -> None:
    trace = get_trace("opus-testbed-mini")  # every time x 0.1: windows 0.7 ms, 48 ms, 0.7 ms, 100 ms
    # 2 steps of 4 switches
    for t_ns, hidden in ((700_000, 8), (700_001, 4), (48_000_000, 4), (48_000_001, 2), (100_000_001, 0)):
        o = replay_recovery(trace, Recovery("t", "reference", (t_ns,)), "provisioning")
        assert o.hidden == hidden, t_ns
        assert [s.hidden for s in o.per_switch] == [s.recovery_ns <= s.window_ns for s in o.per_switch]
        assert all(s.exposed_ns == max(0, s.recovery_ns - s.window_ns) for s in o.per_switch)
        assert replay_recovery(trace, Recovery("t", "reference", (t_ns,)), "on-demand").hidden == 0


def test_drawn_recoveries_agree_with_the_model_on_the_same_draws() -> None:
    trace = get_trace("opus-testbed")
    values = tuple(range(1_000_000, 2_000_000_000, 7_654_321))  # spans the 7 ms .. 1 s windows
    measured = Recovery("measured", "measured", values)
    windows = [p.window_ns for p in switch_points(trace)]
    first = replay_recovery(trace, measured, "provisioning", "draw", seed=3)
    again = replay_recovery(trace, measured, "provisioning", "draw", seed=3)
    on_demand = replay_recovery(trace, measured, "on-demand", "draw", seed=3)
    drawn = [s.recovery_ns for s in first.per_switch]
    assert drawn == [s.recovery_ns for s in again.per_switch] == [s.recovery_ns for s in on_demand.per_switch]
    assert len(set(drawn)) > 1 and set(drawn) <= set(values)
    assert first.engine_stall_ns == first.model_stall_ns == model_stall_ns(windows, drawn, "provisioning")
    assert on_demand.engine_stall_ns == on_demand.model_stall_ns == sum(drawn)
    assert first.hidden == sum(t <= w for t, w in zip(drawn, windows, strict=True))
    other = replay_recovery(trace, measured, "provisioning", "draw", seed=4)
    assert [s.recovery_ns for s in other.per_switch] != drawn
    # the median policy: every switch takes the same T
    med = replay_recovery(trace, measured, "provisioning")
    assert {s.recovery_ns for s in med.per_switch} == {measured.median_ns}


def test_median_is_integer_ns() -> None:
    assert Recovery("m", "measured", (3, 1, 2)).median_ns == 2
    # as the summary rounds its median (round(float(np.percentile(values, 50)))): half to even
    assert Recovery("m", "measured", (1, 2, 3, 4)).median_ns == 2  # 2.5
    assert Recovery("m", "measured", (3, 4)).median_ns == 4  # 3.5
    for values in [(71094682, 71094683), (5, 8, 1, 2), (10**9 + 1, 10**9 + 2, 7, 10**10)]:
        assert Recovery("m", "measured", values).median_ns == round(float(np.percentile(values, 50)))
    assert Recovery("m", "measured", (10, 20)).median_ns == 15


def test_the_virtual_clock_jumps_to_deadlines_and_leaves_no_task() -> None:
    seen: list[tuple[str, int]] = []

    async def sleeper(clock: VirtualClock, name: str, t: int) -> None:
        await clock.sleep_until(t)
        seen.append((name, clock.now_ns()))

    async def main(clock: VirtualClock) -> int:
        asyncio.get_running_loop().create_task(sleeper(clock, "late", 10**12))  # never awaited
        await asyncio.gather(sleeper(clock, "b", 6_000_000_000), sleeper(clock, "a", 25_000_000))
        return clock.now_ns()

    assert run_virtual(main) == 6_000_000_000
    assert seen == [("a", 25_000_000), ("b", 6_000_000_000)]  # the stray task was cancelled, not run

    async def stuck(clock: VirtualClock) -> None:
        await asyncio.get_running_loop().create_future()

    with pytest.raises(RuntimeError, match="deadlock"):
        run_virtual(stuck)


def _run_dir(tmp_path: Path, frame: pd.DataFrame) -> Path:
    run_dir = tmp_path / "runs" / "20260101-000000-tune-abcd"
    run_dir.mkdir(parents=True)
    (run_dir / "run.json").write_text(json.dumps({"run_id": run_dir.name, "status": "completed"}))
    (run_dir / "events.jsonl").write_text("")
    write_breakdown(frame, run_dir)  # the writer labctl's runs use
    return run_dir


def _frame(totals: list[int], settings: list[str] | None, **extra: list[object]) -> pd.DataFrame:
    n = len(totals)
    data: dict[str, object] = {
        "reconfig": pd.array([1 + i // 4 for i in range(n)], dtype="Int64"),
        "phase": pd.array(["pp"] * n, dtype="string"),
        "rail": pd.array([0] * n, dtype="Int64"),
        "host": pd.array([f"h{1 + i % 4}" for i in range(n)], dtype="string"),
        "port": pd.array(["eth0"] * n, dtype="string"),
        "t0_command_ns": pd.array([1000 * i for i in range(n)], dtype="Int64"),
        "t1_switch_done_ns": pd.array([1000 * i + 5 for i in range(n)], dtype="Int64"),
        "total_ns": pd.array(totals, dtype="Int64"),
        "peer": pd.array(["h9"] * n, dtype="string"),
        "timed_out": [False] * n,
        "impossible": pd.array([""] * n, dtype="string"),
        "unresolved": pd.array([""] * n, dtype="string"),
    }
    if settings is not None:
        data["link_setting"] = pd.array(settings, dtype="string")
    for key, values in extra.items():
        data[key] = pd.array(values, dtype="Int64" if key.endswith("ns") or key == "reconfig" else "string")
    return pd.DataFrame(data)


def test_a_tune_run_gives_one_recovery_per_link_setting(tmp_path: Path) -> None:
    totals = [6_000_000_000, 6_100_000_000, 5_900_000_000, 6_050_000_000, 3_000_000_000, 2_900_000_000,
              3_100_000_000, 3_050_000_000]  # fmt: skip
    settings = ["autoneg=on"] * 4 + ["autoneg=off,fec=rs"] * 4
    flagged = [""] * 7 + ["total"]  # flagged for the total phase: left out
    run_dir = _run_dir(tmp_path, _frame(totals, settings, impossible=flagged))
    got = run_recoveries(tmp_path / "runs")  # runs/: the newest run
    assert got.run_dir == run_dir and got.by_setting and not got.notes
    assert [(r.label, r.n, r.median_ns) for r in got.recoveries] == [
        ("autoneg=on", 4, 6_025_000_000),
        ("autoneg=off,fec=rs", 3, 3_000_000_000),
    ]
    result = what_if(get_trace("opus-testbed"), got.recoveries)
    labels = [row.recovery.label for row in result.rows]
    assert labels == ["autoneg=on", "autoneg=off,fec=rs", "reference 25 ms", "reference 6 s", "reference 3 s"]
    on = result.rows[0].outcomes["on-demand"]
    assert on.stall_per_switch_ns == 6_025_000_000 and result.agrees()


def test_a_run_without_settings_is_one_measured_recovery_and_leaves_out_the_baseline(tmp_path: Path) -> None:
    totals = [70_000_000, 60_000_000, 80_000_000, 65_000_000, 1, 2, 3, 4]
    frame = _frame(totals, None)
    frame["reconfig"] = pd.array([1, 1, 1, 1, 0, 0, 0, 0], dtype="Int64")  # 0: the baseline set-up
    frame["peer"] = pd.array(["h9", "h9", "h9", ""] + ["h9"] * 4, dtype="string")  # no peer: no circuit end
    _run_dir(tmp_path, frame)
    got = run_recoveries(tmp_path / "runs")
    assert not got.by_setting
    ((r),) = got.recoveries
    assert r.label == "measured" and sorted(r.values_ns) == [60_000_000, 70_000_000, 80_000_000]


def test_a_breakdown_with_no_measured_total_is_one_input_error(tmp_path: Path) -> None:
    frame = _frame([70_000_000] * 4, None)
    frame["total_ns"] = pd.array([None] * 4, dtype="Int64")
    _run_dir(tmp_path, frame)
    with pytest.raises(InputError, match="no circuit end with a measured total"):
        run_recoveries(tmp_path / "runs")
    with pytest.raises(InputError, match="no such run directory"):
        run_recoveries(tmp_path / "nowhere")


def test_values_are_integer_ns() -> None:
    values = np.array([1, 2, 3], dtype=np.int64)
    r = Recovery("m", "measured", tuple(int(v) for v in values))
    assert all(type(v) is int for v in r.values_ns) and type(r.median_ns) is int
