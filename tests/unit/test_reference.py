"""`labctl schema` and docs/reference.md (issue 26): JSON Schemas generated from the models that validate the
files, every shipped inventory and experiment valid against them, the schemas rejecting what the models
reject, and the reference page in step with the models."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import typer
from typer.testing import CliRunner

from labctl.cli.schema import (
    REFERENCE,
    REGENERATE,
    experiment_schema,
    experiment_specs,
    inventory_schema,
    profile_schema,
    reference_markdown,
    register,
    schema_of,
)
from labctl.core.errors import InputError
from labctl.core.yamlio import load_yaml
from tests.unit.test_cli_startup import _heavy, load_time_closure

REPO = Path(__file__).resolve().parents[2]
INVENTORIES = [REPO / "inventory.yaml", *sorted((REPO / "experiments" / "inventories").glob("*.yaml"))]
EXPERIMENTS = sorted((REPO / "experiments").glob("*.yaml"))


def _as_json(path: Path) -> Any:
    """A YAML file's data as an editor's schema check sees it: JSON (mapping keys are strings)."""
    return json.loads(json.dumps(load_yaml(path, "file").data))


_VALIDATORS: dict[str, Any] = {}


def _validator(schema: dict[str, Any]) -> Any:
    """A validator for `schema`, which is itself checked against the meta-schema once (that check is most of
    a validation's cost, and `labctl schema` gives the same schema to every test)."""
    key = json.dumps(schema, sort_keys=True)
    if key not in _VALIDATORS:
        jsonschema = pytest.importorskip("jsonschema")
        jsonschema.Draft202012Validator.check_schema(schema)
        _VALIDATORS[key] = jsonschema.Draft202012Validator(schema)
    return _VALIDATORS[key]


def _errors(schema: dict[str, Any], data: Any) -> list[str]:
    return [error.message for error in _validator(schema).iter_errors(data)]


def _app() -> typer.Typer:
    app = typer.Typer(add_completion=False, pretty_exceptions_enable=False)
    register(app)

    @app.command("other")  # a second command, so `schema` is a subcommand as under `labctl`
    def other() -> None: ...

    return app


# -- every shipped file is valid -------------------------------------------------------------------------------


def test_the_shipped_files_are_there() -> None:
    assert len(INVENTORIES) >= 5 and len(EXPERIMENTS) >= 4


@pytest.mark.parametrize("path", INVENTORIES, ids=lambda p: str(p.relative_to(REPO)))
def test_every_shipped_inventory_is_valid_against_the_schema(path: Path) -> None:
    assert _errors(inventory_schema(), _as_json(path)) == []


@pytest.mark.parametrize("path", EXPERIMENTS, ids=lambda p: str(p.relative_to(REPO)))
def test_every_shipped_experiment_is_valid_against_the_schema(path: Path) -> None:
    assert _errors(experiment_schema(), _as_json(path)) == []


def test_the_shipped_experiments_cover_every_kind() -> None:
    kinds = {_as_json(path).get("kind", "timeline") for path in EXPERIMENTS}
    assert {"timeline", "replay"} <= kinds <= set(experiment_specs())


# -- and a wrong one is not ------------------------------------------------------------------------------------


def _inventory(**nic: Any) -> dict[str, Any]:
    return {
        "lab": "t",
        "switches": {"ocs1": {"driver": "sim", "size": "4x4"}},
        "hosts": {"h1": {"nics": [{"ifname": "e0", "rail": 0, "switch": "ocs1", "tx": 1, "rx": 5, **nic}]}},
    }


def test_a_wrong_type_is_rejected_by_the_inventory_schema_and_by_the_model() -> None:
    from pydantic import ValidationError

    from labctl.inventory.schema import InventoryModel

    schema = inventory_schema()
    assert _errors(schema, _inventory()) == []
    for bad in ({"gbps": "fast"}, {"gbps": 0}, {"tx": "one"}, {"ifname": ""}, {"typo": 1}):
        assert _errors(schema, _inventory(**bad)), bad
        with pytest.raises(ValidationError):
            InventoryModel.model_validate(_inventory(**bad))


@pytest.mark.parametrize(
    ("where", "value"),
    [
        (("switches", "ocs1"), {"driver": "nosuch"}),  # no driver of that name
        (("switches", "ocs1"), {"driver": "polatis-tl1", "emulate": True, "pipeline_depth": "deep"}),
        (("hosts", "h1", "gpus"), [{"index": -1}]),
        (("profiles",), {"mine": {"switching_ms": [1, 2]}}),  # no `extends:`, no firmware_up_ms
        (("profiles",), {"mine": {"extends": "fast", "switching_ms": 5}}),
        (("profiles",), {"mine": {"extends": "fast", "rtt_us": [-1, 2]}}),
        (("broker",), {"clock_samples": "many"}),
    ],
)
def test_the_inventory_schema_rejects(where: tuple[str, ...], value: Any) -> None:
    data = _inventory()
    node = data
    for key in where[:-1]:
        node = node[key]
    node[where[-1]] = value
    assert _errors(inventory_schema(), data)


def test_a_profile_may_extend_another_or_stand_alone() -> None:
    schema = profile_schema()
    assert _errors(schema, {"extends": "fast", "switching_ms": [1, 2]}) == []
    full = {"switching_ms": [1, 2], "firmware_up_ms": [3, 4], "transport_after_carrier_ms": [5, 6]}
    assert _errors(schema, full) == []
    assert _errors(schema, {"switching_ms": [1, 2]})
    assert _errors(schema, {**full, "switching_ms": [1, 2, 3]})


TIMELINE = {"name": "t", "phases": {"a": {"ring": ["h1", "h2"]}}, "baseline": "a", "cycle": ["a"]}


def test_the_experiment_schema_is_one_of_the_kinds_by_kind() -> None:
    schema = experiment_schema()
    assert len(schema["oneOf"]) == len(experiment_specs()) >= 2
    assert _errors(schema, TIMELINE) == []  # no `kind:`: a timeline
    assert _errors(schema, {**TIMELINE, "kind": "timeline"}) == []
    assert _errors(schema, {"name": "r", "kind": "replay", "trace": "opus-testbed"}) == []
    assert _errors(schema, {**TIMELINE, "kind": "replay"})  # a timeline's fields are no replay's
    assert _errors(schema, {"name": "r", "trace": "opus-testbed"})  # a replay says so
    assert _errors(schema, {**TIMELINE, "kind": "nosuch"})


@pytest.mark.parametrize(
    "bad",
    [
        {"repeat": "twice"},
        {"repeat": 0},
        {"name": ""},
        {"probes": {"rx_power_deadband_db": "half"}},
        {"probes": {"rdma": {"retry_cnt": 8}}},
        {"analysis": {"plot_formats": ["gif"]}},
        {"phases": {"a": {"ring": "h1"}}},
        {"cycle": []},
        {"unknown_field": 1},
    ],
)
def test_a_wrong_experiment_is_rejected_by_the_schema(bad: dict[str, Any]) -> None:
    assert _errors(experiment_schema(), {**TIMELINE, **bad})


# -- the command -----------------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["inventory", "experiment", "profile"])
def test_the_command_prints_each_schema(name: str) -> None:
    result = CliRunner().invoke(_app(), ["schema", name])
    assert result.exit_code == 0, result.output
    printed = json.loads(result.stdout)
    assert printed == schema_of(name)
    assert printed["$schema"] == "https://json-schema.org/draft/2020-12/schema"
    assert printed["title"] == f"labctl {'delay profile' if name == 'profile' else name}"


def test_the_command_writes_out(tmp_path: Path) -> None:
    target = tmp_path / "inventory.schema.json"
    result = CliRunner().invoke(_app(), ["schema", "inventory", "--out", str(target)])
    assert result.exit_code == 0, result.output
    assert json.loads(target.read_text()) == inventory_schema()
    target = tmp_path / "reference.md"
    result = CliRunner().invoke(_app(), ["schema", "--markdown", "-o", str(target)])
    assert result.exit_code == 0, result.output
    assert target.read_text() == reference_markdown()


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["schema", "nosuch"], "unknown schema 'nosuch' (known: inventory, experiment, profile)"),
        (["schema"], "name a schema: inventory, experiment, profile"),
        (["schema", "inventory", "--markdown"], "--markdown documents every file"),
        (
            # a folder that cannot be made (its parent is a device); a missing one is made (--out schemas/…)
            ["schema", "inventory", "--out", "/dev/null/dir/x.json"],
            "/dev/null/dir/x.json: cannot write",
        ),
    ],
)
def test_bad_input_is_an_input_error(args: list[str], message: str) -> None:
    result = CliRunner().invoke(_app(), args)
    assert isinstance(result.exception, InputError), result.output
    assert str(result.exception).startswith(message)
    assert "\n" not in str(result.exception)


