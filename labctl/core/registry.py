"""Where labctl finds every kind of lab, switch driver, probe and experiment: Python entry points, one
group per concern (`GROUPS`), name → `module:attribute` of its entry, imported on first use.

labctl declares its own entries the same way (pyproject.toml, `[project.entry-points."labctl.…"]`), so a
package installed beside it adds a driver, a probe, a lab kind or an experiment kind by declaring entry
points in these groups, with no edit to labctl (decision 0055). The tables below are labctl's built-ins:
the registry reads them where labctl's own distribution metadata is not installed (a source tree on
PYTHONPATH), and tests/unit/test_plugins.py holds them equal to pyproject.toml's entry points.

Adding a built-in is a line here and in pyproject.toml plus its own module(s): a switch driver brings its
config model, how to open it and how to emulate it (labctl.ocs.switches.SwitchDriver); a lab kind its check
and builder (labctl.labs.base.LabKind); a probe its signals and factory (labctl.probes.base.ProbeKind).
Nothing else in labctl branches on these names (tests/unit/test_architecture.py holds that). Entries live
in their own modules and are imported lazily, so an optional dependency is only needed by what uses it.

The installed entry points are read once, on first use (not by `labctl --help`); `claims` lists who claims
what. An entry that does not load, or a name two packages claim, is a `PluginError` when that name is used
and a line of `labctl plugins`; every other name keeps working.

This module imports nothing of labctl's above errors: the typed registries are built next to their entry
types (labctl.ocs.switches, labctl.probes, labctl.labs), which keeps every import pointing one way.
"""

from __future__ import annotations

import functools
import importlib
import weakref
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Generic, Protocol, TypeVar

from labctl.core.errors import InputError, LabctlError
from labctl.core.version import DISTRIBUTION

SWITCH_DRIVERS: Mapping[str, str] = {
    "sim": "labctl.ocs.drivers.sim:DRIVER",
    "polatis-tl1": "labctl.ocs.drivers.polatis_tl1:DRIVER",
    "polatis-netconf": "labctl.ocs.drivers.polatis_netconf:DRIVER",
    "polatis-scpi": "labctl.ocs.drivers.polatis_scpi:DRIVER",
    "dicon-serial": "labctl.ocs.drivers.dicon_serial:DRIVER",
}
DEFAULT_LAB_KIND = "simulated"
LAB_KINDS: Mapping[str, str] = {
    "simulated": "labctl.labs.simulated:KIND",
    "kernel": "labctl.labs.kernel:KIND",
    "agents": "labctl.labs.agents:KIND",
    "real": "labctl.labs.real:KIND",
}
DEFAULT_EXPERIMENT_KIND = "timeline"
EXPERIMENT_KINDS: Mapping[str, str] = {
    "timeline": "labctl.run.experiment:KIND",
    "replay": "labctl.workload.experiment:KIND",
    "tune": "labctl.run.tune:KIND",
}
PROBES: Mapping[str, str] = {
    "model-link": "labctl.probes.model:LINK",
    "model-traffic": "labctl.probes.model:TRAFFIC",
    "model-rc-traffic": "labctl.probes.model:RC_TRAFFIC",
    "rx-power": "labctl.probes.rxpower:PROBE",
    "carrier": "labctl.probes.carrier:PROBE",
    "traffic": "labctl.probes.traffic:PROBE",
    "rc-traffic": "labctl.probes.rdma:PROBE",
    "verbs-rc": "labctl.probes.verbs_rc:PROBE",
    "switch-power": "labctl.probes.switch_power:PROBE",
    "link-state": "labctl.probes.linkstate:PROBE",
    "power-meter": "labctl.probes.power_meter:PROBE",
}


GROUPS: Mapping[str, Mapping[str, str]] = {
    "labctl.switch_drivers": SWITCH_DRIVERS,
    "labctl.probes": PROBES,
    "labctl.lab_kinds": LAB_KINDS,
    "labctl.experiment_kinds": EXPERIMENT_KINDS,
}
"""Entry-point group → labctl's built-in entries in it."""


@dataclass(frozen=True)
class Claim:
    """One package's entry point: `name` in `group` is `target` (`module:attribute`)."""

    group: str
    name: str
    target: str
    package: str
    version: str

    @property
    def origin(self) -> str:
        return f"{self.package} {self.version}"


def _key(package: str) -> str:
    """A distribution name as pip compares them (PEP 503)."""
    return package.lower().replace("_", "-").replace(".", "-")


@functools.cache
def _installed() -> dict[str, tuple[Claim, ...]]:
    """Every installed distribution's entry points in labctl's groups: one scan of the metadata."""
    from importlib.metadata import Distribution, entry_points

    origins: dict[int, tuple[str, str]] = {}

    def origin(dist: Distribution | None) -> tuple[str, str]:
        """(name, version), reading each distribution's metadata once (a long README makes it slow)."""
        if dist is None:
            return ("?", "?")
        if id(dist) not in origins:
            metadata = dist.metadata
            origins[id(dist)] = (metadata["Name"] or "?", metadata["Version"] or "?")
        return origins[id(dist)]

    installed = entry_points()  # one scan; the first distribution of a name on sys.path, as pip's
    return {
        group: tuple(
            Claim(group, point.name, point.value, *origin(point.dist))
            for point in installed.select(group=group)
        )
        for group in GROUPS
    }


def builtin_claims(group: str, table: Mapping[str, str] | None = None) -> tuple[Claim, ...]:
    """labctl's own entries in `group` as claims (default: the built-in table)."""
    from labctl.core.version import __version__

    table = GROUPS[group] if table is None else table
    return tuple(Claim(group, name, target, DISTRIBUTION, __version__) for name, target in table.items())


