"""The documentation site (mkdocs.yml, docs/) and the README a newcomer reads first.

The site builds with `mkdocs build --strict` (a broken link or anchor fails it: mkdocs.yml's `validation`),
every page under docs/ is in its navigation and the navigation names no page that is not there, and no page
cites an issue number or a path on the machine it was written on: a reader has neither. The README fits
one screen's worth of reading (200 lines) and its quick start is the two commands `.ci/run` runs.
"""

from __future__ import annotations

import importlib.util
import logging
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from labctl.testing.support import require

REPO = Path(__file__).resolve().parents[2]
DOCS = REPO / "docs"
MKDOCS = REPO / "mkdocs.yml"
README = REPO / "README.md"
README_LINES = 200

# labctl's own issues, by number (another project's, "ARTIQ ... #1546", is a citation a reader can follow)
ISSUE = re.compile(r"\b[Ii]ssues? #?\d+")
# the machines the docs were written on: their home and work directories, and notes kept beside the clone
MACHINE_PATH = re.compile(r"(?<![\w.])(/work/|/home/\w|/root/|/Users/\w|\.\./(seeds|shared)/)")


def nav_pages(entries: Any) -> Iterator[str]:
    """Each page a navigation (mkdocs.yml's `nav:`) names, in order: `- page.md`, `- Title: page.md` and
    `- Section: [...]` entries; external links (`http...`) are no pages."""
    for entry in entries:
        if isinstance(entry, str):
            if not entry.startswith(("http://", "https://")):
                yield entry
        elif isinstance(entry, dict):
            for value in entry.values():
                if isinstance(value, list):
                    yield from nav_pages(value)
                elif isinstance(value, str) and not value.startswith(("http://", "https://")):
                    yield value


def site_pages() -> list[str]:
    return sorted(p.relative_to(DOCS).as_posix() for p in DOCS.rglob("*.md"))


def config() -> dict[str, Any]:
    loaded = yaml.safe_load(MKDOCS.read_text(encoding="utf-8"))
    assert isinstance(loaded, dict)
    return loaded


def test_the_site_is_docs_and_builds_strictly() -> None:
    site = config()
    assert site.get("docs_dir", "docs") == "docs" and site.get("strict") is True
    assert site["theme"]["name"] == "material"
    # what makes --strict fail on a broken link, a missing anchor or a page left out of the navigation
    assert all(
        site["validation"][key] == "warn" for key in ("omitted_files", "unrecognized_links", "anchors")
    )


def test_every_page_is_in_the_navigation_and_every_entry_is_a_page() -> None:
    named = list(nav_pages(config()["nav"]))
    repeated = sorted({page for page in named if named.count(page) > 1})
    assert not repeated, f"mkdocs.yml names these pages more than once: {repeated}"
    missing = sorted(set(site_pages()) - set(named))
    assert not missing, f"pages under docs/ that mkdocs.yml's nav leaves out (add a line each): {missing}"
    stale = sorted(set(named) - set(site_pages()))
    assert not stale, f"mkdocs.yml's nav names pages docs/ does not have: {stale}"


def test_mkdocs_build_strict_passes(tmp_path: Path) -> None:
    """`mkdocs build --strict`, in process: every warning (a link to a missing page or anchor, a page not in
    the navigation) fails it."""
    require(importlib.util.find_spec("mkdocs") is not None, "mkdocs is not installed (the `test` extra)")
    from mkdocs.commands.build import build
    from mkdocs.config import load_config

    warnings: list[str] = []

    class Collect(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            if record.levelno >= logging.WARNING:
                warnings.append(record.getMessage())

    handler = Collect()
    logging.getLogger("mkdocs").addHandler(handler)
    try:
        build(load_config(str(MKDOCS), site_dir=str(tmp_path / "site"), strict=True))
    except Exception as e:  # mkdocs' Abort: the warnings it counted are the message
        pytest.fail(f"mkdocs build --strict: {e}\n" + "\n".join(warnings))
    finally:
        logging.getLogger("mkdocs").removeHandler(handler)
    assert not warnings, "\n".join(warnings)
    assert (tmp_path / "site" / "index.html").is_file()


@pytest.mark.parametrize("page", ["README.md", *(f"docs/{p}" for p in site_pages())])
def test_no_page_cites_an_issue_number_or_a_machine_path(page: str) -> None:
    text = (REPO / page).read_text(encoding="utf-8")
    found = [
        f"{page}:{n}: {match.group(0)!r}"
        for n, line in enumerate(text.splitlines(), start=1)
        for match in (*ISSUE.finditer(line), *MACHINE_PATH.finditer(line))
    ]
    assert not found, "the reader has no issue tracker and not this machine:\n" + "\n".join(found)


def test_the_checks_find_what_they_look_for() -> None:
    assert ISSUE.search("What is left (issue 24)") and ISSUE.search("Issue 45 · Amends 0061")
    assert not ISSUE.search("decision 0045") and not ISSUE.search("[link](#what-is-left)")
    assert MACHINE_PATH.search("(Opus, Figure 9: ../seeds/000_c57dabf76e4b88f5.txt)")
    assert MACHINE_PATH.search("cd /work/main && make")
    assert not MACHINE_PATH.search("$schema=../schemas/inventory.schema.json")


def test_the_readme_fits_one_screen_of_reading() -> None:
    lines = README.read_text(encoding="utf-8").splitlines()
    assert len(lines) <= README_LINES, (
        f"README.md has {len(lines)} lines; the rest belongs on the site (docs/)"
    )


def quick_start() -> list[str]:
    """The two commands of the README's quick start block."""
    text = README.read_text(encoding="utf-8")
    block = re.search(r"^## Quick start\n+```sh\n(.*?)^```", text, flags=re.MULTILINE | re.DOTALL)
    assert block is not None, "README.md has no `## Quick start` with a sh block"
    lines = [line.strip() for line in block.group(1).splitlines() if line.strip()]
    assert len(lines) == 2, f"the quick start is two commands: {lines}"
    return lines


def test_the_readme_quick_start_is_what_ci_runs() -> None:
    """`.ci/run` runs README command 2 as its own lines, in order (its comment says to keep them identical)."""
    *installs, test = [part.strip() for part in quick_start()[1].split(" && ")]
    ci = [line.strip() for line in (REPO / ".ci" / "run").read_text(encoding="utf-8").splitlines()]
    # the lock's install, after the newest-releases branch: the last occurrence of each step, in order
    at = [len(ci) - 1 - ci[::-1].index(step) if step in ci else -1 for step in installs]
    assert -1 not in at, f".ci/run does not run `{installs[at.index(-1)]}`"
    assert at == sorted(at), f".ci/run runs README command 2's installs out of order: {installs}"
    assert test in ci[at[-1] + 1 :], f".ci/run runs `{installs[-1]}` but not `{test}` after it"
