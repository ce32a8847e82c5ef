"""Registries by entry point (decision 0055): labctl's built-ins are declared in pyproject.toml exactly as
labctl/core/registry.py lists them; a package installed beside labctl (here a fake distribution written on
the fly: a `*.dist-info` with METADATA and entry_points.txt, and its module, on sys.path) adds a switch
driver, a probe and a lab kind; a broken one is one line when used and breaks no other name; a name two
packages claim is an error naming both; `labctl plugins` lists it all."""

from __future__ import annotations

import json
import sys
import tomllib
from collections.abc import Iterator, Mapping
from pathlib import Path

import pytest
import typer
from pydantic import TypeAdapter, ValidationError
from typer.testing import CliRunner

from labctl.cli.plugins import plugin_rows, register
from labctl.core import registry
from labctl.core.errors import InputError
from labctl.core.registry import GROUPS, PluginConflict, PluginError, Registry, builtin_claims, claims
from labctl.core.version import __version__
from labctl.labs import lab_kinds, load
from labctl.ocs.drivers.sim import DRIVER as SIM
from labctl.ocs.switches import SwitchDriver, config_union, switch_drivers
from labctl.probes.base import probe_kinds
from labctl.probes.model import LINK

REPO = Path(__file__).resolve().parents[2]

FAKE_MODULE = """
import dataclasses
from typing import Literal

from labctl.labs.simulated import KIND
from labctl.ocs.drivers.sim import DRIVER, SimSwitchConfig
from labctl.probes.model import LINK


class PluginSimConfig(SimSwitchConfig):
    driver: Literal["plugin-sim"]


SIM = dataclasses.replace(DRIVER, name="plugin-sim", config=PluginSimConfig)
PROBE = dataclasses.replace(LINK, name="plugin-link")
LAB = dataclasses.replace(KIND, name="plugin-lab")
"""
FAKE_ENTRIES = {
    "labctl.switch_drivers": {"plugin-sim": "fakeplugin_mod:SIM"},
    "labctl.probes": {"plugin-link": "fakeplugin_mod:PROBE"},
    "labctl.lab_kinds": {"plugin-lab": "fakeplugin_mod:LAB"},
}
FAKE_MODULES = ("fakeplugin_mod", "fakebroken_mod")


def install(
    site: Path,
    monkeypatch: pytest.MonkeyPatch,
    package: str,
    version: str,
    entries: Mapping[str, Mapping[str, str]],
) -> None:
    """A distribution as pip would leave it: its dist-info (METADATA, entry_points.txt) on sys.path."""
    info = site / f"{package}-{version}.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {package}\nVersion: {version}\n")
    sections = [
        f"[{group}]\n" + "".join(f"{name} = {target}\n" for name, target in table.items())
        for group, table in entries.items()
    ]
    (info / "entry_points.txt").write_text("\n".join(sections))
    if str(site) not in sys.path:
        monkeypatch.syspath_prepend(str(site))
    registry.clear_caches()


@pytest.fixture(autouse=True)
def _forget_plugins() -> Iterator[None]:
    yield
    for name in FAKE_MODULES:
        sys.modules.pop(name, None)
    registry.clear_caches()  # the next test sees only what is installed


@pytest.fixture
def site(tmp_path: Path) -> Path:
    site = tmp_path / "site"
    site.mkdir()
    (site / "fakeplugin_mod.py").write_text(FAKE_MODULE)
    (site / "fakebroken_mod.py").write_text('raise ImportError("needs libfoo\\n  (second line)")\n')
    return site


def _app() -> typer.Typer:
    app = typer.Typer(pretty_exceptions_enable=False)
    register(app)
    app.command("other")(lambda: None)  # two commands: typer keeps `plugins` a subcommand
    return app


# -- labctl's own entries ------------------------------------------------------------------------------------
def test_pyproject_declares_exactly_the_builtin_tables() -> None:
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    declared = {g: t for g, t in project["entry-points"].items() if g.startswith("labctl.")}
    assert declared == {group: dict(table) for group, table in GROUPS.items()}


