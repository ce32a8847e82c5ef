"""The `OpticalSwitch` contract: one suite that every switch driver passes, for labctl's drivers and yours.

A lab that writes its own driver (a `SwitchDriver` registry entry with an `emulate` entry: the driver over
labctl's switch model, directly or through its protocol emulator) runs the suite from its own tests::

    from labctl.testing.switch_contract import SwitchContract


    class TestMyDriver(SwitchContract):
        driver = "my-driver"  # its name in labctl's switch driver registry

pytest then collects every case below against that driver (`driver` may also be a tuple of names, or a
`driver` fixture the subclass defines). The fixtures come from labctl's pytest plugin
(labctl.testing.plugin, registered as the `labctl` pytest11 entry point), with pytest-asyncio installed.

Each case runs the driver through `emulate_switch` as a lab builds it: `sim` drives the switch model
in-process, `polatis-tl1` drives its TL1 emulator around the same model over real TCP. Every fault is
injected at the model (`lose_state`, `refusals`, a long switching time), so it reaches each driver through
whatever protocol it speaks, and the same assertions hold for every driver.
"""

from __future__ import annotations

import asyncio
import gc
import random
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any, ClassVar

import pytest
import pytest_asyncio

from labctl.core.errors import HardwareError, InputError, MappingError
from labctl.core.events import Event, Kind
from labctl.inventory.config import SwitchConfig
from labctl.inventory.mapping import MappingDiff
from labctl.inventory.profiles import Profile, resolve_profile
from labctl.models.switch import ChangeRefused, SwitchModel
from labctl.ocs.protocol import ApplyResult, OpticalSwitch, Timed
from labctl.ocs.switches import emulate_switch, open_switch, switch_drivers
from labctl.testing.support import names_of

__all__ = [
    "FAST",
    "NAME",
    "SIZE",
    "SOURCE",
    "TIMEOUT_S",
    "Rig",
    "SwitchContract",
    "driver_config",
    "emulated_drivers",
    "is_network_driver",
    "light_settled",
    "open_rig",
    "profile",
    "serving_servers",
]

NAME = "ocs1"
SIZE = "8x8"  # ingress 1..8, egress 9..16
TIMEOUT_S = 5.0  # the deadline of every operation, except in the timeout case
FAST = resolve_profile("fast")  # switching 2-3 ms
SOURCE = f"ocs:{NAME}"


def emulated_drivers() -> tuple[str, ...]:
    """Every registered driver the suite can run: those that can be driven over the lab's switch model."""
    return tuple(name for name in switch_drivers.names() if switch_drivers.get(name).emulate is not None)


def is_network_driver(driver: str) -> bool:
    """A driver of a switch at an address, emulated only when its config says `emulate: true`."""
    return "emulate" in switch_drivers.get(driver).config.model_fields


# -- building a driver over a model --------------------------------------------------------------------------
def driver_config(driver: str, timeout_s: float = TIMEOUT_S, **fields: Any) -> SwitchConfig:
    """The inventory config of an 8x8 switch of this driver, built only from what every config has."""
    entry = switch_drivers.get(driver)
    emulate = {"emulate": True} if "emulate" in entry.config.model_fields else {}
    config: SwitchConfig = entry.config.model_validate(
        {"driver": driver, "size": SIZE, "timeout_s": timeout_s, **emulate, **fields}
    )
    return config


def profile(switching_ms: float | None) -> Profile:
    if switching_ms is None:
        return FAST
    return Profile(**{**FAST.model_dump(), "switching_ms": (switching_ms, switching_ms)})


@dataclass
class Rig:
    """One connected driver over its model, and every event it wrote."""

    driver: str
    config: SwitchConfig
    model: SwitchModel
    switch: OpticalSwitch
    events: list[Event]

    def mark(self) -> int:
        return len(self.events)

    def since(self, mark: int, *kinds: str) -> list[Event]:
        return [e for e in self.events[mark:] if e.kind in kinds]


