"""SIGINT and SIGTERM in the `labctl` process outside the run's event loop (decision 0073).

Inside `labctl run`'s event loop the loop's own handlers stop the run (labctl.cli.run). Outside it a signal
would be Python's: a `KeyboardInterrupt` traceback wherever the interpreter was (an import, argument
parsing, the summary being printed), or for SIGTERM a silent death by signal. So the command line installs
`guard` as early as its package is imported, in the `labctl` process only (`is_cli_process`: never in a
process that merely imports labctl.cli, such as a test runner), and:

- before the run's loop (imports, parsing, a dry run): nothing was started, so a signal ends the process
  at once with one line and exit code 130 (`Stage.EXIT`);
- after it (the run's record is final): the line is printed, the rest (its summary) goes on, and the
  command's exit code is 130 (`Stage.NOTE`, `noted`);
- once all is printed (`settle`): ignored to the exit, so the interpreter's finalization, which restores
  the default action of a handled signal, cannot end a finished run by signal.

Only the window before Python runs labctl's first line (interpreter start-up, tens of ms) is left to Python;
a parent that starts labctl with the two signals blocked closes it: they stay pending until the guard is
installed, and are then delivered to it.
Other commands get Python's handlers back once the command is known (`release`).
"""

from __future__ import annotations

import contextlib
import enum
import os
import signal
import sys
from pathlib import Path
from types import FrameType
from typing import Any

SIGNALS = (signal.SIGINT, signal.SIGTERM)
EXIT_ABORTED = 130


class Stage(enum.Enum):
    EXIT = "exit"
    """Nothing has started: end now, with one line."""
    NOTE = "note"
    """The work is done and recorded: say so once, let it finish, exit 130."""


_previous: dict[int, Any] = {}
_stage = Stage.EXIT
_line = "aborted: {name} before the run started; nothing was changed"
_noted: list[str] = []


def is_cli_process(argv: list[str] | None = None) -> bool:
    """Whether this interpreter was started as the `labctl` command: the console script, `python -m
    labctl` or `python -m labctl.cli` (from `sys.orig_argv`: known before any module has run)."""
    args = list(getattr(sys, "orig_argv", []) if argv is None else argv)[1:]
    i = 0
    while i < len(args):
        arg = args[i]
        if arg == "-m":
            return i + 1 < len(args) and args[i + 1] in ("labctl", "labctl.cli")
        if arg.startswith("-m"):
            return arg[2:] in ("labctl", "labctl.cli")
        if arg in ("-c",) or arg.startswith("-c"):
            return False
        if arg in ("-X", "-W"):  # options that take a value
            i += 2
            continue
        if arg.startswith("-"):
            i += 1
            continue
        script = Path(arg)
        return script.name == "labctl" or script.parts[-2:] in (
            ("labctl", "__main__.py"),
            ("cli", "__main__.py"),
        )
    return False


def _handler(signum: int, frame: FrameType | None) -> None:
    name = signal.Signals(signum).name
    if _stage is Stage.EXIT:
        _write(_line.format(name=name))
        os._exit(EXIT_ABORTED)
    if not _noted:
        _noted.append(name)
        _write(_line.format(name=name))


def _write(line: str) -> None:
    """One line on stderr, straight to the descriptor: a handler may run in the middle of a buffered write
    of the same stream, which Python refuses to re-enter."""
    with contextlib.suppress(OSError):
        os.write(2, (line + "\n").encode(errors="replace"))


def guard(stage: Stage = Stage.EXIT, line: str | None = None) -> None:
    """Handle SIGINT and SIGTERM as `stage` says, with `line` (`{name}`: the signal's name) said once."""
    global _stage, _line
    _stage = stage
    if line is not None:
        _line = line
    for sig in SIGNALS:
        previous = signal.signal(sig, _handler)
        if previous is not _handler:
            _previous.setdefault(sig, previous)


def release() -> None:
    """Python's handlers back (those found when `guard` was first installed)."""
    for sig, previous in list(_previous.items()):
        signal.signal(sig, previous)
    _previous.clear()


def settle() -> None:
    """The command's work is done and said: SIGINT and SIGTERM are ignored from here to the exit. Python's
    finalization puts back the default action of a signal it handled (death by signal, after a run had
    printed `status: completed`), but leaves an ignored one ignored."""
    for sig in SIGNALS:
        signal.signal(sig, signal.SIG_IGN)


def noted() -> str | None:
    """The signal that came after the work was done (`Stage.NOTE`), if one did."""
    return _noted[0] if _noted else None


def installed() -> bool:
    return signal.getsignal(signal.SIGINT) is _handler


def for_command(args: list[str]) -> None:
    """Keep the guard for `labctl run` only: every other command keeps Python's handlers (and its own)."""
    command = next((a for a in args if not a.startswith("-")), None)
    if command != "run":
        release()


if is_cli_process():  # as early as labctl.cli is imported (before typer, rich and the command's modules)
    guard()
    # A parent that started labctl with SIGINT/SIGTERM blocked (a supervisor; bench/interrupt.py, so that
    # a burst in the interpreter's own start-up waits for labctl) has them delivered now, to the guard.
    signal.pthread_sigmask(signal.SIG_UNBLOCK, SIGNALS)
