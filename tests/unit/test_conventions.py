"""labctl's conventions as a command and a service (issue 26): `python -m labctl`, shell completion through
the lazy command table, the services' logging (--log-level, --log-format; JSON lines for journald) and the
example systemd units under docs/systemd, whose ExecStart labctl must accept.

Pure (tests/unit): the CLI runs in this process. The same through real processes (the console script, an
agent against mosquitto, serve running a run) is tests/integration/test_conventions.py."""

from __future__ import annotations

import configparser
import io
import json
import logging
import re
import runpy
import shlex
import sys
import types
import typing
import warnings
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path

import pytest
import typer.main

import labctl.cli
from labctl.cli import COMMANDS
from labctl.core.logs import (
    FORMATS,
    LEVELS,
    JsonFormatter,
    TextFormatter,
    default_format,
    rfc3339,
    setup_logging,
)

REPO = Path(__file__).resolve().parents[2]
UNITS = REPO / "docs" / "systemd"
RFC3339_UTC = re.compile(r"^\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}\.\d{6}Z$")


# -- python -m labctl --------------------------------------------------------------------------------------------
def _as_labctl(monkeypatch: pytest.MonkeyPatch, args: list[str]) -> None:
    """Be the `labctl` script for click, which names the program (and its completion variable) after
    sys.argv[0] unless __main__ is a package's (here: pytest's)."""
    monkeypatch.setattr(sys, "argv", ["labctl", *args])
    monkeypatch.setitem(sys.modules, "__main__", types.ModuleType("__main__"))


def _run_module(args: list[str], monkeypatch: pytest.MonkeyPatch) -> int:
    """`python -m labctl ARGS` in this process; its exit code."""
    _as_labctl(monkeypatch, args)
    monkeypatch.setenv("COLUMNS", "160")
    try:
        # The file `python -m labctl` runs (run_module would ask pytest's import hook, which rewrites
        # labctl.testing's asserts, for code it does not give).
        runpy.run_path(str(REPO / "labctl" / "__main__.py"), run_name="__main__")
    except SystemExit as e:
        return int(e.code or 0)
    return 0