@asynccontextmanager
async def open_rig(
    driver: str, *, switching_ms: float | None = None, timeout_s: float = TIMEOUT_S
) -> AsyncIterator[Rig]:
    """Connect (which serves the switch's emulator, if it has one); on the way out close (which stops it)
    and cancel the model's pending light changes, whatever the test did."""
    config = driver_config(driver, timeout_s)
    model = SwitchModel.many({NAME: config.space}, profile(switching_ms), random.Random(7))[NAME]
    events: list[Event] = []
    try:
        switch = emulate_switch(NAME, config, model, events.append)
        await switch.connect()
        try:
            yield Rig(driver, config, model, switch, events)
        finally:
            await switch.close()
    finally:
        model.cancel_pending()


async def light_settled(model: SwitchModel, within_s: float = 2.0) -> None:
    """Until the model's outputs carry exactly its patches' light (the modeled switching time has passed)."""
    settled = asyncio.Event()

    def check(*_: object) -> None:
        if model.lit == {egress: ingress for ingress, egress in model.patches}:
            settled.set()

    model.add_listener(check)
    try:
        check()
        async with asyncio.timeout(within_s):
            await settled.wait()
    finally:
        model.listeners.remove(check)


def serving_servers() -> set[int]:
    """Every asyncio server of this process that still listens (an emulator's, among others)."""
    return {id(o) for o in gc.get_objects() if isinstance(o, asyncio.AbstractServer) and o.is_serving()}


