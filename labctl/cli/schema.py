"""`labctl schema`: the JSON Schema of labctl's files, generated from the pydantic models that validate them
(issue 26), and docs/reference.md, written from the same schemas.

- `inventory`: an inventory file (inventory.yaml, experiments/inventories/*.yaml); each switch entry is one
  of the registered switch drivers' config models, chosen by its `driver`.
- `experiment`: an experiment file of any registered experiment kind: `oneOf` the kinds' spec models. The
  branches exclude each other by `kind` (each spec declares it as a constant; the timeline's is optional,
  as the loader defaults it), so no OpenAPI `discriminator` is added: it would claim `kind` is required.
- `profile`: a delay profile as written under an inventory's `profiles:` (the Profile model's fields, each
  optional where `extends:` names the profile it starts from).

The schemas say what the models' types and field constraints say; checks that span fields (switch names, port
directions, phase names, a range's low <= high...) stay with `labctl inventory check` and `labctl run
--dry-run`. The models are imported inside the functions: `labctl --help` loads this module.
"""

from __future__ import annotations

import json
import re
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from labctl.core.errors import InputError

if TYPE_CHECKING:
    from pydantic import BaseModel
    from pydantic.json_schema import GenerateJsonSchema

SCHEMAS = ("inventory", "experiment", "profile")
DIALECT = "https://json-schema.org/draft/2020-12/schema"
REFERENCE = Path("docs/reference.md")
REGENERATE = "labctl schema --markdown --out docs/reference.md"

JsonSchema = dict[str, Any]


# -- the schemas -------------------------------------------------------------------------------------------


def _generator() -> type[GenerateJsonSchema]:
    """pydantic's generator, also writing the defaults a `default_factory` makes (an empty `hosts:`...)."""
    from pydantic.json_schema import GenerateJsonSchema, NoDefault
    from pydantic_core import core_schema

    class WithFactoryDefaults(GenerateJsonSchema):
        def get_default_value(self, schema: core_schema.WithDefaultSchema) -> Any:
            factory = schema.get("default_factory")
            if factory is not None and not schema.get("default_factory_takes_data"):
                return factory()  # type: ignore[call-arg]
            return schema.get("default", NoDefault)

    return WithFactoryDefaults


def _range_bounds(properties: dict[str, JsonSchema]) -> None:
    """A delay range's ends are 0 <= end <= MAX_RANGE (checked by Profile's validator, not its types)."""
    from labctl.inventory.profiles import MAX_RANGE

    for prop in properties.values():
        for item in prop.get("prefixItems", ()):
            if item.get("type") == "number":
                item.update(minimum=0, maximum=MAX_RANGE)


def profile_schema(standalone: bool = True) -> JsonSchema:
    """A delay profile as an inventory's `profiles:` entry holds it: Profile's fields plus `extends:`; one
    without `extends:` needs the fields no default covers."""
    from labctl.inventory.profiles import Profile

    model = Profile.model_json_schema(schema_generator=_generator())
    required = model.pop("required", [])
    properties = {
        "extends": {
            "type": "string",
            "minLength": 1,
            "description": "the profile this one starts from (another of `profiles:`, or a built-in): "
            "its fields are used where this one does not set them",
        },
        **model["properties"],
    }
    _range_bounds(properties)
    schema: JsonSchema = {**model, "title": "Profile", "properties": properties}
    if required:
        schema["anyOf"] = [{"required": ["extends"]}, {"required": required}]
    if standalone:
        schema = {"$schema": DIALECT, **schema, "title": "labctl delay profile"}
    return schema


def inventory_schema() -> JsonSchema:
    """An inventory file: InventoryModel, with `profiles:` entries as `profile_schema` says."""
    from labctl.inventory.schema import InventoryModel

    schema = InventoryModel.model_json_schema(schema_generator=_generator())
    schema["$defs"]["Profile"] = profile_schema(standalone=False)
    schema["properties"]["profiles"]["additionalProperties"] = {"$ref": "#/$defs/Profile"}
    return {
        "$schema": DIALECT,
        **schema,
        "title": "labctl inventory",
        "description": "A lab inventory (inventory.yaml): its switches, hosts with their GPUs and NIC ports "
        "and the fibers from those to the switches, the delay profile of a simulated or emulated lab, the "
        "MQTT broker to `labctl agent`s, bench power meters. Checked in full by `labctl inventory check`.",
    }


