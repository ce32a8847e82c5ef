"""From a PyTorch profiler (Kineto) trace's NCCL kernels to the trace format.

A Kineto trace is Chrome trace JSON: `traceEvents` of complete events (`"ph": "X"`) with `ts`/`dur` in µs.
NCCL's GPU work shows up as `"cat": "kernel"` events named after the NCCL kernel
(`ncclDevKernel_AllReduce_Sum_f32_RING_LL(...)`, `ncclKernel_SendRecv(...)`,
`ncclDevKernel_AllGather_RING_LL`);
recent PyTorch copies its communication record (`record_param_comms`) into the kernel's `args`:
`Collective name`, `In msg nelems`, `Out msg nelems`, `dtype`, `Group size`, `Process Group Name`,
`Process Group Description`, `Process Group Ranks`. Steps are the `ProfilerStep#N` annotations when
present, else the whole trace is one step.

What becomes of each kernel: the type from `Collective name` (else the kernel name); the bytes from the
message element counts and dtype (absent: 0, then it counts as a front-end call unless the job says
otherwise); the group from a name the caller maps (`groups`: process-group name or description → dp, cp,
pp or tp), else from the description's words (TorchTitan's mesh names: dp_shard, pp, tp, cp), else pp for
point-to-point and dp for collectives; the ranks from `Process Group Ranks`. Rail operations overlapping
in time (several streams) are serialised: each starts no earlier than the previous one ended, keeping its
end (a window is never negative); the import says how many it clipped.
"""

from __future__ import annotations

import contextlib
import json
import math
import re
from pathlib import Path
from typing import Any

from labctl.core.errors import InputError

GPU_KERNEL_CAT = "Kernel".casefold()
"""Kineto's category of GPU kernel events: `Kernel` in older PyTorch, `kernel` since; compared casefolded."""
_KERNEL = re.compile(r"^nccl(?:Dev)?Kernel_([A-Za-z]+)")
_TYPES = {
    "allreduce": "allreduce",
    "allgather": "allgather",
    "allgatherintotensor": "allgather",
    "allgatherbase": "allgather",
    "reducescatter": "reducescatter",
    "reducescattertensor": "reducescatter",
    "reducescatterbase": "reducescatter",
    "sendrecv": "sendrecv",
    "send": "send",
    "recv": "recv",
    "alltoall": "alltoall",
    "alltoallv": "alltoall",
    "alltoallbase": "alltoall",
    "broadcast": "broadcast",
}
_DTYPE_BYTES = {
    "float": 4,
    "float32": 4,
    "f32": 4,
    "double": 8,
    "float64": 8,
    "half": 2,
    "float16": 2,
    "f16": 2,
    "bfloat16": 2,
    "bf16": 2,
    "int": 4,
    "int32": 4,
    "long": 8,
    "int64": 8,
    "char": 1,
    "int8": 1,
    "byte": 1,
    "uint8": 1,
    "bool": 1,
    "float8_e4m3fn": 1,
    "float8_e5m2": 1,
}
_DIM_WORDS = (("pp", "pp"), ("tp", "tp"), ("cp", "cp"), ("dp", "dp"), ("fsdp", "dp"))


def _norm(name: str) -> str:
    return re.sub(r"[^a-z0-9]", "", name.lower())


def _args(event: dict[str, Any]) -> dict[str, Any]:
    args = event.get("args")
    return args if isinstance(args, dict) else {}


def _op_type(event: dict[str, Any]) -> str | None:
    args = _args(event)
    named = args.get("Collective name")
    if isinstance(named, str) and _norm(named) in _TYPES:
        return _TYPES[_norm(named)]
    m = _KERNEL.match(str(event.get("name", "")))
    return _TYPES.get(_norm(m[1])) if m else None


def _bytes(args: dict[str, Any], op_type: str) -> int:
    size = _DTYPE_BYTES.get(str(args.get("dtype", "")).lower(), 0)
    key = "Out msg nelems" if op_type == "allgather" else "In msg nelems"
    nelems = args.get(key, args.get("In msg nelems"))
    if not isinstance(nelems, int | float) or isinstance(nelems, bool) or not math.isfinite(nelems):
        return 0
    return max(0, int(nelems)) * size


def _ranks(args: dict[str, Any]) -> list[int] | None:
    raw = args.get("Process Group Ranks")
    if isinstance(raw, str):
        try:
            raw = json.loads(raw)
        except json.JSONDecodeError:
            return None
    if isinstance(raw, list) and raw and all(isinstance(r, int) for r in raw):
        return raw
    return None


def _group(args: dict[str, Any], op_type: str, groups: dict[str, str]) -> str:
    for key in ("Process Group Name", "Process Group Description"):
        value = args.get(key)
        if isinstance(value, str) and value in groups:
            return groups[value]
    desc = _norm(str(args.get("Process Group Description", "")))
    for word, dim in _DIM_WORDS:
        if word in desc:
            return dim
    return "pp" if op_type in ("send", "recv", "sendrecv") else "dp"


