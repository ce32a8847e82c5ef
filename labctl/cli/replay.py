"""`labctl replay …`: the workload engine's commands (issue 16). A single replay is `labctl run` on a
`kind: replay` experiment; these are what goes around it: the Figure 10 sweep, the stall model of a trace,
and the Kineto importer."""

from __future__ import annotations

import json
from dataclasses import asdict
from pathlib import Path
from typing import Annotated, Any

import typer

from labctl.cli.common import (
    DEFAULT_INVENTORY,
    RUNS,
    InventoryOpt,
    NoPlotsOpt,
    OutOpt,
    ProfileOpt,
    err,
    fmt_ns,
    out,
    resolve_experiment,
)
from labctl.core.errors import InputError

"""Above this, the replay's own lateness (wake-ups, control lag) is large enough to say so."""

replay_app = typer.Typer(
    help="Replay training-job traces on a lab: the Figure 10 sweep, the stall model, imports.",
    no_args_is_help=True,
)


def _floats(text: str | None, what: str) -> list[float] | None:
    if text is None:
        return None
    try:
        values = [float(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise InputError(f"{what}: {text!r} is not a comma-separated list of numbers") from None
    if not values:
        raise InputError(f"{what}: no values in {text!r}")
    return values


DelaysOpt = Annotated[
    str | None,
    typer.Option(
        "--switching-ms", help="Comma-separated switching delays in ms (e.g. 0,25,50,100,250,500,1000)."
    ),
]


@replay_app.command("sweep")
def sweep(
    experiment: Annotated[
        Path,
        typer.Argument(
            help="A replay experiment file, or a built-in one by name (fig10).", callback=resolve_experiment
        ),
    ],
    inventory: InventoryOpt = DEFAULT_INVENTORY,
    profile: ProfileOpt = None,
    out_dir: OutOpt = RUNS,
    switching_ms: DelaysOpt = None,
    seed: Annotated[
        int | None, typer.Option(min=0, max=2**63 - 1, help="Seed for every point's lab.")
    ] = None,
    no_plots: NoPlotsOpt = False,
) -> None:
    """Figure 10: the replay at each switching delay, on demand and with provisioning; writes
    step_time_vs_delay.csv and step_time_vs_delay.png/.svg/.pdf in runs/<sweep-id>/."""
    import asyncio

    from labctl.workload.sweep import CSV_NAME, run_sweep

    delays = _floats(switching_ms, "--switching-ms")

    def point(row: dict[str, Any]) -> None:
        ratio = f"{int(row['step_ns']) / int(row['native_ns']):.3f}x native" if row["step_ns"] != "" else "—"
        err.print(f"{row['mode']:>12} at {row['switching_ms']:g} ms: {ratio} ({row['status']})")

    result = asyncio.run(
        run_sweep(
            experiment,
            inventory,
            switching_ms=delays,
            profile=profile,
            out_dir=out_dir,
            seed=seed,
            plots=not no_plots,
            on_point=point,
        )
    )
    out.print(f"sweep: {result.path / CSV_NAME}")
    for path in result.plots:
        if path.suffix == ".png":
            out.print(f"plot:  {path}")
    if any(r["status"] != "completed" for r in result.rows):
        raise typer.Exit(1)


@replay_app.command("model")
def model(
    trace: Annotated[
        str, typer.Argument(help="A built-in trace (opus-testbed, config-1, config-2, …) or a trace file.")
    ],
    switching_ms: DelaysOpt = "0,25,50,100,250,500,1000",
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON instead of a table.")] = False,
) -> None:
    """The stall model of a trace: per switching delay, the mean step with provisioning (Σ max(0, T − Wᵢ)),
    on demand (N·T) and the estimate T_native + T × N. Touches no lab."""
    from rich.table import Table

    from labctl.workload.stall import model_rows, switch_points
    from labctl.workload.trace import get_trace

    loaded = get_trace(trace, Path.cwd())
    delays = _floats(switching_ms, "--switching-ms") or []
    rows = model_rows(loaded, [round(d * 1e6) for d in delays])
    if as_json:
        windows = [p.window_ns for p in switch_points(loaded) if p.step == 0]
        print(json.dumps({"trace": loaded.name, "windows_ns": windows, "rows": [asdict(r) for r in rows]}))
        return
    table = Table(
        title=f"{loaded.name}: {rows[0].switches_per_step:g} switches per step" if rows else loaded.name,
        title_justify="left",
    )
    for col in ("switching", "native", "provisioning", "on demand", "estimate"):
        table.add_column(col, justify="right")
    for r in rows:
        table.add_row(
            f"{r.switch_ns / 1e6:g} ms",
            fmt_ns(r.native_ns),
            f"{fmt_ns(r.provisioning_ns)} ({r.provisioning_ns / r.native_ns:.3f}x)",
            f"{fmt_ns(r.on_demand_ns)} ({r.on_demand_ns / r.native_ns:.3f}x)",
            fmt_ns(r.estimate_ns),
        )
    out.print(table)


@replay_app.command("import-kineto")
def import_kineto(
    kineto: Annotated[Path, typer.Argument(help="A PyTorch profiler (Kineto) JSON trace of one rank.")],
    job: Annotated[
        Path, typer.Option("--job", help="YAML/JSON file with the job: hosts, gpus_per_host, tp, dp, pp, cp.")
    ],
    output: Annotated[Path, typer.Option("-o", "--output", help="Where to write the trace (YAML).")],
    group: Annotated[
        list[str] | None,
        typer.Option("--group", help="PG=DIM: the process group (name or description) is dp, cp, pp or tp."),
    ] = None,
    name: Annotated[str, typer.Option(help="The trace's name.")] = "kineto",
    rank_view: Annotated[
        bool, typer.Option("--rank-view", help="Keep DP/CP ranks as the rank saw them (default: symmetric).")
    ] = False,
) -> None:
    """Convert a Kineto trace's NCCL kernels to the labctl trace format (and check it)."""
    import yaml

    from labctl.core.yamlio import load_yaml
    from labctl.workload.kineto import kineto_to_trace, load_kineto
    from labctl.workload.trace import load_trace

    groups: dict[str, str] = {}
    for item in group or []:
        pg, _, dim = item.partition("=")
        if dim not in ("dp", "cp", "pp", "tp") or not pg:
            raise InputError(f"--group {item!r}: use PG=DIM with DIM one of dp, cp, pp, tp")
        groups[pg] = dim
    job_data = load_yaml(job, "job").data
    trace, stats = kineto_to_trace(
        load_kineto(kineto), job_data, name=name, groups=groups, symmetric=not rank_view
    )
    # Written beside the output and renamed only once it loads: a bad trace never replaces a good file.
    staged = output.with_name(f".{output.name}.tmp")
    try:
        staged.write_text(yaml.safe_dump(trace, sort_keys=False), encoding="utf-8")
        try:
            load_trace(staged)  # what was written loads (a bad job is named against the file)
        except InputError as e:
            raise InputError(str(e).replace(str(staged), str(output))) from None
        staged.replace(output)
    except OSError as e:
        raise InputError(f"{output}: cannot write: {e}") from None
    finally:
        staged.unlink(missing_ok=True)
    out.print(
        f"{output}: {stats['kernels']} NCCL kernels in {stats['steps']} steps"
        + (f", {stats['clipped']} overlapping ones serialised" if stats["clipped"] else "")
    )


def register(app: typer.Typer) -> None:
    app.add_typer(replay_app, name="replay")
