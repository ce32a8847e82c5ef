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

from labctl.core.version import __version__

_EXPORTS = {
    "Event": "labctl.core.events",
    "load_experiment": "labctl.run.experiment",
    "load_inventory": "labctl.inventory.schema",
    "Run": "labctl.analysis.store",
    "load_run": "labctl.analysis.store",
}

if TYPE_CHECKING:
    from labctl.analysis.store import Run, load_run
    from labctl.core.events import Event
    from labctl.inventory.schema import load_inventory
    from labctl.run.experiment import load_experiment


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'labctl' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


__all__ = ["Event", "Run", "__version__", "load_experiment", "load_inventory", "load_run"]
