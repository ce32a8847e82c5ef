"""Lab kinds: one module per kind, a registry entry each (labctl.registry.LAB_KINDS).

`load(path)` is what every command that takes an inventory calls (`inventory check`, `run`, `submit`,
`agent`, `emulate fabric`): the inventory's schema and cross-references, then its lab kind's own check.
`build_lab(ctx)` builds the kind's `Lab`. Because both go through the kind's `check`, a file that `labctl
inventory check` accepts is one `labctl run` can build, and the other way round.
"""

from __future__ import annotations

from pathlib import Path

from labctl.inventory import Inventory, load_inventory
from labctl.labs.base import Lab, LabContext, LabKind
from labctl.registry import LAB_KINDS, Registry

lab_kinds: Registry[LabKind] = Registry("lab kind", LAB_KINDS, LabKind)


def check(inventory: Inventory) -> LabKind:
    """The inventory's lab kind, after it checked the inventory (InputError if it would not build it)."""
    kind = lab_kinds.get(inventory.kind)
    kind.check(inventory)
    return kind


def load(path: Path | str) -> Inventory:
    """Load an inventory and check it against its lab kind: what every command taking one does."""
    inventory = load_inventory(path)
    check(inventory)
    return inventory


def build_lab(ctx: LabContext) -> Lab:
    return check(ctx.inventory).build(ctx)