class SwitchContract:
    """The suite: subclass it, name the driver (`driver = "my-driver"`), and pytest runs every case on it.

    Every case takes the `driver` (or the `rig` built from it) and runs once per driver named. The one case
    about a switch at an address runs only for drivers whose config has `emulate` (NETWORK_ONLY)."""

    driver: ClassVar[str | Sequence[str]]
    """The registry name of the driver under test, or several; or a `driver` fixture of the subclass."""

    NETWORK_ONLY: ClassVar[frozenset[str]] = frozenset({"test_a_switch_at_an_address_is_not_emulated"})
    """Cases for a driver of a switch at an address only (its config has an `emulate` field)."""

    def pytest_generate_tests(self, metafunc: pytest.Metafunc) -> None:
        """Each case once per named driver (a pytest hook: pytest calls it on the class)."""
        names = names_of(getattr(type(self), "driver", None))
        if names is None or "driver" not in metafunc.fixturenames:
            return  # a `driver` fixture of the subclass supplies it (or the case takes none)
        if metafunc.function.__name__ in self.NETWORK_ONLY:
            network = [name for name in names if is_network_driver(name)]
            if not network:
                reason = f"{', '.join(names)}: no switch at an address (its config has no `emulate` field)"
                metafunc.parametrize("driver", [pytest.param(None, marks=pytest.mark.skip(reason=reason))])
                return
            names = tuple(network)
        metafunc.parametrize("driver", names)

    @pytest.fixture(autouse=True)
    def _labctl_no_leaked_tasks(self, labctl_no_leaked_tasks: None) -> None:
        """No case may leave a task of the driver or its emulator running (labctl.testing.plugin)."""

    @pytest_asyncio.fixture(loop_scope="function")
    async def rig(self, driver: str) -> AsyncIterator[Rig]:
        async with open_rig(driver) as connected:
            yield connected

    # -- 1. apply, read back, diff, idempotence --------------------------------------------------------------
    @pytest.mark.asyncio
    async def test_apply_reads_back_and_reports_the_diff(self, rig: Rig) -> None:
        sw = rig.switch
        assert isinstance(sw, OpticalSwitch)
        assert sw.name == NAME and sw.space == rig.config.space
        first = {(1, 9), (2, 10)}
        second = {(1, 10), (2, 9), (3, 11)}
        await sw.apply(first)

        mark = rig.mark()
        timed = await sw.apply(second, context={"contract": 1})
        assert isinstance(timed, Timed) and isinstance(timed.value, ApplyResult)
        assert timed.start_ns <= timed.end_ns
        result = timed.value
        assert result.switch == NAME
        assert result.added == second and result.removed == first
        assert result.mapping == second  # the switch's read-back after the change
        assert result.attempts == 1
        assert result.command_ns is not None and result.complete_ns is not None
        assert timed.start_ns <= result.command_ns <= result.complete_ns <= timed.end_ns
        assert [e.meta.get("contract") for e in rig.since(mark, Kind.OCS_COMMAND)] == [
            1
        ]  # context is carried

        read = await sw.get_mapping()
        assert read.value == second and read.start_ns <= read.end_ns
        assert rig.model.patches == second  # the switch itself, not only the driver's idea of it

        mark, changes = rig.mark(), rig.model.commands
        again = await sw.apply(second)
        assert again.value.attempts == 0
        assert again.value.added == frozenset() and again.value.removed == frozenset()
        assert again.value.mapping == second and again.value.command_ns is None
        assert not rig.since(mark, Kind.OCS_COMMAND, Kind.OCS_COMPLETE, Kind.OCS_ERROR)
        assert rig.model.commands == changes  # nothing reached the switch

    # -- 2. scope and disconnect -----------------------------------------------------------------------------
    @pytest.mark.asyncio
    async def test_scope_changes_only_its_ports_and_disconnect_removes_their_patches(self, rig: Rig) -> None:
        sw = rig.switch
        await sw.apply({(1, 9), (2, 10), (5, 13), (6, 14)})

        # Ports 1, 2, 9, 10 are in scope: (1, 10) goes in, (1, 9) and (2, 10) go, (2, 9) does not appear;
        # (5, 13) and (6, 14) lie outside the scope and stay.
        timed = await sw.apply([(1, 10)], scope={1, 2, 9, 10})
        assert timed.value.removed == {(1, 9), (2, 10)} and timed.value.added == {(1, 10)}
        assert (await sw.get_mapping()).value == {(1, 10), (5, 13), (6, 14)}

        # One ingress end and one egress end: both patches go, the rest stays.
        gone = await sw.disconnect([5, 14])
        assert gone.value.removed == {(5, 13), (6, 14)} and gone.value.added == frozenset()
        assert (await sw.get_mapping()).value == {(1, 10)}
        assert rig.model.patches == {(1, 10)}

        mark = rig.mark()
        idle = await sw.disconnect([7, 15])  # ports that carry nothing: nothing to send
        assert idle.value.attempts == 0 and idle.value.removed == frozenset()
        assert not rig.since(mark, Kind.OCS_COMMAND)
        assert (await sw.get_mapping()).value == {(1, 10)}

    # -- 3. state loss repaired by a verified apply ----------------------------------------------------------
    @pytest.mark.asyncio
    async def test_verified_apply_repairs_lost_state(self, rig: Rig) -> None:
        sw = rig.switch
        wanted = {(1, 9), (2, 10), (3, 11)}
        await sw.apply(wanted)
        rig.model.lose_state()  # as after a power cycle of the switch
        assert (await sw.get_mapping()).value == frozenset()

        repaired = await sw.apply(wanted)  # diffs against the switch's read-back, not a cached mapping
        assert repaired.value.added == wanted and repaired.value.removed == frozenset()
        assert repaired.value.mapping == wanted
        assert (await sw.get_mapping()).value == wanted
        assert rig.model.patches == wanted

    # -- 4. bounded retries on refusal -----------------------------------------------------------------------
    @pytest.mark.asyncio
    async def test_refused_changes_are_retried_a_bounded_number_of_times(self, rig: Rig) -> None:
        sw = rig.switch
        base = {(5, 13)}
        await sw.apply(base)
        change = [(1, 9)]  # one patch: one change reaches the switch per attempt, whatever the protocol

        # Learn the driver's bound from what it does: refuse far more changes than it may try.
        plenty = 50
        rig.model.refusals = plenty
        mark = rig.mark()
        with pytest.raises(HardwareError):
            await sw.apply(change)
        attempts = len(rig.since(mark, Kind.OCS_COMMAND))
        assert 2 <= attempts < plenty, f"{rig.driver} tried {attempts} time(s): it must retry, and give up"
        assert rig.model.refusals == plenty - attempts  # each ocs.command is one change the switch refused

        # Exactly as many refusals as attempts: every attempt is refused, the apply fails, nothing changed.
        rig.model.refusals = attempts
        mark = rig.mark()
        with pytest.raises(HardwareError):
            await sw.apply(change)
        commands = rig.since(mark, Kind.OCS_COMMAND)
        assert len(commands) == attempts
        assert rig.since(mark, Kind.OCS_ERROR)
        assert not rig.since(mark, Kind.OCS_COMPLETE)
        assert all(e.source == SOURCE for e in rig.since(mark, Kind.OCS_COMMAND, Kind.OCS_ERROR))
        assert rig.model.refusals == 0
        assert rig.model.patches == base
        assert (await sw.get_mapping()).value == base

        # One refusal fewer: the last attempt goes through.
        rig.model.refusals = attempts - 1
        mark = rig.mark()
        done = await sw.apply(change)
        assert done.value.attempts == attempts
        assert done.value.added == set(change) and done.value.mapping == base | set(change)
        assert len(rig.since(mark, Kind.OCS_COMMAND)) == attempts
        assert len(rig.since(mark, Kind.OCS_COMPLETE)) == 1
        assert len(rig.since(mark, Kind.OCS_ERROR)) >= attempts - 1
        assert rig.model.patches == base | set(change)

    # -- 5. deadlines ----------------------------------------------------------------------------------------
    @pytest.mark.asyncio
    async def test_an_operation_past_its_deadline_fails_at_the_deadline(self, driver: str) -> None:
        deadline_s = 0.3
        switching_s = 4.0  # the switch takes far longer than the deadline allows
        async with open_rig(driver, switching_ms=switching_s * 1000, timeout_s=deadline_s) as rig:
            mark = rig.mark()
            start = time.monotonic()
            with pytest.raises(HardwareError, match=r"did not finish within 0\.3 s"):
                await rig.switch.apply([(1, 9)])
            elapsed = time.monotonic() - start
            # The bound is loose on purpose: a loaded CI machine may run the loop late by a second or more
            # (docs/decisions/0018). It still fails a driver that waits for the switch (>= 4 s) instead of
            # abandoning the operation at its deadline.
            assert deadline_s - 0.05 <= elapsed < deadline_s + 2.5
            assert rig.since(mark, Kind.OCS_COMMAND) and not rig.since(mark, Kind.OCS_COMPLETE)

            # The driver is still usable: a read (no switching) answers within the deadline.
            assert (await rig.switch.get_mapping()).value == rig.model.patches
        # open_rig closed the switch and its emulator with the change still in flight; the task guard checks
        # that nothing was left running.

    # -- 6. close --------------------------------------------------------------------------------------------
    @pytest.mark.asyncio
    async def test_close_is_idempotent_final_and_stops_the_emulator(self, driver: str) -> None:
        tasks_before = set(asyncio.all_tasks())
        servers_before = serving_servers()
        async with open_rig(driver) as rig:
            sw = rig.switch
            await sw.apply([(1, 9)])
            await sw.close()
            await sw.close()  # harmless
            calls: list[Callable[[], Awaitable[object]]] = [
                sw.get_mapping,
                lambda: sw.apply([(2, 10)]),
                lambda: sw.disconnect([1]),
                lambda: sw.port_power([1, 9]),
            ]
            for call in calls:
                with pytest.raises(HardwareError, match="not connected"):
                    await call()
        # open_rig has closed the switch a third time, then what ran around it
        await asyncio.sleep(0)
        assert serving_servers() <= servers_before, "an emulator is still listening after its close()"
        leaked = [t for t in asyncio.all_tasks() if t not in tasks_before and not t.done()]
        assert not leaked, f"tasks left running: {sorted(t.get_name() for t in leaked)}"
        assert rig.model.patches == {(1, 9)}  # ending a session does not touch the switch's patches

    # -- 7. events -------------------------------------------------------------------------------------------
    @pytest.mark.asyncio
    async def test_changes_and_power_readings_are_events(self, rig: Rig) -> None:
        sw = rig.switch
        for mapping in ({(1, 9), (2, 10)}, {(1, 10), (2, 9)}, set()):
            mark = rig.mark()
            await sw.apply(mapping, scope={1, 2, 9, 10})
            changes = rig.since(mark, Kind.OCS_COMMAND, Kind.OCS_COMPLETE)
            assert [e.kind for e in changes] == [Kind.OCS_COMMAND, Kind.OCS_COMPLETE]
            assert all(e.source == SOURCE for e in changes)
            assert changes[0].t_ns <= changes[1].t_ns

        rig.model.transmitting.update({1: -1.0, 2: -3.0})  # transceivers on ingress 1 and 2
        await sw.apply({(1, 10), (2, 9)})
        await light_settled(rig.model)
        ports = [1, 2, 3, 9, 10, 11]  # lit and dark ingress, lit and dark egress
        expected = {p: rig.model.power_dbm(p) for p in ports}
        assert {p for p, dbm in expected.items() if dbm is None} == {3, 11}

        mark = rig.mark()
        timed = await sw.port_power(ports)
        assert timed.start_ns <= timed.end_ns
        assert set(timed.value) == set(ports)
        if not switch_drivers.get(rig.driver).measures_power:  # no monitors: nothing measured, said per port
            expected = dict.fromkeys(ports)
        for port, dbm in expected.items():
            assert timed.value[port] == (None if dbm is None else pytest.approx(dbm, abs=0.01)), port
        rx = rig.since(mark, Kind.RX_POWER)
        assert len(rx) == len(ports)
        assert {e.source: e.value for e in rx} == {f"{SOURCE}/{p}": timed.value[p] for p in ports}

    # -- 8. invalid mappings ---------------------------------------------------------------------------------
    @pytest.mark.parametrize(
        "bad",
        [
            pytest.param([(1, 17)], id="port-out-of-range"),
            pytest.param([(0, 9)], id="port-zero"),
            pytest.param([(1, 9), (2, 9)], id="egress-shared"),
            pytest.param([(1, 9), (1, 10)], id="ingress-shared"),
            pytest.param([(9, 1)], id="egress-to-ingress"),
            pytest.param([(1, 2)], id="ingress-to-ingress"),
        ],
    )
    @pytest.mark.asyncio
    async def test_invalid_mappings_are_refused_before_anything_is_sent(
        self, rig: Rig, bad: list[tuple[int, int]]
    ) -> None:
        sw = rig.switch
        await sw.apply({(5, 13)})
        mark, changes = rig.mark(), rig.model.commands
        with pytest.raises(MappingError):
            await sw.apply(bad)
        assert not rig.since(mark, Kind.OCS_COMMAND, Kind.OCS_COMPLETE, Kind.OCS_ERROR)
        assert rig.model.commands == changes
        assert rig.model.patches == {(5, 13)}

    @pytest.mark.asyncio
    async def test_ports_out_of_range_in_a_scope_are_refused_before_anything_is_sent(self, rig: Rig) -> None:
        sw = rig.switch
        await sw.apply({(5, 13)})
        mark, changes = rig.mark(), rig.model.commands
        with pytest.raises(MappingError):
            await sw.apply([], scope=[5, 17])
        with pytest.raises(MappingError):
            await sw.disconnect([5, 17])
        assert not rig.since(mark, Kind.OCS_COMMAND, Kind.OCS_COMPLETE, Kind.OCS_ERROR)
        assert rig.model.commands == changes
        assert rig.model.patches == {(5, 13)}

    # -- what every driver takes from the inventory ----------------------------------------------------------
    @pytest.mark.asyncio
    async def test_the_switch_has_its_inventory_name_and_refuses_a_size_it_does_not_have(
        self, driver: str
    ) -> None:
        """The name comes from the inventory (events are filed under it), and a switch whose port space is not
        the inventory's is refused at connect, before anything is sent."""
        config = driver_config(driver)
        model = SwitchModel("the-models-own-name", config.space, FAST, random.Random(0))
        switch = emulate_switch(NAME, config, model, lambda event: None)
        assert switch.name == NAME and switch.space == config.space
        bigger = SwitchModel(NAME, type(config.space)(16, 16), FAST, random.Random(0))
        switch = emulate_switch(NAME, config, bigger, lambda event: None)
        servers_before = serving_servers()
        try:
            with pytest.raises(InputError, match=r"inventory says 8x8"):
                await switch.connect()
            assert serving_servers() <= servers_before, "a refused connect left its emulator serving"
        finally:
            await switch.close()
            bigger.cancel_pending()
        assert bigger.commands == 0

    @pytest.mark.asyncio
    async def test_power_queries_take_ports_of_the_switch(self, rig: Rig) -> None:
        """A per-port query names at least one port, and only ports the switch has."""
        with pytest.raises(InputError, match="no ports given"):
            await rig.switch.port_power([])
        with pytest.raises(InputError, match=r"ports \[17\] are outside 1\.\.16"):
            await rig.switch.port_power([1, 17])

    # -- a switch shared with another lab --------------------------------------------------------------------
    @pytest.mark.asyncio
    async def test_a_shared_switch_touches_only_the_owned_ports(self, driver: str) -> None:
        """`owned_ports`: changes inside them go through; nothing outside is named, patched or unpatched; a
        patch joining an owned port to a foreign one is not removed (it is the other lab's too)."""
        config = driver_config(driver, owned_ports=["1-4", "9-12"])
        model = SwitchModel(NAME, config.space, FAST, random.Random(0))
        switch = emulate_switch(NAME, config, model, lambda event: None)
        await switch.connect()
        try:
            await model.execute(
                MappingDiff(remove=frozenset(), add=frozenset({(5, 13)}))
            )  # another lab's patch
            await switch.apply({(1, 9), (2, 10)}, scope=[1, 2, 3, 4, 9, 10, 11, 12])
            assert model.patches == {(1, 9), (2, 10), (5, 13)}
            for mapping, scope in (({(5, 14)}, None), ({(1, 9)}, [1, 9, 6])):
                with pytest.raises(MappingError, match="does not own"):
                    await switch.apply(mapping, scope=scope)
            with pytest.raises(MappingError, match="does not own"):
                await switch.disconnect([13])
            await model.execute(MappingDiff(remove=frozenset({(2, 10)}), add=frozenset({(2, 14)})))  # crosses
            commands = model.commands
            with pytest.raises(HardwareError, match=r"\(2, 14\).*another lab"):
                await switch.disconnect([2])
            assert model.commands == commands and model.patches == {(1, 9), (2, 14), (5, 13)}
        finally:
            await switch.close()
            model.cancel_pending()

    @pytest.mark.asyncio
    async def test_a_retry_does_not_remove_a_patch_another_lab_made_meanwhile(self, driver: str) -> None:
        """The crossing check holds on every attempt, not only the first: when another lab patches into one
        of our egress ports while our change is in flight (so the switch refuses ours), the retry's read-back
        shows that foreign patch in our scope, and converge must refuse to remove it rather than "repair"
        it."""
        config = driver_config(driver, owned_ports=["1-4", "9-12"])
        model = SwitchModel(NAME, config.space, FAST, random.Random(0))
        events: list[Event] = []
        switch = emulate_switch(NAME, config, model, events.append)
        model_execute = model.execute

        async def foreign_patch_lands_first(diff: MappingDiff) -> tuple[int, int]:
            if (1, 9) in diff.add and (5, 9) not in model.patches:
                model.patches = model.patches | {(5, 9)}  # another lab's ENT-PATCH 5,9, just before ours
                model.commands += 1
                raise ChangeRefused(f"{NAME}: port 9 is already in use")
            return await model_execute(diff)

        model.execute = foreign_patch_lands_first  # type: ignore[method-assign]
        await switch.connect()
        try:
            with pytest.raises(HardwareError, match=r"\(5, 9\).*another lab"):
                await switch.apply({(1, 9)}, scope=[1, 9])
            assert (5, 9) in model.patches, "the retry removed the other lab's patch"
            assert "another lab" in str([e.value for e in events if e.kind == Kind.OCS_ERROR][-1])
        finally:
            await switch.close()
            model.cancel_pending()

    # -- who is in the suite, and what it refuses ------------------------------------------------------------
    def test_an_emulated_switch_has_no_address_to_open(self, driver: str) -> None:
        # the wording is the registry's; the refusal is the contract
        with pytest.raises(InputError, match=NAME):
            open_switch(NAME, driver_config(driver), lambda event: None)

    def test_a_switch_at_an_address_is_not_emulated(self, driver: str) -> None:
        if not is_network_driver(driver):  # under a `driver` fixture (named drivers: filtered at collection)
            pytest.skip(f"{driver}: no switch at an address (its config has no `emulate` field)")
        config = driver_config(driver, emulate=False, address="192.0.2.10", user="admin")
        assert not config.over_model
        model = SwitchModel(NAME, config.space, FAST, random.Random(0))
        with pytest.raises(InputError, match=NAME):
            emulate_switch(NAME, config, model, lambda event: None)
        assert model.commands == 0 and model.patches == frozenset()