def claims(group: str) -> tuple[Claim, ...]:
    """Who claims which name in `group`: the installed entry points, labctl's own included; where labctl's
    distribution declares none (run from a source tree), its built-in table in their place."""
    installed = _installed()
    if any(_key(c.package) == DISTRIBUTION for found in installed.values() for c in found):
        return installed[group]
    return builtin_claims(group) + installed[group]


def names(group: str) -> tuple[str, ...]:
    """Every name claimed in `group`, sorted, without importing any entry (schema checks use it): the
    group's registry's names, where a test has set its `table`."""
    for registry in tuple(_REGISTRIES):
        if registry.group == group and registry.table is not None:
            return registry.names()
    return tuple(sorted({c.name for c in claims(group)}))


def clear_caches() -> None:
    """Forget the scanned entry points and every registry's loaded entries (after installing a package,
    or in tests)."""
    _installed.cache_clear()
    for registry in tuple(_REGISTRIES):
        registry.forget()


class Named(Protocol):
    @property
    def name(self) -> str: ...


E = TypeVar("E", bound=Named)


class UnknownName(InputError):
    """A name no registry entry answers to; the message lists the known ones."""


class PluginError(LabctlError):
    """An installed entry that cannot be used: its module fails to import, its attribute is not the
    registry's kind of entry, or more than one package claims its name. Not bad input but the environment
    (exit code 1): the message names the entry, its package and version, and what went wrong, in one line."""


class PluginConflict(PluginError):
    """More than one package claims one name: neither is used until one is uninstalled."""


def _one_line(text: str) -> str:
    return " ".join(text.split())


_REGISTRIES: weakref.WeakSet[Registry[Named]] = weakref.WeakSet()


class Registry(Generic[E]):
    """A typed, lazily loaded view of one entry-point group."""

    def __init__(self, what: str, group: str, entry_type: type[E]) -> None:
        if group not in GROUPS:
            raise ValueError(f"{group!r} is not one of labctl's entry-point groups: {', '.join(GROUPS)}")
        self.what = what
        self.group = group
        self.entry_type = entry_type
        self.table: Mapping[str, str] | None = None
        """labctl's own entries in place of the ones it declares (a test registers an entry so); other
        packages' entry points still count."""
        self._loaded: dict[str, E] = {}
        self._failed: dict[str, PluginError] = {}
        _REGISTRIES.add(self)  # type: ignore[arg-type]  # E is Named

    def forget(self) -> None:
        """Drop what was loaded (and what failed): the next `get` imports again."""
        self._loaded = {}
        self._failed = {}

    def claims(self) -> dict[str, tuple[Claim, ...]]:
        """name → the claims on it (one each from different packages; more than one is a conflict)."""
        found = claims(self.group)
        if self.table is not None:
            own = builtin_claims(self.group, self.table)
            found = own + tuple(c for c in found if _key(c.package) != DISTRIBUTION)
        by_name: dict[str, dict[str, Claim]] = {}
        for claim in found:
            by_name.setdefault(claim.name, {}).setdefault(_key(claim.package), claim)
        return {name: tuple(by_name[name].values()) for name in sorted(by_name)}

    def names(self) -> tuple[str, ...]:
        return tuple(self.claims())

    def __contains__(self, name: object) -> bool:
        return name in self.claims()

    def __iter__(self) -> Iterator[str]:
        return iter(self.names())

    def unknown(self, name: str) -> UnknownName:
        return UnknownName(f"unknown {self.what} {name!r} (known: {', '.join(self.names())})")

    def get(self, name: str) -> E:
        entry = self._loaded.get(name)
        if entry is not None:
            return entry
        failed = self._failed.get(name)
        if failed is not None:
            raise failed
        found = self.claims().get(name)
        if found is None:
            raise self.unknown(name)
        try:
            entry = self._load(name, found)
        except PluginError as e:
            self._failed[name] = e
            raise
        self._loaded[name] = entry
        return entry

    def _load(self, name: str, found: tuple[Claim, ...]) -> E:
        if len(found) > 1:
            ordered = sorted(found, key=lambda c: (_key(c.package) != DISTRIBUTION, _key(c.package)))
            who = [f"{c.origin} ({c.target})" for c in ordered]
            raise PluginConflict(
                f"{self.what} {name!r} is claimed by {len(who)} packages: {', '.join(who[:-1])} and "
                f"{who[-1]}; uninstall all but one to use it"
            )
        (claim,) = found
        where = f"{self.what} {name!r} ({claim.target}, from {claim.origin})"
        module_name, _, attribute = claim.target.partition(":")
        try:
            entry = getattr(importlib.import_module(module_name.strip()), attribute.strip())
        except Exception as e:  # whatever the plugin raises: one line, and every other name still works
            raise PluginError(f"{where} does not load: {type(e).__name__}: {_one_line(str(e))}") from e
        if not isinstance(entry, self.entry_type) or entry.name != name:
            raise PluginError(f"{where} is not a {self.entry_type.__name__} named {name!r}")
        return entry

    def problems(self) -> dict[str, PluginError]:
        """name → why it cannot be used, for every name that does not load (imports every entry)."""
        found: dict[str, PluginError] = {}
        for name in self.names():
            try:
                self.get(name)
            except PluginError as e:
                found[name] = e
        return found

    def all(self) -> dict[str, E]:
        """Every entry that loads, by name; the ones that do not are in `problems()` (and raise on `get`)."""
        loaded: dict[str, E] = {}
        for name in self.names():
            try:
                loaded[name] = self.get(name)
            except PluginError:
                continue
        return loaded
