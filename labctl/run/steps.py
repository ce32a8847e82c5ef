"""Plans as typed steps that the run engine executes in order, like bluesky's RunEngine executes messages.

Each step carries its own `execute(run)`, written against `RunContext`: the primitives the engine offers
(reconfigure and wait for recovery, set up the baseline, write a rail, watch ports come up, hold, run the
GPU benchmarks, keep a result for the experiment kind to record). So the engine has no branch per step
type, and a kind of experiment that needs a new kind of step brings its own class (the replay kind's
`labctl.workload.experiment.ReplaySegment`) without editing the engine.

A timeline experiment compiles to: GPU benchmarks before, the baseline reconfiguration, a hold, then per
step a reconfiguration and a hold, then GPU benchmarks after; with an attenuation sweep (`voa:`), each
repetition of the cycle starts by setting the swept attenuators (`Attenuate`), and the plan ends by
clearing them. `check_program` refuses a program the engine
could not carry out, before anything moves.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Collection, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar, Literal, Protocol

from labctl.core.errors import InputError
from labctl.core.events import EventLog
from labctl.inventory.mapping import Mapping
from labctl.ocs.protocol import attenuator_of

if TYPE_CHECKING:
    from labctl.labs.base import Lab
    from labctl.run.rails import RailWriter

__all__ = [  # the public surface (docs/architecture.md, "Public surface"); the rest is internal
    "Attenuate",
    "GpuBench",
    "Hold",
    "LinkWatch",
    "ProgressSink",
    "Reconfigure",
    "RunContext",
    "Stage",
    "Step",
    "StepBase",
    "check_program",
    "timeline_program",
]


@dataclass(frozen=True)
class Stage:
    """What a reconfiguration is, for a person watching: the baseline set-up, step i of n, or the restore
    after a stop (which is not one of the n)."""

    kind: Literal["baseline", "step", "restore"]
    phase: str
    index: int = 0  # 1-based, steps only
    of: int = 0

    def __str__(self) -> str:
        if self.kind == "step":
            return f"reconfig {self.index}/{self.of} → {self.phase}"
        return f"{'baseline' if self.kind == 'baseline' else 'restoring baseline'} → {self.phase}"


class ProgressSink(Protocol):
    """What the engine tells a UI. Every method must return quickly."""

    def started(self, run_dir: Path, steps: int) -> None:
        """The run directory exists; `steps` reconfigurations follow the baseline."""

    def reconfig_started(self, stage: Stage, expected: int) -> None: ...

    def port_recovered(self, stage: Stage, recovered: int, expected: int) -> None: ...

    def reconfig_done(self, stage: Stage, timed_out: list[str]) -> None: ...

    def message(self, text: str) -> None: ...


class LinkWatch(Protocol):
    """Ports of a write being watched until each carries traffic to its new peer (`ready: link`)."""

    async def wait(self) -> None: ...

    def close(self) -> None: ...


class RunContext(Protocol):
    """What a step may use of the run that executes it (labctl.run.engine.RunEngine)."""

    lab: Lab
    events: EventLog
    progress: ProgressSink
    rails: RailWriter
    """The one path to the switches: what each rail holds, and writes that re-target the probes."""
    results: list[Any]
    """What steps produced for their experiment kind to record at the end (a replay's result)."""
    attenuated: dict[str, set[int]]
    """Switch → the ports a `voa:` step left attenuated (the run sets them back to 0 dB on any exit)."""

    async def reconfigure(
        self,
        phase: str,
        step: int | None,
        *,
        measured: bool = ...,
        wait: bool = ...,
        stage: Stage | None = ...,
    ) -> list[str]:
        """Apply a phase on every rail, wait for every moved port; the ports that did not recover."""
        ...

    async def baseline(self, phase: str) -> None:
        """Set up the baseline; a port that does not come back stops the run."""
        ...

    async def gpu_bench(self, stage: Literal["before", "after"]) -> None: ...

    def links_up(self, changes: list[tuple[int, Mapping, Mapping]], t0_ns: int) -> LinkWatch:
        """Start watching, now, the ports these changes move (subscribed before the write is sent)."""
        ...

    def add_restore(self, what: str, restore: Callable[[], Awaitable[None]]) -> None:
        """Put back, when the run ends however it ends, what a step changed outside the switches (a port's
        link settings); a restore that raises fails the run with its message."""
        ...

    def unclean(self) -> None:
        """A write was cut short: what the switches hold is not known here, so the baseline is restored
        whatever the rails' record says."""
        ...


class StepBase:
    """What every step type has: whether it needs the baseline set up before it (`check_program`)."""

    __slots__ = ()
    needs_baseline: ClassVar[bool] = False

    async def execute(self, run: RunContext) -> None:
        raise NotImplementedError


@dataclass(frozen=True, slots=True)
class GpuBench(StepBase):
    """The experiment's `gpu:` microbenchmarks at one stage (skipped, with an event, without a GPU)."""

    stage: Literal["before", "after"]

    async def execute(self, run: RunContext) -> None:
        await run.gpu_bench(self.stage)


@dataclass(frozen=True, slots=True)
class Reconfigure(StepBase):
    """Apply a phase on every rail and wait for every moved port to carry traffic again."""

    phase: str
    step: int | None = None
    """The experiment's step (repeat index) it belongs to; None for the baseline."""
    baseline: bool = False
    """The baseline set-up: a port that does not come back stops the run (nothing later can be trusted)."""
    index: int = 0
    """1-based position among the plan's non-baseline reconfigurations (for progress)."""
    of: int = 0

    async def execute(self, run: RunContext) -> None:
        if self.baseline:
            await run.baseline(self.phase)
        else:
            await run.reconfigure(self.phase, self.step, stage=Stage("step", self.phase, self.index, self.of))


@dataclass(frozen=True, slots=True)
class Hold(StepBase):
    """Let traffic flow on the current circuits. The baseline holds like every step: the next
    reconfiguration must not cut its last port's recovery short."""

    seconds: float

    async def execute(self, run: RunContext) -> None:
        await asyncio.sleep(self.seconds)


@dataclass(frozen=True, slots=True)
class Attenuate(StepBase):
    """Set a switch's variable optical attenuators: each egress port's light `atten_db` dB below what its
    patch brings (0: none), through the switch's `VariableAttenuator` driver (an `ocs.voa` event per port).
    The received power every probe on those ports reads drops by that much: a sweep of it measures how the
    recovery depends on the light a NIC receives."""

    switch: str
    ports: tuple[int, ...]
    atten_db: float
    needs_baseline: ClassVar[bool] = True

    async def execute(self, run: RunContext) -> None:
        attenuator = attenuator_of(run.lab.switches.get(self.switch))
        if attenuator is None:
            raise InputError(
                f"switch {self.switch}: its driver has no variable optical attenuators (voa: needs sim, "
                "polatis-netconf or polatis-tl1)"
            )
        await attenuator.set_attenuation(self.ports, self.atten_db)
        held = run.attenuated.setdefault(self.switch, set())
        if self.atten_db:
            held.update(self.ports)
        else:
            held.difference_update(self.ports)
        ports = ", ".join(map(str, self.ports))
        run.progress.message(f"{self.switch}: port(s) {ports} attenuated {self.atten_db:g} dB")


Step = StepBase
"""Any step: a class with `execute(run)` (and `needs_baseline`)."""


def timeline_program(
    baseline: str,
    steps: Sequence[tuple[int, str]],
    hold_s: float,
    *,
    gpu: bool,
    sweeps: Sequence[tuple[str, tuple[int, ...], Sequence[float]]] = (),
) -> tuple[Step, ...]:
    """The fixed order a timeline experiment always had, as steps. `sweeps`: (switch, egress ports, dB
    levels); repetition r of the cycle first sets each one's ports to its level r (cycling through the
    levels), and the plan ends by setting them back to 0 dB."""
    program: list[Step] = [GpuBench("before")] if gpu else []
    program += [Reconfigure(baseline, None, baseline=True), Hold(hold_s)]
    repetition: int | None = None
    for i, (step, phase) in enumerate(steps, start=1):
        if sweeps and step != repetition:
            repetition = step
            program += [
                Attenuate(sw, ports, float(levels[step % len(levels)])) for sw, ports, levels in sweeps
            ]
        program += [Reconfigure(phase, step, index=i, of=len(steps)), Hold(hold_s)]
    program += [Attenuate(sw, ports, 0.0) for sw, ports, _ in sweeps]
    if gpu:
        program.append(GpuBench("after"))
    return tuple(program)


def check_program(program: Sequence[Step], phases: Collection[str]) -> None:
    """A program the engine can carry out: every item is a step, its first reconfiguration is a baseline,
    every phase it names exists, a step that needs the baseline comes after it, and there is one at all."""
    seen_baseline = False
    for i, step in enumerate(program):
        if not isinstance(step, StepBase):
            raise InputError(f"plan step {i}: {step!r} is not a step (labctl.run.steps.StepBase)")
        if isinstance(step, Reconfigure):
            if step.phase not in phases:
                raise InputError(
                    f"plan step {i}: unknown phase {step.phase!r} (defined: {', '.join(phases)})"
                )
            if not seen_baseline and not step.baseline:
                raise InputError(f"plan step {i}: the first reconfiguration must set up the baseline")
            seen_baseline = True
        elif step.needs_baseline and not seen_baseline:
            raise InputError(f"plan step {i}: {type(step).__name__} needs the baseline set up before it")
        elif isinstance(step, Hold) and not 0 <= step.seconds <= 3600:
            raise InputError(f"plan step {i}: hold {step.seconds} s is outside 0..3600 s")
        elif isinstance(step, Attenuate) and (not step.ports or not 0 <= step.atten_db <= 40):
            raise InputError(f"plan step {i}: attenuate needs ports and 0..40 dB, not {step.atten_db:g} dB")
    if not seen_baseline:  # the plan's baseline is what the run restores at the end: there must be one
        raise InputError("plan: no baseline reconfiguration (the first reconfiguration sets it up)")