def _kind_of(model: type[BaseModel]) -> str | None:
    """The experiment kind a spec model declares: its `kind` field's single Literal value."""
    from typing import Literal, get_args, get_origin

    field = model.model_fields.get("kind")
    if field is None or get_origin(field.annotation) is not Literal:
        return None
    values = get_args(field.annotation)
    return values[0] if len(values) == 1 and isinstance(values[0], str) else None


def experiment_specs() -> dict[str, type[BaseModel] | None]:
    """Each registered experiment kind → its spec model (a SpecBase whose `kind` is that name, found in the
    modules of the kind's entry functions; an entry's own `spec` attribute first, if it has one), or None
    where none is found."""
    from labctl.core.registry import DEFAULT_EXPERIMENT_KIND
    from labctl.run.experiment import SpecBase, experiment_kinds

    found: dict[str, type[BaseModel] | None] = {}
    for name in sorted(experiment_kinds.names(), key=lambda n: n != DEFAULT_EXPERIMENT_KIND):
        kind = experiment_kinds.get(name)
        spec = getattr(kind, "spec", None)
        if not (isinstance(spec, type) and issubclass(spec, SpecBase) and _kind_of(spec) == name):
            spec = None
            for function in (kind.compile, kind.describe):
                module = sys.modules.get(getattr(function, "__module__", ""))
                candidates = [
                    obj
                    for obj in (vars(module).values() if module is not None else ())
                    if isinstance(obj, type) and issubclass(obj, SpecBase) and _kind_of(obj) == name
                ]
                if candidates:
                    spec = candidates[0]
                    break
        found[name] = spec
    return found


def experiment_schema() -> JsonSchema:
    """An experiment file of any registered kind: oneOf the kinds' spec models (see the module docstring)."""
    from pydantic.json_schema import models_json_schema

    from labctl.core.registry import DEFAULT_EXPERIMENT_KIND

    specs = experiment_specs()
    models = [(model, "validation") for model in specs.values() if model is not None]
    refs, top = models_json_schema(models, schema_generator=_generator())  # type: ignore[arg-type]
    branches: list[JsonSchema] = []
    for name, model in specs.items():
        if model is not None:
            branches.append(refs[(model, "validation")])
        else:  # a kind whose spec model is not to be found: its name, and nothing more, is checked
            branches.append(
                {
                    "title": name,
                    "description": f"kind {name}: its spec model is not known to `labctl schema`",
                    "type": "object",
                    "properties": {"kind": {"const": name}},
                    "required": ["kind"],
                }
            )
    return {
        "$schema": DIALECT,
        "title": "labctl experiment",
        "description": "An experiment file: one of the registered experiment kinds, chosen by `kind:` "
        f"(default: {DEFAULT_EXPERIMENT_KIND}). Kinds: {', '.join(specs)}.",
        "oneOf": branches,
        "$defs": top.get("$defs", {}),
    }


def schema_of(name: str) -> JsonSchema:
    """The JSON Schema `labctl schema NAME` prints."""
    if name == "inventory":
        return inventory_schema()
    if name == "experiment":
        return experiment_schema()
    if name == "profile":
        return profile_schema()
    raise InputError(f"unknown schema {name!r} (known: {', '.join(SCHEMAS)})")


def schema_json(name: str) -> str:
    return json.dumps(schema_of(name), indent=2, ensure_ascii=False) + "\n"


# -- docs/reference.md -------------------------------------------------------------------------------------


def _cell(text: str) -> str:
    """Text for a Markdown table cell: one line, pipes escaped."""
    return re.sub(r"\s+", " ", text).strip().replace("|", "\\|")


def _number(value: Any) -> str:
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    return str(value)


