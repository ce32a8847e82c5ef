"""What a run's measured link recovery costs a job (issue 40): its recoveries fed into the replay engine.

A run's breakdown gives, per circuit end of every measured reconfiguration, the `total` phase (t5 − t0: the
switch command to traffic again). Where the breakdown has a `link_setting` column (a tune run), each
setting is its own recovery. Each recovery, and the Opus paper's reference points (≈25 ms, the Polatis
switch with no firmware delay; ≈6 s and ≈3 s, the testbed NIC's firmware link-up with auto-negotiation on
and off), replaces the fixed switching time of a replay: every topology write of a built-in job or a trace
takes that recovery before the operation may start, on demand and with provisioning.

The replay is `labctl.workload.replay.ReplayEngine` itself, its timeline on a virtual clock: the loop jumps
to the next deadline when every task waits (`run_virtual`), so a 6 s recovery replays in milliseconds and
the engine's own overhead (how late it woke, its control lag) is 0 by construction and is still measured
and said. No lab is touched: a write is `RecoveryOrchestrator`'s, which takes the recovery and acknowledges.
Each result is checked against the stall model computed apart from the engine (Σᵢ max(0, Tᵢ − Wᵢ) over the
trace's switch windows with provisioning, Σᵢ Tᵢ on demand) with the same Tᵢ.

Which T: `median` (the default) uses each recovery's median over its circuit ends for every switch, the
stall model's one T; `draw` draws each switch's T from the recovery's circuit ends (uniformly over them,
seeded: the same sequence for both modes), so the spread shows (max(0, T − W) is convex in T: a window
near the median hides some draws and not others). Decision 0078.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import selectors
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, TypeVar

from labctl.core.errors import InputError
from labctl.workload.circuits import TopoState, changed_stages, initial_state, topo_id
from labctl.workload.orchestrator import WriteResult
from labctl.workload.replay import Mode, ReplayEngine, ReplayResult
from labctl.workload.stall import model_rows, switch_points
from labctl.workload.trace import Trace

if TYPE_CHECKING:
    import pandas as pd

Policy = Literal["median", "draw"]
MODES: tuple[Mode, ...] = ("on-demand", "provisioning")
SETTING_COLUMN = "link_setting"
"""A tune run's breakdown column: the NIC link setting each row was measured under."""
PLOT_NAME = "whatif.png"
AGREE_NS_PER_SWITCH = 1_000_000
"""The engine and the stall model must agree to this per switch (beyond the engine's measured overhead)."""

T = TypeVar("T")


# --- the virtual clock --------------------------------------------------------------------------------


class VirtualClock:
    """Integer-ns time that moves only when every task of its loop waits: then it jumps to the earliest
    `sleep_until` deadline and wakes that sleeper (`advance`, called by `_VirtualSelector`)."""

    def __init__(self, start_ns: int = 0) -> None:
        self.t_ns = start_ns
        self._sleepers: list[tuple[int, int, asyncio.Future[None]]] = []
        self._seq = 0

    def now_ns(self) -> int:
        return self.t_ns

    async def sleep_until(self, t_ns: int) -> int:
        if t_ns > self.t_ns:
            import heapq

            waiter: asyncio.Future[None] = asyncio.get_running_loop().create_future()
            self._seq += 1
            heapq.heappush(self._sleepers, (t_ns, self._seq, waiter))
            await waiter
        return 0  # woken exactly at its deadline: a virtual clock is never late

    def advance(self) -> bool:
        """Wake the earliest sleeper still waiting (its deadline becomes now); False: none waits."""
        import heapq

        while self._sleepers:
            t_ns, _, waiter = heapq.heappop(self._sleepers)
            if not waiter.done():  # a cancelled sleep is skipped
                self.t_ns = max(self.t_ns, t_ns)
                waiter.set_result(None)
                return True
        return False

    def close(self) -> None:
        """The replay's clock is closed when it ends; this one has nothing to release."""


