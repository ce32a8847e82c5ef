"""labctl.testing as a lab uses it from its own package: the contract classes subclassed in a project that
is not labctl's tests (pytest-asyncio in strict mode, no conftest of labctl's), and the plugin's fixtures,
each cleaning up after itself."""

from __future__ import annotations

import asyncio
import os
import textwrap
from pathlib import Path

import pytest

from labctl.linux import netns
from labctl.ocs.switches import open_switch, switch_drivers
from labctl.testing.mosquitto import Mosquitto
from labctl.testing.plugin import EmulatorFactory, KernelFabricFactory, SimLabFactory
from labctl.testing.switch_contract import SwitchContract

pytest_plugins = ["pytester"]

# Each project runs in a pytest of its own (runpytest_subprocess): run in this process, pytester would
# unload the labctl modules it imported, and this session's copies would then differ from later imports.
# A lab's conftest needs nothing once labctl is installed with its `labctl` pytest11 entry point; until the
# installed labctl has it, this registers the plugin the same way tests/conftest.py does.
CONFTEST = """
import importlib

def pytest_configure(config):
    plugin = importlib.import_module("labctl.testing.plugin")
    if not config.pluginmanager.is_registered(plugin):
        config.pluginmanager.register(plugin, "labctl")
"""
STRICT = (
    "-o",
    "asyncio_mode=strict",
    "-o",
    "asyncio_default_fixture_loop_scope=function",
    "-p",
    "no:benchmark",
)


def test_a_lab_runs_the_switch_contract_on_its_driver(pytester: pytest.Pytester) -> None:
    pytester.makeconftest(CONFTEST)
    pytester.makepyfile(
        test_my_driver="""
        from labctl.testing.switch_contract import SwitchContract


        class TestMyDriver(SwitchContract):
            driver = "sim"  # its name in labctl's switch driver registry
        """
    )
    result = pytester.runpytest_subprocess(*STRICT)
    # every case but the one for a switch at an address (sim has none): skipped, saying why
    cases = sum(1 for name in vars(SwitchContract) if name.startswith("test_"))
    result.assert_outcomes(passed=cases - 1 + 5, skipped=1)  # + the 5 more mappings of the parametrized case
    result.stdout.no_fnmatch_line("*PytestUnraisableExceptionWarning*")


def test_a_lab_runs_the_probe_contract_on_its_probe_and_one_without_a_harness_fails(
    pytester: pytest.Pytester,
) -> None:
    pytester.makeconftest(CONFTEST)
    pytester.makepyfile(
        test_my_probe="""
        from labctl.testing.probe_contract import MODEL_PORTS, ProbeContract


        class TestMyProbe(ProbeContract):
            probe = "model-link"  # its name in labctl's probe registry
            harness = MODEL_PORTS  # the simulated world's ports


        class TestNoHarness(ProbeContract):
            probe = "model-link"
        """
    )
    result = pytester.runpytest_subprocess(*STRICT)
    # TestMyProbe passes its 8 cases; TestNoHarness passes the one that needs no harness (the entry's
    # signals) and fails each of the 7 that run the probe.
    result.assert_outcomes(passed=9, errors=7)
    result.stdout.fnmatch_lines(["*probe 'model-link' has no harness: give TestNoHarness one*"])


class TestFixtures:
    async def test_sim_lab_is_built_started_and_connected(self, labctl_sim_lab: SimLabFactory) -> None:
        sim = await labctl_sim_lab()  # the built-in lab, on the fast profile
        assert sim.inventory.kind == "simulated" and set(sim.switches) == {"ocs1"}
        assert (await sim.switches["ocs1"].get_mapping()).value == frozenset()
        assert [p.name for p in sim.lab.probes] == ["model-link", "rx-power", "model-traffic"]
        text = (Path(__file__).parents[2] / "labctl/data/inventory.yaml").read_text()
        again = await labctl_sim_lab(text.replace("driver: sim", "driver: polatis-tl1, emulate: true"))
        result = await again.switches["ocs1"].apply({(1, 33)})  # over TCP, to its emulator
        assert result.value.mapping == {(1, 33)}

    async def test_emulator_serves_a_driver_that_connects(
        self, labctl_emulator: EmulatorFactory, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        served = await labctl_emulator("polatis-tl1")
        monkeypatch.setenv("LABCTL_TEST_EMULATOR_PASSWORD", served.users["admin"])
        config = switch_drivers.get("polatis-tl1").config.model_validate(
            {
                "driver": "polatis-tl1",
                "size": "8x8",
                "address": served.host,
                "port": served.port,
                "user": "admin",
                "password": "${LABCTL_TEST_EMULATOR_PASSWORD}",
            }
        )
        switch = open_switch("ocs1", config, lambda event: None)
        await switch.connect()
        try:
            await switch.apply({(1, 9)})
        finally:
            await switch.close()
        assert served.model.patches == {(1, 9)}

    def test_mosquitto_listens(self, labctl_mosquitto: Mosquitto) -> None:
        assert labctl_mosquitto.url == f"mqtt://127.0.0.1:{labctl_mosquitto.port}"
        assert labctl_mosquitto.proc is not None and labctl_mosquitto.proc.poll() is None

    async def test_kernel_fabric_is_up_and_follows_its_models(
        self, labctl_kernel_fabric: KernelFabricFactory
    ) -> None:
        inventory = textwrap.dedent(
            """
            lab: plugin-fabric
            kind: kernel
            switches:
              ocs1: {driver: sim, size: 4x4}
            profile: fast
            hosts:
              h1:
                nics:
                  - {ifname: ens1f0np0, rail: 0, switch: ocs1, tx: 1, rx: 5, address: 10.78.0.1/24}
              h2:
                nics:
                  - {ifname: ens1f0np0, rail: 0, switch: ocs1, tx: 2, rx: 6, address: 10.78.0.2/24}
            """
        )
        rig = await labctl_kernel_fabric(inventory)
        assert rig.prefix.startswith(f"lt{os.getpid()}-k")
        assert netns.list_netns(rig.prefix) == sorted(rig.fabric.layout.netns_names())
        assert set(rig.models) == {"ocs1"}
        await asyncio.sleep(0)


def test_the_emulator_and_the_sim_lab_are_gone_after_their_test(pytester: pytest.Pytester) -> None:
    """Run as a lab's tests would: the first test keeps what its fixtures served, the second finds it
    closed (no listening port, no task: the task guard of the contract classes is on every test)."""
    pytester.makeconftest(
        CONFTEST
        + """
import pytest

@pytest.fixture(autouse=True)
def _guard(labctl_no_leaked_tasks):
    pass
"""
    )
    pytester.makepyfile(
        test_cleanup="""
        import asyncio
        import pytest

        SEEN = {}

        @pytest.mark.asyncio
        async def test_serve(labctl_emulator, labctl_sim_lab):
            SEEN["port"] = (await labctl_emulator("polatis-tl1")).port
            SEEN["sim"] = await labctl_sim_lab()

        @pytest.mark.asyncio
        async def test_gone():
            with pytest.raises(OSError):
                await asyncio.open_connection("127.0.0.1", SEEN["port"])
            with pytest.raises(Exception, match="not connected"):
                await SEEN["sim"].switches["ocs1"].get_mapping()
        """
    )
    result = pytester.runpytest_subprocess(*STRICT)
    result.assert_outcomes(passed=2)
