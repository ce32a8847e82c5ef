"""docs/cli.md, the site's command-line reference, is every command's `--help` as labctl prints it now
(labctl/cli/helpdoc.py generates it): a changed option, help text or command fails here until the page is
regenerated."""

from __future__ import annotations

from pathlib import Path

import pytest

from labctl.cli.helpdoc import OUT, REGENERATE, cli_markdown, command_paths

REPO = Path(__file__).resolve().parents[2]


def test_docs_cli_is_what_every_help_says() -> None:
    from labctl.core import registry

    others = sorted(
        {f"{c.package} ({c.name})" for group in registry.GROUPS for c in registry.claims(group)}
        - {f"{c.package} ({c.name})" for group in registry.GROUPS for c in registry.builtin_claims(group)}
    )
    if others:  # the page documents labctl's own; a plugin's kinds would show in some helps
        pytest.skip(f"plugins installed beside labctl: {', '.join(others)}")
    written = (REPO / OUT).read_text(encoding="utf-8")
    assert written == cli_markdown(), (
        f"{OUT} is out of date with the command line: regenerate it with `{REGENERATE}`"
    )


def test_the_page_has_every_command_and_group() -> None:
    paths = list(command_paths())
    assert paths[0] == ()
    names = {" ".join(path) for path in paths}
    # a plain command, a group, a group's command, two levels down: the walk reaches each kind
    assert {"run", "ocs", "ocs apply", "emulate fabric up", "replay import-kineto"} <= names
    page = (REPO / OUT).read_text(encoding="utf-8")
    for path in paths:
        assert f"\n## {' '.join(('labctl', *path))}\n" in page
