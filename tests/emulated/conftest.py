"""Shared fixtures for tests that need root and Linux network namespaces (mark them `emulated`).

Namespaces carry the prefix `lt<pid>-` so parallel runs never collide, and are deleted in a finally
block even when the test fails midway.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from collections.abc import Callable, Iterator

import pytest

from tests.conftest import require

NetnsFactory = Callable[[str], str]


def ip(*args: str) -> None:
    subprocess.run(["ip", *args], check=True, capture_output=True, text=True)


@pytest.fixture
def netns() -> Iterator[NetnsFactory]:
    """`netns("x")` creates namespace `lt<pid>-x` and returns its name; all are deleted afterwards."""
    require(os.geteuid() == 0, "needs root for network namespaces")
    require(shutil.which("ip") is not None, "needs iproute2 (ip)")
    created: list[str] = []

    def make(suffix: str) -> str:
        name = f"lt{os.getpid()}-{suffix}"
        ip("netns", "add", name)
        created.append(name)
        return name

    try:
        yield make
    finally:
        for name in reversed(created):
            subprocess.run(["ip", "netns", "del", name], check=False, capture_output=True)


# -- kernel fabric fixtures (issue 4) ------------------------------------------------------------------------
def _root_links() -> set[str]:
    out = subprocess.run(["ip", "-o", "link", "show"], check=True, capture_output=True, text=True).stdout
    return {line.split(":")[1].strip().split("@")[0] for line in out.splitlines() if ":" in line}


def _children() -> set[int]:
    """Live (non-zombie) child processes of this test process."""
    me = str(os.getpid())
    kids = set()
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if fields[1] == me and fields[0] != "Z":
            kids.add(int(entry))
    return kids


@pytest.fixture(scope="session", autouse=True)
def _sweep_test_namespaces() -> Iterator[None]:
    """Session-level sweep: namespaces of earlier, killed test sessions before; this session's after."""
    if os.geteuid() != 0 or not os.path.isdir("/run/netns"):
        yield
        return
    from labctl.linux import netns as lnetns

    for prefix in lnetns.stale_run_prefixes("lt"):
        lnetns.cleanup(prefix)
    try:
        yield
    finally:
        lnetns.cleanup(f"lt{os.getpid()}-")


_fabric_counter = iter(range(1_000_000))


@pytest.fixture
def fabric_prefix() -> Iterator[str]:
    """A unique `lt<pid>-<n>-` prefix; afterwards every namespace with it is removed (even if the test failed
    midway) and the test fails if it left a namespace, a root-namespace link or a child process behind."""
    require(sys.platform == "linux", "needs Linux")
    require(os.geteuid() == 0, "needs root for network namespaces")
    from labctl.linux import netns as lnetns

    prefix = f"lt{os.getpid()}-{next(_fabric_counter)}-"
    links_before = _root_links()
    kids_before = _children()
    try:
        yield prefix
    finally:
        leftover = lnetns.cleanup(prefix)
    assert not leftover, f"test left namespaces behind: {leftover}"
    new_links = _root_links() - links_before
    assert not new_links, f"test left links in the root namespace: {sorted(new_links)}"
    new_kids = _children() - kids_before
    assert not new_kids, f"test left child processes: {sorted(new_kids)}"
