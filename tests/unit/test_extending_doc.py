"""docs/extending.md and docs/architecture.md against the code: what they cite exists, and what extending.md
shows how to write works.

Citations (both documents): every repository path, every `labctl.x.y` name (imported, then looked up
attribute by attribute), every `Class.attribute` (a private one must be defined by the class named, not
inherited, so that a reader finds it where the page points), every CamelCase name in backticks, every
decision record.

Examples (extending.md): the code blocks whose first line is `# <path>` of a file that is not in the tree
are the files a reader would add. They are written, as they are, into a temporary package that stands in
for `labctl` (`labctl/ocs/drivers/loopback/codec.py` becomes `<package>/drivers/loopback/codec.py`), registered
by the registry lines the page shows, and used in-process: the driver against a `sim` switch model, the
probe against the simulated lab's behaviour model and named by an experiment's `probes.extra`, the lab
kind through `labctl.labs.load` and `build_lab`, the experiment kind through `compile_experiment`; and
each imports only what the import contract allows its layer.

Layers (architecture.md): its table of layers is the import contract's (pyproject.toml), prefix for prefix, and
the parts it gives the lab layer cover exactly that layer's prefixes.

Pure: no sockets, no subprocesses, no sleeps (the switch model's switching time is zero).
"""

from __future__ import annotations

import ast
import asyncio
import importlib
import random
import re
import sys
import tomllib
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import pydantic
import pytest
import yaml

from labctl.core import registry
from labctl.core.errors import HardwareError, InputError, MappingError
from labctl.core.events import Event, Kind
from labctl.inventory.profiles import resolve_profile
from labctl.inventory.schema import Inventory, load_inventory
from labctl.labs import build_lab, lab_kinds, load
from labctl.labs.base import Lab, LabContext, LabKind
from labctl.models.fabric import SimFabric
from labctl.models.switch import SwitchModel
from labctl.ocs.protocol import OpticalSwitch, VerifiedSwitch
from labctl.ocs.switches import SwitchDriver, config_union, emulate_switch, switch_drivers
from labctl.probes.base import PortSite, ProbeContext, ProbeKind, probe_kinds
from labctl.probes.sampling import Probe, ProbeSettings, QueueProbe
from labctl.run.engine import RunEngine
from labctl.run.experiment import (
    ExperimentKind,
    Plan,
    RunSpec,
    SpecBase,
    compile_experiment,
    experiment_kind,
    experiment_kinds,
)
from labctl.run.steps import Hold, Reconfigure, StepBase
from tests.helpers.architecture import parsed

REPO = Path(__file__).resolve().parents[2]
EXTENDING = REPO / "docs" / "extending.md"
ARCHITECTURE = REPO / "docs" / "architecture.md"
DOCS = {"extending": EXTENDING, "architecture": ARCHITECTURE}

PACKAGE = "labctl_extending_doc_example"
"""Where the page's example files are imported from: `labctl/<rest>` of the page is `PACKAGE/<rest>`."""

EXAMPLES = {
    "labctl/ocs/drivers/loopback/__init__.py",
    "labctl/ocs/drivers/loopback/codec.py",
    "labctl/ocs/drivers/loopback/connection.py",
    "labctl/ocs/drivers/loopback/switch.py",
    "labctl/probes/polled_carrier.py",
    "labctl/labs/polled.py",
    "labctl/run/hold_sweep.py",
}
"""The files extending.md shows how to write (they are not in the tree)."""

ZERO = resolve_profile("fast").model_copy(update={"switching_ms": (0.0, 0.0), "light_loss_ms": (0.0, 0.0)})
"""Mirrors that move at once: the model's `execute` then waits for nothing."""

TABLES = {
    "SWITCH_DRIVERS": registry.SWITCH_DRIVERS,
    "PROBES": registry.PROBES,
    "LAB_KINDS": registry.LAB_KINDS,
    "EXPERIMENT_KINDS": registry.EXPERIMENT_KINDS,
}
"""The registry's tables, by the name extending.md's excerpts of labctl/core/registry.py give them."""

NEW_NAMES = {
    "SWITCH_DRIVERS": "loopback",
    "PROBES": "polled-carrier",
    "LAB_KINDS": "polled",
    "EXPERIMENT_KINDS": "hold-sweep",
}
"""The registry name each of extending.md's examples adds, by table."""


