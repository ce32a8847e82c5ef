"""`labctl tune EXPERIMENT`: `labctl run` on a `kind: tune` experiment (issue 40), with `--json` for scripts:
each link setting's firmware and total link-up, the difference to the reference and the ranking, and what
every port holds at the end."""

from __future__ import annotations

import json
from typing import Annotated

import typer

from labctl.cli.common import (
    DEFAULT_INVENTORY,
    EXIT_ABORTED,
    RUNS,
    ExperimentArg,
    InventoryOpt,
    JsonOpt,
    NoPlotsOpt,
    OutOpt,
    ProfileOpt,
)
from labctl.core.errors import InputError


def tune(
    experiment: ExperimentArg,
    inventory: InventoryOpt = DEFAULT_INVENTORY,
    profile: ProfileOpt = None,
    out_dir: OutOpt = RUNS,
    seed: Annotated[
        int | None, typer.Option(min=0, max=2**63 - 1, help="Seed for the profile's modeled delays.")
    ] = None,
    no_plots: NoPlotsOpt = False,
    dry_run: Annotated[
        bool,
        typer.Option(
            "--dry-run",
            help="List each port's changes (from → to) in order, then read each port's support for the "
            "settings from the lab (reads only); exit 2 if a port would refuse one. Change nothing.",
        ),
    ] = False,
    as_json: JsonOpt = False,
) -> None:
    """Sweep NIC link settings (auto-negotiation, FEC, link modes, private flags) and rank their link-up.

    The same as `labctl run` on a `kind: tune` experiment: every swept port is read first, each setting is
    applied (verified by read-back) before its reconfigurations, and every port is set back as found at the
    end, on Ctrl-C and on failure. The report ranks the settings by median total link-up with 95% CIs and
    says which ones the data cannot tell apart. `--json`: the run's outcome and `by_link_setting`."""
    from labctl.cli import run as run_cli
    from labctl.run.lifecycle import RunInputs

    inputs = RunInputs.read(experiment, inventory)  # once: the kind is checked on what the run is given
    if inputs.plan.kind != "tune":
        raise InputError(
            f"{experiment}: a kind {inputs.plan.kind} experiment: `labctl tune` runs kind: tune "
            "(`labctl run` runs any)"
        )
    request = run_cli.RunRequest(
        experiment, inventory, profile, out_dir, seed, plots=not no_plots, inputs=inputs
    )
    if dry_run or not as_json:
        run_cli.run_and_report(request, dry_run=dry_run)
        return
    outcome, signalled = run_cli.execute(request)
    print(
        json.dumps(
            {
                "run": str(outcome.run_dir),
                "status": outcome.status,
                "error": outcome.error,
                "by_link_setting": outcome.summary.get("by_link_setting"),
                "link_settings": outcome.summary.get("link_settings"),
            },
            indent=2,
        )
    )
    if outcome.status == "aborted" or signalled:
        raise typer.Exit(EXIT_ABORTED)
    if outcome.status != "completed":
        raise typer.Exit(1)


def register(app: typer.Typer) -> None:
    app.command()(tune)
