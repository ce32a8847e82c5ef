"""What keeps `labctl` quick to start (issue 25): a command's module is imported, and its typer signature
turned into a click command, only when that command is used; typer's help formatter is imported without
the two rich modules labctl's help never uses; and no --help flag that was not given imports pydantic.

typer builds every command of an app (reading each function's signature and evaluating its annotations)
whenever the app is called, and each command module imports what its commands share: with one module per
command group, that was every group's module and every command's parameters for `labctl inventory check`.
`LazyGroup` holds a table, command name -> module, instead: resolving `inventory` imports
labctl/cli/inventory.py alone. The root help lists every command from the modules' registrations (name,
help, hidden, deprecated, panel) without building any command's parameters.
"""

from __future__ import annotations

import importlib
import inspect
import sys
import types
from collections.abc import Iterator, Mapping, MutableMapping
from typing import TYPE_CHECKING, Any, ClassVar

import typer
import typer.main
from typer.core import TyperCommand, TyperGroup, TyperOption
from typer.models import DefaultPlaceholder

if TYPE_CHECKING:
    from typer._click import Command as ClickCommand
    from typer._click import Context, HelpFormatter

PACKAGE = "labctl.cli"

# typer.rich_utils imports rich.markdown (markdown-it, pygments) for rich_markup_mode="markdown" and
# rich.traceback (rich.pretty, attrs) for its pretty exceptions; labctl uses neither (markup mode "rich",
# pretty_exceptions_enable=False), and they were a third of the time `labctl --help` spent importing.
UNUSED_BY_HELP = {"rich.markdown": "Markdown", "rich.traceback": "Traceback"}


class _Deferred(type):
    """A stand-in class: calling it, or reading an attribute it lacks, imports the real one and uses it."""

    target: tuple[str, str]

    def real(cls) -> Any:
        module, name = cls.target
        return getattr(importlib.import_module(module), name)

    def __call__(cls, *args: Any, **kwargs: Any) -> Any:
        return cls.real()(*args, **kwargs)

    def __getattr__(cls, name: str) -> Any:
        return getattr(cls.real(), name)


def preload_rich_help() -> None:
    """Import typer.rich_utils (the formatter of every --help) with stand-ins for `UNUSED_BY_HELP`'s
    classes, each importing the real module on first use. The stand-in modules are gone again once
    typer.rich_utils is in: any other import of rich.markdown or rich.traceback gets the real module. If
    typer's formatter does not import this way, nothing changes: it is imported in full for the help."""
    if "typer.rich_utils" in sys.modules:
        return
    stand_ins: dict[str, types.ModuleType] = {}
    for module, name in UNUSED_BY_HELP.items():
        if module not in sys.modules:
            stand_ins[module] = types.ModuleType(module, f"labctl's stand-in for {module} (labctl.cli.lazy)")
            setattr(stand_ins[module], name, _Deferred(name, (), {"target": (module, name)}))
    sys.modules.update(stand_ins)
    try:
        importlib.import_module("typer.rich_utils")
    except Exception:
        sys.modules.pop("typer.rich_utils", None)
    finally:
        for module, stand_in in stand_ins.items():
            if sys.modules.get(module) is stand_in:
                del sys.modules[module]


class Command(TyperCommand):
    """A typer command whose help is formatted by the lighter typer.rich_utils (`preload_rich_help`)."""

    def format_help(self, ctx: Context, formatter: HelpFormatter) -> None:
        preload_rich_help()
        super().format_help(ctx, formatter)


class Group(TyperGroup):
    """A typer group formatted like `Command`, whose --help, when not given, is False: typer leaves it None
    and coerces that with a pydantic TypeAdapter, importing pydantic (most of the time `labctl run --help`
    took). False is what click's own flags default to; the help reads the same."""

    def get_help_option(self, ctx: Context) -> TyperOption | None:
        option = super().get_help_option(ctx)
        if option is not None and option.default is None:
            option.default = False
        return option

    def format_help(self, ctx: Context, formatter: HelpFormatter) -> None:
        preload_rich_help()  # also for a bare group: click formats its help as it raises NoArgsIsHelpError
        super().format_help(ctx, formatter)


def use_own_classes(app: typer.Typer) -> None:
    """Build `app`'s commands as `Command` and its groups (and theirs) as `Group`, where their own code
    picks no class."""
    for command in app.registered_commands:
        if command.cls in (None, TyperCommand):  # typer's default
            command.cls = Command
    for info in app.registered_groups:
        sub = info.typer_instance
        if sub is None:
            continue
        if isinstance(info.cls, DefaultPlaceholder) and isinstance(sub.info.cls, DefaultPlaceholder):
            info.cls = Group
        use_own_classes(sub)