class _VirtualSelector(selectors.SelectSelector):
    """The loop blocks in select() only when nothing is ready: that is when virtual time moves."""

    def __init__(self, clock: VirtualClock) -> None:
        super().__init__()
        self.clock = clock

    def select(self, timeout: float | None = None) -> list[tuple[selectors.SelectorKey, int]]:
        if timeout is None or timeout > 0:
            if self.clock.advance():
                timeout = 0
            elif timeout is None:
                raise RuntimeError("virtual clock: every task waits and no deadline is due (a deadlock)")
        return super().select(timeout)


def run_virtual(main: Callable[[VirtualClock], Awaitable[T]]) -> T:
    """Run `main(clock)` on a fresh event loop whose time is `clock`'s; no task outlives it."""
    clock = VirtualClock()
    loop = asyncio.SelectorEventLoop(_VirtualSelector(clock))
    try:

        async def wrapped() -> T:
            return await main(clock)

        return loop.run_until_complete(wrapped())
    finally:
        left = asyncio.all_tasks(loop)
        for task in left:
            task.cancel()
        if left:
            loop.run_until_complete(asyncio.gather(*left, return_exceptions=True))
        loop.close()


# --- recoveries ---------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Recovery:
    """One link recovery a job's switches take: measured (each circuit end's t5 − t0) or a reference."""

    label: str
    kind: Literal["measured", "reference"]
    values_ns: tuple[int, ...]
    """Measured: one total per circuit end; a reference: its one value."""
    note: str = ""

    @property
    def n(self) -> int:
        return len(self.values_ns)

    @property
    def median_ns(self) -> int:
        ordered = sorted(self.values_ns)
        mid = len(ordered) // 2
        if len(ordered) % 2:
            return ordered[mid]
        # the summary's median to the ns (round(float(np.percentile(values, 50)))): half to even, as it
        # rounds, so that `whatif` and `report` print the same median of the same circuit ends
        return round((ordered[mid - 1] + ordered[mid]) / 2)

    def sampler(self, policy: Policy, seed: int) -> Callable[[], int]:
        """Each switch's T, in order: the median every time, or a seeded draw over the circuit ends."""
        if policy == "median" or self.kind == "reference":
            median = self.median_ns
            return lambda: median
        import numpy as np

        rng = np.random.default_rng(seed)
        values = self.values_ns
        return lambda: values[int(rng.integers(len(values)))]


REFERENCES: tuple[Recovery, ...] = (
    Recovery("reference 25 ms", "reference", (25_000_000,), "the Polatis switch, no firmware delay"),
    Recovery("reference 6 s", "reference", (6_000_000_000,), "testbed NIC firmware link-up"),
    Recovery("reference 3 s", "reference", (3_000_000_000,), "the same with auto-negotiation off"),
)
"""The Opus paper's points: the switching time its emulation injected, and the real testbed's link-up."""


@dataclass
class RunRecoveries:
    run_dir: Path
    recoveries: list[Recovery]
    notes: list[str] = field(default_factory=list)
    by_setting: bool = False


def read_breakdown(run_dir: Path) -> tuple[pd.DataFrame, list[str]]:
    """The run's breakdown: breakdown.parquet as written, else as labctl.load_run computes it (said)."""
    import pandas as pd

    from labctl.analysis.store import BREAKDOWN_PARQUET, load_run

    parquet = run_dir / BREAKDOWN_PARQUET
    why = f"no {BREAKDOWN_PARQUET}"
    if parquet.is_file():
        try:
            frame = pd.read_parquet(parquet)
            if "impossible" in frame:
                return frame, []
            why = f"{BREAKDOWN_PARQUET} predates the impossible/unresolved flags"
        except Exception as e:  # pyarrow's errors for a damaged file have no common base
            why = f"{BREAKDOWN_PARQUET} is damaged ({str(e).splitlines()[0] if str(e) else type(e).__name__})"
    run = load_run(run_dir)
    return run.breakdown, [f"{why}: the breakdown was read with labctl.load_run", *run.notes]


