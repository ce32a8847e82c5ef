"""tests/unit stays pure: no subprocess, no broker, no socket but a socketpair, no sleep on the real clock,
no whole experiment run. Those tests belong in tests/integration (README, Development).

A simple check of the source (the AST of every file under tests/unit and of the tests.helpers modules they
import), not of what a test does when it runs: a test that sleeps through a library call passes it. A sleep
is flagged whatever its argument but a literal 0 (asyncio.sleep(0) only yields to the loop). ALLOWED names
each exception, with its reason."""

from __future__ import annotations

import ast
from dataclasses import dataclass
from pathlib import Path

from tests.helpers.architecture import parsed

UNIT = Path(__file__).resolve().parent
TESTS = UNIT.parent
REPO = TESTS.parent

ALLOWED: dict[tuple[str, str, str], str] = {
    ("tests/unit/test_sampling.py", "_Bursting._run", "sleep"): (
        "the sampler's task parks after its burst; stopping the probe cancels it, nothing waits for it"
    ),
}
"""(file, enclosing function, kind) -> why it is allowed."""

PROCESS_MODULES = {"subprocess", "multiprocessing"}
OS_PROCESS_CALLS = {"system", "popen", "fork", "forkpty", "posix_spawn", "posix_spawnp", "execv", "execvp"}
SOCKET_CALLS = {
    "create_connection",
    "create_server",
    "open_connection",
    "start_server",
    "open_unix_connection",
    "start_unix_server",
    "create_unix_connection",
    "create_unix_server",
    "create_datagram_endpoint",
}
SLEEP_MODULES = {"asyncio", "time", "trio", "anyio"}
BROKER_MODULES = {"tests.mosquitto", "labctl.testing.mosquitto"}
BROKER_FIXTURES = {"mosquitto", "labctl_mosquitto"}  # the session's broker (tests/conftest.py, the plugin's)


@dataclass(frozen=True)
class Finding:
    path: str
    where: str
    kind: str
    line: int
    text: str

    def __str__(self) -> str:
        return f"{self.path}:{self.line}: {self.kind} in {self.where}: {self.text}"


class Impurities(ast.NodeVisitor):
    def __init__(self, path: str) -> None:
        self.path = path
        self.scope: list[str] = []
        self.sleep_names: set[str] = set()  # `from asyncio import sleep`
        self.found: list[Finding] = []

    def add(self, kind: str, node: ast.AST) -> None:
        where = ".".join(self.scope) or "<module>"
        self.found.append(Finding(self.path, where, kind, getattr(node, "lineno", 0), ast.unparse(node)[:80]))

    def visit_Import(self, node: ast.Import) -> None:
        for alias in node.names:
            if alias.name.split(".")[0] in PROCESS_MODULES:
                self.add("subprocess", node)
            if alias.name in BROKER_MODULES:
                self.add("broker", node)

    def visit_ImportFrom(self, node: ast.ImportFrom) -> None:
        module = node.module or ""
        names = {a.name for a in node.names}
        if module.split(".")[0] in PROCESS_MODULES:
            self.add("subprocess", node)
        if module in BROKER_MODULES or (
            module in ("tests", "labctl.testing") and names & {"mosquitto", "Mosquitto"}
        ):
            self.add("broker", node)
        if module in SLEEP_MODULES and "sleep" in names:
            self.sleep_names.update(a.asname or a.name for a in node.names if a.name == "sleep")
        if "run_experiment" in names:
            self.add("run_experiment", node)

    def _function(self, node: ast.FunctionDef | ast.AsyncFunctionDef) -> None:
        for arg in node.args.args + node.args.kwonlyargs:
            if arg.arg in BROKER_FIXTURES:
                self.scope.append(node.name)
                self.add("broker", arg)
                self.scope.pop()
        self.scope.append(node.name)
        self.generic_visit(node)
        self.scope.pop()

    visit_FunctionDef = _function
    visit_AsyncFunctionDef = _function

    def visit_ClassDef(self, node: ast.ClassDef) -> None:
        self.scope.append(node.name)
        self.generic_visit(node)
        self.scope.pop()

    def visit_Name(self, node: ast.Name) -> None:
        if node.id == "run_experiment":
            self.add("run_experiment", node)

    def visit_Attribute(self, node: ast.Attribute) -> None:
        if node.attr == "run_experiment":
            self.add("run_experiment", node)
        self.generic_visit(node)

    def visit_Call(self, node: ast.Call) -> None:
        func = node.func
        owner = (
            func.value.id if isinstance(func, ast.Attribute) and isinstance(func.value, ast.Name) else None
        )
        name = (
            func.attr if isinstance(func, ast.Attribute) else func.id if isinstance(func, ast.Name) else None
        )
        is_sleep = (name == "sleep" and owner in SLEEP_MODULES) or (
            isinstance(func, ast.Name) and func.id in self.sleep_names
        )
        if is_sleep:
            arg = node.args[0] if node.args else None
            if not (isinstance(arg, ast.Constant) and arg.value == 0):
                self.add("sleep", node)
        if (name or "").startswith("create_subprocess") or (owner == "os" and name in OS_PROCESS_CALLS):
            self.add("subprocess", node)
        if name in SOCKET_CALLS or (owner == "socket" and name == "socket"):
            self.add("socket", node)
        self.generic_visit(node)


