"""labctl: hardware-in-the-loop timing of optical circuit switch reconfigurations.

The public entry points most users need:
- `labctl.load_run(path)`: a finished (or killed) run directory as pandas frames;
- `labctl.load_inventory(path)`, `labctl.load_experiment(path)`: validated input files;
- `labctl.Event`: the one record type every part of labctl writes.
"""

from __future__ import annotations

__version__ = "0.1.0"

from labctl.events import Event
from labctl.experiment import load_experiment
from labctl.inventory import load_inventory
from labctl.store import Run, load_run

__all__ = ["Event", "Run", "__version__", "load_experiment", "load_inventory", "load_run"]
