"""`labctl init DIR`: a lab directory to start from, written from the built-in lab (labctl.core.shipped)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from labctl.cli.common import out
from labctl.core.errors import InputError

EXPERIMENTS = ("reconfig-timeline", "replay-opus-testbed")
"""The built-in experiments a new lab directory starts with (the rest: `labctl run NAME` by name)."""

README = """# {name}

A labctl lab directory, written by `labctl init` (labctl {version}).

- `inventory.yaml`: the lab. It starts as the built-in simulated Opus testbed (`kind: simulated`):
  one 32x32 switch, 4 hosts, 2 rails. Describe your own switches, hosts and NIC ports here; `labctl
  inventory check` validates it (file:line on any mistake), `labctl schema inventory` prints its JSON
  Schema for your editor.
- `experiments/`: what to run. `labctl run experiments/reconfig-timeline.yaml --profile fast` runs one
  here; `labctl run --help` lists the options.
- Runs are written to `runs/<id>/` (run.json, events.jsonl, breakdown.csv, figures).

Next: `labctl lab check` (before a real lab's first run), `labctl report runs/`.
"""


def init(
    directory: Annotated[Path, typer.Argument(help="The lab directory to create (or fill, if empty).")],
    force: Annotated[
        bool, typer.Option("--force", help="Overwrite the files labctl init writes, where they exist.")
    ] = False,
) -> None:
    """Write a lab directory to start from: the built-in lab's inventory, two experiments, a README.

    inventory.yaml is the simulated Opus testbed to edit into your lab; experiments/ holds
    reconfig-timeline and replay-opus-testbed. Nothing is overwritten without --force."""
    from labctl.core.shipped import builtin_experiments, builtin_inventory
    from labctl.core.version import __version__

    experiments = builtin_experiments()
    files = {Path("inventory.yaml"): builtin_inventory().read_text(encoding="utf-8")}
    for name in EXPERIMENTS:
        files[Path("experiments") / f"{name}.yaml"] = experiments[name].read_text(encoding="utf-8")
    files[Path("README.md")] = README.format(name=directory.resolve().name, version=__version__)
    if directory.exists() and not directory.is_dir():
        raise InputError(f"{directory}: exists and is not a directory")
    existing = [str(directory / p) for p in files if (directory / p).exists()]
    if existing and not force:
        raise InputError(f"{existing[0]}: already exists (labctl init overwrites nothing without --force)")
    for relative, text in files.items():
        path = directory / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")
    out.print(f"wrote {directory}/: {', '.join(str(p) for p in files)}")
    out.print(f"next: labctl inventory check {directory / 'inventory.yaml'}")


def register(app: typer.Typer) -> None:
    app.command("init")(init)
