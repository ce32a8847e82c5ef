"""labctl's pytest plugin: the fixtures a lab needs to test its own switch driver or probe against labctl.

Installed with labctl as the `labctl` pytest11 entry point, so every pytest run in an environment with
labctl has these fixtures (nothing is autouse: a project that does not ask for them is not touched);
`-p no:labctl` turns it off. Every fixture cleans up after itself, whatever the test did:

- `labctl_no_leaked_tasks`: fails an async test that leaves an asyncio task running (the contract classes
  use it; a conftest makes it every test's with an autouse fixture that requests it).
- `labctl_sim_lab`: `await labctl_sim_lab()` builds and starts a simulated lab (the built-in one, or the
  inventory given) with its switches connected: a `SimLab` (inventory, lab, events).
- `labctl_emulator`: `await labctl_emulator("polatis-tl1")` serves a driver's protocol emulator around a
  SwitchModel on a free 127.0.0.1 port: a `ServedEmulator` (model, emulator, address, users).
- `labctl_mosquitto`: a mosquitto broker of this session on a free 127.0.0.1 port (`.url`), skipped where
  mosquitto is not installed.
- `labctl_adversarial_agent`: `await labctl_adversarial_agent(inventory, host)` runs an `AdversarialAgent`
  (labctl.testing.adversary): honest for `host`, forging replies for every other host.
- `labctl_kernel_fabric`: `await labctl_kernel_fabric(inventory)` brings an inventory's kernel fabric up
  (network namespaces, veth NICs, tc cross-connects) following one SwitchModel per switch: a
  `KernelFabricRig`. Root and Linux only (skipped otherwise); torn down, and checked for leftovers, always.

A prerequisite that is missing skips the test, or fails it where LABCTL_CI=1 (labctl.testing.support).
Only pytest is imported here at startup (pytest-asyncio if present); labctl's modules load when a fixture
runs.
"""

from __future__ import annotations

import asyncio
import inspect
import itertools
import os
import random
import shutil
import subprocess
import sys
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from labctl.testing.support import fail_on_leaked_tasks, require

try:
    from pytest_asyncio import fixture as async_fixture
except ImportError:  # pragma: no cover - the async fixtures then fail when used, and only then
    async_fixture = pytest.fixture  # type: ignore[assignment]

if TYPE_CHECKING:
    from labctl.core.events import Event
    from labctl.emulators.core import FaultPlan
    from labctl.emulators.fabric import KernelFabric
    from labctl.inventory.schema import Inventory
    from labctl.labs.base import Lab
    from labctl.models.switch import SwitchModel
    from labctl.ocs.protocol import OpticalSwitch
    from labctl.ocs.switches import Emulator
    from labctl.probes.sampling import ProbeSettings
    from labctl.testing.adversary import AdversarialAgent
    from labctl.testing.mosquitto import Mosquitto

__all__ = [
    "DEFAULT_USERS",
    "KernelFabricRig",
    "ServedEmulator",
    "SimLab",
    "labctl_adversarial_agent",
    "labctl_emulator",
    "labctl_kernel_fabric",
    "labctl_mosquitto",
    "labctl_no_leaked_tasks",
    "labctl_sim_lab",
    "labctl_task_guard",
]

MARKERS = {
    "emulated": "runs in Linux network namespaces (needs root); labctl's probe contract marks such cases"
}


def pytest_configure(config: pytest.Config) -> None:
    """Register the markers the contract classes set, unless the project already has (--strict-markers)."""
    known = {line.split(":")[0].split("(")[0].strip() for line in config.getini("markers")}
    for name, text in MARKERS.items():
        if name not in known:
            config.addinivalue_line("markers", f"{name}: {text}")


# -- no leaked asyncio task ----------------------------------------------------------------------------------
@async_fixture(loop_scope="function")
async def labctl_task_guard() -> AsyncIterator[None]:
    """The guard itself, in the test's loop: the tasks before the test, then any new one still running
    after it is cancelled and the test fails, naming them."""
    before = set(asyncio.all_tasks())
    yield
    await fail_on_leaked_tasks(before)


