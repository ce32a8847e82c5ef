"""The shape of the package, checked from its source: imports point one way, every module imports on its
own, optional dependencies stay optional, and only the registry knows the names of drivers and lab kinds."""

from __future__ import annotations

import ast
import functools
from collections.abc import Iterator
from pathlib import Path

import pytest

from labctl.core.events import KINDS
from labctl.core.registry import LAB_KINDS, PROBES, SWITCH_DRIVERS
from tests.helpers.architecture import MODULES, PACKAGE, module_name, parsed


def imported_names(path: Path) -> Iterator[str]:
    """Every module an import statement anywhere in the file names (top level, in functions, under
    TYPE_CHECKING alike), relative imports resolved. `from a import b` yields `a.b` when that is a module."""
    name = module_name(path)
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    for node in ast.walk(parsed(path)):
        if isinstance(node, ast.Import):
            yield from (alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*anchor, base] if base else anchor)
            yield base
            for alias in node.names:
                yield f"{base}.{alias.name}"


def graph() -> dict[str, set[str]]:
    """Module → the labctl modules it imports, including the packages Python imports on the way (importing
    `labctl.labs.world` runs `labctl/labs/__init__.py` first) unless they are the importer's own ancestors
    (already being imported when it runs). The root package is the public facade: it imports what it
    exports, lazily, and nothing imports it (checked below), so it is no step in a cycle."""
    # built once; each caller gets its own copy, so no test can change another's graph
    return {name: set(targets) for name, targets in _graph().items()}


@functools.cache
def _graph() -> dict[str, set[str]]:
    edges: dict[str, set[str]] = {}
    for name, path in MODULES.items():
        ancestors = {".".join(name.split(".")[:n]) for n in range(1, name.count(".") + 1)}
        targets = set()
        for imported in imported_names(path):
            parts = imported.split(".")
            for n in range(2, len(parts) + 1):  # every package on the way, and the module itself
                prefix = ".".join(parts[:n])
                if prefix in MODULES and prefix != name and prefix not in ancestors:
                    targets.add(prefix)
        edges[name] = targets
    return edges


def find_cycle(edges: dict[str, set[str]]) -> list[str] | None:
    state: dict[str, int] = {}  # 1 visiting, 2 done
    stack: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        stack.append(node)
        for nxt in sorted(edges.get(node, ())):
            if state.get(nxt) == 1:
                return [*stack[stack.index(nxt) :], nxt]
            if nxt not in state and (cycle := visit(nxt)) is not None:
                return cycle
        stack.pop()
        state[node] = 2
        return None

    for node in sorted(edges):
        if node not in state and (cycle := visit(node)) is not None:
            return cycle
    return None


def test_the_cycle_finder_finds_a_cycle() -> None:
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"a.b"}, "a.b": set()}) is None
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": set()}) is None


def test_no_import_cycle_in_labctl() -> None:
    edges = graph()
    assert len(edges) > 80 and sum(map(len, edges.values())) > 300, "the graph must cover the package"
    cycle = find_cycle(edges)
    assert cycle is None, "import cycle: " + " → ".join(cycle or [])


def test_nothing_imports_the_public_facade() -> None:
    """`labctl/__init__.py` re-exports the public API lazily; a module importing it would close a loop."""
    users = sorted(
        name
        for name, path in MODULES.items()
        if name != "labctl" and any(imported == "labctl" for imported in imported_names(path))
    )
    assert users == []


def test_the_lab_contract_imports_nothing_above_it() -> None:
    """labs/base.py is the contract: no lab kind, agent, driver, probe, CLI or controller in its imports (the
    probe contract, labctl/probes/base.py and labctl/probes/sampling.py, may be named in a type: they are a
    peer contract, not a probe)."""
    above = (
        "labctl.labs.",
        "labctl.agents",
        "labctl.ocs.drivers",
        "labctl.probes.",
        "labctl.cli",
        "labctl.run.engine",
    )
    reached = graph()["labctl.labs.base"]
    contracts = {"labctl.labs", "labctl.probes", "labctl.probes.base", "labctl.probes.sampling"}
    assert not [m for m in reached if m.startswith(above) and m not in contracts]


