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
        and "data" not in d.relative_to(repo / "labctl").parts[:1]  # package data: files, never modules
        and any(d.glob("*.py"))
        and not (d / "__init__.py").exists()
    )
    assert not missing, f"directories of modules without __init__.py (not shipped): {missing}"


def test_every_path_the_readme_names_exists(repo: Path) -> None:
    """A new user follows the README and the site it leads to (docs/): a file they name that the repository
    does not hold (a tests/ tier, a design document) is a dead end on the first day."""
    import re

    text = "\n".join(p.read_text() for p in [repo / "README.md", *sorted((repo / "docs").rglob("*.md"))])
    named = set(re.findall(r"(?<![\w/.~-])((?:tests|docs|experiments|bench|\.ci)/[\w./-]*[\w/])", text))
    assert len(named) > 10
    missing = [p for p in sorted(named) if not (repo / p).exists() and not list(repo.glob(p + "*"))]
    assert not missing, f"README names paths the repository does not have: {missing}"
    for doc in re.findall(r"\b([A-Z]+\.md)\b", text):
        assert (repo / doc).exists() or list(repo.glob(f"docs/**/{doc}")), f"README names {doc}"