def test_the_command_module_imports_nothing_heavy() -> None:
    """`labctl --help` loads it: the models and pydantic are imported inside its functions."""
    assert _heavy(load_time_closure("labctl.cli.schema")) == []


# -- docs/reference.md -----------------------------------------------------------------------------------------


def test_docs_reference_is_what_the_models_say() -> None:
    from labctl.core import registry

    others = sorted(
        {f"{c.package} ({c.name})" for group in registry.GROUPS for c in registry.claims(group)}
        - {f"{c.package} ({c.name})" for group in registry.GROUPS for c in registry.builtin_claims(group)}
    )
    if others:  # the reference documents labctl's own; an installed plugin's models would show in it
        pytest.skip(f"plugins installed beside labctl: {', '.join(others)}")
    written = (REPO / REFERENCE).read_text(encoding="utf-8")
    assert written == reference_markdown(), (
        f"{REFERENCE} is out of date with the models: regenerate it with `{REGENERATE}` "
        f"(or `python3 -m labctl.cli.schema --markdown --out {REFERENCE}`)"
    )


def test_the_reference_documents_every_model_and_kind() -> None:
    text = reference_markdown()
    for heading in (
        "## Inventory",
        "### HostSpec",
        "### NicPortSpec",
        "### GpuSpec",
        "### BrokerSpec",
        "### PowerMeterSpec",
        "### PolatisTl1Config",
        "### SimSwitchConfig",
        "## Experiments",
        "### ProbeSettings",
        "## Delay profile",
        "### Profile",
        "### Built-in profiles",
        "yaml-language-server: $schema=",
        '"yaml.schemas"',
    ):
        assert heading in text, heading
    for kind in experiment_specs():
        assert f"### kind: {kind}" in text


