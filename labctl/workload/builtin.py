"""Built-in traces: the Opus testbed job and Config. 1/2-like jobs, with where each number comes from.

Sources (../shared/seeds/000_c57dabf76e4b88f5.txt, the Opus digest):
- Figure 4(b), Exp. 1 (Llama-3-8B, TP4 FSDP2 PP2 on Perlmutter, rail 0): one iteration has 8 windows before
  4 kinds of operation: AllReduce < 1 MB (1 window, ≈75 ms), 64 MB PP Send/Recv (3, ≈7 ms), 957 MB DP
  AllGather (2, ≈480 ms) and 3,829 MB ReduceScatter (2, ≈1,000 ms). The lengths are the digest's readings of
  the group averages from a log-scale plot (only ≈1,000 ms is in the paper's text).
- The testbed: 4 servers × 2 L40 GPUs, 2 rails, a 6-layer Llama-3 with DP2 TP2 PP2, each rail switched
  4 times per step between DP and PP circuits, each phase at the full 200 Gb/s per GPU.
- Configs 1/2 (emulated OCS on Perlmutter): Llama-3-8B, TP4 FSDP2 PP2 on 16 GPUs / TP4 FSDP8 PP2 on
  64 GPUs, 6 switches per step; Config 2's native step is 13.86 s.

Durations are ours: bytes a ring moves per GPU, (n − 1)/n × size (the whole size for a Send/Recv), at the
phase's bandwidth (200 Gb/s = 25 GB/s per GPU: the testbed's two 100G ports; Perlmutter's Slingshot-11
NIC per A100 is 200 Gb/s too). The phase order is schematic (the digest says so of Figure 4(b) as well).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

GBPS_PER_GPU = 200  # the testbed's 2 x 100G per GPU; one 200G Slingshot-11 NIC per A100 on Perlmutter
BYTES_PER_NS = GBPS_PER_GPU / 8  # 25 GB/s = 25 bytes/ns

# Figure 4(b) window lengths (ms), by the operation that follows.
W_ALLREDUCE_MS = 75.0
W_PP_MS = 7.0
W_ALLGATHER_MS = 480.0
W_REDUCESCATTER_MS = 1000.0
# Figure 4(b) sizes (bytes), Llama-3-8B.
AG_BYTES_8B = 957_000_000
RS_BYTES_8B = 3_829_000_000
PP_BYTES = 64_000_000
AR_BYTES = 500_000  # "under 1 MB": goes over the CPU front-end network (the shim's choice)

Row = tuple[str, str, str, int, float, dict[str, Any]]  # name, group, type, bytes, window before (ms), extra


def _duration_ns(group: str, nbytes: int, ring: int) -> int:
    moved = nbytes if group == "pp" else nbytes * (ring - 1) / ring
    return max(1, round(moved / BYTES_PER_NS))


def _step(rows: list[Row], ring: int, tail_window_ms: float) -> dict[str, Any]:
    """Ops one after another, each after its window; the step ends `tail_window_ms` after the last op, so
    the window before the next step's first op is the tail plus that op's own lead (0 here)."""
    ops, t = [], 0
    for name, group, kind, nbytes, window_ms, extra in rows:
        t += round(window_ms * 1e6)
        duration = _duration_ns(group, nbytes, ring)
        ops.append(
            {
                "name": name,
                "group": group,
                "type": kind,
                "bytes": nbytes,
                "start_ns": t,
                "duration_ns": duration,
                **extra,
            }
        )
        t += duration
    return {"step_ns": t + round(tail_window_ms * 1e6), "ops": ops}


def opus_testbed() -> dict[str, Any]:
    """6-layer Llama-3, DP2 TP2 PP2 on the testbed (h1..h4 x 2 GPUs): DP -> PP -> DP -> PP -> DP, 4 switches
    per rail per step. Stage 0 = h1, h2; stage 1 = h3, h4 (the DP rings h1-h2 and h3-h4, PP pairs h1-h3 and
    h2-h4: the circuits of experiments/reconfig-timeline.yaml). FSDP shard sizes scale with the layers:
    Figure 4(b)'s 8B sizes x 6/32; the PP activations stay 64 MB (they do not depend on depth)."""
    ag, rs = AG_BYTES_8B * 6 // 32, RS_BYTES_8B * 6 // 32
    pp = {"stages": [0, 1]}
    rows: list[Row] = [
        ("ag-fwd", "dp", "allgather", ag, 0.0, {}),
        ("fwd-act", "pp", "sendrecv", PP_BYTES, W_PP_MS, pp),
        ("ag-bwd", "dp", "allgather", ag, W_ALLGATHER_MS, {}),
        ("bwd-grad", "pp", "sendrecv", PP_BYTES, W_PP_MS, pp),
        ("rs-grad", "dp", "reducescatter", rs, W_REDUCESCATTER_MS, {}),
        ("loss-ar", "dp", "allreduce", AR_BYTES, W_ALLREDUCE_MS, {}),
    ]
    return {
        "name": "opus-testbed",
        "description": "Opus testbed job: 6-layer Llama-3, DP2 TP2 PP2 on 4 servers x 2 GPUs, 4 switches per "
        "rail per step",
        "source": "Opus digest: testbed (Figure 9) and Figure 4(b) windows; durations at 200 Gb/s per GPU",
        "job": {"hosts": ["h1", "h2", "h3", "h4"], "gpus_per_host": 2, "tp": 2, "dp": 2, "pp": 2},
        # The tail is the AllGather window before the next step's first op (it starts the step at 0).
        "steps": [_step(rows, 2, W_ALLGATHER_MS)],
        "repeat": 3,
    }


