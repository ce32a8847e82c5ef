"""The Kineto importer on a small trace written by hand, following the Chrome-trace schema PyTorch's
profiler writes (complete events, ts/dur in µs, NCCL kernels with the communication record in args)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from labctl.core.errors import InputError
from labctl.workload.kineto import kineto_to_trace, load_kineto
from labctl.workload.stall import switch_points
from labctl.workload.trace import trace_from_data

JOB = {"hosts": ["h1", "h2", "h3", "h4"], "gpus_per_host": 2, "tp": 2, "dp": 2, "pp": 2}


def _kernel(name: str, ts: float, dur: float, **args: object) -> dict[str, object]:
    return {
        "ph": "X",
        "cat": "kernel",
        "name": name,
        "pid": 0,
        "tid": 7,
        "ts": ts,
        "dur": dur,
        "args": {"device": 0, "stream": 7, "correlation": 11, **args},
    }


KINETO = {
    "schemaVersion": 1,
    "distributedInfo": {"backend": "nccl", "rank": 0, "world_size": 8},
    "traceEvents": [
        {
            "ph": "X",
            "cat": "user_annotation",
            "name": "ProfilerStep#4",
            "pid": 1,
            "tid": 1,
            "ts": 1000.0,
            "dur": 100_000.0,
        },
        {"ph": "X", "cat": "cpu_op", "name": "aten::mm", "pid": 1, "tid": 1, "ts": 1100.0, "dur": 50.0},
        _kernel(
            "ncclDevKernel_AllGather_RING_LL(ncclDevComm*, unsigned long, ncclWork*)",
            1000.0,
            3000.0,
            **{
                "Collective name": "_allgather_base",
                "In msg nelems": 1_000_000,
                "Out msg nelems": 2_000_000,
                "dtype": "BFloat16",
                "Group size": 2,
                "Process Group Name": "3",
                "Process Group Description": "mesh_dp_shard",
                "Process Group Ranks": "[0, 2]",
            },
        ),
        _kernel(
            "ncclKernel_SendRecv(ncclDevComm*, unsigned long, ncclWork*)",
            11_000.0,
            2000.0,
            **{
                "Collective name": "send",
                "In msg nelems": 16_000_000,
                "dtype": "Float",
                "Process Group Name": "5",
                "Process Group Ranks": "[0, 4]",
            },
        ),
        # Overlaps the send by 0.5 ms (another stream): serialised on import.
        _kernel(
            "ncclDevKernel_ReduceScatter_Sum_bf16_RING_LL(ncclDevComm*, unsigned long, ncclWork*)",
            12_500.0,
            4000.0,
            **{
                "In msg nelems": 4_000_000,
                "dtype": "BFloat16",
                "Process Group Description": "mesh_dp_shard",
                "Process Group Ranks": [0, 2],
            },
        ),
        # No communication record: type from the kernel name, 0 bytes: a front-end call by the job's rule.
        _kernel(
            "ncclDevKernel_AllReduce_Sum_f32_RING_LL(ncclDevComm*, unsigned long, ncclWork*)", 60_000.0, 100.0
        ),
        {
            "ph": "X",
            "cat": "kernel",
            "name": "ampere_bf16_gemm",
            "pid": 0,
            "tid": 7,
            "ts": 1500.0,
            "dur": 9.0,
        },
    ],
}


def test_nccl_kernels_become_trace_operations(tmp_path: Path) -> None:
    path = tmp_path / "rank0.json"
    path.write_text(json.dumps(KINETO))
    data, stats = kineto_to_trace(load_kineto(path), JOB, name="imported", groups={"5": "pp"})
    assert stats == {"kernels": 4, "clipped": 1, "skipped": 0, "steps": 1}
    ops = data["steps"][0]["ops"]
    assert [(o["type"], o["group"]) for o in ops] == [
        ("allgather", "dp"),
        ("send", "pp"),
        ("reducescatter", "dp"),
        ("allreduce", "dp"),
    ]
    assert ops[0]["bytes"] == 2_000_000 * 2 and ops[1]["bytes"] == 16_000_000 * 4 and ops[3]["bytes"] == 0
    assert [o["start_ns"] for o in ops] == [0, 10_000_000, 12_000_000, 59_000_000]
    assert ops[2]["duration_ns"] == 3_500_000  # keeps its end (15.5 ms) after the 0.5 ms clip
    assert ops[1]["ranks"] == [0, 4] and data["steps"][0]["step_ns"] == 100_000_000
    trace = trace_from_data(data, "imported")
    points = switch_points(trace)
    assert [(p.op.type, p.window_ns, p.topo_id) for p in points] == [
        ("send", 7_000_000, "00"),
        ("reducescatter", 0, "11"),
    ]
    assert points[0].op.stages == (0, 1)
    # One rank's own view: its DP group [0, 2] is stage 0's only; stage 1 keeps digit 0, partner gone.
    data, _ = kineto_to_trace(KINETO, JOB, groups={"5": "pp"}, symmetric=False)
    assert [p.topo_id for p in switch_points(trace_from_data(data))] == ["00", "10"]


def test_not_a_kineto_trace_is_one_line(tmp_path: Path) -> None:
    with pytest.raises(InputError, match="not a Kineto/Chrome trace"):
        kineto_to_trace({"events": []}, JOB)
    with pytest.raises(InputError, match="no NCCL kernels"):
        kineto_to_trace({"traceEvents": [KINETO["traceEvents"][1]]}, JOB)
    bad = tmp_path / "bad.json"
    bad.write_text('{\n  "traceEvents": [,]\n}')
    with pytest.raises(InputError, match=r"bad.json:2: not valid JSON"):
        load_kineto(bad)


@pytest.mark.parametrize(
    ("field", "value", "shown"),
    [
        ("ts", "x", "'x' is not a time in µs"),
        ("dur", None, "None is not a duration in µs (>= 0)"),
        ("dur", float("nan"), "nan is not a duration in µs (>= 0)"),
        ("ts", float("inf"), "inf is not a time in µs"),
    ],
)
def test_malformed_times_are_one_line_naming_the_event(field: str, value: object, shown: str) -> None:
    events = [dict(e) for e in KINETO["traceEvents"]]  # type: ignore[call-overload]
    events[3] = {**events[3], field: value}
    with pytest.raises(InputError) as e:
        kineto_to_trace({"traceEvents": events}, JOB, name="rank0.json")
    assert str(e.value) == f"rank0.json: traceEvents[3].{field}: {shown}"
    # NaN message sizes and args that are not an object are not tracebacks either.
    events = [dict(e) for e in KINETO["traceEvents"]]  # type: ignore[call-overload]
    events[2] = {**events[2], "args": {**events[2]["args"], "In msg nelems": float("nan")}}  # type: ignore[dict-item]
    events[4] = {**events[4], "args": ["not", "an", "object"]}
    data, _ = kineto_to_trace({"traceEvents": events}, JOB, name="rank0.json")
    assert data["steps"][0]["ops"][0]["bytes"] == 2_000_000 * 2
