"""docs/cli.md: every command's `--help`, as labctl prints it, on one page of the documentation site.

Generated, never written by hand: `python3 -m labctl.cli.helpdoc --out docs/cli.md` walks the command tree
(every group and command `labctl --help` lists, hidden ones left out) and runs each one's `--help` at a
fixed width with colour off, so the page reads as a terminal shows it. tests/unit/test_cli_reference.py
regenerates it and fails while the page differs, so it cannot go stale.
"""

from __future__ import annotations

import argparse
from collections.abc import Iterator
from pathlib import Path
from typing import Any

OUT = Path("docs/cli.md")
REGENERATE = "python3 -m labctl.cli.helpdoc --out docs/cli.md"
# Wide enough for a docstring's source lines (ruff's 110 columns less the indent): rich keeps a help
# text's line breaks, so a narrower terminal splits each of those lines in two.
WIDTH = 120
# What the help is printed under: no colour, no terminal-dependent width, no completion environment.
ENV = {"COLUMNS": str(WIDTH), "TERMINAL_WIDTH": str(WIDTH), "NO_COLOR": "1", "TERM": "dumb"}

HEADER = f"""\
# Command line

<!-- Generated from labctl's own --help by `{REGENERATE}`: do not edit by hand. -->

Every `labctl` command and what `labctl COMMAND --help` prints for it. The fields of the files these commands
read (inventory, experiment, delay profile) are in the [configuration reference](reference.md).
tests/unit/test_cli_reference.py regenerates this page and fails while it is out of date.
"""


def command_paths() -> Iterator[tuple[str, ...]]:
    """Each command's words after `labctl` (the root first, `()`), depth first, in the order each group's
    help lists its commands; hidden commands left out."""
    import typer.main

    from labctl.cli import app

    root = typer.main.get_command(app)

    def walk(command: Any, path: tuple[str, ...], ctx: Any) -> Iterator[tuple[str, ...]]:
        yield path
        list_commands = getattr(command, "list_commands", None)
        if list_commands is None:
            return
        for name in list_commands(ctx):
            sub = command.get_command(ctx, name)
            if sub is None or getattr(sub, "hidden", False):
                continue
            yield from walk(sub, (*path, name), type(ctx)(sub, info_name=name, parent=ctx))

    yield from walk(root, (), typer.main.get_command(app).make_context("labctl", [], resilient_parsing=True))


def help_text(path: tuple[str, ...]) -> str:
    """`labctl PATH --help` as printed, each line's trailing blanks (rich pads to the width) removed."""
    import typer.rich_utils
    from typer.testing import CliRunner

    from labctl.cli import app

    # typer reads TERMINAL_WIDTH once, when typer.rich_utils is first imported: a process that imported it
    # under another width (a test's own environment, a terminal) would print at that width whatever ENV says
    saved = typer.rich_utils.MAX_WIDTH
    typer.rich_utils.MAX_WIDTH = WIDTH
    try:
        done = CliRunner().invoke(app, [*path, "--help"], env=ENV, prog_name="labctl")
    finally:
        typer.rich_utils.MAX_WIDTH = saved
    if done.exit_code != 0:
        raise RuntimeError(f"{' '.join(('labctl', *path, '--help'))} exited {done.exit_code}:\n{done.output}")
    lines = [line.rstrip() for line in done.output.splitlines()]
    while lines and not lines[0]:
        lines.pop(0)
    while lines and not lines[-1]:
        lines.pop()
    return "\n".join(lines)


def cli_markdown() -> str:
    """docs/cli.md: a section per command, its `--help` in a text block."""
    parts = [HEADER]
    for path in command_paths():
        parts += [f"## {' '.join(('labctl', *path))}", "", "```text", help_text(path), "```", ""]
    return "\n".join(parts)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python3 -m labctl.cli.helpdoc", description=__doc__.split("\n")[0])
    parser.add_argument("--out", type=Path, help=f"write the page here (the site's: {OUT}); default stdout")
    args = parser.parse_args(argv)
    text = cli_markdown()
    if args.out is None:
        print(text, end="")
    else:
        args.out.write_text(text, encoding="utf-8")


if __name__ == "__main__":
    main()
