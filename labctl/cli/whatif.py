"""`labctl whatif RUN`: what a run's measured link recovery would cost a training job (issue 40)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from labctl.cli.common import RUNS, JsonOpt, err, fmt_ns, out
from labctl.core.errors import InputError

if TYPE_CHECKING:
    from rich.table import Table

    from labctl.workload.replay import Mode
    from labctl.workload.whatif import WhatIf


def whatif(
    run: Annotated[
        Path,
        typer.Argument(metavar="RUN", help="A run directory, or runs/ for the newest run (the default)."),
    ] = RUNS,
    job: Annotated[
        str | None,
        typer.Option(
            "--job", help="A built-in job: opus-testbed (the default), opus-testbed-mini, config-1, config-2."
        ),
    ] = None,
    trace: Annotated[
        Path | None,
        typer.Option(
            "--trace",
            help="A trace file (labctl-trace/1; `labctl replay import-kineto` makes one from a PyTorch "
            "profiler trace) instead of a built-in job.",
        ),
    ] = None,
    provisioning: Annotated[
        bool,
        typer.Option(
            "--provisioning",
            help="Replay with provisioning too (each switch asked for when the phase before it ends), beside "
            "on demand.",
        ),
    ] = False,
    draw: Annotated[
        bool,
        typer.Option(
            "--draw",
            help="Draw each switch's link-up from the measured circuit ends (seeded) instead of using their "
            "median for every switch.",
        ),
    ] = False,
    seed: Annotated[int, typer.Option("--seed", min=0, max=2**63 - 1, help="Seed of --draw.")] = 0,
    plot_out: Annotated[
        Path | None, typer.Option("--out", help="Where to write the figure (default: RUN/whatif.png).")
    ] = None,
    no_plot: Annotated[bool, typer.Option("--no-plot", help="Write no figure.")] = False,
    as_json: JsonOpt = False,
) -> None:
    """Replay a job with a run's measured link recovery at every switch, against the paper's references.

    Reads the run's breakdown (the total phase, t5 - t0, per circuit end; one recovery per link_setting
    of a tune run) and replays the job (a built-in one or a trace) with each switch taking that recovery:
    on demand, and with --provisioning also provisioned. Also replayed: the Opus paper's 25 ms switch
    with no firmware delay, and its 6 s and 3 s NIC link-up. Prints each one's step time against the
    electrical baseline, the stall per switch and per step, and how many switch windows hide it; checks
    each against the stall model (sum of max(0, T - W) over the windows). The replay runs on a virtual
    clock: no lab is touched, and a 6 s switch takes no time. Writes whatif.png: step time against
    link-up time, the model's curves, every row marked."""
    if job is not None and trace is not None:
        raise InputError("give --job or --trace, not both")
    from labctl.workload.trace import get_trace, load_trace
    from labctl.workload.whatif import (
        AGREE_NS_PER_SWITCH,
        REFERENCES,
        plot_whatif,
        run_recoveries,
        what_if,
    )

    if trace is not None:
        if not trace.is_file():
            raise InputError(f"--trace {trace}: no such file")
        loaded = load_trace(trace)
    else:
        from labctl.workload.builtin import TRACES

        name = job or "opus-testbed"
        if name not in TRACES:
            raise InputError(
                f"--job {name}: no such built-in job (built-in: {', '.join(TRACES)}; or --trace FILE)"
            )
        loaded = get_trace(name)
    if not run.exists():
        raise InputError(
            f"{run}: no such run directory (`labctl run reconfig-timeline --profile fast` writes runs/)"
        )
    recs = run_recoveries(run)
    modes: tuple[Mode, ...] = ("on-demand", "provisioning") if provisioning else ("on-demand",)
    result = what_if(loaded, recs.recoveries, modes=modes, policy="draw" if draw else "median", seed=seed)
    figure: Path | None = None
    if not no_plot:
        figure = plot_whatif(result, plot_out or recs.run_dir / "whatif.png")
    if as_json:
        data = {"run": str(recs.run_dir), "by_setting": recs.by_setting, "notes": recs.notes}
        data |= result.to_json() | {"figure": None if figure is None else str(figure)}
        print(json.dumps(data, indent=2))
        return
    for note in recs.notes:
        err.print(f"[yellow]note: {note}[/]", highlight=False)
    out.print(_table(result, str(recs.run_dir)))
    how = (
        f"each switch's link-up drawn from the measured circuit ends (seed {seed})"
        if draw
        else "every switch takes the measured median link-up"
    )
    out.print(
        f"link-up used: {how} (n: circuit ends); step and stall/step are means over {len(loaded.steps)} "
        "steps, stall/switch over every replayed switch; baseline: the electrical fabric (no switch)",
        highlight=False,
    )
    for ref in REFERENCES:
        out.print(f"{ref.label}: {ref.note} (the Opus paper)", highlight=False)
    worst, overhead = result.worst_disagreement_ns(), result.max_overhead_ns()
    verdict = "agrees" if result.agrees() else "[red]DISAGREES[/]"
    out.print(
        f"stall model (Σ max(0, T − Wᵢ) with provisioning, Σ T on demand, same T): the replay {verdict}, "
        "worst "
        f"{fmt_ns(worst)} per switch (tolerance {fmt_ns(AGREE_NS_PER_SWITCH)} beyond the engine's own "
        f"overhead, {fmt_ns(overhead)}: it runs on a virtual clock)",
        highlight=False,
    )
    if provisioning:
        from labctl.workload.whatif import hiding_lines

        out.print("with provisioning, per switch window (W: the idle window before it):", highlight=False)
        for line in hiding_lines(result):
            out.print(f"  {line}", markup=False, highlight=False)
    if figure is not None:
        out.print(f"figure: {figure}", highlight=False)
    if not result.agrees():
        raise typer.Exit(1)


def _table(result: WhatIf, run: str) -> Table:
    """One row per recovery and mode; means over the replayed steps, stall per switch over its switches."""
    from rich.table import Table

    steps = len(result.trace.steps)
    used = (
        "the median of the drawn link-ups" if result.policy == "draw" else "the median over its circuit ends"
    )
    table = Table(
        title=f"{run}: {result.trace.name}, {steps} steps of {result.switches_per_step:g} switches; "
        f"link-up used: {used} (measured), fixed (reference)",
        title_justify="left",
    )
    for col in ("recovery", "mode", "link-up used", "step", "baseline", "stall/switch", "stall/step"):
        table.add_column(col, justify="left" if col in ("recovery", "mode") else "right")
    table.add_column("hidden by\nits window", justify="right")
    for row in result.rows:
        r = row.recovery
        for k, (mode, o) in enumerate(row.outcomes.items()):
            link = f"{fmt_ns(o.recovery_used_ns)}" + (f" (n {r.n})" if r.kind == "measured" else "")
            table.add_row(
                r.label if k == 0 else "",
                mode,
                link if k == 0 or result.policy == "draw" else "",
                f"{fmt_ns(o.step_ns)} ({o.step_ns / o.native_ns:.3f}x)",
                fmt_ns(o.native_ns),
                fmt_ns(o.stall_per_switch_ns),
                fmt_ns(o.stall_per_step_ns),
                f"{o.hidden} of {o.switches}",
                end_section=k == len(row.outcomes) - 1,
            )
    return table


def register(app: typer.Typer) -> None:
    app.command("whatif")(whatif)