@pytest.fixture
def labctl_no_leaked_tasks(request: pytest.FixtureRequest) -> None:
    """Fail an async test that leaves an asyncio task running (ophyd-async does the same); a sync test has
    no loop of its own to check. Make it every test's with, in a conftest::

        @pytest.fixture(autouse=True)
        def _no_leaked_tasks(labctl_no_leaked_tasks: None) -> None: ...
    """
    if inspect.iscoroutinefunction(request.function):
        request.getfixturevalue("labctl_task_guard")


# -- a simulated lab -----------------------------------------------------------------------------------------
@dataclass
class SimLab:
    """A simulated lab built as a run builds it (labctl.labs.load, build_lab), started, switches connected."""

    inventory: Inventory
    lab: Lab
    events: list[Event] = field(default_factory=list)
    """Everything the lab's switches and models wrote."""

    @property
    def switches(self) -> dict[str, OpticalSwitch]:
        return self.lab.switches


SimLabFactory = Callable[..., Awaitable[SimLab]]


@async_fixture(loop_scope="function")
async def labctl_sim_lab(tmp_path: Path) -> AsyncIterator[SimLabFactory]:
    """`await labctl_sim_lab(inventory=None, *, profile="fast", seed=0, probes=None)`: a started `SimLab`.

    `inventory`: a path, or an inventory's YAML text (written under tmp_path), or None for the built-in
    lab; it must be of a kind that runs in-process (`simulated`). The probes are built, not started (enter
    them with `async with`). Afterwards every switch is closed and the lab closed."""
    from labctl.labs import build_lab, load, simulated
    from labctl.labs.base import LabContext
    from labctl.probes.sampling import ProbeSettings

    opened: list[SimLab] = []
    files = itertools.count()

    async def open_lab(
        inventory: Path | str | None = None,
        *,
        profile: str | None = "fast",
        seed: int = 0,
        probes: ProbeSettings | None = None,
    ) -> SimLab:
        from labctl.core.errors import InputError
        from labctl.core.shipped import builtin_inventory

        if inventory is None:
            path = builtin_inventory()
        elif isinstance(inventory, str) and "\n" in inventory:
            path = tmp_path / f"labctl-sim-lab-{next(files)}.yaml"
            path.write_text(inventory)
        else:
            path = Path(inventory)
        inv = load(path)
        kind = simulated.KIND.name
        if inv.kind != kind:
            raise InputError(f"{path}: labctl_sim_lab builds a {kind} lab, not one of kind {inv.kind!r}")
        events: list[Event] = []
        settings = probes or ProbeSettings()
        lab = build_lab(LabContext(inv, inv.profile(profile), random.Random(seed), events.append, settings))
        sim = SimLab(inv, lab, events)
        opened.append(sim)  # building started nothing; from here on, whatever starts is undone
        await sim.lab.start()
        for switch in sim.lab.switches.values():
            await switch.connect()
        return sim

    try:
        yield open_lab
    finally:
        for sim in reversed(opened):
            try:
                for switch in sim.lab.switches.values():
                    await switch.close()
                await sim.lab.aclose()
            finally:
                sim.lab.close()


# -- a switch's protocol emulator ----------------------------------------------------------------------------
DEFAULT_USERS: Mapping[str, str] = {"admin": "labctl-test"}
"""Whom an emulator served by `labctl_emulator` lets in, unless told otherwise."""


@dataclass
class ServedEmulator:
    """A driver's protocol emulator serving `model` on 127.0.0.1."""

    driver: str
    model: SwitchModel
    emulator: Emulator
    users: Mapping[str, str]
    host: str = "127.0.0.1"

    @property
    def port(self) -> int:
        return self.emulator.port

    @property
    def address(self) -> tuple[str, int]:
        return self.host, self.port


EmulatorFactory = Callable[..., Awaitable[ServedEmulator]]


