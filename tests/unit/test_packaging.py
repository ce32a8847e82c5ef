"""Every package directory ships: pyproject's explicit package list must name all of them."""

from __future__ import annotations

import tomllib
from pathlib import Path


def test_every_package_directory_is_listed(repo: Path) -> None:
    config = tomllib.loads((repo / "pyproject.toml").read_text())["tool"]["setuptools"]
    listed = set(config["packages"])
    roots = {name: repo / path for name, path in config["package-dir"].items()}
    found = set()
    for name, root in roots.items():
        for init in root.rglob("__init__.py"):
            rel = init.parent.relative_to(root)
            dotted = ".".join((name, *rel.parts)) if rel.parts else name
            if not any(part.startswith((".", "__pycache__")) for part in rel.parts):
                found.add(dotted)
    assert found == listed, (
        f"missing from pyproject: {sorted(found - listed)}; listed but absent: {sorted(listed - found)}"
    )