# -- reading the pages ---------------------------------------------------------------------------------------
def blocks(path: Path) -> list[tuple[str, str]]:
    """The fenced code blocks of a markdown file: (info string, text)."""
    found: list[tuple[str, str]] = []
    info: str | None = None
    lines: list[str] = []
    for line in path.read_text().splitlines():
        if line.startswith("```"):
            if info is None:
                info, lines = line[3:].strip(), []
            else:
                found.append((info, "\n".join(lines) + "\n"))
                info = None
        elif info is not None:
            lines.append(line)
    assert info is None, f"{path.name}: a code block is not closed"
    return found


def prose(path: Path) -> str:
    """The page without its code blocks."""
    return re.sub(r"^```.*?^```", "", path.read_text(), flags=re.S | re.M)


def named_blocks(path: Path) -> dict[str, str]:
    """Code blocks whose first line is `# <path>`: path → the block (several excerpts of one file: joined)."""
    out: dict[str, str] = {}
    for info, text in blocks(path):
        first = text.split("\n", 1)[0]
        if info == "python" and re.fullmatch(r"# [\w/.-]+\.py", first):
            out[first[2:]] = out.get(first[2:], "") + text
    return out


def is_example(path: str) -> bool:
    """An example file, or a folder only examples are in."""
    return path in EXAMPLES or any(example.startswith(path.rstrip("/") + "/") for example in EXAMPLES)


def example_file(module: str) -> str | None:
    """The example file that defines `labctl.a.b` (or a name in it), as the page writes it; None: none."""
    parts = module.split(".")
    for n in range(len(parts), 1, -1):
        for path in ("/".join(parts[:n]) + ".py", "/".join(parts[:n]) + "/__init__.py"):
            if path in EXAMPLES:
                return path
    return None


# -- the example package -------------------------------------------------------------------------------------
def example_module(doc_name: str) -> str:
    """`labctl.ocs.drivers.loopback` (as the page writes it) → the module the test imported it as."""
    return PACKAGE + doc_name.removeprefix("labctl")


@pytest.fixture(scope="module")
def example(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, ModuleType]]:
    """The page's example files as written there, importable; doc path → module."""
    root = tmp_path_factory.mktemp("extending_doc")
    files = named_blocks(EXTENDING)
    for doc_path in EXAMPLES:
        target = root / PACKAGE / doc_path.removeprefix("labctl/")
        for parent in reversed(target.relative_to(root).parents[:-1]):
            (root / parent).mkdir(exist_ok=True)
            (root / parent / "__init__.py").touch()
        target.write_text(files[doc_path])
    sys.path.insert(0, str(root))
    try:
        modules = {}
        for doc_path in sorted(EXAMPLES):
            name = doc_path.removesuffix(".py").removesuffix("/__init__").replace("/", ".")
            modules[doc_path] = importlib.import_module(example_module(name))
        yield modules
    finally:
        sys.path.remove(str(root))
        for name in [m for m in sys.modules if m == PACKAGE or m.startswith(PACKAGE + ".")]:
            del sys.modules[name]


REGISTRY_LINE = re.compile(r'^\s*"([\w-]+)": "([\w.]+):(\w+)",', re.M)


def registry_lines() -> dict[str, dict[str, tuple[str, str]]]:
    """table → name → (module, attribute), from the page's excerpts of labctl/core/registry.py."""
    out: dict[str, dict[str, tuple[str, str]]] = {}
    for info, text in blocks(EXTENDING):
        if info != "python" or not text.startswith("# labctl/core/registry.py\n"):
            continue
        table = re.search(r"^(\w+): Mapping\[str, str\] = \{", text, re.M)
        assert table is not None, f"a registry excerpt without its table:\n{text}"
        for name, module, attribute in REGISTRY_LINE.findall(text):
            out.setdefault(table[1], {})[name] = (module, attribute)
    return out


@pytest.fixture
def registered(monkeypatch: pytest.MonkeyPatch, example: dict[str, ModuleType]) -> None:
    """The examples registered as the page's registry lines say (for this test only)."""
    registries = {
        "SWITCH_DRIVERS": switch_drivers,
        "PROBES": probe_kinds,
        "LAB_KINDS": lab_kinds,
        "EXPERIMENT_KINDS": experiment_kinds,
    }
    for table, name in NEW_NAMES.items():
        module, attribute = registry_lines()[table][name]
        assert module.startswith("labctl."), module
        # labctl's own entries plus the example's, in place of its entry points (labctl.core.registry)
        own = {**TABLES[table], name: f"{example_module(module)}:{attribute}"}
        monkeypatch.setattr(registries[table], "table", own)
    for loaded in (switch_drivers, probe_kinds, lab_kinds, experiment_kinds):
        monkeypatch.setattr(loaded, "_loaded", dict(loaded._loaded))  # forget what this test loads


