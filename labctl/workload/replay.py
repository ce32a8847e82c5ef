"""Trace replay in real time: each rail operation holds its circuits for its duration; phase boundaries write
topo_id on demand (when the next operation arrives) or with provisioning (as soon as the phase ends).

The replay keeps its own timeline in integer ns on the run's clock. An operation arrives its trace gap
after the previous one ended (so a stall shifts everything after it, as in a job); it starts when it has
arrived and its circuits are ready (the orchestrators acknowledged, or with `ready: link` every moved port
carries traffic again); it ends `duration` later. The loop sleeps to those absolute times, so being woken
late never drifts the timeline; how late it woke is recorded per operation at every wake (arrival, start,
end), and so is the control lag (write request − boundary): the replay's own overhead, which the switch
exposure would otherwise silently include. Per switch, with
boundary b (provisioning: the previous operation's end; on demand: the arrival) and ready r, the
reconfiguration time the job saw is T = r − b and the part it exposed is max(0, r − arrival): with
provisioning exactly max(0, T − W), on demand T (decided per operation: with provisioning the steps before
`learn_steps` run on demand). A step's time is its trace length plus what its switches exposed; a step
with no rail operation is its trace length.

The replay runs one operation at a time (rail operations of a step do not overlap), so its G1/G2 waits are
structurally 0; the locks matter when operations and writes run concurrently (the orchestrator tests).
"""

from __future__ import annotations

import asyncio
import csv
from collections.abc import Callable, Sequence
from contextlib import AbstractAsyncContextManager
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Literal, Protocol

from labctl.core.clock import now_ns
from labctl.core.events import Event, Kind
from labctl.linux import timerfd
from labctl.linux.timerfd import Alarm
from labctl.workload.circuits import TopoState, after_op, topo_id
from labctl.workload.orchestrator import WriteResult
from labctl.workload.trace import Op, Trace

Mode = Literal["provisioning", "on-demand"]


class LinkWatch(Protocol):
    """Watching, from its creation, for the moved ports of some rail changes to carry traffic again."""

    async def wait(self) -> None: ...

    def close(self) -> None: ...


class Orchestrator(Protocol):
    """What the replay asks of a job's controller (JobOrchestrator on a lab; labctl.workload.whatif's
    stand-in, whose switches take a given recovery time)."""

    fallback: dict[str, Any] | None

    @property
    def state(self) -> TopoState: ...

    def operation(self, label: str, stages: Sequence[int]) -> AbstractAsyncContextManager[int]: ...

    def planned_changes(self, target: TopoState) -> list[tuple[int, Any, Any]]: ...

    async def write(self, target: TopoState, context: dict[str, Any] | None = None) -> WriteResult: ...


class ReplayClock(Protocol):
    """The replay's timeline clock: CLOCK_MONOTONIC with a timerfd on a lab (`TimerfdClock`), or a
    virtual one (labctl.workload.whatif) that jumps to the next deadline when every task waits."""

    def now_ns(self) -> int: ...

    async def sleep_until(self, t_ns: int) -> int:
        """Sleep to an absolute time; returns how late it woke (ns)."""
        ...

    def close(self) -> None: ...


LinksUp = Callable[[list[tuple[int, Any, Any]], int], LinkWatch]
"""Starts watching (buffering from then on) for every port the given planned rail changes move, from the
given ns (ready: link). Called before the write is sent, so no link-up during a retry is missed."""

OPS_CSV = "replay_ops.csv"
STEPS_CSV = "replay_steps.csv"


@dataclass
class OpRecord:
    step: int
    index: int
    op: str
    group: str
    type: str
    bytes: int
    stages: str
    topo_id: str
    switched: bool
    """A change was sent for it (after a fallback, writes are no-ops: not a switch)."""
    provisioned: bool
    """Its write was asked for when the previous phase ended (else when it arrived: on demand)."""
    window_ns: int
    arrival_ns: int
    boundary_ns: int | None
    request_ns: int | None
    switch_done_ns: int | None
    ready_ns: int | None
    start_ns: int
    end_ns: int
    reconfig_ns: int | None
    """T as the job saw it: ready − boundary."""
    exposed_ns: int
    g1_wait_ns: int
    g2_wait_ns: int
    late_ns: int
    """How late the replay woke for this operation's start (its own overhead, not in the step time)."""
    late_arrival_ns: int
    late_end_ns: int
    control_lag_ns: int | None
    """Write request − boundary: how late the replay asked for the circuits (counts as exposure)."""
    fallback: bool


