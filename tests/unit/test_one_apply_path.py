"""One switch-apply path (issue 24): every mapping labctl sends to a switch goes through
`labctl.ocs.protocol.send_mapping`, and within a run through `labctl.run.rails.RailWriter.write` only — a
timeline's reconfigurations and baseline restore, a replayed job's writes and its giant-ring fallback. Outside
any run, two callers send directly: the scheduler's restore of a crashed run's baseline, and `labctl ocs`
(an operator's command on one switch). A switch implementation may delegate to the switch it wraps (a class
that defines `apply` itself: `VerifiedSwitch`, the agents lab's `AnnouncedSwitch`); nothing else calls a
switch's `apply` or `disconnect`."""

from __future__ import annotations

import ast
import re
from pathlib import Path

from tests.helpers.architecture import parsed

LABCTL = Path(__file__).resolve().parents[2] / "labctl"
SENDING = {"apply", "disconnect"}
# What a switch is called where one is at hand; a receiver named otherwise (a DataFrame's `.apply`, the
# agents' world mirror) is not a switch unless the call passes a switch's keywords.
SWITCH_NAME = re.compile(r"(^|[._\[])(sw|s|switch|switches|ocs)\b|switch", re.IGNORECASE)
SWITCH_KEYWORDS = {"scope", "context"}


def sends(tree: ast.AST, module: str) -> list[str]:
    """`module:line: call` for each call that sends a mapping to a switch outside the one path."""
    found: list[str] = []

    def visit(node: ast.AST, classes: list[ast.ClassDef], function: str | None) -> None:
        if isinstance(node, ast.ClassDef):
            classes = [*classes, node]
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            function = node.name
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in SENDING:
            receiver = ast.unparse(node.func.value)
            keywords = {k.arg for k in node.keywords}
            switch_like = bool(SWITCH_NAME.search(receiver)) or bool(keywords & SWITCH_KEYWORDS)
            delegating = any(  # inside a switch: a class whose own `apply` has a switch's signature
                isinstance(item, ast.FunctionDef | ast.AsyncFunctionDef)
                and item.name == "apply"
                and {"scope", "context"} <= {a.arg for a in item.args.kwonlyargs}
                for cls in classes[-1:]
                for item in cls.body
            )
            the_path = module == "labctl/ocs/protocol.py" and function == "send_mapping"
            if switch_like and not delegating and not the_path:
                found.append(f"{module}:{node.lineno}: {ast.unparse(node)[:80]}")
        for child in ast.iter_child_nodes(node):
            visit(child, classes, function)

    visit(tree, [], None)
    return found


# The contract suites (labctl.testing, shipped for labs' own tests, imported by nothing in labctl) exist to call
# a driver's `apply` and `disconnect` themselves: they test the driver, not the run.
SUITES = "labctl/testing/"


def test_only_send_mapping_sends_mappings_to_a_switch() -> None:
    found = []
    for path in sorted(LABCTL.rglob("*.py")):
        module = path.relative_to(LABCTL.parent).as_posix()
        if module.startswith(SUITES):
            continue
        found += sends(parsed(path), module)
    assert found == [], "send mappings through labctl.ocs.protocol.send_mapping:\n" + "\n".join(found)


def test_the_check_finds_a_second_path() -> None:
    """The deliberate violations the check must see, and what it must leave alone."""
    source = """
async def restore(lab, rail, mapping):
    await lab.switches["ocs1"].apply(mapping, scope=[1, 2])
    await sw.disconnect([3])
    await driver.apply(mapping, context={"rail": rail})

def analysis(frame, mirror, item):
    frame["x"].apply(len)
    mirror.apply(item, 0)

class Wrapper:
    async def apply(self, mapping, *, scope=None, context=None):
        return await self.switch.apply(mapping, scope=scope, context=context)

class NotASwitch:
    async def apply(self, target, timeout_s, context):
        return await self.switch.apply(target, scope=None, context=context)
"""
    found = sends(ast.parse(source), "labctl/example.py")
    assert [line.split(":")[1] for line in found] == ["3", "4", "5", "17"], found


# Who may call send_mapping: the run's one path, and the two commands that work outside any run.
SEND_MAPPING_CALLERS = {
    ("labctl/run/rails.py", "_send"),  # RailWriter.write and write_rails: every write of a run
    ("labctl/scheduler/crash_recovery.py", "restore_baseline"),  # a crashed run's baseline, no run around it
    ("labctl/cli/ocs.py", None),  # `labctl ocs connect|disconnect|apply`: one switch, by hand
}


def send_mapping_calls(tree: ast.AST, module: str) -> list[str]:
    """`module:line` of each call of send_mapping outside the allowed callers."""
    found: list[str] = []

    def visit(node: ast.AST, function: str | None) -> None:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            function = node.name
        if isinstance(node, ast.Call):
            name = node.func.attr if isinstance(node.func, ast.Attribute) else getattr(node.func, "id", None)
            allowed = (module, function) in SEND_MAPPING_CALLERS or (module, None) in SEND_MAPPING_CALLERS
            if name == "send_mapping" and not allowed:
                found.append(f"{module}:{node.lineno}: {ast.unparse(node)[:80]}")
        for child in ast.iter_child_nodes(node):
            visit(child, function)

    visit(tree, None)
    return found


def test_a_run_writes_its_rails_through_one_writer() -> None:
    found = []
    for path in sorted(LABCTL.rglob("*.py")):
        module = path.relative_to(LABCTL.parent).as_posix()
        found += send_mapping_calls(parsed(path), module)
    assert found == [], "a run writes its rails through labctl.run.rails.RailWriter.write:\n" + "\n".join(
        found
    )


def test_the_writer_check_finds_a_second_writer() -> None:
    source = """
async def _write_rails(self, r, mapping):
    await send_mapping(r.switch, mapping, scope=r.scope)
    await ocs.send_mapping(r.switch, mapping)
"""
    found = send_mapping_calls(ast.parse(source), "labctl/workload/orchestrator.py")
    assert [line.split(":")[1] for line in found] == ["3", "4"], found
