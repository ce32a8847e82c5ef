"""The `labctl` command line: one module per command group, each adding its commands to `app`.

Bad input is one line on stderr and exit code 2 (`main` is the one place that maps errors to exit codes);
a device or environment problem is one line and exit code 1; Ctrl-C is 130.

A command's module is imported only when the command runs (or a help lists it): `COMMANDS` says which
module registers which command, and labctl/cli/lazy.py explains why. A command module imports its heavy
dependencies (asyncio, pandas, the run engine, drivers, rich tables) inside its functions.
"""

from __future__ import annotations

import errno
import os
import sys
from typing import Annotated

# First: a `labctl` process handles SIGINT/SIGTERM from here on, before typer and rich load (decision 0073).
from labctl.cli import signals

# isort: split
import typer

from labctl.cli.common import EXIT_ABORTED, err, out
from labctl.cli.lazy import lazy_group
from labctl.core.errors import InputError, LabctlError
from labctl.core.extras import hide_library_deprecations

# Every top-level command, in the order `labctl --help` lists them, and the module (labctl/cli/<module>.py)
# whose `register(app)` adds it.
COMMANDS = {
    **{command: command for command in ("run", "report", "compare", "plot")},
    **dict.fromkeys(("serve", "submit", "queue", "cancel", "history"), "queue"),
    "dashboard": "dashboard",
    "agent": "agent",
    "tune": "tune",
    # plain commands before the groups: typer lists them so when all are built
    **{command: command for command in ("runs", "init", "plugins", "schema", "export", "cost", "whatif")},
    **{group: group for group in ("inventory", "lab", "ocs", "emulate", "probe", "dom", "bench", "plan")},
    "replay": "replay",
}

app = typer.Typer(
    cls=lazy_group(COMMANDS),
    help="labctl: time optical circuit switch reconfigurations, from the switch command to traffic "
    "resuming.\n\n"
    "Start with `labctl run reconfig-timeline` (a built-in experiment on the simulated Opus testbed, from "
    "any directory, no root needed; `--profile fast` for seconds), then `labctl report` (the newest run in "
    "runs/) and open the run's headline.png and timeline.png.",
    no_args_is_help=True,
    add_completion=True,
    pretty_exceptions_enable=False,
)


def _print_version(value: bool) -> None:
    if value:
        from labctl.core.version import __version__

        out.print(f"labctl {__version__}")
        raise typer.Exit()


@app.callback()
def _root(
    version: Annotated[
        bool,
        typer.Option(
            "--version", callback=_print_version, is_eager=True, help="Print labctl's version and exit."
        ),
    ] = False,
) -> None:
    """labctl: time optical circuit switch reconfigurations, from the switch command to traffic resuming."""


def _permission_hint(e: PermissionError) -> str:
    """EPERM is a missing capability (netns, netlink, tc); EACCES on a path is that file's permissions."""
    if e.errno == errno.EACCES and e.filename:
        try:
            owner = f"; it belongs to uid {os.stat(e.filename).st_uid}"
        except OSError:
            owner = ""
        return f" (you are uid {os.geteuid()}{owner}: run as its owner, or write elsewhere)"
    return " (this needs root: CAP_NET_ADMIN and CAP_SYS_ADMIN)"


def main() -> None:
    """Console entry point: bad input is one line on stderr and exit code 2, never a traceback."""
    signals.for_command(sys.argv[1:])
    hide_library_deprecations()
    try:
        # With standalone_mode=False click returns the code of a typer.Exit instead of raising it.
        code = app(standalone_mode=False)
    except InputError as e:
        err.print(f"error: {e}", markup=False, highlight=False, soft_wrap=True)
        sys.exit(2)
    except LabctlError as e:
        err.print(f"error: {e}", markup=False, highlight=False, soft_wrap=True)
        sys.exit(1)
    except typer.Exit as e:
        sys.exit(e.exit_code)
    except typer.Abort:
        err.print("aborted")
        sys.exit(EXIT_ABORTED)
    except BrokenPipeError:
        # `labctl history | head`: the reader left; say nothing more (and let Python's exit flush nowhere).
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        sys.exit(1)
    except OSError as e:
        # The environment said no (permissions, a missing device, a busy port): one line, not a traceback.
        if os.environ.get("LABCTL_DEBUG"):
            raise
        hint = _permission_hint(e) if isinstance(e, PermissionError) else ""
        err.print(f"error: {e}{hint}", markup=False, highlight=False, soft_wrap=True)
        sys.exit(1)
    except Exception as e:
        # Usage errors (unknown option, missing argument, bad value): one line and exit code 2. Matched by
        # shape, not class: typer may bundle its own copy of click. A bare command group shows its help.
        show, exit_code = getattr(e, "show", None), getattr(e, "exit_code", None)
        if callable(show) and isinstance(exit_code, int):
            message, ctx = getattr(e, "format_message", None), getattr(e, "ctx", None)
            if type(e).__name__ == "NoArgsIsHelpError" or not callable(message):
                show()
            else:
                where = f" (see: {ctx.command_path} --help)" if ctx is not None else ""
                err.print(f"error: {message()}{where}", markup=False, highlight=False, soft_wrap=True)
            sys.exit(exit_code)
        raise
    if isinstance(code, int) and code:
        sys.exit(code)