def _own_modules(where: str) -> tuple[str, ...]:
    """A registry entry's own modules: the module that holds it, or its whole package."""
    module = where.partition(":")[0]
    path = MODULES[module]
    return (module,) if path.name != "__init__.py" else (module, module + ".")


# Beyond the entry's own module(s): the agents lab's implementation package (it writes `agents` as a
# run.json key), and the GPU benchmarks, whose events name the CUDA `kernel` they timed (the word, not the
# lab kind).
EXTRA_OWNERS = {"agents": ("labctl.agents",), "kernel": ("labctl.probes.gpu",)}


@functools.cache
def _string_constants() -> dict[str, list[tuple[str, str]]]:
    """Each string constant written anywhere in the package → (module, file:line) of every place it is, in
    module order: one walk of every tree for all the parametrized cases below."""
    where: dict[str, list[tuple[str, str]]] = {}
    for module, path in MODULES.items():
        for node in ast.walk(parsed(path)):
            if isinstance(node, ast.Constant) and isinstance(node.value, str):
                where.setdefault(node.value, []).append(
                    (module, f"{path.relative_to(PACKAGE.parent)}:{node.lineno}")
                )
    return where


@pytest.mark.parametrize(
    ("name", "where"), [*SWITCH_DRIVERS.items(), *LAB_KINDS.items()], ids=[*SWITCH_DRIVERS, *LAB_KINDS]
)
def test_only_the_registry_and_its_own_modules_name_a_driver_or_lab_kind(name: str, where: str) -> None:
    owners = (*_own_modules(where), *EXTRA_OWNERS.get(name, ()))
    found = [
        at
        for module, at in _string_constants().get(name, [])
        if not (module == "labctl.core.registry" or module == owners[0] or module.startswith(owners))
    ]
    assert not found, f"{name!r} is written outside the registry and its own modules: {found}"


def test_every_registry_entry_loads_and_names_itself() -> None:
    from labctl.labs import lab_kinds
    from labctl.ocs.switches import switch_drivers
    from labctl.probes.base import probe_kinds

    for registry, table in ((switch_drivers, SWITCH_DRIVERS), (lab_kinds, LAB_KINDS), (probe_kinds, PROBES)):
        assert set(registry.all()) == set(table)
        for name, entry in registry.all().items():
            assert entry.name == name


def test_event_kinds_are_named_constants_on_both_sides() -> None:
    """Producers and consumers write `Kind.CARRIER`, not "carrier": a literal event kind passed as `kind=`,
    as the second argument of `emit(...)`, or compared with `.kind` is a typo waiting to happen."""
    found = []
    for module, path in MODULES.items():
        if module == "labctl.core.events":
            continue
        for node in ast.walk(parsed(path)):
            literals: list[ast.expr] = []
            if isinstance(node, ast.keyword) and node.arg == "kind":
                literals.append(node.value)
            elif (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Attribute)
                and node.func.attr == "emit"
            ):
                literals.extend(node.args[1:2])
            elif isinstance(node, ast.Compare):
                sides = [node.left, *node.comparators]
                if any(isinstance(s, ast.Attribute) and s.attr == "kind" for s in sides):
                    literals.extend(sides)
            found.extend(
                f"{path.relative_to(PACKAGE.parent)}:{lit.lineno}: {lit.value!r}"
                for lit in literals
                if isinstance(lit, ast.Constant) and lit.value in KINDS
            )
    assert not found, found


def test_a_missing_optional_dependency_is_one_line_naming_the_extra() -> None:
    from labctl.core.extras import MissingExtra, install_hint, require

    with pytest.raises(MissingExtra) as info:
        require("labctl_test_no_such_module.sub", "netconf", "the NETCONF driver")
    assert str(info.value) == (
        "the NETCONF driver needs labctl_test_no_such_module.sub (labctl_test_no_such_module is not "
        "installed): " + install_hint("netconf")
    )
    assert require("json", "none", "nothing").dumps([]) == "[]"