def _registered(module: str) -> typer.Typer:
    """A throwaway app holding what labctl/cli/<module>.py registers (its `register(app)`), unbuilt."""
    holder = typer.Typer()
    importlib.import_module(f"{PACKAGE}.{module}").register(holder)
    use_own_classes(holder)
    return holder


def _listing(holder: typer.Typer) -> dict[str, ClickCommand]:
    """Each command and group of `holder` as a group's help lists it: name, help, short help, hidden,
    deprecated and help panel, as typer derives them; no parameters (building those is the slow part)."""
    found: dict[str, ClickCommand] = {}
    for info in holder.registered_commands:
        assert info.callback is not None
        name = info.name or typer.main.get_command_name(info.callback.__name__)
        text = inspect.getdoc(info.callback) if info.help is None else inspect.cleandoc(info.help)
        found[name] = Command(
            name,
            help=text,
            short_help=info.short_help,
            hidden=info.hidden,
            deprecated=info.deprecated,
            rich_help_panel=info.rich_help_panel,
        )
    for group in holder.registered_groups:
        solved = typer.main.solve_typer_info_defaults(group)
        if solved.name:
            found[solved.name] = Command(
                solved.name,
                help=solved.help,
                short_help=solved.short_help,
                hidden=solved.hidden,
                deprecated=solved.deprecated,
                rich_help_panel=solved.rich_help_panel,
            )
    return found


class LazyCommands(MutableMapping[str, "ClickCommand"]):
    """A group's subcommands by name. Looking one up imports its module and builds that module's commands;
    names, membership and iteration read the table alone."""

    def __init__(
        self, modules: Mapping[str, str], group: TyperGroup, built: Mapping[str, ClickCommand]
    ) -> None:
        self.modules = dict(modules)
        self._group = group
        self._built = dict(built)

    def _build(self, module: str) -> None:
        holder = _registered(module)
        holder.rich_markup_mode = self._group.rich_markup_mode
        holder.suggest_commands = self._group.suggest_commands
        for name, command in typer.main.get_group(holder).commands.items():
            self._built.setdefault(name, command)

    def __getitem__(self, name: str) -> ClickCommand:
        if name not in self._built and name in self.modules:
            self._build(self.modules[name])
        return self._built[name]  # KeyError: no such command (a module that lacks its name, too)

    def listing(self) -> dict[str, ClickCommand]:
        """Every command as the group's help lists it: a built one as it is, the others unbuilt."""
        shown: dict[str, ClickCommand] = {}
        for module in dict.fromkeys(m for n, m in self.modules.items() if n not in self._built):
            shown.update(_listing(_registered(module)))
        return {name: c for name in self if (c := self._built.get(name) or shown.get(name)) is not None}

    def __iter__(self) -> Iterator[str]:
        yield from self.modules
        yield from (name for name in self._built if name not in self.modules)

    def __len__(self) -> int:
        return len(self.modules.keys() | self._built.keys())

    def __contains__(self, name: object) -> bool:
        return name in self.modules or name in self._built

    def __setitem__(self, name: str, command: ClickCommand) -> None:
        self._built[name] = command

    def __delitem__(self, name: str) -> None:
        if name not in self:
            raise KeyError(name)
        self.modules.pop(name, None)
        self._built.pop(name, None)


class LazyGroup(Group):
    """A `Group` whose subcommands are `MODULES` (name -> module of labctl.cli), built on first use."""

    MODULES: ClassVar[Mapping[str, str]] = {}

    def __init__(self, **attrs: Any) -> None:
        super().__init__(**attrs)
        self.commands = LazyCommands(self.MODULES, self, self.commands)

    def list_commands(self, ctx: Context) -> list[str]:
        return list(self.commands)  # TyperGroup's reads .items(): every command built

    def format_help(self, ctx: Context, formatter: HelpFormatter) -> None:
        commands = self.commands
        if isinstance(commands, LazyCommands):
            self.commands = commands.listing()
        try:
            super().format_help(ctx, formatter)
        finally:
            self.commands = commands


def lazy_group(modules: Mapping[str, str]) -> type[LazyGroup]:
    """The group class for a typer app whose commands are `modules` (`typer.Typer(cls=...)`)."""
    return type("LazyGroup", (LazyGroup,), {"MODULES": dict(modules)})
