"""Lab kinds: one module per kind, a registry entry each (labctl.core.registry.LAB_KINDS).

`load(path)` is what the commands that run a lab call (`inventory check`, `run`, `submit`; `agent` runs
`check` on the inventory it loaded): the inventory's schema and cross-references, then its lab kind's own
check and its secrets.
`build_lab(ctx)` builds the kind's `Lab`. Because both go through the kind's `check`, a file that `labctl
inventory check` accepts is one `labctl run` can build, and the other way round.
"""

from __future__ import annotations

import os
from pathlib import Path

from labctl.core.registry import Registry
from labctl.inventory.schema import Inventory, load_inventory
from labctl.labs.base import Lab, LabContext, LabKind

lab_kinds: Registry[LabKind] = Registry("lab kind", "labctl.lab_kinds", LabKind)


def check(inventory: Inventory, *, secrets: bool = True) -> LabKind:
    """The inventory's lab kind, after it checked the inventory (InputError if it would not build it), and
    (with `secrets`) after every `${ENV}` secret the inventory names was found in this environment: the run
    reads them. An agent skips that: it needs only the broker's, which it resolves itself."""
    kind = lab_kinds.get(inventory.kind)
    kind.check(inventory)
    for loc, ref in inventory.secret_refs() if secrets else ():
        if ref.env_name not in os.environ:
            raise inventory.fail(
                loc, f"environment variable {ref.env_name} is not set (the run reads {ref} from it)"
            )
    return kind


def kinds_with_agents() -> list[str]:
    """The lab kinds whose hosts run `labctl agent`."""
    return [name for name, kind in lab_kinds.all().items() if kind.agent_probes]


def load(path: Path | str) -> Inventory:
    """Load an inventory and check it against its lab kind: what every command taking one does."""
    inventory = load_inventory(path)
    check(inventory)
    return inventory


def build_lab(ctx: LabContext) -> Lab:
    return check(ctx.inventory).build(ctx)