@async_fixture(loop_scope="function")
async def labctl_emulator() -> AsyncIterator[EmulatorFactory]:
    """`await labctl_emulator(driver, model=None, *, size="8x8", users=DEFAULT_USERS, faults=None,
    session_timeout_s=None)`: the driver's emulator front end (its registry entry's `emulator`) serving
    `model` (default: a fresh `size` SwitchModel on the `fast` profile) on a free 127.0.0.1 port.

    Afterwards every emulator is closed (its sessions, its listening socket) and its model's pending light
    changes cancelled."""
    from labctl.core.errors import InputError
    from labctl.inventory.mapping import PortSpace
    from labctl.inventory.profiles import resolve_profile
    from labctl.models.switch import SwitchModel
    from labctl.ocs.switches import EmulatorOptions, switch_drivers

    served: list[ServedEmulator] = []

    async def serve(
        driver: str,
        model: SwitchModel | None = None,
        *,
        size: str = "8x8",
        users: Mapping[str, str] = DEFAULT_USERS,
        faults: FaultPlan | None = None,
        session_timeout_s: float | None = None,
    ) -> ServedEmulator:
        front = switch_drivers.get(driver).emulator
        if front is None:
            raise InputError(f"switch driver {driver} has no protocol emulator (its entry's `emulator`)")
        if model is None:
            model = SwitchModel("ocs1", PortSpace.parse(size), resolve_profile("fast"), random.Random(0))
        options = EmulatorOptions(
            host="127.0.0.1", port=0, users=dict(users), faults=faults, session_timeout_s=session_timeout_s
        )
        emulator = front.serve(model, options)
        one = ServedEmulator(driver, model, emulator, dict(users))
        served.append(one)
        await emulator.start()
        return one

    try:
        yield serve
    finally:
        for one in reversed(served):
            try:
                await one.emulator.close()
            finally:
                one.model.cancel_pending()


# -- a broker ------------------------------------------------------------------------------------------------
@pytest.fixture(scope="session")
def labctl_mosquitto(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Mosquitto]:
    """One mosquitto for the whole session on a free 127.0.0.1 port (`.url`, `.port`); tests keep apart by
    their topics (a lab's name). Skipped where mosquitto is not installed; stopped at the session's end."""
    from labctl.testing.mosquitto import Mosquitto

    require(shutil.which("mosquitto") is not None, "mosquitto is not installed (apt-get install mosquitto)")
    broker = Mosquitto(tmp_path_factory.mktemp("mosquitto"))
    broker.start()
    try:
        yield broker
    finally:
        broker.stop()


# -- a hostile agent host ------------------------------------------------------------------------------------
AdversaryFactory = Callable[..., Awaitable["AdversarialAgent"]]


@async_fixture(loop_scope="function")
async def labctl_adversarial_agent() -> AsyncIterator[AdversaryFactory]:
    """`await labctl_adversarial_agent(inventory, host, *, leaked_ids=None, guesses=2)`: an
    `AdversarialAgent` for `host` (`inventory`: an Inventory or a path; a lab kind with agents, its broker
    running), connected. It logs in and signs with `host`'s own identity only (its secret in the
    environment, decision 0067). Afterwards each one is stopped and its task awaited."""
    from labctl.agents.broker import BrokerSettings
    from labctl.inventory.schema import Inventory, load_inventory
    from labctl.testing.adversary import AdversarialAgent

    running: list[tuple[AdversarialAgent, asyncio.Task[None]]] = []

    async def start(
        inventory: Inventory | Path | str,
        host: str,
        *,
        leaked_ids: Callable[[], Iterable[tuple[int, str]]] | None = None,
        guesses: int = 2,
        connect_timeout_s: float = 10.0,
    ) -> AdversarialAgent:
        inv = inventory if isinstance(inventory, Inventory) else load_inventory(Path(inventory))
        settings = BrokerSettings.from_inventory(inv, identity=host)
        agent = AdversarialAgent(inv, host, settings, leaked_ids=leaked_ids, guesses=guesses)
        task = asyncio.create_task(agent.run(), name=f"labctl-adversary:{host}")
        running.append((agent, task))
        connected = asyncio.ensure_future(agent.connected.wait())
        await asyncio.wait([connected, task], timeout=connect_timeout_s, return_when=asyncio.FIRST_COMPLETED)
        if not connected.done():
            connected.cancel()
            if task.done():
                task.result()  # its own error (a refused login names the host)
            raise TimeoutError(f"adversarial agent {host} did not connect within {connect_timeout_s:g} s")
        return agent

    try:
        yield start
    finally:
        for agent, task in reversed(running):
            if not task.done():
                agent.stop()
            await asyncio.gather(task, return_exceptions=True)