class _Doc:
    """Renders schemas as Markdown: one table per model, types linked to their model's section."""

    def __init__(self, defs: dict[str, JsonSchema], anchors: dict[str, str]) -> None:
        self.defs = defs
        self.anchors = anchors

    def link(self, ref: str) -> str:
        name = ref.rsplit("/", 1)[-1]
        return f"[{name}](#{self.anchors.get(name, name.lower())})"

    def type(self, s: JsonSchema) -> str:
        if "$ref" in s:
            return self.link(s["$ref"])
        for key in ("anyOf", "oneOf"):
            if key in s:
                parts = [self.type(branch) for branch in s[key]]
                nullable = "null" in parts
                text = " or ".join(p for p in parts if p != "null")
                if "discriminator" in s:
                    text = f"one of {text}, by `{s['discriminator']['propertyName']}`"
                return f"{text}, or null" if nullable else text
        if "const" in s:
            return f"`{json.dumps(s['const'])}`"
        if "enum" in s:
            return " or ".join(f"`{json.dumps(v)}`" for v in s["enum"])
        kind = s.get("type")
        if kind == "array":
            if "prefixItems" in s:
                return "[" + ", ".join(self.type(i) for i in s["prefixItems"]) + "]"
            return f"list of {self.type(s.get('items', {}))}"
        if kind == "object":
            values = s.get("additionalProperties")
            if isinstance(values, dict) and values:
                return f"map of name to {self.type(values)}"
            return "mapping"
        if isinstance(kind, str):
            return kind
        return "any"

    @staticmethod
    def bounds(s: JsonSchema) -> list[str]:
        found = []
        for key, fmt in (
            ("minimum", ">= {}"),
            ("exclusiveMinimum", "> {}"),
            ("maximum", "<= {}"),
            ("exclusiveMaximum", "< {}"),
            ("minLength", "length >= {}"),
            ("maxLength", "length <= {}"),
            ("minItems", ">= {} items"),
            ("maxItems", "<= {} items"),
            ("minProperties", ">= {} entries"),
            ("maxProperties", "<= {} entries"),
            ("pattern", "matches `{}`"),
        ):
            if key in s and not (key in ("minItems", "maxItems") and "prefixItems" in s):
                found.append(fmt.format(_number(s[key])))
        return found

    def constraints(self, s: JsonSchema) -> str:
        found = self.bounds(s)
        for branch in s.get("anyOf", ()):
            found += self.bounds(branch)
            s_items = branch.get("items")
            if isinstance(s_items, dict) and self.bounds(s_items):
                found.append("each " + ", ".join(self.bounds(s_items)))
        items = s.get("items")
        if isinstance(items, dict) and self.bounds(items):
            found.append("each " + ", ".join(self.bounds(items)))
        prefix = s.get("prefixItems")
        if prefix and self.bounds(prefix[0]):
            found.append("each " + ", ".join(self.bounds(prefix[0])))
        return ", ".join(found)

    @staticmethod
    def default(s: JsonSchema, required: bool, required_unless: str | None = None) -> str:
        if required:
            return "**required**"
        if required_unless is not None:
            return f"**required** without `{required_unless}`"
        if "default" not in s:
            return ""
        text = json.dumps(s["default"], ensure_ascii=False)
        if isinstance(s["default"], dict) and s["default"] and len(text) > 40:
            return "each field's default"
        return f"`{text}`"

    def description(self, s: JsonSchema) -> str:
        text = s.get("description")
        if text is None and "$ref" in s:  # a model with no field description: its own
            text = self.defs.get(s["$ref"].rsplit("/", 1)[-1], {}).get("description")
        return text or ""

    def table(self, model: JsonSchema) -> list[str]:
        required = set(model.get("required", ()))
        # `anyOf: [{required: [a]}, {required: [b, c]}]`: b and c are required unless a is given
        alternatives = [set(branch.get("required", ())) for branch in model.get("anyOf", ())]
        unless: dict[str, str] = {}
        if len(alternatives) == 2 and len(alternatives[0]) == 1:
            unless = dict.fromkeys(alternatives[1], next(iter(alternatives[0])))
        lines = [
            "| Field | Type | Default | Constraints | Description |",
            "| --- | --- | --- | --- | --- |",
        ]
        for name, s in model.get("properties", {}).items():
            cells = (
                f"`{name}`",
                self.type(s),
                self.default(s, name in required, unless.get(name)),
                self.constraints(s),
                self.description(s),
            )
            lines.append("| " + " | ".join(_cell(c) for c in cells) + " |")
        return lines

    def section(self, heading: str, model: JsonSchema, level: int = 3) -> list[str]:
        lines = ["#" * level + " " + heading, ""]
        if model.get("description"):
            lines += [re.sub(r"\s+", " ", model["description"]).strip(), ""]
        return [*lines, *self.table(model), ""]


