"""Plans as typed steps: what the controller executes, in order, like bluesky's RunEngine executes messages.

A timeline experiment compiles to: GPU benchmarks before, the baseline reconfiguration, a hold, then per
step a reconfiguration and a hold, then GPU benchmarks after (the order the controller always had). A
replay experiment compiles to: the baseline (the circuits the trace's first operation needs), a hold, and
one replay segment. `check_program` refuses a program the controller could not carry out, before anything
moves. Pure data: no I/O, nothing imported above the experiment layer.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from labctl.core.errors import InputError


@dataclass(frozen=True, slots=True)
class GpuBench:
    """The experiment's `gpu:` microbenchmarks at one stage (skipped, with an event, without a GPU)."""

    stage: Literal["before", "after"]


@dataclass(frozen=True, slots=True)
class Reconfigure:
    """Apply a phase on every rail and wait for every moved port to carry traffic again."""

    phase: str
    step: int | None = None
    """The experiment's step (repeat index) it belongs to; None for the baseline."""
    baseline: bool = False
    """The baseline set-up: a port that does not come back stops the run (nothing later can be trusted)."""
    index: int = 0
    """1-based position among the plan's non-baseline reconfigurations (for progress)."""
    of: int = 0


@dataclass(frozen=True, slots=True)
class Hold:
    """Let traffic flow on the current circuits."""

    seconds: float


@dataclass(frozen=True, slots=True)
class ReplaySegment:
    """Replay a trace's steps against the lab (labctl.workload.replay), from the baseline's circuits."""

    replay: Any
    """The compiled replay (labctl.workload.experiment.CompiledReplay): trace, circuits, settings."""


Step = GpuBench | Reconfigure | Hold | ReplaySegment


def timeline_program(
    baseline: str, steps: Sequence[tuple[int, str]], hold_s: float, *, gpu: bool
) -> tuple[Step, ...]:
    """The fixed order a timeline experiment always had, as steps."""
    program: list[Step] = [GpuBench("before")] if gpu else []
    program += [Reconfigure(baseline, None, baseline=True), Hold(hold_s)]
    for i, (step, phase) in enumerate(steps, start=1):
        program += [Reconfigure(phase, step, index=i, of=len(steps)), Hold(hold_s)]
    if gpu:
        program.append(GpuBench("after"))
    return tuple(program)


def check_program(program: Sequence[Step], phases: Collection[str]) -> None:
    """A program the controller can carry out: its first reconfiguration is a baseline, every phase it
    names exists, a replay segment starts from a baseline, and there is a baseline at all."""
    seen_baseline = False
    for i, step in enumerate(program):
        if isinstance(step, Reconfigure):
            if step.phase not in phases:
                raise InputError(
                    f"plan step {i}: unknown phase {step.phase!r} (defined: {', '.join(phases)})"
                )
            if not seen_baseline and not step.baseline:
                raise InputError(f"plan step {i}: the first reconfiguration must set up the baseline")
            seen_baseline = True
        elif isinstance(step, ReplaySegment) and not seen_baseline:
            raise InputError(f"plan step {i}: a replay segment needs the baseline set up before it")
        elif isinstance(step, Hold) and not 0 <= step.seconds <= 3600:
            raise InputError(f"plan step {i}: hold {step.seconds} s is outside 0..3600 s")
    if not seen_baseline:  # the plan's baseline is what the run restores at the end: there must be one
        raise InputError("plan: no baseline reconfiguration (the first reconfiguration sets it up)")
