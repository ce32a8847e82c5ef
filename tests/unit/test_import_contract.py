"""The import contract (issue 24; docs/architecture.md): labctl's modules in layers, each importing only
the layers below it (and its own), and the switch drivers independent of the probes, lab kinds and agents.
Read from every module's imports (including those inside functions: a lazy import is still a dependency),
so a module that reaches up fails here, naming the import."""

from __future__ import annotations

import ast
from collections.abc import Iterable, Mapping
from pathlib import Path

LABCTL = Path(__file__).resolve().parents[2] / "labctl"

# Top to bottom. A module belongs to the first layer with a prefix of its name; labctl/__init__.py (the
# public facade, which re-exports from several layers lazily) and labctl/__main__.py (`python -m labctl`, the
# command line's entry point) stand above them all. `testing` (the contract
# suites and the pytest plugin, which import pytest) is the top layer: nothing else in labctl may import it.
LAYERS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("testing", ("labctl.testing",)),
    ("cli", ("labctl.cli",)),
    ("scheduler", ("labctl.scheduler",)),
    ("run", ("labctl.run", "labctl.workload")),
    (
        "lab",
        (
            "labctl.labs", "labctl.agents", "labctl.probes", "labctl.models", "labctl.emulators",
            "labctl.ocs", "labctl.rdma", "labctl.plans", "labctl.inventory", "labctl.linux", "labctl.nic",
        ),
    ),
    ("analysis", ("labctl.analysis",)),
    ("core", ("labctl.core",)),
)  # fmt: skip
ROOT = ("labctl", "labctl.__main__")  # above every layer: nothing in labctl imports them
# Independence: the switch side (drivers) knows nothing of what measures the light.
INDEPENDENT = {"labctl.ocs.drivers": ("labctl.probes", "labctl.labs", "labctl.agents")}


def layer_of(module: str, layers: Iterable[tuple[str, tuple[str, ...]]] = LAYERS) -> int | None:
    for rank, (_name, prefixes) in enumerate(layers):
        if any(module == p or module.startswith(p + ".") for p in prefixes):
            return rank
    return None


def imports_of(tree: ast.AST) -> list[tuple[str, int]]:
    """(module, line) of every absolute labctl import in a module, wherever it stands."""
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            found.append((node.module, node.lineno))
        elif isinstance(node, ast.Import):
            found += [(alias.name, node.lineno) for alias in node.names]
    return [(m, line) for m, line in found if m == "labctl" or m.startswith("labctl.")]


def violations(
    graph: Mapping[str, list[tuple[str, int]]],
    layers: tuple[tuple[str, tuple[str, ...]], ...] = LAYERS,
    independent: Mapping[str, tuple[str, ...]] = INDEPENDENT,
) -> list[str]:
    out = []
    for module, imported in graph.items():
        mine = layer_of(module, layers)
        for target, line in imported:
            theirs = layer_of(target, layers)
            if mine is not None and theirs is not None and theirs < mine:
                out.append(
                    f"{module}:{line} imports {target}: layer {layers[mine][0]} may not import layer "
                    f"{layers[theirs][0]} (above it)"
                )
            for side, forbidden in independent.items():
                if (module == side or module.startswith(side + ".")) and target.startswith(forbidden):
                    out.append(f"{module}:{line} imports {target}: {side} is independent of it")
    return out


def _graph() -> dict[str, list[tuple[str, int]]]:
    graph = {}
    for path in sorted(LABCTL.rglob("*.py")):
        parts = list(path.relative_to(LABCTL.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        graph[".".join(parts)] = imports_of(ast.parse(path.read_text(), str(path)))
    return graph


def test_every_module_has_a_layer() -> None:
    graph = _graph()
    unplaced = [m for m in graph if m not in ROOT and layer_of(m) is None]
    assert unplaced == [], f"modules in no layer (add them to LAYERS and docs/architecture.md): {unplaced}"


def test_no_module_imports_a_layer_above_it() -> None:
    found = violations(_graph())
    assert found == [], "\n".join(found)


def test_the_contract_fails_on_a_deliberate_violation() -> None:
    """A driver that reaches for the controller, and one that reads a probe: both named, with the line."""
    graph = {
        "labctl.ocs.drivers.polatis_tl1.switch": [("labctl.run.engine", 12), ("labctl.ocs.protocol", 13)],
        "labctl.ocs.drivers.sim": [("labctl.probes.rxpower", 7)],
        "labctl.analysis.breakdown": [("labctl.core.events", 3)],
    }
    found = violations(graph)
    assert len(found) == 2, found
    assert found[0].startswith(
        "labctl.ocs.drivers.polatis_tl1.switch:12 imports labctl.run.engine: layer lab"
    )
    assert (
        found[1]
        == "labctl.ocs.drivers.sim:7 imports labctl.probes.rxpower: labctl.ocs.drivers is independent of it"
    )