def _row(text: str, field: str, after: str) -> str:
    """The table row of `field` in the section headed `after`."""
    section = text[text.index(after) :]
    return next(line for line in section.splitlines() if line.startswith(f"| `{field}` |"))


@pytest.mark.parametrize(
    ("field", "section"),
    [
        ("gbps", "### NicPortSpec"),
        ("gpus", "### HostSpec"),
        ("profiles", "## Inventory"),
        ("rx_power_deadband_db", "### ProbeSettings"),
        ("pipeline_depth", "### PolatisTl1Config"),
    ],
)
def test_the_fields_issue_26_found_undocumented_are_described(field: str, section: str) -> None:
    description = _row(reference_markdown(), field, section).rstrip(" |").rsplit(" | ", 1)[-1]
    assert len(description) > 20, description


def _models() -> list[type[Any]]:
    from labctl.inventory import schema as inventory
    from labctl.inventory.profiles import Profile
    from labctl.probes.sampling import ProbeSettings, RdmaSettings
    from labctl.run import experiment
    from labctl.workload.experiment import ReplayFaults, ReplaySpec, SweepSettings

    return [
        inventory.InventoryModel,
        inventory.HostSpec,
        inventory.GpuSpec,
        inventory.NicPortSpec,
        inventory.RdmaPortSpec,
        inventory.BrokerSpec,
        inventory.BrokerTlsSpec,
        inventory.PowerMeterSpec,
        inventory.PowerMeterChannelSpec,
        Profile,
        ProbeSettings,
        RdmaSettings,
        experiment.SpecBase,
        experiment.ExperimentSpec,
        experiment.PhaseSpec,
        experiment.AnalysisSettings,
        experiment.GpuSettings,
        ReplaySpec,
        ReplayFaults,
        SweepSettings,
    ]


@pytest.mark.parametrize("model", _models(), ids=lambda m: m.__name__)
def test_every_field_of_the_inventory_experiment_and_profile_models_has_a_description(
    model: type[Any],
) -> None:
    missing = [name for name, field in model.model_fields.items() if not field.description]
    assert missing == [], f"{model.__name__}: give these fields a Field(description=...): {missing}"