def kineto_to_trace(
    data: Any,
    job: dict[str, Any],
    *,
    name: str = "kineto",
    groups: dict[str, str] | None = None,
    symmetric: bool = True,
) -> tuple[dict[str, Any], dict[str, int]]:
    """The trace (as data for `labctl.workload.trace`) and what the import did (kernels, clipped, skipped).

    One rank's trace names only its own groups. `symmetric` (default): its DP/CP operations stand for
    every stage's (Opus treats DP and CP as symmetric: all stages run them alike), so their ranks are
    dropped; PP operations keep theirs (they say which two stages)."""
    if not isinstance(data, dict) or not isinstance(data.get("traceEvents"), list):
        raise InputError(f"{name}: not a Kineto/Chrome trace (no traceEvents list)")
    groups = groups or {}
    events = [(i, e) for i, e in enumerate(data["traceEvents"]) if isinstance(e, dict) and e.get("ph") == "X"]

    def us(i: int, e: dict[str, Any], key: str) -> float:
        """A finite time in µs from event i (`dur` absent: 0; Kineto's `ts` may be epoch-based, so large), or
        one line naming it."""
        raw: Any = e.get(key, 0 if key == "dur" else None)
        value = math.nan
        if isinstance(raw, int | float | str) and not isinstance(raw, bool):
            with contextlib.suppress(ValueError):
                value = float(raw)
        if not math.isfinite(value) or (key == "dur" and value < 0):
            what = "a duration in µs (>= 0)" if key == "dur" else "a time in µs"
            raise InputError(f"{name}: traceEvents[{i}].{key}: {raw!r} is not {what}")
        return value

    steps = sorted(
        (us(i, e, "ts"), us(i, e, "ts") + us(i, e, "dur"))
        for i, e in events
        if str(e.get("name", "")).startswith("ProfilerStep#") and "ts" in e
    )
    kernels = []
    skipped = 0
    for i, e in events:
        if str(e.get("cat", "")).casefold() != GPU_KERNEL_CAT or not str(e.get("name", "")).startswith(
            "nccl"
        ):
            continue
        op_type = _op_type(e)
        if op_type is None or "ts" not in e:
            skipped += 1
            continue
        kernels.append((round(us(i, e, "ts") * 1000), round(us(i, e, "dur") * 1000), op_type, e))
    if not kernels:
        raise InputError(f"{name}: no NCCL kernels (cat 'kernel', name nccl...) in the trace")
    kernels.sort(key=lambda k: k[0])
    bounds: list[tuple[int, int | None]] = [(round(a * 1000), round(b * 1000)) for a, b in steps]
    bounds = bounds or [(kernels[0][0], None)]
    out_steps: list[dict[str, Any]] = []
    clipped = 0
    for step_start, step_end in bounds:
        mine = [kn for kn in kernels if kn[0] >= step_start and (step_end is None or kn[0] < step_end)]
        if not mine:
            continue
        ops, prev_end = [], 0
        for i, (ts, dur, op_type, e) in enumerate(mine):
            args = _args(e)
            start, end = ts - step_start, ts - step_start + dur
            if start < prev_end:  # overlapping streams: serialise, keep the end
                clipped += 1
                start = prev_end
                end = max(end, start)
            op: dict[str, Any] = {
                "name": f"{op_type}-{i}",
                "group": _group(args, op_type, groups),
                "type": op_type,
                "bytes": _bytes(args, op_type),
                "start_ns": start,
                "duration_ns": end - start,
            }
            if op["group"] == "pp" and op_type not in ("send", "recv", "sendrecv"):
                op["group"] = "dp"
            ranks = _ranks(args)
            if ranks is not None and not (symmetric and op["group"] in ("dp", "cp")):
                op["ranks"] = ranks
            ops.append(op)
            prev_end = end
        length = (step_end - step_start) if step_end is not None else prev_end
        out_steps.append({"step_ns": max(length, prev_end), "ops": ops})
    trace = {
        "format": "labctl-trace/1",
        "name": name,
        "description": "imported from a PyTorch profiler (Kineto) trace's NCCL kernels",
        "source": "kineto",
        "job": job,
        "steps": out_steps,
    }
    return trace, {"kernels": len(kernels), "clipped": clipped, "skipped": skipped, "steps": len(out_steps)}


def load_kineto(path: Path) -> Any:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise InputError(f"{path}: Kineto trace not found") from None
    except json.JSONDecodeError as e:
        raise InputError(f"{path}:{e.lineno}: not valid JSON ({e.msg})") from None
    except (OSError, UnicodeDecodeError) as e:
        raise InputError(f"{path}: cannot read: {e}") from None