def recoveries_from_breakdown(
    frame: pd.DataFrame, where: str = "the breakdown"
) -> tuple[list[Recovery], bool]:
    """The `total` phase (t5 − t0) over circuit ends, flagged rows and the baseline (reconfiguration 0)
    left out: one recovery, or one per `link_setting` (in order of first appearance) where the column
    exists; also whether it did."""
    from labctl.analysis.phase_stats import phase_values

    if "total_ns" not in frame or "reconfig" not in frame:
        raise InputError(f"{where}: no total_ns/reconfig columns: not a labctl breakdown")
    rows = frame[frame["reconfig"].fillna(0) > 0]
    by_setting = SETTING_COLUMN in rows and bool(rows[SETTING_COLUMN].fillna("").astype(str).ne("").any())
    groups: list[tuple[str, pd.DataFrame]]
    if by_setting:
        settings = rows[SETTING_COLUMN].fillna("").astype(str)
        groups = [(s or "(no setting applied)", rows[settings == s]) for s in dict.fromkeys(settings)]
    else:
        groups = [("measured", rows)]
    out: list[Recovery] = []
    for label, group in groups:
        values = phase_values(group, "total_ns")
        if values.size:
            out.append(Recovery(label, "measured", tuple(int(v) for v in values), "total t5 − t0"))
    if not out:
        raise InputError(
            f"{where}: no circuit end with a measured total (t5 − t0) outside the baseline: nothing to replay"
        )
    return out, by_setting


def run_recoveries(run: Path) -> RunRecoveries:
    """RUN (a run directory, or runs/ for the newest) read into its recoveries."""
    from labctl.analysis.store import resolve_run_path

    run_dir = resolve_run_path(run)
    frame, notes = read_breakdown(run_dir)
    recoveries, by_setting = recoveries_from_breakdown(frame, str(run_dir))
    return RunRecoveries(run_dir, recoveries, notes, by_setting)


# --- the replay ---------------------------------------------------------------------------------------


class RecoveryOrchestrator:
    """The job's controller with no lab: a write that changes stages takes the next recovery T on the
    clock, then acknowledges (the ranks are released when the link is back); operations never wait."""

    def __init__(self, state: TopoState, clock: VirtualClock, recovery: Callable[[], int]) -> None:
        self._state = state
        self.clock = clock
        self.recovery = recovery
        self.fallback: dict[str, Any] | None = None
        self.drawn: list[int] = []
        """Each switch's T, in the order the writes were asked for."""

    @property
    def state(self) -> TopoState:
        return self._state

    @contextlib.asynccontextmanager
    async def operation(self, label: str, stages: Sequence[int]) -> AsyncIterator[int]:
        yield 0

    def planned_changes(self, target: TopoState) -> list[tuple[int, Any, Any]]:
        return []

    async def write(self, target: TopoState, context: dict[str, Any] | None = None) -> WriteResult:
        request = self.clock.now_ns()
        stages = changed_stages(self._state, target)
        if not stages:
            return WriteResult(topo_id(target), stages, request, request, None, 0, 0)
        t = self.recovery()
        self.drawn.append(t)
        await self.clock.sleep_until(request + t)
        self._state = target
        ready = self.clock.now_ns()
        return WriteResult(topo_id(target), stages, request, ready, ready, 0, 1)


@dataclass(frozen=True)
class SwitchRow:
    step: int
    op: str
    window_ns: int
    recovery_ns: int
    exposed_ns: int
    hidden: bool
    """Provisioning, T ≤ W: the window hid the whole recovery (never on demand)."""


@dataclass
class Outcome:
    """One recovery replayed in one mode: means over the replayed steps and over its switches."""

    mode: Mode
    steps: int
    switches: int
    native_ns: int
    """Mean step with no switch: the electrical baseline (the trace's own lengths)."""
    step_ns: int
    stall_per_step_ns: int
    stall_per_switch_ns: int
    hidden: int
    """Switches whose window hid the recovery (of `switches`)."""
    recovery_used_ns: int
    """Median of the Tᵢ the switches took."""
    model_stall_ns: int
    """The stall model over every replayed switch, Σ max(0, Tᵢ − Wᵢ) or Σ Tᵢ, with the same Tᵢ."""
    engine_stall_ns: int
    """The replay's stall over every step (Σ of what each switch exposed)."""
    engine_overhead_ns: int
    """The engine's own measured lateness (wake-ups, control lag), max over its operations."""
    per_switch: list[SwitchRow]

    @property
    def disagreement_per_switch_ns(self) -> float:
        return abs(self.engine_stall_ns - self.model_stall_ns) / self.switches if self.switches else 0.0

    def to_json(self) -> dict[str, Any]:
        data = asdict(self)
        data["disagreement_per_switch_ns"] = self.disagreement_per_switch_ns
        return data