def test_the_builtins_come_from_labctl_with_its_version() -> None:
    for group, table in GROUPS.items():
        own = {c.name: c for c in claims(group) if c.package == "labctl-ocs"}
        assert {name: c.target for name, c in own.items()} == dict(table), group
        assert {c.version for c in own.values()} == {__version__}


def test_without_labctls_metadata_the_builtin_tables_are_the_entries(monkeypatch: pytest.MonkeyPatch) -> None:
    """A source tree on PYTHONPATH: no labctl distribution declares anything, the tables stand in."""
    monkeypatch.setattr(registry, "_installed", lambda: {group: () for group in GROUPS})
    for group in GROUPS:
        assert claims(group) == builtin_claims(group)
    assert switch_drivers.get("sim") is SIM


def test_a_registry_reads_nothing_until_used(monkeypatch: pytest.MonkeyPatch) -> None:
    def scan() -> None:
        raise AssertionError("entry points read at construction")

    monkeypatch.setattr(registry, "_installed", scan)
    Registry("switch driver", "labctl.switch_drivers", SwitchDriver)


# -- a plugin ------------------------------------------------------------------------------------------------
def test_a_plugins_driver_probe_and_lab_kind_are_found(site: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    install(site, monkeypatch, "fakeplugin", "1.0", FAKE_ENTRIES)
    driver = switch_drivers.get("plugin-sim")
    assert driver.name == "plugin-sim" and driver.emulate is SIM.emulate
    assert probe_kinds.get("plugin-link").build is LINK.build
    assert lab_kinds.get("plugin-lab").name == "plugin-lab"
    (claim,) = switch_drivers.claims()["plugin-sim"]
    assert (claim.package, claim.version, claim.target) == ("fakeplugin", "1.0", "fakeplugin_mod:SIM")
    # the inventory's switch entries are a union over every driver's config, the plugin's included
    spec = TypeAdapter(config_union()).validate_python({"driver": "plugin-sim", "size": "8x8"})
    assert type(spec).__name__ == "PluginSimConfig" and spec.space.n_ingress == 8
    assert "sim" in switch_drivers and switch_drivers.get("sim") is SIM

    rows = {(r.group, r.name): r for r in plugin_rows()}
    assert rows[("labctl.probes", "plugin-link")].package == "fakeplugin"
    assert all(r.status == "ok" for r in rows.values())
    done = CliRunner().invoke(_app(), ["plugins", "--json"])
    assert done.exit_code == 0, done.output
    listed = {(e["group"], e["name"]): e for e in json.loads(done.output)}
    assert listed[("labctl.switch_drivers", "plugin-sim")] == {
        "group": "labctl.switch_drivers",
        "name": "plugin-sim",
        "target": "fakeplugin_mod:SIM",
        "package": "fakeplugin",
        "version": "1.0",
        "status": "ok",
        "error": None,
    }
    assert listed[("labctl.switch_drivers", "sim")]["package"] == "labctl-ocs"


def test_inventory_check_accepts_a_plugins_lab_kind(
    site: Path, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    inventory = tmp_path / "inventory.yaml"
    inventory.write_text((REPO / "inventory.yaml").read_text() + "\nkind: plugin-lab\n")
    with pytest.raises(InputError, match=r"unknown lab kind 'plugin-lab'"):
        load(inventory)  # what `labctl inventory check` calls
    install(site, monkeypatch, "fakeplugin", "1.0", FAKE_ENTRIES)
    assert load(inventory).kind == "plugin-lab"


def test_a_broken_plugin_is_one_line_and_breaks_nothing_else(
    site: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    entries = {**FAKE_ENTRIES, "labctl.probes": {"broken-probe": "fakebroken_mod:PROBE"}}
    install(site, monkeypatch, "fakeplugin", "1.0", entries)
    with pytest.raises(PluginError) as caught:
        probe_kinds.get("broken-probe")
    message = str(caught.value)
    assert message == (
        "probe 'broken-probe' (fakebroken_mod:PROBE, from fakeplugin 1.0) does not load: "
        "ImportError: needs libfoo (second line)"
    )
    assert not isinstance(caught.value, InputError)  # the environment, not the input: exit code 1
    with pytest.raises(PluginError, match="needs libfoo"):  # still, on the next use
        probe_kinds.get("broken-probe")
    assert "broken-probe" in probe_kinds and "broken-probe" not in probe_kinds.all()
    assert probe_kinds.get("rx-power").name == "rx-power"
    assert set(probe_kinds.problems()) == {"broken-probe"}

    rows = [r for r in plugin_rows() if r.status != "ok"]
    assert [(r.name, r.status, r.error) for r in rows] == [("broken-probe", "broken", message)]
    done = CliRunner().invoke(_app(), ["plugins"], env={"COLUMNS": "400"})
    assert done.exit_code == 1
    assert "broken-probe" in done.output and "plugin-sim" in done.output and "rx-power" in done.output


def test_a_broken_plugin_driver_is_refused_by_the_inventory_in_one_line(
    site: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    install(
        site, monkeypatch, "fakeplugin", "1.0", {"labctl.switch_drivers": {"gone": "fakebroken_mod:DRIVER"}}
    )
    union = TypeAdapter(config_union())
    assert union.validate_python({"driver": "sim"}).driver == "sim"
    with pytest.raises(ValidationError) as caught:
        union.validate_python({"driver": "gone"})
    assert "switch driver 'gone' (fakebroken_mod:DRIVER, from fakeplugin 1.0) does not load" in str(
        caught.value
    )


def test_an_entry_of_the_wrong_kind_is_one_line(site: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    install(
        site, monkeypatch, "fakeplugin", "1.0", {"labctl.lab_kinds": {"not-a-lab": "fakeplugin_mod:PROBE"}}
    )
    with pytest.raises(
        PluginError,
        match=r"^lab kind 'not-a-lab' \(fakeplugin_mod:PROBE, from fakeplugin 1.0\) is not a LabKind",
    ):
        lab_kinds.get("not-a-lab")


def test_two_packages_claiming_a_name_is_an_error_naming_both(
    site: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    install(site, monkeypatch, "fakeplugin", "1.0", FAKE_ENTRIES)
    install(
        site,
        monkeypatch,
        "otherplugin",
        "2.0",
        {"labctl.switch_drivers": {"plugin-sim": "fakeplugin_mod:SIM", "sim": "fakeplugin_mod:SIM"}},
    )
    with pytest.raises(PluginConflict) as caught:
        switch_drivers.get("plugin-sim")
    assert "fakeplugin 1.0 (fakeplugin_mod:SIM)" in str(caught.value)
    assert "otherplugin 2.0 (fakeplugin_mod:SIM)" in str(caught.value)
    with pytest.raises(
        PluginConflict, match=rf"claimed by 2 packages: labctl-ocs {__version__} .* and otherplugin 2.0"
    ):
        switch_drivers.get("sim")  # a plugin claiming a built-in's name takes neither
    assert switch_drivers.get("polatis-tl1").name == "polatis-tl1"
    assert probe_kinds.get("plugin-link").name == "plugin-link"

    conflicts = sorted((r.name, r.package) for r in plugin_rows() if r.status == "conflict")
    assert conflicts == [
        ("plugin-sim", "fakeplugin"),
        ("plugin-sim", "otherplugin"),
        ("sim", "labctl-ocs"),
        ("sim", "otherplugin"),
    ]
    done = CliRunner().invoke(_app(), ["plugins", "--json"])
    assert done.exit_code == 1
    assert {e["status"] for e in json.loads(done.output) if e["name"] == "sim"} == {"conflict"}
