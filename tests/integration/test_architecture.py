"""The package's shape, checked in fresh interpreters: every module imports on its own without optional
dependencies, and loading the lab contract loads no driver, probe or lab kind. The checks on the source
itself are tests/unit/test_architecture.py."""

from __future__ import annotations

import subprocess
import sys

from labctl.core.registry import SWITCH_DRIVERS
from tests.helpers.architecture import MODULES

OPTIONAL = ("cuda", "ncclient", "pyvisa", "serial", "pyverbs", "psycopg")  # the extras' top-level packages


def test_loading_the_lab_contract_loads_no_driver_probe_or_lab_kind() -> None:
    """What `import labctl.labs.base` actually loads, in a fresh interpreter: the inventory needs every
    switch driver's config model, so the drivers' entry modules (their package `__init__`, config and entry
    only) load with it, and the probe contract (`labctl.probes.sampling`, in a package file that imports
    nothing); no driver implementation, probe, lab kind, agent, emulator or CLI does."""
    script = "import sys, labctl.labs.base; print('\\n'.join(sorted(m for m in sys.modules if m.startswith('labctl'))))"
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    loaded = set(out.stdout.split())
    entries = {where.partition(":")[0] for where in SWITCH_DRIVERS.values()}
    above = sorted(
        m
        for m in loaded
        if m.startswith(
            ("labctl.ocs.drivers.", "labctl.probes", "labctl.agents", "labctl.cli", "labctl.emulators.tl1")
        )
        or (m.startswith("labctl.labs.") and m != "labctl.labs.base")
        or m in ("labctl.run.engine", "labctl.scheduler")
    )
    contracts = {"labctl.probes", "labctl.probes.sampling"}
    assert [m for m in above if m not in entries | contracts] == [], "loaded above the contract"
    assert entries <= loaded  # the config models do load (the union needs them)


def test_every_module_imports_on_its_own_without_optional_dependencies() -> None:
    """In a fresh interpreter, each module imported first (after forgetting every labctl module), with the
    optional extras made unimportable: an order-dependent import or an eager optional one fails here."""
    # The cyclic garbage collector is off in the checking interpreter: each forgotten round of labctl modules
    # is garbage that the collector would trace again and again (~13% of the check's CPU); no import's
    # outcome depends on when unreachable objects are collected. (One forked process per module costs
    # more: each child re-faults the parent's pages and imports the dependencies' lazy parts again.)
    script = f"""
import gc, importlib, sys
gc.disable()
for blocked in {OPTIONAL!r}:
    sys.modules[blocked] = None  # `import cuda` now raises ImportError
failed = []
for name in {sorted(m for m in MODULES if not m.endswith(".__main__"))!r}:  # __main__: scripts
    for loaded in [m for m in sys.modules if m == "labctl" or m.startswith("labctl.")]:
        del sys.modules[loaded]
    try:
        importlib.import_module(name)
    except BaseException as e:
        failed.append(f"{{name}}: {{type(e).__name__}}: {{e}}")
print("\\n".join(failed))
"""
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "", out.stdout