# -- what the pages cite exists ------------------------------------------------------------------------------
Index = dict[str, list[tuple[str, ast.ClassDef | None]]]
"""Every top-level name of labctl and of the examples → where it is defined (the ClassDef, for a class)."""
PATH = re.compile(r"(?<![\w/.-])((?:labctl|tests|docs|bench|experiments)/[\w./-]*[\w/])")
LABCTL_NAME = re.compile(r"(?<![\w/.-])labctl(?:\.[A-Za-z_]\w*)+")
CLASS_ATTRIBUTE = re.compile(r"^[A-Z][A-Za-z0-9]*[a-z][A-Za-z0-9]*(?:\.[A-Za-z_]\w*)+$")  # not DESIGN.md
CAMEL = re.compile(r"^[A-Z][a-z0-9]+(?:[A-Z][a-z0-9]*)+$")
CODE_ATTRIBUTE = re.compile(r"\b([A-Z][A-Za-z0-9]+)\.([A-Za-z_]\w*)")
DECISION = re.compile(r"[Dd]ecisions? (\d{4})")


def backticked(text: str) -> list[str]:
    return re.findall(r"`([^`\n]+)`", text)


def own_names(node: ast.ClassDef) -> set[str]:
    """What a class body defines: methods, class attributes and annotations, and `self.x` set in methods."""
    names: set[str] = set()
    for item in node.body:
        if isinstance(item, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            names.add(item.name)
        elif isinstance(item, ast.Assign):
            names.update(t.id for t in item.targets if isinstance(t, ast.Name))
        elif isinstance(item, ast.AnnAssign) and isinstance(item.target, ast.Name):
            names.add(item.target.id)
    for sub in ast.walk(node):
        targets = (
            sub.targets
            if isinstance(sub, ast.Assign)
            else [sub.target]
            if isinstance(sub, ast.AnnAssign)
            else []
        )
        for target in targets:
            if (
                isinstance(target, ast.Attribute)
                and isinstance(target.value, ast.Name)
                and target.value.id == "self"
            ):
                names.add(target.attr)
    return names


def source_index(example: dict[str, ModuleType]) -> Index:
    """Every top-level name of labctl's modules and of the examples → (module, its ClassDef if a class)."""
    files = {p: p.relative_to(REPO) for p in sorted((REPO / "labctl").rglob("*.py"))}
    modules = {
        p: ".".join(
            rel.with_suffix("").parts[:-1] if rel.name == "__init__.py" else rel.with_suffix("").parts
        )
        for p, rel in files.items()
    }
    sources = [(modules[p], parsed(p).body) for p in files]
    sources += [
        (module.__name__, ast.parse(named_blocks(EXTENDING)[doc]).body) for doc, module in example.items()
    ]
    index: Index = {}
    for module_name, body in sources:
        for node in body:
            if isinstance(node, ast.ClassDef):
                index.setdefault(node.name, []).append((module_name, node))
            elif isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                index.setdefault(node.name, []).append((module_name, None))
            elif isinstance(node, ast.Assign | ast.AnnAssign):
                targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                for t in targets:
                    if isinstance(t, ast.Name):
                        index.setdefault(t.id, []).append((module_name, None))
    return index


def has_attribute(owner: Any, name: str, index: Index) -> bool:
    """`owner.name` exists: an attribute, a field of a dataclass or pydantic model, or (for a class) an
    attribute its instances get in a method of it or of a base class."""
    if hasattr(owner, name):
        return True
    if not isinstance(owner, type):
        return False
    if name in getattr(owner, "__dataclass_fields__", {}) or name in getattr(owner, "model_fields", {}):
        return True
    for klass in owner.__mro__:
        for module_name, node in index.get(klass.__name__, []):
            if node is not None and module_name == klass.__module__ and name in own_names(node):
                return True
    return False


def resolve(dotted: str, index: Index) -> str | None:
    """None if `labctl.a.b.C.d` exists (the longest importable module, then attributes); else why not. A
    class or function must be cited in the module that defines it, not one that imports it (the public
    facade `labctl` aside: re-exporting is its job)."""
    if example_file(dotted) is not None:
        dotted = example_module(dotted)
    parts = dotted.split(".")
    for n in range(len(parts), 0, -1):
        module = ".".join(parts[:n])
        try:
            obj: Any = importlib.import_module(module)
        except ModuleNotFoundError:
            continue
        for i, attribute in enumerate(parts[n:], start=n):
            if not has_attribute(obj, attribute, index):
                return f"{'.'.join(parts[:i])} has no {attribute!r}"
            obj = getattr(obj, attribute, None)
            defined = getattr(obj, "__module__", None) or module
            ours = defined.startswith(("labctl.", PACKAGE))  # not an alias of the standard library's
            if i == n and n > 1 and (isinstance(obj, type) or callable(obj)) and ours and defined != module:
                return f"defined in {defined}, not {module}"
        return None
    return "no such module"


def class_attribute_problem(token: str, index: Index) -> str | None:
    """None if `Class.attr[.more]` names a class (of labctl or an example) that has it; a private `_attr`
    must be the class's own (cited on a subclass that inherits it, the reader looks in the wrong place)."""
    head, attribute, *more = token.split(".")
    candidates = [(m, node) for m, node in index.get(head, []) if node is not None]
    if not candidates:
        return f"{head}: no such class in labctl or the examples"
    for module_name, node in candidates:
        owner = getattr(importlib.import_module(module_name), head)
        if attribute.startswith("_") and not attribute.startswith("__") and attribute not in own_names(node):
            continue
        if not has_attribute(owner, attribute, index):
            continue
        obj = getattr(owner, attribute, None)
        if all(has_attribute(obj, m, index) for m in more):
            return None
    return f"{token}: not defined there"


@pytest.fixture(scope="module")
def index(example: dict[str, ModuleType]) -> Index:
    return source_index(example)


@pytest.mark.parametrize("doc", DOCS)
def test_every_cited_path_exists(doc: str) -> None:
    text = DOCS[doc].read_text()
    cited = set(PATH.findall(text))
    assert len(cited) > 15, "the pattern must find the page's paths"
    missing = sorted(p for p in cited if not (REPO / p).exists() and not is_example(p))
    assert not missing, f"{doc}.md cites paths that do not exist: {missing}"


@pytest.mark.parametrize("doc", DOCS)
def test_every_cited_labctl_name_resolves(doc: str, index: Index) -> None:
    # an entry-point group (`labctl.switch_drivers`) is a name of its own, and must be one labctl reads
    cited = set(LABCTL_NAME.findall(DOCS[doc].read_text())) - set(registry.GROUPS)
    assert len(cited) > 20, "the pattern must find the page's names"
    problems = sorted(f"{name}: {why}" for name in cited if (why := resolve(name, index)) is not None)
    assert not problems, f"{doc}.md cites names that do not exist:\n" + "\n".join(problems)


@pytest.mark.parametrize("doc", DOCS)
def test_every_cited_class_attribute_exists_where_cited(doc: str, index: Index) -> None:
    """In backticks anywhere, and in the code blocks (the pictures) wherever the name before the dot is a
    class of labctl's or of an example."""
    text = DOCS[doc].read_text()
    tokens = {t for t in backticked(prose(DOCS[doc])) if CLASS_ATTRIBUTE.match(t)}
    for info, body in blocks(DOCS[doc]):
        if info == "text":
            tokens |= {
                f"{c}.{a}" for c, a in CODE_ATTRIBUTE.findall(body) if any(n for _, n in index.get(c, []))
            }
    assert tokens and "labctl" in text
    problems = sorted(p for t in tokens if (p := class_attribute_problem(t, index)) is not None)
    assert not problems, f"{doc}.md:\n" + "\n".join(problems)


@pytest.mark.parametrize("doc", DOCS)
def test_every_cited_camel_case_name_exists(doc: str, index: Index) -> None:
    names = {t for t in backticked(prose(DOCS[doc])) if CAMEL.match(t)}
    assert names
    missing = sorted(n for n in names if n not in index)
    assert not missing, f"{doc}.md names what neither labctl nor the examples define: {missing}"


@pytest.mark.parametrize("doc", DOCS)
def test_every_cited_decision_exists(doc: str) -> None:
    numbers = set(DECISION.findall(DOCS[doc].read_text()))
    missing = sorted(n for n in numbers if not list((REPO / "docs" / "decisions").glob(f"{n}-*.md")))
    assert not missing, f"{doc}.md cites decisions that do not exist: {missing}"


def test_the_pages_have_their_parts() -> None:
    extending = EXTENDING.read_text()
    for heading in (
        "## A switch driver on `VerifiedSwitch`",
        "## A probe",
        "## A lab kind",
        "## An experiment kind",
    ):
        assert f"\n{heading}\n" in extending, heading
    architecture = ARCHITECTURE.read_text()
    for heading in ("## The layers", "## One reconfiguration", "## Glossary", "## What is left"):
        assert f"\n{heading}\n" in architecture, heading
    assert "](extending.md)" in architecture and "](architecture.md)" in extending


def test_the_example_files_are_the_ones_the_page_shows() -> None:
    shown = {path for path in named_blocks(EXTENDING) if not (REPO / path).exists()}
    assert shown == EXAMPLES


def test_the_registry_lines_match_the_registry() -> None:
    """Every registry line the page shows is the registry's own, except the one each example adds, which
    names the example's module and entry."""
    shown = registry_lines()
    assert set(shown) == set(TABLES)
    for table, lines in shown.items():
        for name, (module, attribute) in lines.items():
            if name == NEW_NAMES[table]:
                assert name not in TABLES[table], f"{name} is registered already: pick another example name"
                assert example_file(module) is not None, f"{name}: {module} is none of the example files"
            else:
                assert TABLES[table].get(name) == f"{module}:{attribute}", (table, name)


# -- the switch driver ---------------------------------------------------------------------------------------
def model(space: str = "4x4") -> SwitchModel:
    from labctl.inventory.mapping import PortSpace

    return SwitchModel("ocs1", PortSpace.parse(space), ZERO, random.Random(7))


def loopback_config(size: str = "4x4") -> Any:
    return switch_drivers.get("loopback").config.model_validate(
        {"driver": "loopback", "size": size, "timeout_s": 5}
    )


@pytest.mark.usefixtures("registered")
def test_the_driver_entry_is_registered_and_validates_its_switch_entry() -> None:
    entry = switch_drivers.get("loopback")
    assert isinstance(entry, SwitchDriver) and entry.emulate is not None and entry.open is None
    adapter: pydantic.TypeAdapter[Any] = pydantic.TypeAdapter(config_union())
    config = adapter.validate_python({"driver": "loopback", "size": "8x8", "owned_ports": ["1-4"]})
    assert type(config) is entry.config and config.over_model and config.owned == {1, 2, 3, 4}
    with pytest.raises(pydantic.ValidationError, match="address"):
        adapter.validate_python({"driver": "loopback", "address": "192.0.2.1"})  # not one of its fields


@pytest.mark.usefixtures("registered")
async def test_the_driver_is_an_optical_switch_on_verified_switch() -> None:
    sw_model = model()
    events: list[Event] = []
    switch = emulate_switch("ocs1", loopback_config(), sw_model, events.append)  # as a lab builds it
    assert isinstance(switch, OpticalSwitch) and isinstance(switch, VerifiedSwitch)
    try:
        with pytest.raises(HardwareError, match="not connected"):
            await switch.get_mapping()
        await switch.connect()
        first = await switch.apply([(1, 5), (2, 6)], context={"rail": 0})
        assert first.value.mapping == {(1, 5), (2, 6)} == sw_model.patches and first.value.attempts == 1
        assert first.start_ns <= first.value.command_ns <= first.value.complete_ns <= first.end_ns  # type: ignore[operator]
        sw_model.refusals = 1  # the switch refuses the next change: converge reads back and sends again
        second = await switch.apply([(1, 6), (2, 5)])
        assert second.value.attempts == 2 and sw_model.patches == {(1, 6), (2, 5)}
        assert (await switch.get_mapping()).value == {(1, 6), (2, 5)}
        sw_model.transmitting[1] = -2.0
        power = await switch.port_power([1, 7])
        assert power.value == {1: -2.0, 7: None}
        scoped = await switch.apply([(3, 7)], scope=[1])  # port 1 in scope: its patch goes
        assert scoped.value.mapping == {(2, 5), (3, 7)}
        await switch.disconnect([3])
        assert sw_model.patches == {(2, 5)}
        with pytest.raises(MappingError):
            await switch.apply([(1, 2)])  # ingress to ingress: refused before anything is sent
    finally:
        await switch.close()
        sw_model.cancel_pending()
    kinds = {e.kind for e in events}
    assert {
        Kind.OCS_COMMAND,
        Kind.OCS_COMPLETE,
        Kind.OCS_ERROR,
        Kind.OCS_READ,
        Kind.OCS_IO,
        Kind.OCS_SESSION,
    } <= kinds
    assert Kind.RX_POWER in kinds and {e.source.split("/")[0] for e in events} == {"ocs:ocs1"}
    assert next(e for e in events if e.kind == Kind.OCS_COMMAND).meta["rail"] == 0  # the caller's context
    assert events[-1].kind == Kind.OCS_SESSION and events[-1].value == "closed"


@pytest.mark.usefixtures("registered")
async def test_the_driver_refuses_a_switch_of_another_size() -> None:
    sw_model = model("8x8")
    switch = emulate_switch("ocs1", loopback_config("4x4"), sw_model, lambda e: None)
    with pytest.raises(InputError, match="the inventory says 4x4 but the switch reports 8x8"):
        await switch.connect()


# -- the probe -----------------------------------------------------------------------------------------------
@pytest.fixture
def world() -> Iterator[tuple[Inventory, SimFabric]]:
    inventory = load_inventory(REPO / "inventory.yaml")
    rng = random.Random(3)
    spaces = {name: spec.space for name, spec in inventory.switches.items()}
    fabric = SimFabric(inventory, SwitchModel.many(spaces, ZERO, rng), ZERO, rng)
    yield inventory, fabric
    fabric.cancel_pending()


def polled(world: tuple[Inventory, SimFabric], report_interval_ms: float = 100.0) -> Any:
    inventory, fabric = world
    settings = ProbeSettings(report_interval_ms=report_interval_ms, link_state_hz=1000)
    ctx = ProbeContext(settings, ports=[PortSite(p) for p in inventory.ports], world=fabric)
    return probe_kinds.get("polled-carrier").build(ctx)


@pytest.mark.usefixtures("registered")
def test_the_probe_is_registered_and_samples_the_model(world: tuple[Inventory, SimFabric]) -> None:
    entry = probe_kinds.get("polled-carrier")
    assert isinstance(entry, ProbeKind) and entry.signals == (Kind.CARRIER,)
    probe = polled(world)
    assert isinstance(probe, Probe) and isinstance(probe, QueueProbe) and probe.name == "polled-carrier"
    inventory, fabric = world
    probe.tick(1_000_000)  # the first sample of every port is reported (a tick driven by hand)
    first = probe.queue.drain()
    assert [e.source for e in first] == [p.source for p in inventory.ports]
    assert {(e.kind, e.value, e.t_ns) for e in first} == {(Kind.CARRIER, 0, 1_000_000)}
    assert all(e.host == e.source.split(":")[1].split("/")[0] and e.meta == {"initial": True} for e in first)
    probe.tick(2_000_000)  # steady: nothing
    assert probe.queue.drain() == []
    fabric.state(inventory.ports[0]).carrier = 1  # the link came up
    probe.tick(3_000_000)
    # the change, bracketed by the sample before it, which did not see it
    changed = [(e.source, e.value, e.meta) for e in probe.queue.drain()]
    assert changed == [(inventory.ports[0].source, 1, {"prev_ns": 2_000_000})]
    probe.tick(103_000_000)  # steady for a report interval: carrier is a transition, not a heartbeat
    assert probe.queue.drain() == []
    assert probe.stats()["dropped"] == 0 and probe.samples == 4 * len(inventory.ports)


@pytest.mark.usefixtures("registered")
async def test_the_probe_runs_once_as_a_probe(world: tuple[Inventory, SimFabric]) -> None:
    probe = polled(world)
    async with asyncio.timeout(10):  # a guard: the first tick is due at once
        async with probe:
            stream = probe.events()
            first = await anext(stream)
        rest = [e async for e in stream]  # the stream ends once the probe has stopped
    assert first.kind == Kind.CARRIER and len(rest) >= len(world[0].ports) - 1
    with pytest.raises(RuntimeError, match="has run and stopped"):
        async with probe:
            pass


# -- the lab kind --------------------------------------------------------------------------------------------
def inventory_file(tmp_path: Path, extra: str) -> Path:
    path = tmp_path / "inventory.yaml"
    path.write_text((REPO / "inventory.yaml").read_text() + extra)
    return path


@pytest.mark.usefixtures("registered")
async def test_the_lab_kind_checks_and_builds_with_the_probe(tmp_path: Path) -> None:
    kind = lab_kinds.get("polled")
    assert isinstance(kind, LabKind) and kind.agent_probes == ()
    inventory = load(inventory_file(tmp_path, "\nkind: polled\n"))  # what `inventory check` and `run` call
    with pytest.raises(InputError, match=r"inventory\.yaml:\d+: broker: a polled lab runs in one process"):
        load(inventory_file(tmp_path, "\nkind: polled\nbroker: {url: 'mqtt://127.0.0.1:1'}\n"))
    events: list[Event] = []
    lab = build_lab(LabContext(inventory, ZERO, random.Random(5), events.append, ProbeSettings()))
    try:
        assert isinstance(lab, Lab) and set(lab.switches) == {"ocs1"}
        assert all(isinstance(s, OpticalSwitch) for s in lab.switches.values())
        assert [p.name for p in lab.probes] == ["model-link", "rx-power", "model-traffic", "polled-carrier"]
        assert all(isinstance(p, Probe) for p in lab.probes)
    finally:
        lab.close()
    assert events == []  # building sends nothing
    extra = ProbeSettings(extra=["polled-carrier", "model-link"])  # named twice: built once
    lab = build_lab(LabContext(inventory, ZERO, random.Random(5), events.append, extra))
    lab.close()
    assert [p.name for p in lab.probes] == ["model-link", "rx-power", "model-traffic", "polled-carrier"]


@pytest.mark.usefixtures("registered")
async def test_an_experiment_that_names_the_probe_runs_it_on_the_simulated_lab() -> None:
    """The page's `probes: {extra: [polled-carrier]}`, as the experiment's settings reach the lab."""
    yaml_block = next(text for info, text in blocks(EXTENDING) if info == "yaml" and "extra:" in text)
    settings = ProbeSettings.model_validate(yaml.safe_load(yaml_block)["probes"])
    inventory = load(REPO / "inventory.yaml")
    lab = build_lab(LabContext(inventory, ZERO, random.Random(5), lambda e: None, settings))
    lab.close()
    assert [p.name for p in lab.probes][-1] == "polled-carrier"


# -- the import contract -------------------------------------------------------------------------------------
def contract() -> tuple[list[tuple[str, tuple[str, ...]]], dict[str, tuple[str, ...]]]:
    """The import contract in pyproject.toml (`[tool.importlinter]`): its layers, each as (name, module
    prefixes), the names as its name lists them ("labctl's layers: testing > cli > ..."); and what the
    switch drivers may not import."""
    contracts = {
        c["id"]: c
        for c in tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["importlinter"]["contracts"]
    }
    layers = contracts["layers"]
    names = layers["name"].split(": ", 1)[1].split(" > ")
    modules = [
        tuple(f"labctl.{part.strip()}" for part in layer.replace("|", ":").split(":"))
        for layer in layers["layers"]
    ]
    assert len(names) == len(modules), layers["name"]
    blind = contracts["drivers-blind"]
    independent = {source: tuple(blind["forbidden_modules"]) for source in blind["source_modules"]}
    return list(zip(names, modules, strict=True)), independent


def section(text: str, start: str, end: str) -> str:
    return text[text.index(start) : text.index(end, text.index(start))]


def test_the_layer_table_is_the_import_contract() -> None:
    layers, _ = contract()
    text = ARCHITECTURE.read_text()
    rows = re.findall(
        r"^\| \*\*([\w ]+)\*\* \| ([^|]*) \|", section(text, "## The layers", "### Inside"), re.M
    )
    shown = [(name, set(LABCTL_NAME.findall(modules))) for name, modules in rows]
    assert shown == [(name, set(prefixes)) for name, prefixes in layers]
    # the parts of the lab layer, as paths, are the lab layer's prefixes
    parts = re.findall(
        r"^\| \*\*[\w ]+\*\* \| ([^|]*) \|", section(text, "### Inside", "### The picture"), re.M
    )
    paths = [p for cell in parts for p in re.findall(r"`(labctl/[\w/.]+)`", cell)]
    as_modules = {p.removesuffix("/").removesuffix(".py").replace("/", ".") for p in paths}
    assert as_modules == set(dict(layers)["lab"])


def layer_of(module: str, layers: list[tuple[str, tuple[str, ...]]]) -> str | None:
    return next(
        (
            name
            for name, prefixes in layers
            if any(module == p or module.startswith(p + ".") for p in prefixes)
        ),
        None,
    )


def test_the_examples_obey_the_import_contract() -> None:
    """Each example imports only its own layer and those below, a driver nothing of what it is independent
    of; every example sits in a package the contract already places (no edit to LAYERS)."""
    layers, independent = contract()
    order = [name for name, _ in layers]
    for doc_path, text in named_blocks(EXTENDING).items():
        if doc_path not in EXAMPLES:
            continue
        module = doc_path.removesuffix(".py").removesuffix("/__init__").replace("/", ".")
        mine = layer_of(module, layers)
        assert mine is not None, f"{module} is in no layer"
        for node in ast.walk(ast.parse(text)):
            if (
                isinstance(node, ast.ImportFrom)
                and node.level == 0
                and (node.module or "").startswith("labctl")
            ):
                target = node.module or ""
                theirs = layer_of(target, layers)
                assert theirs is not None and order.index(theirs) >= order.index(mine), (
                    f"{module} imports {target}"
                )
                for side, forbidden in independent.items():
                    if module.startswith(side + "."):
                        assert not target.startswith(forbidden), f"{module} imports {target}"


# -- the experiment kind -------------------------------------------------------------------------------------
def hold_sweep_file(tmp_path: Path, extra: str, baseline: str = "dp") -> Path:
    """The timeline experiment's file with `extra` added (and another baseline phase)."""
    path = tmp_path / "hold-sweep.yaml"
    timeline = (REPO / "experiments" / "reconfig-timeline.yaml").read_text()
    path.write_text(timeline.replace("\nbaseline: dp\n", f"\nbaseline: {baseline}\n") + extra)
    return path


@pytest.mark.usefixtures("registered")
def test_the_experiment_kind_compiles_to_a_plan_the_controller_carries_out(tmp_path: Path) -> None:
    inventory = load_inventory(REPO / "inventory.yaml")
    path = hold_sweep_file(tmp_path, "kind: hold-sweep\nholds_s: [0.1, 0.5, 2]\n")
    kind = experiment_kind(path)
    assert isinstance(kind, ExperimentKind) and kind.name == "hold-sweep"
    plan = compile_experiment(path, inventory)  # what `labctl run` and the scheduler call
    assert isinstance(plan, Plan) and isinstance(plan.spec, SpecBase) and plan.baseline == "dp"
    for attribute in [n for n in vars(RunSpec) if not n.startswith("_")]:
        assert hasattr(plan.spec, attribute), attribute  # what the controller reads of any kind
    assert plan.spec.model_dump(mode="json")["kind"] == "hold-sweep"  # run.json says which kind ran
    assert plan.steps == [(0, "pp"), (0, "dp"), (1, "pp"), (1, "dp"), (2, "pp"), (2, "dp")]
    assert [s.seconds for s in plan.program if isinstance(s, Hold)] == [0.1, 0.1, 0.1, 0.5, 0.5, 2, 2]
    planned = plan.planned(inventory)
    assert [r.phase for r in planned] == ["dp", "pp", "dp", "pp", "dp", "pp", "dp"]
    assert all(r.moved for r in planned[1:])
    with pytest.raises(InputError, match=r"hold-sweep\.yaml:\d+: holds_s\[0\]: Input should be greater"):
        compile_experiment(hold_sweep_file(tmp_path, "kind: hold-sweep\nholds_s: [-1]\n"), inventory)
    with pytest.raises(InputError, match="unknown phase"):
        compile_experiment(
            hold_sweep_file(tmp_path, "kind: hold-sweep\nholds_s: [1]\n", baseline="nope"), inventory
        )
    # "changes nothing in the engine": each step executes itself; the engine's sequence branches on none
    assert all(isinstance(s, StepBase) for s in plan.program) and Reconfigure in {
        type(s) for s in plan.program
    }
    source = (REPO / "labctl" / "run" / "engine.py").read_text()
    sequence = next(
        n for n in ast.walk(ast.parse(source)) if isinstance(n, ast.AsyncFunctionDef) and n.name == "sequence"
    )
    branches = [ast.unparse(c) for c in ast.walk(sequence) if isinstance(c, ast.Call | ast.If | ast.Match)]
    assert not [b for b in branches if "isinstance" in b or "type(" in b], RunEngine.sequence.__qualname__
    # `labctl run --dry-run` prints any kind's plan: the entry's default describes its reconfigurations
    from typer.testing import CliRunner

    from labctl.cli import app

    path = hold_sweep_file(tmp_path, "kind: hold-sweep\nholds_s: [0.1, 0.5, 2]\n")
    dry = CliRunner().invoke(
        app, ["run", str(path), "--dry-run", "--inventory", str(REPO / "inventory.yaml")]
    )
    assert dry.exit_code == 0, dry.output
    assert "7 reconfigurations (baseline dp, then 6 more)" in dry.output and "reconfig 6 → dp" in dry.output
