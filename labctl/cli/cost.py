"""`labctl cost`: the Opus per-port cost model for a lab's photonic rails against an electrical fabric."""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from labctl.cli.common import DEFAULT_INVENTORY, InventoryOpt, JsonOpt, out

if TYPE_CHECKING:
    from rich.table import Table

    from labctl.models.cost import CostModel


def cost(
    inventory: InventoryOpt = DEFAULT_INVENTORY,
    prices: Annotated[
        Path | None,
        typer.Option(
            "--prices",
            help="Prices table (YAML: switch_port, transceiver, ocs_port, each usd, watts, source). Default: "
            "the Opus paper's Table 2 for H200 at 400G; copy labctl/data/prices.yaml to edit it.",
        ),
    ] = None,
    gpus: Annotated[
        int | None,
        typer.Option(
            "--gpus",
            min=1,
            max=10_000_000,
            help="Cost N GPUs (one NIC port each at the prices' rate, 2 OCS ports per GPU) instead of the "
            "inventory: the paper's case is --gpus 512.",
        ),
    ] = None,
    tiers: Annotated[
        int,
        typer.Option(
            "--tiers",
            min=1,
            max=5,
            help="Switch tiers of the electrical fat tree compared against: a NIC port takes 2*tiers-1 "
            "switch ports, each with a transceiver. 3 comes closest to the paper's figures.",
        ),
    ] = 3,
    as_json: JsonOpt = False,
) -> None:
    """Cost and power of the lab's photonic rails against a rail-optimized electrical fabric of the same size.

    The per-port model of the Opus paper: Cost = n_sw*c_sw + n_ocs*c_ocs + n_xcvr*c_xcvr, the same form
    for power, fibres excluded. The photonic side counts the inventory's own OCS ports and one transceiver
    per NIC port; the electrical side gives every NIC port a path up a non-blocking fat tree. Ratios are
    model outputs from list prices, not measurements.
    """
    from labctl.models.cost import from_inventory, load_prices, notes, synthetic

    table_prices = load_prices(prices)
    if gpus is not None:
        result = synthetic(gpus, table_prices, tiers)
    else:
        from labctl.inventory.schema import load_inventory

        result = from_inventory(load_inventory(inventory), table_prices, tiers)
    if as_json:
        print(json.dumps(result.to_json() | {"notes": notes(result)}, indent=2))
        return
    out.print(_table(result))
    out.print(
        f"photonic rails: {result.cost_ratio:.2f}x lower cost, {result.power_ratio:.2f}x lower power "
        f"(electrical over photonic, over {result.gpus} GPUs and {result.nic_ports} NIC ports)"
    )
    for line in notes(result):
        out.print(f"note: {line}", markup=False, highlight=False)


def _table(result: CostModel) -> Table:
    from rich.table import Table

    fabrics = (result.electrical, result.photonic)
    # One unit per column, chosen for the column's largest value.
    total_w = max(f.power_w for f in fabrics)
    power_unit, power_div = ("kW", 1000.0) if total_w >= 10_000 else ("W", 1.0)
    table = Table(
        title=f"{result.lab}: {result.prices.name}; fibres excluded", title_justify="left", show_lines=False
    )
    for name in (
        "fabric",
        "switch ports",
        "OCS ports",
        "transceivers",
        "cost (USD)",
        "USD per GPU",
        f"power ({power_unit})",
        "W per GPU",
    ):
        table.add_column(name, justify="left" if name == "fabric" else "right")
    for f in fabrics:
        table.add_row(
            f.name,
            f"{f.switch_ports:,}",
            f"{f.ocs_ports:,}",
            f"{f.transceivers:,}",
            f"{f.cost_usd:,.0f}",
            f"{f.cost_usd / result.gpus:,.0f}",
            f"{f.power_w / power_div:,.1f}" if power_div == 1 else f"{f.power_w / power_div:,.2f}",
            f"{f.power_w / result.gpus:,.2f}",
        )
    return table


def register(app: typer.Typer) -> None:
    app.command("cost")(cost)
