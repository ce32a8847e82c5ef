"""`labctl inventory check` in a fresh interpreter loads no model, probe, event loop or array stack: what
`sys.modules` holds after the command ran, for the default (simulated) inventory and a kernel one. The checks
of the source are tests/unit/test_lazy_imports.py; behaviour, not speed, is asserted."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
HEAVY = ("numpy", "pandas", "matplotlib", "pyarrow", "asyncio", "aiomqtt", "labctl.models", "labctl.probes")

SCRIPT = """
import sys
from labctl.cli import main
sys.argv = ["labctl", "inventory", "check", sys.argv[1]]
try:
    main()
except SystemExit as e:
    assert not e.code, e.code
heavy = {heavy!r}
print("loaded:", *sorted(m for m in sys.modules if m in heavy or m.startswith(tuple(h + "." for h in heavy))))
"""


@pytest.mark.parametrize(
    "inventory", [REPO / "inventory.yaml", REPO / "experiments" / "inventories" / "emulated.yaml"]
)
def test_checking_an_inventory_loads_no_model_probe_or_event_loop(inventory: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-c", SCRIPT.format(heavy=HEAVY), str(inventory)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    assert ": ok" in done.stdout, done.stdout
    assert done.stdout.splitlines()[-1] == "loaded:", done.stdout
