"""`labctl plugins`: every switch driver, probe, lab kind and experiment kind labctl finds, its own and
installed packages' (entry points, labctl.core.registry), where each comes from and whether it loads."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any

import typer

from labctl.cli.common import JsonOpt, out

if TYPE_CHECKING:
    from labctl.core.registry import Named, Registry


@dataclass(frozen=True)
class PluginRow:
    """One package's entry in one group, and whether it can be used."""

    group: str
    name: str
    target: str
    package: str
    version: str
    status: str
    """ok, broken (it does not load, or is not the group's kind of entry) or conflict (another package
    claims the name too)."""
    error: str | None = None
    """The one line `get` raises for this name, where status is not ok."""


def registries() -> list[Registry[Named]]:
    """The four registries, in `GROUPS` order (imports their entry types, not their entries)."""
    from labctl.labs import lab_kinds
    from labctl.ocs.switches import switch_drivers
    from labctl.probes.base import probe_kinds
    from labctl.run.experiment import experiment_kinds

    found: list[Any] = [switch_drivers, probe_kinds, lab_kinds, experiment_kinds]
    return found


def plugin_rows(of: list[Registry[Named]] | None = None) -> list[PluginRow]:
    """Every claim of every group, each entry imported to say whether it loads."""
    from labctl.core.registry import PluginConflict, PluginError

    rows: list[PluginRow] = []
    for registry in registries() if of is None else of:
        for name, claims in registry.claims().items():
            status, error = "ok", None
            try:
                registry.get(name)
            except PluginConflict as e:
                status, error = "conflict", str(e)
            except PluginError as e:
                status, error = "broken", str(e)
            for claim in claims:
                rows.append(
                    PluginRow(claim.group, name, claim.target, claim.package, claim.version, status, error)
                )
    return rows


def plugins(as_json: JsonOpt = False) -> None:
    """List every switch driver, probe, lab kind and experiment kind, labctl's own and plugins'.

    Those installed packages declare are entry points in the groups labctl.switch_drivers, labctl.probes,
    labctl.lab_kinds and labctl.experiment_kinds; each row says the package and version it comes from and
    whether it loads. Exit 0 when every entry loads, 1 when one does not or two packages claim one name
    (all are still listed)."""
    rows = plugin_rows()
    bad = [row for row in rows if row.status != "ok"]
    if as_json:
        print(json.dumps([asdict(row) for row in rows], indent=2))
    else:
        from rich.table import Table
        from rich.text import Text

        table = Table(title="labctl plugins (entry points)", title_justify="left")
        for column in ("group", "name", "target", "package", "version", "status"):
            table.add_column(column, overflow="fold")
        for row in rows:
            status = (
                Text("ok", style="green") if row.error is None else Text(f"{row.status}: {row.error}", "red")
            )
            table.add_row(row.group, row.name, row.target, row.package, row.version, status)
        out.print(table)
        if bad:
            out.print(f"[red]{len({(r.group, r.name) for r in bad})} name(s) cannot be used[/]")
    if bad:
        raise typer.Exit(1)


def register(app: typer.Typer) -> None:
    app.command("plugins")(plugins)