@dataclass
class StepRecord:
    step: int
    native_ns: int
    step_ns: int
    stall_ns: int
    switches: int
    exposed_ns: str
    """Each switch's exposed part, ';'-joined, in order."""
    model_stall_ns: int
    """The stall model on this step's windows with the reconfiguration times the job saw."""
    g1_wait_ns: int
    g2_wait_ns: int
    fallback: bool


@dataclass
class ReplayResult:
    mode: Mode
    ops: list[OpRecord] = field(default_factory=list)
    steps: list[StepRecord] = field(default_factory=list)
    fallback: dict[str, Any] | None = None
    switch_ns: int | None = None
    """The switching time the replay fixed (its `switching_ms`), for the zero-overhead model; None: drawn."""

    def ideal_stall_ns(self) -> float | None:
        """Mean stall per step if every switch took exactly `switch_ns` and labctl's control path took none:
        a provisioned switch exposes max(0, T − its window), one on demand all of T (the stall model at the
        configured time; `model_stall_ns` uses the times the job saw, so it hides the control path)."""
        if self.switch_ns is None or not self.steps:
            return None
        t = self.switch_ns
        total = sum(max(0, t - o.window_ns) if o.provisioned else t for o in self.ops if o.switched)
        return total / len(self.steps)

    def summary(self) -> dict[str, Any]:
        n = len(self.steps) or 1
        ideal = self.ideal_stall_ns()
        switches = sum(s.switches for s in self.steps) / n
        stall = sum(s.stall_ns for s in self.steps) / n
        return {
            "mode": self.mode,
            "steps": len(self.steps),
            "native_ns": round(sum(s.native_ns for s in self.steps) / n),
            "step_ns": round(sum(s.step_ns for s in self.steps) / n),
            "stall_ns": round(sum(s.stall_ns for s in self.steps) / n),
            "switches_per_step": sum(s.switches for s in self.steps) / n,
            "model_stall_ns": round(sum(s.model_stall_ns for s in self.steps) / n),
            "g1_wait_ns": sum(s.g1_wait_ns for s in self.steps),
            "g2_wait_ns": sum(s.g2_wait_ns for s in self.steps),
            "late_ns_max": max(
                (max(o.late_ns, o.late_arrival_ns, o.late_end_ns) for o in self.ops), default=0
            ),
            "control_lag_ns_max": max((o.control_lag_ns or 0 for o in self.ops), default=0),
            "fallback": self.fallback,
            "ideal_stall_ns": None if ideal is None else round(ideal),
            "overhead_per_switch_ns": None
            if ideal is None or not switches
            else round((stall - ideal) / switches),
        }

    def write_csv(self, run_dir: Path) -> None:
        for name, rows, cls in ((OPS_CSV, self.ops, OpRecord), (STEPS_CSV, self.steps, StepRecord)):
            with open(run_dir / name, "w", newline="", encoding="utf-8") as f:
                writer = csv.DictWriter(f, fieldnames=list(cls.__dataclass_fields__))
                writer.writeheader()
                for row in rows:
                    writer.writerow({k: ("" if v is None else v) for k, v in asdict(row).items()})


async def sleep_until(t_ns: int, alarm: Alarm | None = None) -> int:
    """Sleep to an absolute time; returns how late it woke (ns, 0 when on time). With `alarm` (a timerfd)
    it wakes within tens of µs, where `asyncio.sleep` rounds up to the next millisecond: every replayed
    operation sleeps to its arrival and its end, so that millisecond would land in every step."""
    if t_ns > now_ns():
        await timerfd.sleep_until(t_ns, alarm)
    return max(0, now_ns() - t_ns)


class TimerfdClock:
    """The run's clock (labctl.core.clock.now_ns), slept on with one timerfd (`sleep_until`)."""

    def __init__(self) -> None:
        self._alarm = Alarm()

    def now_ns(self) -> int:
        return now_ns()

    async def sleep_until(self, t_ns: int) -> int:
        return await sleep_until(t_ns, self._alarm)

    def close(self) -> None:
        self._alarm.close()


