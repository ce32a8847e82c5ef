"""The Polatis SCPI driver without a switch: its config and a missing extra. The driver against the SCPI
emulator over real sockets is tests/integration/test_scpi_driver.py."""

from __future__ import annotations

import sys
from collections.abc import Callable

import pytest

from labctl.core.extras import MissingExtra, install_hint
from labctl.ocs.drivers.polatis_scpi import PolatisScpiConfig
from labctl.ocs.switches import emulate_switch, switch_drivers
from tests.helpers import scpi_driver as helpers
from tests.helpers.scpi_driver import model_of

_no_leaked_threads = helpers._no_leaked_threads  # autouse: no SCPI worker thread outlives a test


# -- a missing extra ------------------------------------------------------------------------------------------
@pytest.mark.parametrize("module", ["pyvisa", "pyvisa_py"])
def test_without_pyvisa_the_driver_is_one_line_naming_the_extra(
    monkeypatch: pytest.MonkeyPatch, module: str
) -> None:
    monkeypatch.setitem(sys.modules, module, None)  # `import pyvisa` now raises ImportError
    entry = switch_drivers.get("polatis-scpi")
    at_address = PolatisScpiConfig.model_validate({"driver": "polatis-scpi", "address": "192.0.2.1"})
    emulated = PolatisScpiConfig.model_validate({"driver": "polatis-scpi", "emulate": True})
    open_at = entry.open
    assert open_at is not None
    model = model_of()
    builds: list[Callable[[], object]] = [
        lambda: open_at("ocs1", at_address, lambda e: None),
        lambda: emulate_switch("ocs1", emulated, model, lambda e: None),
    ]
    for build in builds:
        with pytest.raises(MissingExtra) as info:
            build()
        assert str(info.value) == (
            f"the Polatis SCPI driver needs {module} (it is not installed): " + install_hint("scpi")
        )


def test_the_config_needs_only_an_address() -> None:
    config = PolatisScpiConfig.model_validate({"driver": "polatis-scpi", "address": "192.0.2.1"})
    assert config.port is None and config.user is None
    with pytest.raises(ValueError, match="needs address"):
        PolatisScpiConfig.model_validate({"driver": "polatis-scpi"})
