"""The trace format, its loader's one-line errors, the built-in traces and the stall model (pure)."""

from __future__ import annotations

import itertools
from pathlib import Path

import pytest

from labctl.core.errors import InputError
from labctl.workload.builtin import CONFIG_2_NATIVE_NS, TRACES
from labctl.workload.circuits import topo_id
from labctl.workload.stall import (
    estimate_step_ns,
    model_rows,
    on_demand_stall_ns,
    provisioning_stall_ns,
    switch_points,
)
from labctl.workload.trace import get_trace, load_trace

MS = 1_000_000


def test_builtin_traces_have_the_papers_switch_counts() -> None:
    testbed = get_trace("opus-testbed")
    assert [len([p for p in switch_points(testbed) if p.step == k]) for k in range(3)] == [4, 4, 4]
    for name in ("config-1", "config-2"):
        trace = get_trace(name)
        assert [len([p for p in switch_points(trace) if p.step == k]) for k in range(3)] == [6, 6, 6]
    assert get_trace("config-2").step_lengths_ns[0] == pytest.approx(CONFIG_2_NATIVE_NS, abs=2)
    assert set(TRACES) >= {"opus-testbed", "config-1", "config-2", "opus-testbed-mini"}


def test_testbed_windows_and_topo_ids() -> None:
    points = [p for p in switch_points(get_trace("opus-testbed")) if p.step == 0]
    assert [p.window_ns for p in points] == [7 * MS, 480 * MS, 7 * MS, 1000 * MS]
    assert [p.topo_id for p in points] == ["00", "11", "00", "11"]
    assert [topo_id(p.before) for p in points] == ["11", "00", "11", "00"]
    # The small loss all-reduce goes over the front-end network: never a switch point.
    assert all(p.op.name != "loss-ar" for p in points)


def test_stall_model() -> None:
    windows = [7 * MS, 480 * MS, 7 * MS, 1000 * MS]
    assert provisioning_stall_ns(windows, 25 * MS) == 2 * 18 * MS
    assert provisioning_stall_ns(windows, 0) == 0
    assert provisioning_stall_ns(windows, 600 * MS) == 2 * 593 * MS + 120 * MS
    assert on_demand_stall_ns(4, 25 * MS) == 100 * MS
    assert estimate_step_ns(2000 * MS, 25 * MS, 4) == 2100 * MS
    rows = model_rows(get_trace("opus-testbed"), [0, 25 * MS])
    assert rows[0].provisioning_ns == rows[0].native_ns == rows[0].on_demand_ns
    assert rows[1].provisioning_ns - rows[1].native_ns == 36 * MS
    assert rows[1].on_demand_ns - rows[1].native_ns == 100 * MS == rows[1].estimate_ns - rows[1].native_ns


def test_a_trace_file_round_trips_and_scales(tmp_path: Path) -> None:
    path = tmp_path / "t.yaml"
    path.write_text(
        """format: labctl-trace/1
name: tiny
job: {hosts: [h1, h2, h3, h4], gpus_per_host: 2, tp: 2, dp: 2, pp: 2}
steps:
  - step_ns: 100_000_000
    ops:
      - {group: dp, type: allgather, bytes: 2_000_000, start_ns: 0, duration_ns: 1_000_000}
      - {group: pp, ranks: [0, 4], type: send, bytes: 2_000_000, start_ns: 5_000_000, duration_ns: 1_000_000}
repeat: 2
"""
    )
    trace = load_trace(path)
    assert len(trace.steps) == 2
    points = switch_points(trace)
    # PP at 5 ms (window 4 ms), then back to DP at the next step (window 94 ms of tail).
    assert [(p.step, p.window_ns) for p in points] == [(0, 4 * MS), (1, 94 * MS), (1, 4 * MS)]
    assert points[0].op.stages == (0, 1)
    assert [p.window_ns for p in switch_points(trace.scaled(0.5))] == [2 * MS, 47 * MS, 2 * MS]
    assert len(trace.with_steps(5).steps) == 5


@pytest.mark.parametrize(
    ("body", "message"),
    [
        (
            "      - {group: pp, type: send, bytes: 2_000_000, start_ns: 0, duration_ns: 1}\n",
            ":5: steps[0].ops[0]: a pp operation names its two stages",
        ),
        (
            "      - {group: dp, type: allgather, bytes: 2_000_000, start_ns: 0, duration_ns: 10}\n"
            "      - {group: dp, type: allgather, bytes: 2_000_000, start_ns: 5, duration_ns: 10}\n",
            ":6: steps[0].ops[1].start_ns: starts at 5 before ops[0] ends (10)",
        ),
        (
            "      - {group: dp, type: allgather, bytes: 2_000_000, start_ns: 0, durration_ns: 10}\n",
            ":5: steps[0].ops[0].durration_ns: unknown field",
        ),
        (
            "      - {group: dp, ranks: [9], type: allgather, bytes: 2_000_000, start_ns: 0, duration_ns: 1}\n",
            ":5: steps[0].ops[0].ranks: rank 9 is outside 0..7",
        ),
        (
            "      - {group: pp, stages: [0, 1], type: allreduce, bytes: 2_000_000, start_ns: 0, duration_ns: 1}\n",
            ":5: steps[0].ops[0]: a pp operation is a send, recv or sendrecv, not allreduce",
        ),
    ],
)
def test_bad_traces_are_one_line_with_file_and_line(tmp_path: Path, body: str, message: str) -> None:
    path = tmp_path / "bad.yaml"
    path.write_text(
        "name: bad\njob: {hosts: [h1, h2, h3, h4], gpus_per_host: 2, tp: 2, dp: 2, pp: 2}\nsteps:\n  - ops:\n"
        + body
    )
    with pytest.raises(InputError) as e:
        load_trace(path)
    assert "\n" not in str(e.value)
    assert str(e.value).startswith(f"{path}{message}"), str(e.value)


