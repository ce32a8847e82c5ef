"""Plans as typed steps: a timeline experiment compiles to the order the controller always ran; a bad
program is refused before anything moves; the replay commands' CLI (dry run, model, Kineto import)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from labctl.cli import app
from labctl.core.errors import InputError
from labctl.inventory.schema import load_inventory
from labctl.run.experiment import build_plan, load_experiment
from labctl.run.steps import GpuBench, Hold, Reconfigure, check_program, timeline_program
from labctl.workload.experiment import ReplaySegment, replay_lines
from labctl.workload.replay import OpRecord, ReplayResult, StepRecord

REPO = Path(__file__).resolve().parents[2]


def test_a_timeline_experiment_is_the_old_order() -> None:
    spec, src = load_experiment(REPO / "experiments" / "reconfig-timeline.yaml")
    plan = build_plan(spec, load_inventory(REPO / "inventory.yaml"), src)
    assert plan.program[:2] == (Reconfigure("dp", None, baseline=True), Hold(0.5))
    assert plan.program[2:4] == (Reconfigure("pp", 0, index=1, of=8), Hold(0.5))
    assert len(plan.program) == 2 + 2 * 8 and plan.baseline == "dp"
    assert plan.steps == [(rep, name) for rep in range(2) for name in ["pp", "dp", "pp", "dp"]]
    with_gpu = timeline_program("dp", [(0, "pp")], 0.1, gpu=True)
    assert with_gpu[0] == GpuBench("before") and with_gpu[-1] == GpuBench("after")


def test_bad_programs_are_refused() -> None:
    with pytest.raises(InputError, match="the first reconfiguration must set up the baseline"):
        check_program([Reconfigure("pp", 0)], {"pp"})
    with pytest.raises(InputError, match="unknown phase 'xx'"):
        check_program([Reconfigure("xx", None, baseline=True)], {"dp"})
    with pytest.raises(InputError, match="ReplaySegment needs the baseline"):
        check_program([ReplaySegment(None)], {"dp"})  # type: ignore[arg-type]
    with pytest.raises(InputError, match=r"plan step 1: 'hold' is not a step"):
        check_program([Reconfigure("dp", None, baseline=True), "hold"], {"dp"})  # type: ignore[list-item]
    with pytest.raises(InputError, match="hold -1 s"):
        check_program([Reconfigure("dp", None, baseline=True), Hold(-1)], {"dp"})


def test_replay_cli_dry_run_model_and_import(tmp_path: Path) -> None:
    runner = CliRunner()
    dry = runner.invoke(
        app,
        [
            "run",
            str(REPO / "experiments" / "replay-opus-testbed.yaml"),
            "--dry-run",
            "--inventory",
            str(REPO / "inventory.yaml"),
        ],
    )
    assert dry.exit_code == 0, dry.output
    assert "8 topo writes" in dry.output and "topo_id 00 (stages [0, 1]), window 7.0 ms" in dry.output
    model = runner.invoke(app, ["replay", "model", "opus-testbed", "--switching-ms", "25", "--json"])
    assert model.exit_code == 0, model.output
    data = json.loads(model.output)
    assert data["windows_ns"] == [7_000_000, 480_000_000, 7_000_000, 1_000_000_000]
    assert data["rows"][0]["provisioning_ns"] - data["rows"][0]["native_ns"] == 36_000_000
    kineto = tmp_path / "k.json"
    kineto.write_text(
        json.dumps(
            {
                "traceEvents": [
                    {
                        "ph": "X",
                        "cat": "kernel",
                        "name": "ncclDevKernel_AllGather_RING_LL(x)",
                        "ts": 0,
                        "dur": 1000,
                        "args": {"Out msg nelems": 1_000_000, "dtype": "Float"},
                    },
                    {
                        "ph": "X",
                        "cat": "kernel",
                        "name": "ncclKernel_SendRecv(x)",
                        "ts": 5000,
                        "dur": 1000,
                        "args": {
                            "In msg nelems": 1_000_000,
                            "dtype": "Float",
                            "Process Group Ranks": "[0, 4]",
                        },
                    },
                ]
            }
        )
    )
    job = tmp_path / "job.yaml"
    job.write_text("{hosts: [h1, h2, h3, h4], gpus_per_host: 2, tp: 2, dp: 2, pp: 2}\n")
    out = tmp_path / "trace.yaml"
    imported = runner.invoke(app, ["replay", "import-kineto", str(kineto), "--job", str(job), "-o", str(out)])
    assert imported.exit_code == 0, imported.output
    assert "2 NCCL kernels in 1 steps" in imported.output
    again = runner.invoke(app, ["replay", "model", str(out), "--switching-ms", "0", "--json"])
    assert json.loads(again.output)["windows_ns"] == [4_000_000]
    bad = runner.invoke(
        app, ["replay", "import-kineto", str(kineto), "--job", str(job), "-o", str(out), "--group", "x=ep"]
    )
    assert isinstance(bad.exception, InputError) and "use PG=DIM" in str(bad.exception)  # main(): exit 2


def test_a_program_without_a_baseline_is_refused() -> None:
    with pytest.raises(InputError, match="no baseline reconfiguration"):
        check_program([Hold(1)], {"dp"})


def test_an_import_that_does_not_load_leaves_the_output_as_it_was(tmp_path: Path) -> None:
    kineto = tmp_path / "k.json"
    kineto.write_text(
        json.dumps(
            {
                "traceEvents": [
                    {
                        "ph": "X",
                        "cat": "kernel",
                        "name": "ncclDevKernel_AllGather_RING_LL(x)",
                        "ts": 0,
                        "dur": 1000,
                        "args": {"Out msg nelems": 1_000_000, "dtype": "Float"},
                    }
                ]
            }
        )
    )
    job = tmp_path / "job.yaml"
    job.write_text("{hosts: [h1, h2], gpus_per_host: 2, tp: 2, dp: 2, pp: 2}\n")  # 4 nodes, 2 hosts
    out = tmp_path / "trace.yaml"
    out.write_text("a good trace\n")
    result = CliRunner().invoke(
        app, ["replay", "import-kineto", str(kineto), "--job", str(job), "-o", str(out)]
    )
    assert isinstance(result.exception, InputError)
    assert str(result.exception).startswith(f"{out}:") and "2 hosts" in str(result.exception)
    assert out.read_text() == "a good trace\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["job.yaml", "k.json", "trace.yaml"]


def _op(step: int, switched: bool, provisioned: bool, window_ms: float) -> OpRecord:
    return OpRecord(
        step=step, index=0, op="x", group="pp", type="sendrecv", bytes=0, stages="0", topo_id="0",
        switched=switched, provisioned=provisioned, window_ns=round(window_ms * 1e6), arrival_ns=0,
        boundary_ns=None, request_ns=None, switch_done_ns=None, ready_ns=None, start_ns=0, end_ns=0,
        reconfig_ns=None, exposed_ns=0, g1_wait_ns=0, g2_wait_ns=0, late_ns=0, late_arrival_ns=0,
        late_end_ns=0, control_lag_ns=None, fallback=False,
    )  # fmt: skip


def _step(step: int, stall_ms: float, switches: int) -> StepRecord:
    return StepRecord(step, 2_000_000_000, 2_000_000_000 + round(stall_ms * 1e6), round(stall_ms * 1e6),
                      switches, "", round(stall_ms * 1e6), 0, 0, False)  # fmt: skip


def test_the_zero_overhead_model_takes_the_configured_switch_time() -> None:
    """Per step: a provisioned switch exposes max(0, T − window), one on demand all of T, a no-op write
    nothing; the overhead a switch is the measured stall beyond that, over the step's switches."""
    ops = [
        _op(0, True, True, 7), _op(0, True, True, 480), _op(0, True, False, 0), _op(0, False, True, 0),
        _op(1, True, True, 7), _op(1, True, True, 480), _op(1, True, False, 0), _op(1, False, True, 0),
    ]  # fmt: skip
    result = ReplayResult(
        "provisioning", ops=ops, steps=[_step(0, 50, 3), _step(1, 56, 3)], switch_ns=25_000_000
    )
    summary = result.summary()
    assert summary["ideal_stall_ns"] == 18_000_000 + 25_000_000  # (25 − 7) + 0 + 25, each step
    assert summary["overhead_per_switch_ns"] == round((53_000_000 - 43_000_000) / 3)
    assert (
        ReplayResult("on-demand", ops=ops, steps=result.steps).summary()["ideal_stall_ns"] is None
    )  # T drawn
    assert any("3.3 ms of overhead a switch" in line for line in replay_lines({"replay": summary}))