def _refs(s: Any) -> Iterator[str]:
    """Every model a schema refers to, in the order it names them."""
    if isinstance(s, dict):
        if isinstance(s.get("$ref"), str):
            yield s["$ref"].rsplit("/", 1)[-1]
        for key, value in s.items():
            if key != "discriminator":
                yield from _refs(value)
    elif isinstance(s, list):
        for value in s:
            yield from _refs(value)


def _reachable(start: JsonSchema, defs: dict[str, JsonSchema], skip: set[str]) -> list[str]:
    """The models `start` refers to, directly or through others, breadth first."""
    order: list[str] = []
    queue = [n for n in _refs(start.get("properties", {})) if n not in skip]
    while queue:
        name = queue.pop(0)
        if name in order or name in skip or name not in defs:
            continue
        order.append(name)
        queue += list(_refs(defs[name].get("properties", {})))
    return order


HEADER = f"""\
# Configuration reference

<!-- Generated from labctl's models by `{REGENERATE}`: do not edit by hand. -->

Every field of an inventory, of each experiment kind and of a delay profile: its type, default, constraints
and meaning, as the pydantic models that validate the files declare them (unknown fields are errors). The
same models give the JSON Schemas: `labctl schema inventory`, `labctl schema experiment` (every registered
experiment kind, by `kind:`) and `labctl schema profile` print them, `--out FILE` writes one. Checks that span
fields (switch names, port ranges and directions, phase names, `[low, high]` order) are `labctl inventory
check`'s and `labctl run --dry-run`'s, not the schema's.

Regenerate this file after changing a model: `{REGENERATE}` (or, without the command
installed, `python3 -m labctl.cli.schema --markdown --out docs/reference.md`); tests/unit/test_reference.py
fails while it is out of date.

**Editors.** Write the schemas once (`labctl schema inventory --out schemas/inventory.schema.json`, and the
same for `experiment`), then either name one in the first line of a YAML file, for the YAML language server
(VS Code's YAML extension, Neovim, Helix, JetBrains, ...):

```yaml
# yaml-language-server: $schema=../schemas/inventory.schema.json
```

(the path is relative to the YAML file), or map files to schemas in VS Code's settings.json:

```json
"yaml.schemas": {{
  "./schemas/inventory.schema.json": ["inventory.yaml", "experiments/inventories/*.yaml"],
  "./schemas/experiment.schema.json": ["experiments/*.yaml"]
}}
```

The editor then completes field names, shows these descriptions on hover and marks wrong types and unknown
fields as you type. Regenerate the schemas when labctl changes, as they follow its models (and the switch
drivers and experiment kinds registered where they are generated).
"""


