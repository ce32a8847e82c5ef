"""The public surface (issue 24; docs/architecture.md, "Public surface"): the modules a plugin author builds
on each list their names in `__all__`, every listed name exists, and the examples in docs/extending.md
import nothing else of labctl."""

from __future__ import annotations

import ast
import importlib
import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
ARCHITECTURE = REPO / "docs" / "architecture.md"
EXTENDING = REPO / "docs" / "extending.md"


def surface() -> list[str]:
    text = ARCHITECTURE.read_text()
    section = text[text.index("\n## Public surface\n") :]
    section = section[: section.index("\n## ", 1)]
    table = section[section.index("| for | modules |") :]
    return re.findall(r"`(labctl(?:\.\w+)+)`", table)


def exported(module: str) -> list[str]:
    names = getattr(importlib.import_module(module), "__all__", None)
    assert names is not None, f"{module} is on the public surface and lists no __all__"
    return list(names)


def test_every_surface_module_lists_names_that_exist() -> None:
    modules = surface()
    assert len(modules) >= 15 and "labctl.ocs.protocol" in modules and "labctl.run.steps" in modules
    for module in modules:
        names = exported(module)
        mod = importlib.import_module(module)
        assert names and not [n for n in names if not hasattr(mod, n)], module


def example_imports(text: str) -> list[tuple[str, str]]:
    """(module, name) of every `from labctl... import name` in the page's Python blocks."""
    found = []
    for block in re.findall(r"^```python\n(.*?)^```", text, flags=re.S | re.M):
        for node in ast.walk(ast.parse(block)):
            if (
                isinstance(node, ast.ImportFrom)
                and node.level == 0
                and (node.module or "").startswith("labctl")
            ):
                found += [(node.module or "", alias.name) for alias in node.names]
    return found


def outside_the_surface(imports: list[tuple[str, str]], modules: list[str], examples: set[str]) -> list[str]:
    out = []
    for module, name in imports:
        if module in examples or module.startswith(tuple(m + "." for m in examples)):
            continue  # one example file importing another
        if module not in modules:
            out.append(f"{module} (not a public module)")
        elif name not in exported(module):
            out.append(f"{module}.{name} (not in its __all__)")
    return out


def test_the_examples_import_only_the_public_surface() -> None:
    text = EXTENDING.read_text()
    examples = {m[2:].removesuffix(".py").removesuffix("/__init__").replace("/", ".") for m in
                re.findall(r"^# labctl/[\w/]+\.py$", text, flags=re.M)}  # fmt: skip
    imports = example_imports(text)
    assert len(imports) > 30
    assert outside_the_surface(imports, surface(), examples) == []


def test_the_check_finds_an_internal_import() -> None:
    imports = [
        ("labctl.run.engine", "RunEngine"),
        ("labctl.ocs.protocol", "_timed"),
        ("labctl.ocs.protocol", "Timed"),
    ]
    found = outside_the_surface(imports, ["labctl.ocs.protocol"], set())
    assert found == [
        "labctl.run.engine (not a public module)",
        "labctl.ocs.protocol._timed (not in its __all__)",
    ]
