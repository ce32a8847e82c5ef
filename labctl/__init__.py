"""labctl: hardware-in-the-loop timing of optical circuit switch reconfigurations.

The public entry points most users need:
- `labctl.load_run(path)`: a finished (or killed) run directory as pandas frames;
- `labctl.load_inventory(path)`, `labctl.load_experiment(path)`: validated input files;
- `labctl.Event`: the one record type every part of labctl writes.

They are imported on first use (PEP 562), so `import labctl` and `labctl --help` do not pay for pandas.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from labctl.version import __version__

_EXPORTS = {
    "Event": "labctl.events",
    "load_experiment": "labctl.experiment",
    "load_inventory": "labctl.inventory",
    "Run": "labctl.store",
    "load_run": "labctl.store",
}

if TYPE_CHECKING:
    from labctl.events import Event
    from labctl.experiment import load_experiment
    from labctl.inventory import load_inventory
    from labctl.store import Run, load_run


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'labctl' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


__all__ = ["Event", "Run", "__version__", "load_experiment", "load_inventory", "load_run"]
