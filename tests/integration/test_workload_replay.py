"""Done when (issue 16): the built-in Opus testbed trace replayed on the simulated lab at 25 ms switching.
Provisioning hides each switch whose window is longer than T and exposes T − W otherwise, exactly as the
stall model says for the reconfiguration time each switch took (read from the run's own stamps: the
orchestrators' acknowledgement after the switch model's ocs.command/ocs.complete); on demand exposes N·T.
Also the giant-ring fallback under persistent refusals, and the records a replay leaves in its run."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest

from labctl.core.events import Kind, read_events
from labctl.run.lifecycle import run_experiment
from labctl.workload.stall import switch_points
from labctl.workload.trace import get_trace

REPO = Path(__file__).resolve().parents[2]
T_NS = 25_000_000


def _experiment(tmp_path: Path, **fields: object) -> Path:
    body = {
        "name": "replay-test",
        "kind": "replay",
        "trace": "opus-testbed",
        "mode": "provisioning",
        "switching_ms": 25,
        "steps": 1,
        "hold_s": 0.05,
        **fields,
    }
    path = tmp_path / "replay.yaml"
    path.write_text(json.dumps(body))
    return path


async def _run(tmp_path: Path, **fields: object) -> tuple[Path, list, list[dict[str, str]], str]:
    outcome = await run_experiment(
        _experiment(tmp_path, **fields),
        REPO / "inventory.yaml",
        profile="fast",
        out_dir=tmp_path / "runs",
        seed=11,
        plots=False,
    )
    events = list(read_events(outcome.run_dir / "events.jsonl"))
    # a failed replay's too
    steps = list(csv.DictReader((outcome.run_dir / "replay_steps.csv").read_text().splitlines()))
    return outcome.run_dir, events, steps, outcome.status


async def test_provisioning_matches_the_stall_model_per_window(tmp_path: Path) -> None:
    run_dir, events, steps, status = await _run(tmp_path, mode="provisioning")
    assert status == "completed"
    ops = [e.meta | {"label": e.value, "t_ns": e.t_ns} for e in events if e.kind == Kind.WORKLOAD_OP]
    writes = {e.meta["op"]: e for e in events if e.kind == Kind.WORKLOAD_TOPO}
    commands = [e for e in events if e.kind == Kind.OCS_COMMAND and "topo_id" in e.meta]
    completes = [e for e in events if e.kind == Kind.OCS_COMPLETE and "topo_id" in e.meta]
    switched = [op for op in ops if op["switched"]]
    assert len(switched) == 4  # 4 switches per rail per step
    windows = {p.op.label: p.window_ns for p in switch_points(get_trace("opus-testbed").with_steps(1))}
    assert len(windows) == 4
    prev_end = {op["index"]: op["end_ns"] for op in ops}
    for op in switched:
        write = writes[op["label"]]
        # The model's own stamps: this write's switch command and acknowledgement, both rails of ocs1 in
        # one command (decision 0054).
        mine = [e for e in completes if e.meta["op"] == op["label"]]
        sent = [e for e in commands if e.meta["op"] == op["label"]]
        assert len(mine) == 1 and len(sent) == 1 and sent[0].meta["rails"] == [0, 1]
        assert all(e.value >= T_NS for e in mine)  # the switch model's 25 ms, command to settled
        assert write.t_ns == op["ready_ns"] >= max(e.t_ns for e in mine)
        assert write.meta["switch_done_ns"] == max(e.t_ns for e in mine)
        # Provisioning: the write was asked for when the previous phase ended.
        boundary = prev_end[op["index"] - 1]
        assert op["boundary_ns"] == boundary <= write.meta["request_ns"] <= min(e.t_ns for e in sent)
        reconfig = op["ready_ns"] - boundary
        assert op["reconfig_ns"] == reconfig >= T_NS
        # The stall model, exactly, per window: max(0, T - W).
        assert op["exposed_ns"] == max(0, reconfig - op["window_ns"])
        # ... and against the switch model's own stamps, not the ones exposed is computed from: the
        # window is the trace's, and exposed is the model's max(0, T_sw - W) plus only control overhead.
        assert op["window_ns"] == windows[op["label"]]
        t_sw = max(e.t_ns for e in mine) - boundary
        overhead = op["exposed_ns"] - max(0, t_sw - op["window_ns"])
        assert 0 <= overhead <= 10_000_000, (op["label"], overhead)
        assert reconfig < T_NS + 50_000_000  # observed T: the switch's 25 ms plus little
        assert op["start_ns"] - op["arrival_ns"] == op["exposed_ns"]
        if op["window_ns"] < T_NS:  # 7 ms windows before the PP sends: T - W exposed (at least 18 ms)
            assert op["exposed_ns"] >= T_NS - op["window_ns"]
        else:  # 480 ms and 1 s windows: hidden
            assert op["exposed_ns"] == 0
    (step,) = steps
    exposed = [op["exposed_ns"] for op in switched]
    assert int(step["stall_ns"]) == sum(exposed) == int(step["model_stall_ns"])
    assert step["exposed_ns"] == ";".join(map(str, exposed))
    assert int(step["step_ns"]) == int(step["native_ns"]) + sum(exposed)
    assert [e.value for e in events if e.kind == Kind.WORKLOAD_STEP] == [int(step["step_ns"])]
    assert (run_dir / "replay_ops.csv").is_file()
    run = json.loads((run_dir / "run.json").read_text())
    assert run["replay"]["switches_per_step"] == 4 and run["profile"]["switching_ms"] == [25.0, 25.0]


async def test_on_demand_exposes_every_switch(tmp_path: Path) -> None:
    _, events, steps, status = await _run(tmp_path, mode="on-demand")
    assert status == "completed"
    ops = [e.meta for e in events if e.kind == Kind.WORKLOAD_OP]
    switched = [op for op in ops if op["switched"]]
    assert len(switched) == 4
    for op in switched:
        assert op["boundary_ns"] == op["arrival_ns"]  # asked for when the op arrived
        assert op["exposed_ns"] == op["reconfig_ns"] >= T_NS
    (step,) = steps
    assert int(step["stall_ns"]) == sum(op["reconfig_ns"] for op in switched) >= 4 * T_NS
    assert int(step["switches"]) == 4


async def test_persistent_refusals_fall_back_to_the_giant_ring(tmp_path: Path) -> None:
    # From the second topo write on, the switch refuses every change of both rails' every try (2 tries of
    # 3 commands each, both rails of ocs1 in each command): the job falls back to the giant ring, which
    # then goes through.
    run_dir, events, steps, status = await _run(
        tmp_path, faults={"refuse_changes": 6, "after_writes": 1}, retries=1
    )
    assert status == "completed"
    fallback = [e for e in events if e.kind == Kind.WORKLOAD_FALLBACK]
    assert [e.meta["phase"] for e in fallback] == ["start", "done"] and fallback[1].value == "giant ring up"
    assert len([e for e in events if e.kind == Kind.WORKLOAD_RETRY]) == 4  # 2 rails x 2 tries
    ops = [e.meta for e in events if e.kind == Kind.WORKLOAD_OP]
    assert [op["fallback"] for op in ops] == [False, False, True, True, True]
    # After the fallback the writes are no-ops: not switches (the one that fell back was).
    assert [op["switched"] for op in ops] == [False, True, True, False, False]
    assert steps[0]["fallback"] == "True" and steps[0]["switches"] == "2"
    run = json.loads((run_dir / "run.json").read_text())
    assert (
        run["replay"]["fallback"]["at_topo_id"] == "11" and not run["replay"]["fallback"]["giant_ring_failed"]
    )


async def test_a_switch_that_always_refuses_fails_the_run_saying_why(tmp_path: Path) -> None:
    run_dir, events, _, status = await _run(tmp_path, faults={"refuse_changes": 100_000, "after_writes": 1})
    assert status == "failed"
    run = json.loads((run_dir / "run.json").read_text())
    assert run["error"].startswith("giant-ring fallback failed after ocs1: change refused")
    assert [e.meta["phase"] for e in events if e.kind == Kind.WORKLOAD_FALLBACK] == ["start", "done"]


@pytest.mark.parametrize(
    ("field", "value", "message"),
    [
        ("mode", "sometimes", "mode: Input should be 'provisioning' or 'on-demand'"),
        ("trace", "no-such-trace", "trace: no-such-trace: no such trace file"),
    ],
)
async def test_bad_replay_experiments_are_one_line(
    tmp_path: Path, field: str, value: str, message: str
) -> None:
    from labctl.core.errors import InputError

    with pytest.raises(InputError, match=message):
        await run_experiment(
            _experiment(tmp_path, **{field: value}),
            REPO / "inventory.yaml",
            profile="fast",
            out_dir=tmp_path / "runs",
            plots=False,
        )
    assert not (tmp_path / "runs").exists()


def _final_patches(events: list) -> list[list[int]]:
    return [list(p) for p in [e for e in events if e.kind == Kind.OCS_READ][-1].meta["patches"]]


def _baseline_patches(run_dir: Path) -> list[list[int]]:
    from labctl.inventory.schema import load_inventory
    from labctl.workload.experiment import load_replay_plan

    plan = load_replay_plan(run_dir.parent.parent / "replay.yaml", load_inventory(REPO / "inventory.yaml"))
    return sorted([list(p) for rp in plan.phases[plan.baseline].values() for p in rp.mapping])


@pytest.mark.parametrize(
    "fields",
    [
        # Every change is refused, the ring too: the hardware never moved, but the restore is still sent
        # and is not refused by what is left of the replay's injected fault.
        {"faults": {"refuse_changes": 100_000, "after_writes": 1}},
        # Every change times out halfway (the switch has already moved part of it): `current` still says
        # baseline, yet the restore must run.
        {"switching_ms": 100, "switch_timeout_s": 0.02, "retries": 0, "time_scale": 0.25},
    ],
    ids=["refused", "timed-out"],
)
async def test_the_baseline_is_restored_after_a_replay_that_did_not_finish(
    tmp_path: Path, fields: dict[str, object]
) -> None:
    run_dir, events, _, status = await _run(tmp_path, **fields)
    assert status == "failed"
    run = json.loads((run_dir / "run.json").read_text())
    assert "NOT restored" not in run["error"], run["error"]
    fallback_at = max(e.seq for e in events if e.kind == Kind.WORKLOAD_FALLBACK)
    restores = [e for e in events if e.kind == Kind.PHASE and e.seq > fallback_at]
    assert len(restores) == 1 and restores[0].meta["measured"] is False
    assert sorted(_final_patches(events)) == _baseline_patches(run_dir)


async def test_learn_steps_replay_on_demand_and_the_model_says_so(tmp_path: Path) -> None:
    # Provisioning with learn_steps 1: step 0's switches are asked for on arrival (all of T exposed) and
    # the model of that step must say so, not max(0, T - W); step 1 is provisioned.
    _, events, steps, status = await _run(tmp_path, steps=2, learn_steps=1, time_scale=0.5)
    assert status == "completed"
    switched = [e.meta for e in events if e.kind == Kind.WORKLOAD_OP and e.meta["switched"]]
    assert [op["provisioned"] for op in switched] == [False] * 4 + [True] * 4
    for step in steps:
        assert int(step["stall_ns"]) == int(step["model_stall_ns"])
    assert int(steps[0]["stall_ns"]) >= 4 * T_NS > int(steps[1]["stall_ns"])


async def test_steps_without_rail_operations_are_recorded_at_their_trace_length(tmp_path: Path) -> None:
    ms = 1_000_000
    trace = {
        "format": "labctl-trace/1",
        "name": "gappy",
        "job": {"hosts": ["h1", "h2", "h3", "h4"], "gpus_per_host": 2, "tp": 2, "dp": 2, "pp": 2},
        "steps": [
            {
                "step_ns": 30 * ms,
                "ops": [
                    {"group": "tp", "type": "allreduce", "bytes": 4 << 20, "start_ns": 0, "duration_ns": ms}
                ],
            },
            {
                "step_ns": 60 * ms,
                "ops": [
                    {"group": "dp", "type": "allgather", "bytes": 4 << 20, "start_ns": 0, "duration_ns": ms},
                    {
                        "group": "pp",
                        "stages": [0, 1],
                        "type": "send",
                        "bytes": 4 << 20,
                        "start_ns": 20 * ms,
                        "duration_ns": ms,
                    },
                ],
            },
            {
                "step_ns": 40 * ms,
                "ops": [{"group": "dp", "type": "allreduce", "bytes": 100, "start_ns": 0, "duration_ns": ms}],
            },
        ],
        "repeat": 5,
    }
    (tmp_path / "gappy.yaml").write_text(json.dumps(trace))
    run_dir, events, steps, status = await _run(
        tmp_path, trace="gappy.yaml", steps=None, switching_ms=5, mode="on-demand"
    )
    assert status == "completed"
    assert [int(s["step"]) for s in steps] == [0, 1, 2, 3, 4]
    for k in (0, 2, 3):  # no rail operation (TP, a front-end call): the trace's length, no switch
        assert int(steps[k]["step_ns"]) == int(steps[k]["native_ns"]) and int(steps[k]["switches"]) == 0
    run = json.loads((run_dir / "run.json").read_text())
    assert run["replay"]["steps"] == 5
    lengths = [30, 60, 40, 30, 60]
    assert run["replay"]["native_ns"] == round(sum(lengths) * ms / 5)
    # Consecutive steps tile the timeline: each starts where the one before ended.
    step_events = [e for e in events if e.kind == Kind.WORKLOAD_STEP]
    assert len(step_events) == 5


async def test_ready_link_counts_link_ups_during_another_rails_retry(tmp_path: Path) -> None:
    # The second write: one rail goes through at once, the other is refused 3 times and retried (100 ms).
    # The first rail's ports come up during that retry; ready must be their first traffic on the new
    # peer (the watch is subscribed before the write is sent). Heartbeats are a minute apart here, so a
    # watch that missed those transitions would wait for the recovery timeout.
    _, events, _, status = await _run(
        tmp_path,
        mode="on-demand",
        ready="link",
        switching_ms=100,
        time_scale=0.25,
        recovery_timeout_s=3,
        probes={"report_interval_ms": 60_000},
        faults={"refuse_changes": 5, "after_writes": 1},
    )
    assert status == "completed"
    assert not [e for e in events if e.kind == Kind.RUN_TIMEOUT]
    writes = [e for e in events if e.kind == Kind.WORKLOAD_TOPO]
    assert [w.meta["tries"] for w in writes] == [1, 2, 1, 1]
    oks = [e for e in events if e.kind == Kind.TRAFFIC_OK and "peer" in e.meta]
    for write in writes:
        request = write.meta["request_ns"]
        before = {e.source: e.meta["peer"] for e in oks if e.t_ns < request}
        first_new: dict[str, int] = {}
        for e in oks:
            if e.t_ns >= request and e.source not in first_new and e.meta["peer"] != before.get(e.source):
                first_new[e.source] = e.t_ns
        assert first_new
        assert 0 <= write.t_ns - max(first_new.values()) <= 20_000_000, write.meta["op"]


async def test_the_replays_own_lateness_is_recorded_and_warned_about(tmp_path: Path) -> None:
    from labctl.workload.experiment import replay_lines

    run_dir, events, _, status = await _run(tmp_path, mode="provisioning")
    assert status == "completed"
    for op in [e.meta for e in events if e.kind == Kind.WORKLOAD_OP]:
        assert op["late_arrival_ns"] >= 0 and op["late_ns"] >= 0 and op["late_end_ns"] >= 0
        if op["switched"]:  # asked for after its boundary by no more than the loop took to get there
            assert op["control_lag_ns"] == op["request_ns"] - op["boundary_ns"] >= 0
    summary = json.loads((run_dir / "run.json").read_text())["replay"]
    assert {"late_ns_max", "control_lag_ns_max"} <= set(summary)
    late = {**summary, "late_ns_max": 0, "control_lag_ns_max": 3_000_000, "fallback": None}
    assert any(line.startswith("[yellow]replay ran late") for line in replay_lines({"replay": late}))
    on_time = {**late, "control_lag_ns_max": 10_000}
    assert not any("ran late" in line for line in replay_lines({"replay": on_time}))
    # A switch's error text is printed as text, never as rich markup.
    fell = {
        **on_time,
        "fallback": {
            "at_topo_id": "11",
            "error": "ocs1: [bold]x[/] refused",
            "status": "up",
            "giant_ring_failed": [],
        },
    }
    (line,) = [x for x in replay_lines({"replay": fell}) if "giant-ring" in x]
    assert r"\[bold]x\[/] refused" in line