def findings(source: str, path: str) -> list[Finding]:
    visitor = Impurities(path)
    visitor.visit(ast.parse(source))
    return visitor.found


def helper_modules(tree: ast.Module) -> set[str]:
    """The tests.helpers modules a file imports (`from tests.helpers.x import ...`, `from tests.helpers import
    x`)."""
    out = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module:
            if node.module.startswith("tests.helpers."):
                out.add(node.module)
            elif node.module == "tests.helpers":
                out.update(f"tests.helpers.{a.name}" for a in node.names)
        elif isinstance(node, ast.Import):
            out.update(a.name for a in node.names if a.name.startswith("tests.helpers."))
    return out


def unit_tier_files() -> list[Path]:
    files = sorted(UNIT.rglob("*.py"))
    seen = set(files)
    queue = list(files)
    while queue:
        tree = parsed(queue.pop())
        for module in helper_modules(tree):
            path = REPO / (module.replace(".", "/") + ".py")
            if path.exists() and path not in seen:
                seen.add(path)
                queue.append(path)
    return sorted(seen)


def test_the_unit_tier_starts_no_process_broker_socket_sleep_or_run() -> None:
    files = unit_tier_files()
    assert len(files) > 40, "the check must see the unit tier"
    found = [
        f
        for path in files
        for f in findings(path.read_text(), str(path.relative_to(REPO)))
        if (f.path, f.where, f.kind) not in ALLOWED
    ]
    assert not found, "not pure, move it to tests/integration:\n" + "\n".join(map(str, found))


def test_every_allowance_is_still_needed() -> None:
    present = {
        (f.path, f.where, f.kind)
        for path in unit_tier_files()
        for f in findings(path.read_text(), str(path.relative_to(REPO)))
    }
    assert not set(ALLOWED) - present, f"allowed but no longer there: {sorted(set(ALLOWED) - present)}"


def test_the_check_finds_each_kind() -> None:
    source = """
import subprocess
from multiprocessing import Process
from tests.mosquitto import Mosquitto
from asyncio import sleep as nap
from labctl.run.lifecycle import run_experiment
import asyncio, os, socket, time

async def test_x(mosquitto, tmp_path):
    await asyncio.sleep(0)
    await asyncio.sleep(0.1)
    time.sleep(GRACE_S * 2)
    await nap(1)
    os.system("true")
    await asyncio.create_subprocess_exec("true")
    socket.socket()
    socket.socketpair()
    await asyncio.open_connection("127.0.0.1", 1)
    await labctl.run.lifecycle.run_experiment(tmp_path)

class Fake:
    async def sleep(self, seconds):
        await self.clock.sleep(seconds)
"""
    kinds = [(f.where, f.kind, f.line) for f in findings(source, "x.py")]
    assert kinds == [
        ("<module>", "subprocess", 2),
        ("<module>", "subprocess", 3),
        ("<module>", "broker", 4),
        ("<module>", "run_experiment", 6),
        ("test_x", "broker", 9),
        ("test_x", "sleep", 11),
        ("test_x", "sleep", 12),
        ("test_x", "sleep", 13),
        ("test_x", "subprocess", 14),
        ("test_x", "subprocess", 15),
        ("test_x", "socket", 16),
        ("test_x", "socket", 18),
        ("test_x", "run_experiment", 19),
    ], kinds