@pytest.mark.parametrize("args", [["--help"], ["run", "--help"]])
def test_python_m_labctl_is_the_labctl_command(
    args: list[str], monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    assert _run_module(args, monkeypatch) == 0
    help_text = capsys.readouterr().out
    assert "Usage: " in help_text  # (runpy names the program after the file it runs, __main__.py)
    if args == ["--help"]:
        assert all(name in help_text for name in COMMANDS)
    else:
        assert "--dry-run" in help_text


def test_python_m_labctl_maps_bad_input_to_exit_2(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    assert _run_module(["run", "--no-such-option"], monkeypatch) == 2
    assert "error:" in capsys.readouterr().err


# -- shell completion ------------------------------------------------------------------------------------------
def _complete(
    words: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], shell: str = "bash"
) -> list[str]:
    """What `labctl` answers a shell's completion request (click 8 through typer: _LABCTL_COMPLETE names
    the instruction as typer spells it, complete_<shell>; bash passes COMP_WORDS and COMP_CWORD)."""
    cword = len(words.split()) - (0 if words.endswith(" ") else 1)
    _as_labctl(monkeypatch, [])
    monkeypatch.setenv("_LABCTL_COMPLETE", f"complete_{shell}")
    monkeypatch.setenv("COMP_WORDS", words)
    monkeypatch.setenv("COMP_CWORD", str(cword))
    monkeypatch.setenv("_TYPER_COMPLETE_ARGS", words)  # zsh and fish: the command line so far
    with pytest.raises(SystemExit) as exited:
        labctl.cli.main()
    assert exited.value.code == 0
    return capsys.readouterr().out.split()


def test_show_completion_prints_the_bash_script(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    _as_labctl(monkeypatch, ["--show-completion", "bash"])
    # The shell named, not the one found among this process's ancestors (none when pytest runs detached):
    # Typer's switch for exactly that.
    monkeypatch.setenv("_TYPER_COMPLETE_TEST_DISABLE_SHELL_DETECTION", "1")
    with pytest.raises(SystemExit) as exited:
        labctl.cli.main()
    assert exited.value.code == 0
    script = capsys.readouterr().out
    assert "_LABCTL_COMPLETE=complete_bash" in script
    assert "complete -o default -F _labctl_completion labctl" in script


def test_the_root_help_offers_completion(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    assert _run_module(["--help"], monkeypatch) == 0
    help_text = capsys.readouterr().out
    assert "--install-completion" in help_text and "--show-completion" in help_text


@pytest.mark.parametrize(
    ("words", "expected"),
    [
        ("labctl ", list(COMMANDS)),  # every command, from the lazy table, in its order
        ("labctl ru", ["run", "runs"]),
        ("labctl inv", ["inventory"]),
        ("labctl inventory ", ["check"]),  # a group's own subcommands: its module built on demand
        ("labctl agent --log-", ["--log-level", "--log-format"]),
        ("labctl serve --log-format ", ["json", "text"]),
        ("labctl agent --log-level ", list(LEVELS)),
    ],
)
def test_completion_through_the_lazy_command_table(
    words: str, expected: list[str], monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    assert _complete(words, monkeypatch, capsys) == expected


def test_zsh_completion_names_each_command_with_its_help(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    got = " ".join(_complete("labctl ag", monkeypatch, capsys, shell="zsh"))
    assert '"agent":"Run this host' in got


# -- the services' logging -----------------------------------------------------------------------------------------
@pytest.fixture
def restore_logging() -> Iterator[None]:
    """setup_logging changes the root logger, labctl's level and where warnings go: put them back."""
    root, ours = logging.getLogger(), logging.getLogger("labctl")
    handlers, root_level, our_level = list(root.handlers), root.level, ours.level
    showwarning = warnings.showwarning
    try:
        yield
    finally:
        for h in [h for h in root.handlers if h not in handlers]:
            root.removeHandler(h)
        root.setLevel(root_level)
        ours.setLevel(our_level)
        logging.captureWarnings(False)
        warnings.showwarning = showwarning


def _lines(stream: io.StringIO) -> list[dict[str, object]]:
    return [json.loads(line) for line in stream.getvalue().splitlines()]


def test_json_lines_carry_time_level_logger_message_and_fields(restore_logging: None) -> None:
    stream = io.StringIO()
    setup_logging("info", "json", stream=stream)
    log = logging.getLogger("labctl.scheduler")
    log.info(
        "run %d finished: %s", 7, "completed", extra={"run_id": 7, "status": "completed", "dir": Path("x")}
    )
    log.debug("not at info")
    try:
        raise RuntimeError("boom\nsecond line")
    except RuntimeError:
        log.exception("run %d: failed", 8)
    first, second = _lines(stream)  # one object per line, even for a traceback
    assert first["msg"] == "run 7 finished: completed"
    assert (first["level"], first["logger"]) == ("info", "labctl.scheduler")
    assert (first["run_id"], first["status"], first["dir"]) == (7, "completed", "x")
    assert RFC3339_UTC.match(str(first["ts"])), first["ts"]
    assert list(first)[:4] == ["ts", "level", "logger", "msg"]
    assert second["level"] == "error" and "RuntimeError: boom" in str(second["exc"])


def test_the_level_is_labctls_and_other_libraries_log_warnings_only(restore_logging: None) -> None:
    stream = io.StringIO()
    setup_logging("debug", "json", stream=stream)
    logging.getLogger("labctl.agents").debug("ours")
    logging.getLogger("aiomqtt").info("theirs, chatty")
    logging.getLogger("aiomqtt").warning("theirs, worth it")
    assert [line["msg"] for line in _lines(stream)] == ["ours", "theirs, worth it"]
    stream.truncate(0)
    stream.seek(0)
    setup_logging("warning", "json", stream=stream)  # again: replaces, never doubles, the handler
    logging.getLogger("labctl.agents").info("below warning")
    logging.getLogger("labctl.agents").warning("once")
    assert [line["msg"] for line in _lines(stream)] == ["once"]


def test_a_python_warning_is_a_log_line_too(restore_logging: None) -> None:
    stream = io.StringIO()
    setup_logging("info", "json", stream=stream)
    with warnings.catch_warnings():
        warnings.simplefilter("always")  # not labctl's test setting, "error"
        warnings.warn_explicit("odd thing", RuntimeWarning, "x.py", 1)
        # a library's deprecation notice is not a user's concern: dropped (tests/unit/test_quiet_import.py)
        warnings.warn_explicit("deprecated thing", DeprecationWarning, "x.py", 2)
    [line] = _lines(stream)
    assert line["logger"] == "py.warnings" and "odd thing" in str(line["msg"])


def test_text_for_a_terminal_json_otherwise() -> None:
    class Tty(io.StringIO):
        def isatty(self) -> bool:
            return True

    assert default_format(Tty()) == "text"
    assert default_format(io.StringIO()) == "json"
    record = logging.LogRecord("labctl.agents", logging.INFO, "f.py", 1, "agent %s up", ("h1",), None)
    record.host = "h1"
    assert TextFormatter().format(record).endswith("INFO labctl.agents: agent h1 up (host=h1)")
    assert json.loads(JsonFormatter().format(record))["host"] == "h1"


def test_rfc3339_is_utc() -> None:
    assert rfc3339(0.5) == "1970-01-01T00:00:00.500000Z"
    assert datetime.fromisoformat(rfc3339(1.7e9)).utcoffset() is not None


def test_bad_levels_and_formats_are_refused(restore_logging: None) -> None:
    with pytest.raises(ValueError, match="log level"):
        setup_logging("verbose", "json", stream=io.StringIO())  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="log format"):
        setup_logging("info", "xml", stream=io.StringIO())  # type: ignore[arg-type]


def _params(command: str) -> dict[str, typer.core.TyperOption]:
    """A top-level command's click options by their first name (the command built from its module)."""
    group = typer.main.get_command(labctl.cli.app)
    with typer.Context(group) as ctx:
        cmd = group.get_command(ctx, command)  # type: ignore[attr-defined]
    assert cmd is not None
    return {p.opts[0]: p for p in cmd.params if isinstance(p, typer.core.TyperOption)}


def _choices(option: typer.core.TyperOption) -> tuple[object, ...]:
    """The values of an option typed Literal[...] (or Literal[...] | None)."""
    annotation = option.type_descriptor.annotation
    literals = [a for a in typing.get_args(annotation) if typing.get_origin(a) is typing.Literal]
    return tuple(v for lit in literals for v in typing.get_args(lit)) or typing.get_args(annotation)


def test_agent_and_serve_take_the_same_logging_options() -> None:
    agent, serve = _params("agent"), _params("serve")
    for name, choices, default in (("--log-level", LEVELS, "info"), ("--log-format", FORMATS, None)):
        a, s = agent[name], serve[name]
        assert _choices(a) == _choices(s) == choices
        assert a.default == s.default == default
        assert a.help == s.help


# -- the example systemd units --------------------------------------------------------------------------------
def _unit(path: Path) -> configparser.ConfigParser:
    parser = configparser.ConfigParser(strict=False, interpolation=None)
    parser.optionxform = str  # type: ignore[assignment,method-assign]  # systemd's keys are case-sensitive
    parser.read_string(path.read_text())
    return parser


@pytest.mark.parametrize(
    ("unit", "command"), [("labctl-agent.service", "agent"), ("labctl-serve.service", "serve")]
)
def test_each_units_exec_start_is_a_command_line_labctl_accepts(unit: str, command: str) -> None:
    parsed = _unit(UNITS / unit)
    assert {"Unit", "Service", "Install"} <= set(parsed.sections())
    service = parsed["Service"]
    argv = shlex.split(service["ExecStart"])
    assert Path(argv[0]).name == "labctl" and argv[1] == command, argv
    # systemd's specifiers (%H: the host name) and ${VAR}s become values; then click parses the line as
    # `labctl` would, checking every option's name and value (a choice, a number) but running nothing.
    args = [re.sub(r"%[a-zA-Z]|\$\{\w+\}", "x", a) for a in argv[2:]]
    options = _params(command)
    assert [a for a in args if a.startswith("-") and a not in options and a != "-i"] == []
    group = typer.main.get_command(labctl.cli.app)
    with typer.Context(group, info_name="labctl") as ctx:
        cmd = group.get_command(ctx, command)  # type: ignore[attr-defined]
        assert cmd is not None
        with cmd.make_context(command, args, parent=ctx, resilient_parsing=False) as sub:
            assert sub.params["log_format"] == "json" and sub.params["log_level"] == "info"
    # Secrets come from an EnvironmentFile, never from the unit itself.
    assert service.get("EnvironmentFile", "").startswith("/etc/labctl/")
    assert not re.search(r"(?i)password|secret|auth_key|token", service.get("Environment", ""))
    assert service["RestartPreventExitStatus"] == "2"  # bad input: a restart cannot fix it


def test_the_units_readme_names_both_units() -> None:
    readme = (UNITS / "README.md").read_text()
    assert "labctl-agent.service" in readme and "labctl-serve.service" in readme
    assert "EnvironmentFile" in readme and "journal" in readme