def test_a_job_that_does_not_fit_its_hosts_is_one_line(tmp_path: Path) -> None:
    path = tmp_path / "bad.yaml"
    path.write_text(
        "name: bad\njob: {hosts: [h1, h2], gpus_per_host: 2, tp: 2, dp: 2, pp: 2}\nsteps:\n  - ops:\n"
        "      - {group: dp, type: allgather, bytes: 2_000_000, start_ns: 0, duration_ns: 1}\n"
    )
    with pytest.raises(InputError, match=r"bad.yaml:2: job: .*dp x cp x pp = 4 nodes but 2 hosts"):
        load_trace(path)
    with pytest.raises(InputError, match="no such trace file, and no built-in trace"):
        get_trace("nope")


_JOB = "job: {hosts: [h1, h2, h3, h4], gpus_per_host: 2, tp: 2, dp: 2, pp: 2}\n"


def _replay(tmp_path: Path, trace_body: str, **fields: object) -> Path:
    import json

    (tmp_path / "t.yaml").write_text("name: t\n" + _JOB + trace_body)
    path = tmp_path / "replay.yaml"
    path.write_text(json.dumps({"name": "r", "kind": "replay", "trace": "t.yaml", **fields}) + "\n")
    return path


def test_time_scale_keeps_operations_in_their_step_and_apart(tmp_path: Path) -> None:
    from labctl.workload.experiment import load_replay

    # Rounded one by one, x0.5 would put the first op's end at round(1.5) + round(1.0) = 3 but the
    # second's start at round(2.5) = 2 (overlap), and the last op's end past its step's (3 > 2).
    body = (
        "steps:\n  - step_ns: 5\n    ops:\n"
        "      - {group: dp, type: allgather, bytes: 2_000_000, start_ns: 3, duration_ns: 2}\n"
        "  - step_ns: 5\n    ops:\n"
        "      - {group: dp, type: allgather, bytes: 2_000_000, start_ns: 0, duration_ns: 3}\n"
        "      - {group: pp, stages: [0, 1], type: send, bytes: 2_000_000, start_ns: 3, duration_ns: 2}\n"
    )
    _, _, trace = load_replay(_replay(tmp_path, body, time_scale=0.5))
    for ops, length in zip(trace.steps, trace.step_lengths_ns, strict=True):
        assert all(op.end_ns <= length for op in ops)
        assert all(a.end_ns <= b.start_ns for a, b in itertools.pairwise(ops))
    assert [[(op.start_ns, op.end_ns) for op in ops] for ops in trace.steps] == [[(2, 2)], [(0, 2), (2, 2)]]
    # A factor that leaves a step of no time is one line naming time_scale, with the line.
    path = _replay(tmp_path, body, time_scale=0.01)
    with pytest.raises(InputError) as e:
        load_replay(path)
    assert str(e.value).startswith(f"{path}:1: time_scale: ") and "length is 0" in str(e.value)
    assert "\n" not in str(e.value)


def test_a_trace_of_no_time_is_one_line(tmp_path: Path) -> None:
    path = tmp_path / "zero.yaml"
    path.write_text(
        "name: zero\n" + _JOB + "steps:\n  - ops:\n"
        "      - {group: dp, type: allgather, bytes: 2_000_000, start_ns: 0, duration_ns: 0}\n"
    )
    with pytest.raises(InputError, match=r"zero.yaml:4: steps\[0\]: .*length is 0"):
        load_trace(path)


def test_a_relative_trace_is_found_beside_the_experiment_first(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    body = "steps:\n  - ops:\n      - {group: dp, type: allgather, bytes: 2_000_000, start_ns: 0, duration_ns: %d}\n"
    (tmp_path / "exp").mkdir()
    (tmp_path / "cwd").mkdir()
    (tmp_path / "exp" / "t.yaml").write_text("name: beside\n" + _JOB + body % 7)
    (tmp_path / "cwd" / "t.yaml").write_text("name: cwd\n" + _JOB + body % 9)
    monkeypatch.chdir(tmp_path / "cwd")
    assert get_trace("t.yaml", tmp_path / "exp").name == "beside"
    assert get_trace("t.yaml", tmp_path / "elsewhere").name == "cwd"
