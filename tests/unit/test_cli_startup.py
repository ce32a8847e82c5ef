"""`labctl --help` starts quickly (issue 25), and stays so: behaviour, not speed, is asserted here.

What `import labctl.cli` and the command modules import when they load must not reach numpy, pandas,
matplotlib, pydantic, asyncio, the run engine, the analysis, the drivers or the lab kinds (read from the
modules' source, through labctl's own modules); a command's module is imported only when the command is used;
the root help lists every command exactly as if every module had been built; typer's help formatter comes
without rich.markdown and rich.traceback, and its help reads the same."""

from __future__ import annotations

import ast
import importlib
import sys
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

import pytest
import typer
import typer.core
import typer.main
from typer.testing import CliRunner

import labctl
import labctl.cli
from labctl.cli import COMMANDS, app
from labctl.cli.lazy import UNUSED_BY_HELP, _listing, _registered, preload_rich_help
from tests.helpers.architecture import parsed

REPO = Path(__file__).resolve().parents[2]
LABCTL = REPO / "labctl"

# Never imported while `labctl` starts and reads its command line: each is imported by the command that uses it.
HEAVY = (
    "numpy",
    "pandas",
    "matplotlib",
    "pyarrow",
    "pydantic",
    "msgspec",
    "yaml",
    "asyncio",
    "rich.progress",
    "rich.markdown",
    "rich.traceback",
    "labctl.run",
    "labctl.analysis",
    "labctl.scheduler",
    "labctl.workload",
    "labctl.ocs",
    "labctl.labs",
    "labctl.inventory",
    "labctl.probes",
    "labctl.agents",
    "labctl.emulators",
    "labctl.models",
    "labctl.linux",
    "labctl.rdma",
    "labctl.plans",
    "labctl.core.events",
)
COMMAND_MODULES = sorted(set(COMMANDS.values()))


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _load_time_imports(body: list[ast.stmt]) -> Iterator[str]:
    """The modules a module body imports as it runs: its top level, `if`/`try`/`with` blocks and class
    bodies; not function bodies (a lazy import) nor `if TYPE_CHECKING:`."""
    for node in body:
        if isinstance(node, ast.Import):
            yield from (alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            yield node.module
            yield from (f"{node.module}.{alias.name}" for alias in node.names)  # a submodule, maybe
        elif isinstance(node, ast.If):
            if not _is_type_checking(node.test):
                yield from _load_time_imports(node.body)
            yield from _load_time_imports(node.orelse)
        elif isinstance(node, ast.Try):
            for block in (node.body, *(h.body for h in node.handlers), node.orelse, node.finalbody):
                yield from _load_time_imports(block)
        elif isinstance(node, (ast.With, ast.ClassDef)):
            yield from _load_time_imports(node.body)


def _source(module: str) -> Path | None:
    path = REPO.joinpath(*module.split("."))
    for candidate in (path.with_suffix(".py"), path / "__init__.py"):
        if candidate.is_file():
            return candidate
    return None


def load_time_closure(module: str) -> dict[str, str]:
    """Every module that importing `module` imports, through labctl's own modules (read from source):
    name -> the labctl module that imports it. A package's __init__ runs before its submodules."""
    reached: dict[str, str] = {}
    todo = [module]
    while todo:
        current = todo.pop()
        path = _source(current)
        if path is None:
            continue
        parents = [".".join(current.split(".")[:i]) for i in range(1, current.count(".") + 1)]
        for name in [*parents, *_load_time_imports(parsed(path).body)]:
            if name not in reached and name != module:
                reached[name] = current
                if name == "labctl" or name.startswith("labctl."):
                    todo.append(name)
    return reached


def _heavy(reached: dict[str, str]) -> list[str]:
    return sorted(
        f"{name} (imported by {by})"
        for name, by in reached.items()
        if any(name == h or name.startswith(h + ".") for h in HEAVY)
    )


def test_the_closure_reader_sees_a_heavy_import() -> None:
    """The reader itself: labctl.run.lifecycle, the engine, does reach the heavy stack."""
    assert _heavy(load_time_closure("labctl.run.lifecycle"))


@pytest.mark.parametrize(
    "module", ["labctl.cli", "labctl.cli.__main__", "labctl.cli.lazy", "labctl.cli.common"]
)
def test_starting_labctl_imports_nothing_heavy(module: str) -> None:
    assert _heavy(load_time_closure(module)) == []


@pytest.mark.parametrize("module", COMMAND_MODULES)
def test_a_command_module_imports_its_heavy_dependencies_inside_its_commands(module: str) -> None:
    """`labctl --help` imports every command module (to list the commands): none may load the stack its
    commands run on; those imports belong inside the command functions."""
    assert _heavy(load_time_closure(f"labctl.cli.{module}")) == []


def test_the_command_table_is_what_the_modules_register() -> None:
    """COMMANDS names each top-level command's module: every module registers exactly its names."""
    for module in COMMAND_MODULES:
        registered = list(_listing(_registered(module)))
        assert sorted(registered) == sorted(n for n, m in COMMANDS.items() if m == module), module


def _eager_app() -> typer.Typer:
    """`app` as it was built before issue 25: every command module registered on one typer app."""
    eager = typer.Typer(
        help=app.info.help,
        no_args_is_help=True,
        add_completion=app._add_completion,
        pretty_exceptions_enable=False,
    )
    assert app.registered_callback is not None and app.registered_callback.callback is not None
    eager.callback()(app.registered_callback.callback)
    for module in dict.fromkeys(COMMANDS.values()):
        sys.modules[f"labctl.cli.{module}"].register(eager)
    return eager


def test_the_root_help_lists_every_command_as_if_all_were_built() -> None:
    runner = CliRunner()
    for module in COMMAND_MODULES:  # the eager app needs them all
        __import__(f"labctl.cli.{module}")
    for args in ([], ["--help"]):
        lazy = runner.invoke(app, args, env={"COLUMNS": "160"})
        eager = runner.invoke(_eager_app(), args, env={"COLUMNS": "160"})
        assert lazy.output == eager.output and lazy.exit_code == eager.exit_code
    text = runner.invoke(app, ["--help"], env={"COLUMNS": "160"}).output
    assert all(f" {name} " in text for name in COMMANDS)
    root = typer.main.get_command(app)
    assert isinstance(root, typer.core.TyperGroup) and list(root.commands) == list(COMMANDS)  # its order


@pytest.fixture
def fresh_cli(monkeypatch: pytest.MonkeyPatch) -> ModuleType:
    """labctl.cli imported anew, none of its command modules loaded; the originals are back afterwards."""
    monkeypatch.setattr(labctl, "cli", labctl.cli)
    for name in [m for m in sys.modules if m == "labctl.cli" or m.startswith("labctl.cli.")]:
        monkeypatch.delitem(sys.modules, name)
    import labctl.cli as cli

    return cli


def _command_modules_loaded() -> set[str]:
    # signals: loaded first by every `labctl` process, to handle SIGINT/SIGTERM from the start (decision 0073)
    return {m.rpartition(".")[2] for m in sys.modules if m.startswith("labctl.cli.")} - {
        "common",
        "lazy",
        "signals",
    }


@pytest.mark.parametrize(
    ("args", "modules"),
    [
        (["inventory", "check", str(REPO / "inventory.yaml")], {"inventory"}),
        (["run", "--help"], {"run"}),
        (["replay", "sweep", "--help"], {"replay"}),
        (["history", "--help"], {"queue"}),
        (["--version"], set()),
        (["inventroy"], set()),
    ],
)
def test_a_command_imports_only_its_own_module(
    fresh_cli: ModuleType, args: list[str], modules: set[str]
) -> None:
    assert _command_modules_loaded() == set()
    result = CliRunner().invoke(fresh_cli.app, args, env={"COLUMNS": "160"})
    assert result.exit_code == (2 if args == ["inventroy"] else 0), result.output
    assert _command_modules_loaded() == modules


def test_a_mistyped_command_is_still_suggested(
    fresh_cli: ModuleType, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """The suggestions read the command table: no module is built to say `Did you mean 'inventory'?`."""
    monkeypatch.setattr(sys, "argv", ["labctl", "inventroy", "check"])
    with pytest.raises(SystemExit) as exit_info:
        fresh_cli.main()
    assert exit_info.value.code == 2
    stderr = capsys.readouterr().err
    assert stderr.count("\n") == 1 and "No such command 'inventroy'" in stderr and "'inventory'" in stderr
    assert _command_modules_loaded() == set()


@pytest.fixture
def no_rich_help(monkeypatch: pytest.MonkeyPatch) -> None:
    """typer.rich_utils, rich.markdown and rich.traceback not imported yet; as they were afterwards."""
    import rich

    for name in ("typer.rich_utils", *UNUSED_BY_HELP):
        monkeypatch.delitem(sys.modules, name, raising=False)
    for package, attr in ((typer, "rich_utils"), (rich, "markdown"), (rich, "traceback")):
        monkeypatch.delattr(package, attr, raising=False)  # `from . import rich_utils` reads it first


@pytest.mark.usefixtures("no_rich_help")
@pytest.mark.parametrize("args", [["--help"], [], ["ocs"], ["ocs", "apply", "--help"], ["emulate", "fabric"]])
def test_the_help_formatter_comes_without_markdown_and_tracebacks(args: list[str]) -> None:
    """Whichever help (a command's, a group's, a bare group's, the root's), with the lighter formatter."""
    text = CliRunner().invoke(app, args, env={"COLUMNS": "160"}).output
    assert "Usage:" in text
    assert "typer.rich_utils" in sys.modules
    assert not set(UNUSED_BY_HELP) & set(sys.modules)


@pytest.mark.usefixtures("no_rich_help")
def test_the_stand_ins_are_the_real_classes_on_first_use() -> None:
    preload_rich_help()
    rich_utils = sys.modules["typer.rich_utils"]
    assert not set(UNUSED_BY_HELP) & set(sys.modules)
    from rich.markdown import Markdown  # the real modules are what others import
    from rich.traceback import Traceback

    assert isinstance(rich_utils.Markdown("*x*"), Markdown)
    assert rich_utils.Traceback.from_exception == Traceback.from_exception
    assert sys.modules["rich.markdown"].Markdown is Markdown is not rich_utils.Markdown


@pytest.mark.usefixtures("no_rich_help")
def test_the_help_reads_the_same_with_the_lighter_formatter() -> None:
    runner = CliRunner()
    paths = [[], ["run"], ["ocs", "apply"], ["replay", "sweep"], ["emulate", "fabric"]]
    importlib.import_module("typer.rich_utils")  # in full, as typer imports it
    assert "rich.markdown" in sys.modules
    full = [runner.invoke(app, [*p, "--help"], env={"COLUMNS": "160"}).output for p in paths]
    for name in ("typer.rich_utils", *UNUSED_BY_HELP):
        del sys.modules[name]
    delattr(typer, "rich_utils")
    light = [runner.invoke(app, [*p, "--help"], env={"COLUMNS": "160"}).output for p in paths]
    assert "rich.markdown" not in sys.modules
    assert light == full


def test_no_group_leaves_its_help_flag_none() -> None:
    """typer coerces a --help that was not given, None, with a pydantic TypeAdapter: `labctl run --help`
    imported pydantic for the root's --help alone. Every group's is False instead."""
    root = typer.main.get_command(app)
    groups = []

    def walk(command: object) -> None:
        if isinstance(command, typer.core.TyperGroup):
            groups.append(command)
            for sub in command.commands.values():
                walk(sub)

    walk(root)
    assert len(groups) > 5
    for group in groups:
        with root.make_context("labctl", [], resilient_parsing=True) as ctx:
            option = group.get_help_option(ctx)
            assert option is not None and option.default is False, group.name
