"""Every package directory ships: setuptools finds packages by their __init__.py, so a directory of
modules without one would be silently left out of the wheel."""

from __future__ import annotations

from pathlib import Path


def test_every_directory_of_modules_is_a_package(repo: Path) -> None:
    missing = sorted(
        str(d.relative_to(repo))
        for d in (repo / "labctl").rglob("*")
        if d.is_dir()
        and "__pycache__" not in d.parts
        and any(d.glob("*.py"))
        and not (d / "__init__.py").exists()
    )
    assert not missing, f"directories of modules without __init__.py (not shipped): {missing}"
