"""The CLI in-process: an OS error is one line, and no help text loses its brackets. `labctl run` as a real
subprocess is tests/integration/test_cli_run.py."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest


def test_an_os_error_is_one_line_and_exit_1(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """E.g. `labctl emulate fabric up` without root: the kernel's refusal, said once, with the likely cause."""
    import labctl.labs
    from labctl import cli

    def refuse(*_: object, **__: object) -> None:
        raise PermissionError(1, "Operation not permitted", "/run/netns")

    monkeypatch.setattr(sys, "argv", ["labctl", "inventory", "check", "inventory.yaml"])
    monkeypatch.setattr(labctl.labs, "load_inventory", refuse)
    with pytest.raises(SystemExit) as exit_info:
        cli.main()
    assert exit_info.value.code == 1
    stderr = capsys.readouterr().err
    assert stderr.count("\n") == 1 and "Operation not permitted" in stderr and "needs root" in stderr, stderr


def test_a_file_permission_error_names_the_file_not_a_capability(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    """`labctl plot` as a user on a root-owned run directory: the file's permissions, not CAP_NET_ADMIN."""
    from labctl import cli

    target = tmp_path / "timeline.png"
    target.write_text("")

    def refuse(*_: object, **__: object) -> None:
        raise PermissionError(13, "Permission denied", str(target))

    monkeypatch.setattr(sys, "argv", ["labctl", "inventory", "check", "inventory.yaml"])
    monkeypatch.setattr("labctl.labs.load_inventory", refuse)
    with pytest.raises(SystemExit) as exit_info:
        cli.main()
    assert exit_info.value.code == 1
    stderr = capsys.readouterr().err
    assert stderr.count("\n") == 1 and str(target) in stderr and "CAP_NET_ADMIN" not in stderr, stderr
    assert f"belongs to uid {os.getuid()}" in stderr


def test_no_help_text_loses_its_brackets() -> None:
    """Rich reads `[in, out]` as a markup tag and drops it: `patches: [[in, out], ...]` became `[, ...]`."""
    import re

    import typer.main
    from typer.testing import CliRunner

    from labctl.cli import app

    runner = CliRunner()
    commands: list[list[str]] = []

    def walk(command: object, path: list[str]) -> None:
        commands.append(path)
        for name, sub in getattr(command, "commands", {}).items():
            walk(sub, [*path, name])

    walk(typer.main.get_command(app), [])
    assert len(commands) > 20
    for path in commands:
        text = runner.invoke(app, [*path, "--help"], env={"COLUMNS": "200"}).output
        assert not re.search(r"\[\s*,|\[\]", text), (path, text)
    apply_help = runner.invoke(app, ["ocs", "apply", "--help"], env={"COLUMNS": "200"}).output
    assert "patches: [[in, out], ...]" in apply_help
