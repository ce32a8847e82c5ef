"""`labctl bench gpu`: a quick look at the GPU microbenchmarks (ping-pong, pointer chase, timer)."""

from __future__ import annotations

from typing import Annotated

import typer

from labctl.cli.common import RUNS, OutOpt, err, out

bench_app = typer.Typer(
    help="Microbenchmarks that write a run directory like `labctl run`.", no_args_is_help=True
)


def _dist_cells(d: object, digits: int = 0) -> list[str]:
    return [f"{getattr(d, k):.{digits}f}" for k in ("min", "median", "p99", "max")]


@bench_app.command("gpu")
def bench_gpu(
    device: Annotated[int, typer.Option("--device", help="CUDA device index to run on.")] = 0,
    peer: Annotated[
        int | None,
        typer.Option(
            "--peer", help="Second GPU for the inter-GPU ping-pong (default: first with peer access)."
        ),
    ] = None,
    out_dir: OutOpt = RUNS,
    iterations: Annotated[
        int, typer.Option(min=10, help="Timed round trips per ping-pong variant.")
    ] = 10_000,
    warmup: Annotated[int, typer.Option(min=0, help="Untimed round trips before the timed ones.")] = 2_000,
    no_chase: Annotated[bool, typer.Option("--no-chase", help="Skip the pointer-chase levels.")] = False,
) -> None:
    """Ping-pong between two SMs (and two GPUs with peer access), the %globaltimer's granularity, and
    pointer chasing in shared memory, L1, L2 and HBM. Writes events.jsonl, gpu.csv/.parquet,
    gpu_samples.parquet and gpu_pingpong.png. Without a CUDA GPU: one line, exit code 1."""
    from rich.table import Table

    from labctl.probes.gpu.bench import run_bench
    from labctl.probes.gpu.errors import NoGpuError
    from labctl.probes.gpu.pointer_chase import compare
    from labctl.probes.gpu.runner import open_backend
    from labctl.probes.gpu.suite import SuiteConfig

    try:
        backend = open_backend()
    except NoGpuError as e:
        err.print(str(e), markup=False, highlight=False)
        raise typer.Exit(1) from None
    try:
        config = SuiteConfig(
            device=device,
            peer_device=peer,
            iterations=iterations,
            warmup=warmup,
            pointer_chase=not no_chase,
        )
        outcome = run_bench(backend, config, out_dir, progress=lambda text: err.print(text, markup=False))
    except NoGpuError as e:
        err.print(str(e), markup=False, highlight=False)
        raise typer.Exit(1) from None
    finally:
        backend.close()
    report = outcome.report
    for t in report.timers:
        out.print(
            f"GPU{t.device} %globaltimer step {t.granularity_ns:.0f} ns (min {t.step_ns.min:.0f}, max "
            f"{t.step_ns.max:.0f}); SM clock {t.sm_clock_ghz:.3f} GHz"
        )
    pp = Table(title="ping-pong round trips (ns; one-way = half)", title_justify="left")
    for col in ("scope", "variant", "SMs / GPUs", "n", "min", "median", "p99", "max", "median cycles"):
        pp.add_column(col, justify="left" if col in ("scope", "variant", "SMs / GPUs") else "right")
    for r in report.pingpong:
        where = (
            f"SM{r.sm_ping}↔SM{r.sm_pong}" if r.scope == "intra-gpu" else f"GPU{r.device}↔GPU{r.peer_device}"
        )
        pp.add_row(
            r.scope,
            r.variant,
            where,
            str(r.round_trip_ns.n),
            *_dist_cells(r.round_trip_ns),
            f"{r.round_trip_cycles.median:.0f}",
        )
    out.print(pp)
    if report.chase:
        ch = Table(title="pointer chase (per hop)", title_justify="left")
        for col in ("level", "footprint", "cycles min", "median", "p99", "max", "ns median", "published"):
            ch.add_column(col, justify="left" if col in ("level", "published") else "right")
        for c in report.chase:
            cmp = compare(c.level, c.cycles_per_hop.median)
            pub = (
                "—"
                if cmp.published is None
                else f"{cmp.published.low_cycles:g}-{cmp.published.high_cycles:g}: {cmp.verdict}"
            )
            ch.add_row(
                c.level,
                f"{c.footprint_bytes // 1024} KiB",
                *_dist_cells(c.cycles_per_hop, 1),
                f"{c.ns_per_hop.median:.1f}",
                pub,
            )
        out.print(ch)
    for note in report.notes:
        out.print(f"note: {note}")
    out.print(f"run directory: {outcome.run_dir}")


def register(app: typer.Typer) -> None:
    app.add_typer(bench_app, name="bench")