class ReplayEngine:
    def __init__(
        self,
        trace: Trace,
        orchestrator: Orchestrator,
        emit: Callable[[Event], object],
        *,
        mode: Mode = "provisioning",
        learn_steps: int = 0,
        links_up: LinksUp | None = None,
        on_step: Callable[[StepRecord], None] | None = None,
        clock: Callable[[], ReplayClock] = TimerfdClock,
    ) -> None:
        self.trace = trace
        self.orch = orchestrator
        self.emit = emit
        self.mode = mode
        self.learn_steps = learn_steps
        self.links_up = links_up
        self.on_step = on_step
        self.make_clock = clock
        """Makes the timeline's clock when a replay starts (closed when it ends)."""
        self._clock: ReplayClock | None = None
        self._origin_ns = 0

    def _now(self) -> int:
        return self._clock.now_ns() if self._clock is not None else now_ns()

    async def _write(self, target: TopoState, op: Op) -> WriteResult:
        watch: LinkWatch | None = None
        if self.links_up is not None:
            planned = self.orch.planned_changes(target)
            if planned:  # subscribed before anything is sent: a link up during a retry still counts
                watch = self.links_up(planned, self._now())
        try:
            result = await self.orch.write(target, {"step": op.step, "op": op.label})
            if watch is not None and result.changes and not result.fallback:
                await watch.wait()
                result.ready_ns = self._now()
        finally:
            if watch is not None:
                watch.close()
        self.emit(
            Event(
                t_ns=result.ready_ns,
                kind=Kind.WORKLOAD_TOPO,
                source="orchestrator",
                value=result.topo_id,
                meta={
                    "step": op.step,
                    "op": op.label,
                    "stages": list(result.stages),
                    "request_ns": result.request_ns,
                    "switch_done_ns": result.switch_done_ns,
                    "g2_wait_ns": result.g2_wait_ns,
                    "tries": result.tries,
                    "fallback": result.fallback,
                },
            )
        )
        return result

    async def run(self, out: ReplayResult | None = None) -> ReplayResult:
        """Replay every step; `out` is filled as it goes (a failed replay keeps what it recorded)."""
        out = out if out is not None else ReplayResult(self.mode)
        rail = [op for step in self.trace.steps for op in step if op.on_rail]
        lengths = self.trace.step_lengths_ns
        state = self.orch.state
        timeline = self._clock = self.make_clock()
        clock = timeline.now_ns()  # the timeline's origin: the first rail operation arrives now
        self._origin_ns = clock
        # Steps before the first rail operation's have no switch: each is its trace length, back from it.
        first_step = rail[0].step if rail else len(lengths)
        step_start = {first_step: clock - (rail[0].start_ns if rail else 0)}
        t = step_start[first_step] - sum(lengths[:first_step])
        for k in range(first_step):
            self._close_step(out, k, t, t + lengths[k])
            t += lengths[k]
        prev: Op | None = None
        prev_end = clock
        pending: tuple[TopoState, asyncio.Task[WriteResult], int] | None = None
        offsets = [0]
        for length in lengths:
            offsets.append(offsets[-1] + length)
        try:
            for i, op in enumerate(rail):
                gap = (
                    0
                    if prev is None
                    else (offsets[op.step] + op.start_ns) - (offsets[prev.step] + prev.end_ns)
                )
                arrival = prev_end + gap
                if op.step not in step_start:
                    step_start[op.step] = arrival - op.start_ns
                target = after_op(state, op)
                switched = target != state
                result: WriteResult | None = None
                boundary: int | None = None
                provisioned = False
                late_arrival = 0
                if switched:
                    if pending is not None and pending[0] == target:
                        boundary, task = pending[2], pending[1]
                        pending = None
                        provisioned = True
                        late_arrival = await timeline.sleep_until(arrival)
                        result = await task
                    else:
                        if pending is not None:  # a write for other circuits still runs: it goes first
                            stale, pending = pending[1], None
                            await stale
                        late_arrival = await timeline.sleep_until(arrival)
                        boundary = arrival
                        result = await self._write(target, op)
                    if result.tries == 0:  # a no-op (after the fallback): nothing was switched
                        switched, provisioned, result, boundary = False, False, None, None
                else:
                    late_arrival = await timeline.sleep_until(arrival)
                start = max(arrival, result.ready_ns) if result is not None else arrival
                late = await timeline.sleep_until(start)
                async with self.orch.operation(op.label, op.stages) as g1_wait:
                    if g1_wait:  # a change still held a stage (G1): the op starts when it let go
                        start = timeline.now_ns()
                    end = start + op.duration_ns
                    late_end = await timeline.sleep_until(end)
                state = target
                record = OpRecord(
                    op.step,
                    op.index,
                    op.label,
                    op.group,
                    op.type,
                    op.bytes,
                    " ".join(map(str, op.stages)),
                    topo_id(target),
                    switched,
                    provisioned,
                    gap,
                    arrival,
                    boundary,
                    result.request_ns if result else None,
                    result.switch_done_ns if result else None,
                    result.ready_ns if result else None,
                    start,
                    end,
                    (result.ready_ns - boundary) if result is not None and boundary is not None else None,
                    start - arrival,
                    g1_wait,
                    result.g2_wait_ns if result else 0,
                    late,
                    late_arrival,
                    late_end,
                    (result.request_ns - boundary) if result is not None and boundary is not None else None,
                    self.orch.fallback is not None,
                )
                out.ops.append(record)
                self.emit(
                    Event(
                        t_ns=end,
                        kind=Kind.WORKLOAD_OP,
                        source="replay",
                        value=op.label,
                        meta={k: v for k, v in asdict(record).items() if k not in ("op",)},
                    )
                )
                prev, prev_end = op, end
                nxt = rail[i + 1] if i + 1 < len(rail) else None
                if nxt is not None and self.mode == "provisioning" and nxt.step >= self.learn_steps:
                    nxt_target = after_op(state, nxt)
                    if nxt_target != state:  # the phase ends here: ask for the next one's circuits now
                        pending = (nxt_target, asyncio.create_task(self._write(nxt_target, nxt)), end)
                if nxt is None or nxt.step != op.step:
                    # This step, then every step up to the next rail operation's (none: to the trace's
                    # end), which has no rail operation: its trace length.
                    t = end + (lengths[op.step] - op.end_ns)
                    self._close_step(out, op.step, step_start[op.step], t)
                    for k in range(op.step + 1, nxt.step if nxt is not None else len(lengths)):
                        self._close_step(out, k, t, t + lengths[k])
                        t += lengths[k]
        finally:
            timeline.close()
            if pending is not None:
                if not pending[1].done():
                    pending[1].cancel()
                # Always retrieved: a write that failed while nobody waited is not "never retrieved".
                await asyncio.gather(pending[1], return_exceptions=True)
            out.fallback = self.orch.fallback
        return out

    def _close_step(self, out: ReplayResult, step: int, start_ns: int, end_ns: int) -> None:
        ops = [o for o in out.ops if o.step == step]
        switches = [o for o in ops if o.switched]
        # Per operation: a provisioned switch hides up to its window, one on demand (any mode's learn
        # steps) exposes all of T.
        model = sum(
            max(0, (o.reconfig_ns or 0) - o.window_ns) if o.provisioned else (o.reconfig_ns or 0)
            for o in switches
        )
        record = StepRecord(
            step,
            self.trace.step_lengths_ns[step],
            end_ns - start_ns,
            sum(o.exposed_ns for o in ops),
            len(switches),
            ";".join(str(o.exposed_ns) for o in switches),
            model,
            sum(o.g1_wait_ns for o in ops),
            sum(o.g2_wait_ns for o in ops),
            any(o.fallback for o in ops),
        )
        out.steps.append(record)
        self.emit(
            Event(
                t_ns=max(end_ns, self._origin_ns),  # a step before the first rail operation: at the start
                kind=Kind.WORKLOAD_STEP,
                source="replay",
                value=record.step_ns,
                meta=asdict(record),
            )
        )
        if self.on_step is not None:
            self.on_step(record)
