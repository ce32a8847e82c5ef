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

from labctl.controller import run_experiment
from labctl.events import Kind, read_events

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
    prev_end = {op["index"]: op["end_ns"] for op in ops}
    for op in switched:
        write = writes[op["label"]]
        # The model's own stamps: this write's switch commands and acknowledgements (both rails).
        mine = [e for e in completes if e.meta["op"] == op["label"]]
        sent = [e for e in commands if e.meta["op"] == op["label"]]
        assert len(mine) == 2 and len(sent) == 2
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
    # 3 commands each): the job falls back to the giant ring, which then goes through.
    run_dir, events, steps, status = await _run(
        tmp_path, faults={"refuse_changes": 12, "after_writes": 1}, retries=1
    )
    assert status == "completed"
    fallback = [e for e in events if e.kind == Kind.WORKLOAD_FALLBACK]
    assert [e.meta["phase"] for e in fallback] == ["start", "done"] and fallback[1].value == "giant ring up"
    assert len([e for e in events if e.kind == Kind.WORKLOAD_RETRY]) == 4  # 2 rails x 2 tries
    ops = [e.meta for e in events if e.kind == Kind.WORKLOAD_OP]
    assert [op["fallback"] for op in ops] == [False, False, True, True, True]
    assert steps[0]["fallback"] == "True"
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
    from labctl.errors import InputError

    with pytest.raises(InputError, match=message):
        await run_experiment(
            _experiment(tmp_path, **{field: value}),
            REPO / "inventory.yaml",
            profile="fast",
            out_dir=tmp_path / "runs",
            plots=False,
        )
    assert not (tmp_path / "runs").exists()