def reference_markdown() -> str:
    """docs/reference.md: the inventory, every experiment kind and the delay profile, from their schemas."""
    from labctl.inventory.profiles import BUILTIN_PROFILES, DEFAULT_PROFILE
    from labctl.run.experiment import experiment_kinds

    lines = [HEADER]

    inventory = inventory_schema()
    defs = inventory["$defs"]
    doc = _Doc(defs, {})
    lines += ["## Inventory", "", re.sub(r"\s+", " ", inventory["description"]), ""]
    lines += ["Top-level fields:", "", *doc.table(inventory), ""]
    for name in _reachable(inventory, defs, skip={"Profile"}):
        lines += doc.section(name, defs[name])

    experiment = experiment_schema()
    defs = experiment["$defs"]
    specs = experiment_specs()
    anchors = {model.__name__: f"kind-{kind}" for kind, model in specs.items() if model is not None}
    doc = _Doc(defs, anchors)
    lines += [
        "## Experiments",
        "",
        re.sub(r"\s+", " ", experiment["description"]),
        "",
        "| Kind | Spec | What it runs |",
        "| --- | --- | --- |",
    ]
    for kind, model in specs.items():
        spec = f"[{model.__name__}](#kind-{kind})" if model is not None else "(not found)"
        lines.append(f"| `{kind}` | {spec} | {_cell(experiment_kinds.get(kind).description)} |")
    lines.append("")
    shared: list[str] = []
    for kind, model in specs.items():
        if model is None:
            continue
        spec_schema = defs[model.__name__]
        lines += doc.section(f"kind: {kind}", spec_schema)
        shared += [n for n in _reachable(spec_schema, defs, set(anchors)) if n not in shared]
    for name in shared:
        lines += doc.section(name, defs[name])

    profile = profile_schema(standalone=False)
    defs = profile.get("$defs", {})
    doc = _Doc(defs, {})
    lines += [
        "## Delay profile",
        "",
        "The timing model of a simulated or emulated lab (and of the emulators a rehearsal runs): how long "
        "each step of a link's recovery takes. An inventory picks one with `profile:` (default "
        f"`{DEFAULT_PROFILE}`), `labctl run --profile NAME` overrides it, and `profiles:` defines more. A "
        "range is `[low, high]` in the unit its name ends in (`_ms`, `_us`), drawn uniformly (seeded) per "
        "event, with 0 <= low <= high.",
        "",
        *doc.section("Profile", profile),
        # the models a profile's fields are (`link:`), each a section its table links to
        *(line for name in _reachable(profile, defs, set()) for line in doc.section(name, defs[name])),
        "### Built-in profiles",
        "",
        "| Name | Description | Fields |",
        "| --- | --- | --- |",
    ]
    for name, fields in BUILTIN_PROFILES.items():
        values = ", ".join(
            f"`{key}: {json.dumps(list(value) if isinstance(value, tuple) else value)}`"
            for key, value in fields.items()
            if key != "description"
        )
        lines.append(f"| `{name}` | {_cell(str(fields.get('description', '')))} | {_cell(values)} |")
    lines.append("")
    return "\n".join(lines)


# -- the command -------------------------------------------------------------------------------------------


def _emit(text: str, out_file: Path | None) -> None:
    if out_file is None:
        typer.echo(text, nl=False)
        return
    try:
        out_file.parent.mkdir(parents=True, exist_ok=True)  # `--out schemas/x.json` in a fresh lab
        out_file.write_text(text, encoding="utf-8")
    except OSError as e:
        raise InputError(f"{out_file}: cannot write: {e.strerror or e}") from None
    typer.echo(f"wrote {out_file}", err=True)


def schema(
    what: Annotated[
        str | None,
        typer.Argument(
            help="inventory, experiment (every registered kind) or profile (an entry of an inventory's "
            "`profiles:`).",
            show_default=False,
        ),
    ] = None,
    out_file: Annotated[
        Path | None, typer.Option("--out", "-o", help="Write it to this file instead of stdout.")
    ] = None,
    markdown: Annotated[
        bool,
        typer.Option(
            "--markdown",
            help=f"The Markdown reference of every file instead (docs/reference.md: {REGENERATE}).",
        ),
    ] = False,
) -> None:
    """Print the JSON Schema of an inventory, experiment or delay profile, from labctl's models.

    With --markdown, the reference of every field (docs/reference.md)."""
    if markdown:
        if what is not None:
            raise InputError("--markdown documents every file: give no schema name with it")
        _emit(reference_markdown(), out_file)
    elif what is None:
        raise InputError(f"name a schema: {', '.join(SCHEMAS)} (or --markdown for the reference)")
    else:
        _emit(schema_json(what), out_file)


def register(app: typer.Typer) -> None:
    app.command("schema")(schema)


def _main() -> None:
    """`python3 -m labctl.cli.schema ...`: the command alone (regenerates docs/reference.md where `labctl`
    is not installed); bad input is one line and exit code 2, as from `labctl`."""
    app = typer.Typer(add_completion=False, pretty_exceptions_enable=False)
    register(app)
    try:
        app()
    except InputError as e:
        typer.echo(f"error: {e}", err=True)
        raise SystemExit(2) from None


if __name__ == "__main__":
    _main()
