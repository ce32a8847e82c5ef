"""What ships inside the package: the built-in lab (the simulated Opus testbed) and its experiments.

`labctl run reconfig-timeline` then works from any directory after `pip install labctl`, not only in a
clone: a bare name that is no file here is a built-in experiment, and the default inventory
(`inventory.yaml`) falls back to the built-in one where the working directory has none. In a clone,
labctl/data/ holds links to the repository's inventory.yaml and experiments/ (one copy of each file);
a wheel carries the files themselves.
"""

from __future__ import annotations

from importlib import resources
from pathlib import Path

from labctl.core.errors import InputError

DEFAULT_INVENTORY = Path("inventory.yaml")
"""The inventory a command uses without -i: this directory's, else the built-in one."""


def data_dir() -> Path:
    """labctl/data of the installed package (a real directory: labctl is never imported from a zip)."""
    return Path(str(resources.files("labctl") / "data"))


def builtin_inventory() -> Path:
    return data_dir() / "inventory.yaml"


def builtin_experiments() -> dict[str, Path]:
    """Built-in experiment name (file name without .yaml) → its file."""
    folder = data_dir() / "experiments"
    return {p.stem: p for p in sorted(folder.glob("*.yaml"))}


def builtin_inventories() -> dict[str, Path]:
    """The example inventories shipped beside the experiments (emulated protocols, the rehearsal)."""
    folder = data_dir() / "experiments" / "inventories"
    return {p.stem: p for p in sorted(folder.glob("*.yaml"))}


def resolve_experiment(arg: Path | str) -> Path:
    """An experiment file as given, or a built-in experiment by name (`reconfig-timeline`); anything
    else is one line naming what was looked for and the built-in names."""
    path = Path(arg)
    if path.exists():
        return path
    name = str(arg)
    builtins = builtin_experiments()
    if "/" not in name:
        found = builtins.get(name.removesuffix(".yaml"))
        if found is not None:
            return found
    raise InputError(
        f"{arg}: experiment not found (no such file, and no built-in experiment of that name; built-in: "
        f"{', '.join(builtins) or 'none'})"
    )


def resolve_inventory(path: Path) -> Path:
    """The inventory as given; the default name where this directory has none is the built-in lab."""
    if path == DEFAULT_INVENTORY and not path.exists():
        return builtin_inventory()
    return path