def model_stall_ns(windows_ns: Sequence[int], recoveries_ns: Sequence[int], mode: Mode) -> int:
    """The stall model on given Tᵢ: Σᵢ max(0, Tᵢ − Wᵢ) with provisioning, Σᵢ Tᵢ on demand."""
    if len(windows_ns) != len(recoveries_ns):
        raise ValueError(f"{len(windows_ns)} windows but {len(recoveries_ns)} recoveries")
    if mode == "provisioning":
        return sum(max(0, t - w) for t, w in zip(recoveries_ns, windows_ns, strict=True))
    return sum(recoveries_ns)


def replay_recovery(
    trace: Trace, recovery: Recovery, mode: Mode, policy: Policy = "median", seed: int = 0
) -> Outcome:
    """Replay `trace` with every switch taking `recovery` (on the virtual clock) and check it against the
    stall model."""

    async def main(clock: VirtualClock) -> tuple[ReplayResult, list[int]]:
        state = initial_state(trace.job, (op for _, op in trace.rail_ops()))
        orch = RecoveryOrchestrator(state, clock, recovery.sampler(policy, seed))
        engine = ReplayEngine(trace, orch, lambda _event: None, mode=mode, clock=lambda: clock)
        result = await engine.run()
        return result, orch.drawn

    result, drawn = run_virtual(main)
    windows = [p.window_ns for p in switch_points(trace)]
    switched = [o for o in result.ops if o.switched]
    if len(switched) != len(windows) or len(drawn) != len(windows):  # the engine's own invariant
        raise AssertionError(f"{len(windows)} switch points, {len(switched)} switched, {len(drawn)} drawn")
    rows = [
        SwitchRow(
            o.step,
            o.op,
            o.window_ns,
            t,
            o.exposed_ns,
            o.provisioned and o.exposed_ns == 0,
        )
        for o, t in zip(switched, drawn, strict=True)
    ]
    n_steps = len(result.steps)
    summary = result.summary()
    engine_stall = sum(s.stall_ns for s in result.steps)
    overhead = max(int(summary["late_ns_max"] or 0), int(summary["control_lag_ns_max"] or 0))
    ordered = sorted(drawn)
    used = ordered[len(ordered) // 2] if ordered else recovery.median_ns
    return Outcome(
        mode,
        n_steps,
        len(rows),
        round(sum(s.native_ns for s in result.steps) / n_steps),
        round(sum(s.step_ns for s in result.steps) / n_steps),
        round(engine_stall / n_steps),
        round(engine_stall / len(rows)) if rows else 0,
        sum(r.hidden for r in rows),
        used,
        model_stall_ns(windows, drawn, mode),
        engine_stall,
        overhead,
        rows,
    )


@dataclass
class WhatIfRow:
    recovery: Recovery
    outcomes: dict[str, Outcome]

    def to_json(self) -> dict[str, Any]:
        r = self.recovery
        return {
            "label": r.label,
            "kind": r.kind,
            "note": r.note,
            "circuit_ends": r.n if r.kind == "measured" else None,
            "link_up_median_ns": r.median_ns,
            "link_up_min_ns": min(r.values_ns),
            "link_up_max_ns": max(r.values_ns),
            "modes": {mode: o.to_json() for mode, o in self.outcomes.items()},
        }


@dataclass
class WhatIf:
    trace: Trace
    policy: Policy
    seed: int
    modes: tuple[Mode, ...]
    rows: list[WhatIfRow]

    @property
    def native_ns(self) -> int:
        return round(sum(self.trace.step_lengths_ns) / len(self.trace.step_lengths_ns))

    @property
    def switches_per_step(self) -> float:
        return len(switch_points(self.trace)) / len(self.trace.steps)

    def worst_disagreement_ns(self) -> float:
        return max(
            (o.disagreement_per_switch_ns for row in self.rows for o in row.outcomes.values()), default=0.0
        )

    def max_overhead_ns(self) -> int:
        return max((o.engine_overhead_ns for row in self.rows for o in row.outcomes.values()), default=0)

    def agrees(self) -> bool:
        """Every replay within AGREE_NS_PER_SWITCH of the stall model, beyond its own measured overhead."""
        return all(
            o.disagreement_per_switch_ns <= o.engine_overhead_ns + AGREE_NS_PER_SWITCH
            for row in self.rows
            for o in row.outcomes.values()
        )

    def to_json(self) -> dict[str, Any]:
        return {
            "trace": self.trace.name,
            "steps": len(self.trace.steps),
            "switches_per_step": self.switches_per_step,
            "baseline_step_ns": self.native_ns,
            "windows_ns": [p.window_ns for p in switch_points(self.trace) if p.step == 0],
            "link_up": self.policy,
            "seed": self.seed if self.policy == "draw" else None,
            "clock": "virtual",
            "modes": list(self.modes),
            "agreement": {
                "tolerance_ns_per_switch": AGREE_NS_PER_SWITCH,
                "worst_ns_per_switch": self.worst_disagreement_ns(),
                "engine_overhead_ns_max": self.max_overhead_ns(),
                "agrees": self.agrees(),
            },
            "rows": [row.to_json() for row in self.rows],
        }


def what_if(
    trace: Trace,
    measured: Sequence[Recovery],
    *,
    modes: Sequence[Mode] = MODES,
    policy: Policy = "median",
    seed: int = 0,
    references: Sequence[Recovery] = REFERENCES,
) -> WhatIf:
    """Every recovery (the measured ones, then the references) replayed in each mode."""
    if not switch_points(trace):
        raise InputError(f"trace {trace.name}: no switch between its rail operations: nothing to cost")
    rows = [
        WhatIfRow(r, {mode: replay_recovery(trace, r, mode, policy, seed) for mode in modes})
        for r in (*measured, *references)
    ]
    return WhatIf(trace, policy, seed, tuple(modes), rows)


# --- reading it ---------------------------------------------------------------------------------------


def hiding_lines(result: WhatIf) -> list[str]:
    """Per recovery, with provisioning: which switch windows hide it and which do not (per op and window,
    in how many of the steps)."""
    from labctl.core.units import fmt_ns

    lines: list[str] = []
    for row in result.rows:
        outcome = row.outcomes.get("provisioning")
        if outcome is None:
            continue
        keyed: dict[tuple[str, int], list[SwitchRow]] = {}
        for s in outcome.per_switch:
            keyed.setdefault((s.op, s.window_ns), []).append(s)
        hidden, exposed = [], []
        for (op, window), switches in keyed.items():
            k = sum(s.hidden for s in switches)
            text = f"{op} (W {fmt_ns(window)}" + (
                f", {k} of {len(switches)}" if 0 < k < len(switches) else ""
            )
            if k:
                hidden.append(text + ")")
            if k < len(switches):
                worst = max(s.exposed_ns for s in switches)
                exposed.append(text + f", exposes up to {fmt_ns(worst)})")
        lines.append(
            f"{row.recovery.label}: hidden by {', '.join(hidden) or 'no window'}; "
            f"not hidden: {', '.join(exposed) or 'none'}"
        )
    return lines


def curve(trace: Trace, low_ns: int, high_ns: int, points: int = 121) -> list[dict[str, int]]:
    """The stall model's mean step (on demand, provisioning) over link-up times spaced evenly in log."""
    lo, hi = math.log10(max(low_ns, 1)), math.log10(max(high_ns, low_ns + 1))
    grid = sorted({round(10 ** (lo + (hi - lo) * i / (points - 1))) for i in range(points)})
    return [
        {
            "link_up_ns": r.switch_ns,
            "native_ns": r.native_ns,
            "on_demand_ns": r.on_demand_ns,
            "provisioning_ns": r.provisioning_ns,
        }
        for r in model_rows(trace, grid)
    ]


def plot_whatif(result: WhatIf, out: Path, *, title: str = "") -> Path:
    """Step time against link-up time: the stall model's curves (on demand, provisioning) and the
    electrical baseline, with every measured setting and reference point marked where it was replayed."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import FuncFormatter

    from labctl.analysis.plot_style import styled
    from labctl.core.fileio import atomic_path

    used = [o.recovery_used_ns for row in result.rows for o in row.outcomes.values()]
    low, high = min([1_000_000, *used]) // 2, max([10_000_000_000, *used]) * 3 // 2
    pts = curve(result.trace, low, high)
    x = [p["link_up_ns"] / 1e9 for p in pts]
    native = result.native_ns / 1e9
    with styled(None):
        fig, ax = plt.subplots(figsize=(6.4, 4.6))
        ax.plot(x, [p["on_demand_ns"] / 1e9 for p in pts], color="C0", label="on demand: model, N·T")
        ax.plot(
            x,
            [p["provisioning_ns"] / 1e9 for p in pts],
            color="C1",
            label="provisioning: model, Σ max(0, T − Wᵢ)",
        )
        ax.axhline(native, color="0.5", lw=0.8, ls="--", label=f"electrical baseline ({native:.3g} s)")
        for mode, colour, marker in (("on-demand", "C0", "o"), ("provisioning", "C1", "s")):
            for row in result.rows:
                o = row.outcomes.get(mode)
                if o is None:
                    continue
                face = "white" if row.recovery.kind == "reference" else colour
                ax.plot(
                    [o.recovery_used_ns / 1e9],
                    [o.step_ns / 1e9],
                    marker=marker,
                    color=colour,
                    markerfacecolor=face,
                    ls="none",
                    ms=7 if mode == "on-demand" else 5,
                    zorder=3,
                )
        for i, row in enumerate(result.rows):
            top = max(row.outcomes.values(), key=lambda o: o.step_ns)
            ax.annotate(
                row.recovery.label.removeprefix("reference "),
                (top.recovery_used_ns / 1e9, top.step_ns / 1e9),
                textcoords="offset points",
                xytext=(-8, 8 + 9 * (i % 2)),
                ha="right",
                fontsize="x-small",
            )
        windows = sorted({p.window_ns for p in switch_points(result.trace) if p.window_ns > 0})
        for w in windows:  # a provisioned switch is hidden left of its window
            ax.axvline(w / 1e9, color="0.85", lw=0.6, zorder=0)
        if windows:
            ax.plot([], [], color="0.85", lw=0.6, label="the switches' idle windows Wᵢ")
        ax.set_xscale("log")
        ax.set_yscale("log")
        plain = FuncFormatter(lambda v, _pos: f"{v:g}")
        ax.yaxis.set_major_formatter(plain)
        ax.yaxis.set_minor_formatter(FuncFormatter(lambda v, _pos: f"{v:g}" if str(v)[0] in "2356" else ""))
        ax.set_xlabel("link-up time T per switch (s)")
        ax.set_ylabel(f"mean step time (s, over {len(result.trace.steps)} steps)")
        ax.set_title(
            title
            or f"{result.trace.name}: step time vs link-up time "
            f"({result.switches_per_step:g} switches a step)",
            fontsize="medium",
        )
        ax.plot([], [], "o", color="0.3", label="replayed, on demand (filled: measured, open: reference)")
        ax.plot([], [], "s", color="0.3", ms=5, label="replayed, provisioning")
        ax.legend(fontsize="x-small", loc="upper left")
        fig.tight_layout()
        out.parent.mkdir(parents=True, exist_ok=True)
        with atomic_path(out) as tmp:
            fig.savefig(tmp, format="png", dpi=150)
        plt.close(fig)
    return out


def iter_outcomes(result: WhatIf) -> Iterator[tuple[WhatIfRow, Outcome]]:
    for row in result.rows:
        for outcome in row.outcomes.values():
            yield row, outcome
