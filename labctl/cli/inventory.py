"""`labctl inventory check`: validate a lab description exactly as `labctl run` will."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from labctl.cli.common import DEFAULT_INVENTORY, out, resolve_inventory

inventory_app = typer.Typer(help="Inspect and validate inventory files.", no_args_is_help=True)


@inventory_app.command("check")
def inventory_check(
    file: Annotated[
        Path,
        typer.Argument(
            help="Inventory file to validate (default: ./inventory.yaml, else the built-in lab).",
            callback=resolve_inventory,
        ),
    ] = DEFAULT_INVENTORY,
) -> None:
    """Validate an inventory as `labctl run` will: schema, each switch against its driver's config, switch
    names, port ranges and directions, ports used twice, rails, and what its lab kind needs."""
    from labctl.labs import load

    inv = load(file)
    out.print(
        f"{file}: ok — lab {inv.lab} ({inv.kind}): {len(inv.switches)} switch(es), {len(inv.hosts)} hosts, "
        f"{len(inv.ports)} NIC ports on rails {inv.rails}, profile {inv.model.profile}"
    )


def register(app: typer.Typer) -> None:
    app.add_typer(inventory_app, name="inventory")
