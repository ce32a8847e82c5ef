"""Shared by tests/unit/test_architecture.py and tests/integration/test_architecture.py."""

from __future__ import annotations

import ast
import functools
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[2] / "labctl"


def module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {module_name(p): p for p in sorted(PACKAGE.rglob("*.py")) if "__pycache__" not in p.parts}


@functools.cache
def parsed(path: Path) -> ast.Module:
    """The module's syntax tree, parsed once per test process (parsing every module is ~1 s; the checks
    only walk the trees, never change them)."""
    return ast.parse(path.read_text(), str(path))