def _config(name: str, hosts: int, dp: int, dp_window_scale: float, description: str) -> dict[str, Any]:
    """Llama-3-8B, TP4 FSDPdp PP2: AG P AG P RS P RS AR, 6 switches per step (DP<->PP; the AllReduce is
    front-end and the step wraps from it into the next AllGather without a switch)."""
    pp = {"stages": [0, 1]}
    w_ag, w_rs = W_ALLGATHER_MS * dp_window_scale, W_REDUCESCATTER_MS * dp_window_scale
    rows: list[Row] = [
        ("ag-fwd", "dp", "allgather", AG_BYTES_8B, 0.0, {}),
        ("fwd-act", "pp", "sendrecv", PP_BYTES, W_PP_MS, pp),
        ("ag-bwd", "dp", "allgather", AG_BYTES_8B, w_ag, {}),
        ("bwd-grad-1", "pp", "sendrecv", PP_BYTES, W_PP_MS, pp),
        ("rs-grad-1", "dp", "reducescatter", RS_BYTES_8B, w_rs, {}),
        ("bwd-grad-2", "pp", "sendrecv", PP_BYTES, W_PP_MS, pp),
        ("rs-grad-2", "dp", "reducescatter", RS_BYTES_8B, w_rs, {}),
        ("loss-ar", "dp", "allreduce", AR_BYTES, W_ALLREDUCE_MS, {}),
    ]
    return {
        "name": name,
        "description": description,
        "source": "Opus digest: Configs 1/2 (6 switches per step), Figure 4(b) windows (Exp. 1 is Config 1's "
        "job); durations at 200 Gb/s per GPU",
        "job": {
            "hosts": [f"n{i:02d}" for i in range(1, hosts + 1)],
            "gpus_per_host": 4,
            "tp": 4,
            "dp": dp,
            "pp": 2,
        },
        "steps": [_step(rows, dp, w_ag)],
        "repeat": 3,
    }


def config_1() -> dict[str, Any]:
    """Config. 1: 16 GPUs (4 nodes x 4 A100), TP4 FSDP2 PP2: Exp. 1's job, Figure 4(b)'s windows as read."""
    return _config(
        "config-1", 4, 2, 1.0, "Config. 1-like: Llama-3-8B, TP4 FSDP2 PP2 on 16 GPUs, 6 switches per step"
    )


# Config. 2's DP windows: Figure 4(b)'s, scaled so that the step is its measured native 13.86 s (larger DP
# groups wait longer for their slowest rank and leave wider windows, the digest says; the scale is ours).
CONFIG_2_NATIVE_NS = 13_860_000_000


def config_2() -> dict[str, Any]:
    """Config. 2: 64 GPUs (16 nodes x 4 A100), TP4 FSDP8 PP2; DP windows widened to a 13.86 s step."""
    base = _config("config-2", 16, 8, 1.0, "")
    fixed = sum(op["duration_ns"] for op in base["steps"][0]["ops"]) + round(
        (3 * W_PP_MS + W_ALLREDUCE_MS) * 1e6
    )
    dp_windows_ns = round((2 * W_ALLGATHER_MS + 2 * W_REDUCESCATTER_MS) * 1e6)
    scale = (CONFIG_2_NATIVE_NS - fixed) / dp_windows_ns
    return _config(
        "config-2",
        16,
        8,
        scale,
        "Config. 2-like: Llama-3-8B, TP4 FSDP8 PP2 on 64 GPUs, 6 switches per step, native step 13.86 s",
    )


def opus_testbed_mini() -> dict[str, Any]:
    """The testbed job with every time x 0.1 (a ~0.2 s step): the same shape, fast enough for CI sweeps."""
    data = opus_testbed()
    data["name"] = "opus-testbed-mini"
    data["description"] = "the opus-testbed trace with every time x 0.1, for CI"
    step = data["steps"][0]
    step["step_ns"] = round(step["step_ns"] * 0.1)
    for op in step["ops"]:
        op["start_ns"] = round(op["start_ns"] * 0.1)
        op["duration_ns"] = max(1, round(op["duration_ns"] * 0.1))
    data["repeat"] = 2
    return data


TRACES: dict[str, Callable[[], dict[str, Any]]] = {
    "opus-testbed": opus_testbed,
    "opus-testbed-mini": opus_testbed_mini,
    "config-1": config_1,
    "config-2": config_2,
}