# -- a kernel fabric -----------------------------------------------------------------------------------------
@dataclass
class KernelFabricRig:
    """An inventory's kernel fabric, up and moving light as its switches' models do."""

    inventory: Inventory
    fabric: KernelFabric
    models: dict[str, SwitchModel]
    """One model per inventory switch, followed by the fabric: drive one (a SimSwitch over it, or its own
    `execute`) and the fabric's cross-connects and fiber ends follow."""
    events: list[Event] = field(default_factory=list)

    @property
    def prefix(self) -> str:
        """The namespaces' prefix (`<prefix><host>`, `<prefix>ocs`)."""
        return self.fabric.layout.prefix


KernelFabricFactory = Callable[..., Awaitable[KernelFabricRig]]
_fabrics = itertools.count()


def _root_links() -> set[str]:
    out = subprocess.run(["ip", "-o", "link", "show"], check=True, capture_output=True, text=True).stdout
    return {line.split(":")[1].strip().split("@")[0] for line in out.splitlines() if ":" in line}


@async_fixture(loop_scope="function")
async def labctl_kernel_fabric(tmp_path: Path) -> AsyncIterator[KernelFabricFactory]:
    """`await labctl_kernel_fabric(inventory, *, profile=None, seed=0, management=False)`: a
    `KernelFabricRig` (`inventory`: an Inventory, a path, or an inventory's YAML text).

    Root and Linux only: skipped otherwise (failed where LABCTL_CI=1). The namespaces carry the prefix
    `lt<pid>-k<n>-`; afterwards every one of them is removed, even when the test failed midway, and the
    test fails if a namespace or a root-namespace link was left behind."""
    require(sys.platform == "linux", "needs Linux")
    require(os.geteuid() == 0, "needs root for network namespaces")
    require(shutil.which("ip") is not None, "needs iproute2 (ip)")
    from labctl.emulators.fabric import FabricLayout, KernelFabric
    from labctl.inventory.schema import Inventory, load_inventory
    from labctl.linux import netns
    from labctl.models.switch import SwitchModel

    rigs: list[KernelFabricRig] = []
    prefixes: list[str] = []
    links_before = _root_links()
    files = itertools.count()

    async def up(
        inventory: Inventory | Path | str,
        *,
        profile: str | None = None,
        seed: int = 0,
        management: bool = False,
    ) -> KernelFabricRig:
        if isinstance(inventory, str) and "\n" in inventory:
            path = tmp_path / f"labctl-kernel-fabric-{next(files)}.yaml"
            path.write_text(inventory)
            inventory = path
        inv = inventory if isinstance(inventory, Inventory) else load_inventory(inventory)
        timing = inv.profile(profile)
        rng = random.Random(seed)
        prefix = f"lt{os.getpid()}-k{next(_fabrics)}-"
        events: list[Event] = []
        fabric = KernelFabric(FabricLayout.of(inv, prefix), timing, rng, events.append)
        models = SwitchModel.many({name: spec.space for name, spec in inv.switches.items()}, timing, rng)
        prefixes.append(prefix)
        await asyncio.to_thread(fabric.create, management=management)
        rig = KernelFabricRig(inv, fabric, models, events)
        rigs.append(rig)
        fabric.open()
        for name, model in models.items():
            fabric.follow(name, model)
        return rig

    try:
        yield up
    finally:
        left: list[str] = []
        try:
            for rig in reversed(rigs):
                rig.fabric.close()
                for model in rig.models.values():
                    model.cancel_pending()
        finally:
            # Blocking on purpose: a teardown that awaited could be cancelled halfway and leave namespaces.
            # Removing a fabric's namespaces (fabric.destroy) removes every link inside them, and their veths'
            # peers; a create that failed midway has removed its own.
            for prefix in prefixes:
                netns.cleanup(prefix)
            left = [name for prefix in prefixes for name in netns.list_netns(prefix)]
    assert not left, f"namespaces that could not be removed: {left}"
    new_links = _root_links() - links_before
    assert not new_links, f"the test left links in the root namespace: {sorted(new_links)}"
