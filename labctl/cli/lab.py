"""`labctl lab check`: is the lab ready for a run? Switches and hosts, one row per fact."""

from __future__ import annotations

import json
from typing import Annotated

import typer

from labctl.cli.common import DEFAULT_INVENTORY, InventoryOpt, JsonOpt, bounded, out

lab_app = typer.Typer(help="The lab as a whole: check that it is ready for a run.", no_args_is_help=True)


@lab_app.command("check")
def lab_check(
    inventory: InventoryOpt = DEFAULT_INVENTORY,
    as_json: JsonOpt = False,
    timeout_s: Annotated[
        float,
        typer.Option(
            "--timeout", callback=bounded(0.5, 600), help="Seconds to wait for each agent's answer."
        ),
    ] = 10.0,
) -> None:
    """Preflight: for each switch, reachable, login, size as declared, its current patches (and, on a
    shared switch, none crossing the owned ports); for each host of a lab with agents, the agent online and
    its version, every NIC port's interface, carrier, address, transceiver and Rx power per lane. Reads
    only. Exit 0 when nothing failed, 1 otherwise, 2 for an inventory its lab kind refuses."""
    import asyncio

    from rich.table import Table

    from labctl.labs import load
    from labctl.run.preflight import preflight

    inv = load(inventory)
    checks = asyncio.run(preflight(inv, timeout_s=timeout_s))
    failed = [c for c in checks if c.ok is False]
    if as_json:
        print(
            json.dumps({"lab": inv.lab, "ok": not failed, "checks": [c.as_dict() for c in checks]}, indent=2)
        )
    else:
        table = Table(title=f"lab check: {inv.lab} ({inv.kind})", title_justify="left")
        for col in ("what", "check", "", "detail"):
            table.add_column(col)
        for c in checks:
            mark = {True: "[green]ok[/]", False: "[red]FAIL[/]", None: "·"}[c.ok]
            table.add_row(c.subject, c.item, mark, c.detail)
        out.print(table)
        out.print(f"[red]{len(failed)} check(s) failed[/]" if failed else "[green]ready[/]")
    if failed:
        raise typer.Exit(1)


def register(app: typer.Typer) -> None:
    app.add_typer(lab_app, name="lab")
