"""The stall model (Opus §3): what switching costs a step, from the trace's idle windows alone.

A switch point is a rail operation whose circuits differ from those of the rail operation before it (O1:
consecutive operations of the same dimension need no switch). Wᵢ is the idle window before it. With
provisioning the switch starts when the previous phase ends, so a switch of T costs max(0, T − Wᵢ); on
demand it starts when the operation arrives and costs T. Per step: Σᵢ max(0, T − Wᵢ) and N·T; the paper's
estimate of a step is T_native + T_reconfig × N (no hiding).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from labctl.workload.circuits import TopoState, after_op, changed_stages, initial_state, topo_id
from labctl.workload.trace import Op, Trace


@dataclass(frozen=True, slots=True)
class SwitchPoint:
    step: int
    op: Op
    window_ns: int
    """Idle time between the previous rail operation's end and this one's start."""
    before: TopoState
    after: TopoState

    @property
    def stages(self) -> tuple[int, ...]:
        return changed_stages(self.before, self.after)

    @property
    def topo_id(self) -> str:
        return topo_id(self.after)


def switch_points(trace: Trace) -> list[SwitchPoint]:
    """Every switch the trace needs, in order (the baseline already holds the first operation's circuits)."""
    rail = list(trace.rail_ops())
    state = initial_state(trace.job, (op for _, op in rail))
    out: list[SwitchPoint] = []
    prev_end: int | None = None
    for start, op in rail:
        target = after_op(state, op)
        if target != state:
            window = start - prev_end if prev_end is not None else 0
            out.append(SwitchPoint(op.step, op, window, state, target))
        state = target
        prev_end = start + op.duration_ns
    return out


def provisioning_stall_ns(windows_ns: Iterable[int], switch_ns: int) -> int:
    """Σᵢ max(0, T − Wᵢ): each switch starts at the beginning of its window."""
    return sum(max(0, switch_ns - w) for w in windows_ns)


def on_demand_stall_ns(n_switches: int, switch_ns: int) -> int:
    """N·T: each switch starts when its operation arrives and is exposed in full."""
    return n_switches * switch_ns


def estimate_step_ns(native_ns: int, switch_ns: int, n_switches: int) -> int:
    """The paper's estimate, T_native + T_reconfig × N_reconfig."""
    return native_ns + switch_ns * n_switches


@dataclass(frozen=True, slots=True)
class ModelRow:
    """One switching delay: mean step time per step under each policy, from the model."""

    switch_ns: int
    native_ns: int
    switches_per_step: float
    provisioning_ns: int
    on_demand_ns: int
    estimate_ns: int


def model_rows(trace: Trace, delays_ns: Sequence[int]) -> list[ModelRow]:
    """The stall model over the trace's steps, per switching delay (means over the steps)."""
    points = switch_points(trace)
    steps = len(trace.steps)
    native = round(sum(trace.step_lengths_ns) / steps)
    n = len(points) / steps
    rows = []
    for t in delays_ns:
        prov = provisioning_stall_ns((p.window_ns for p in points), t) / steps
        rows.append(
            ModelRow(
                t,
                native,
                n,
                round(native + prov),
                round(native + on_demand_stall_ns(len(points), t) / steps),
                round(estimate_step_ns(native, t, 0) + t * n),
            )
        )
    return rows
