"""The polatis-netconf driver without a switch: its host-key policy in the inventory and a missing ncclient.
The driver against its emulator over SSH is tests/integration/test_netconf_driver.py."""

from __future__ import annotations

import pytest

from labctl.core.extras import MissingExtra, install_hint
from labctl.ocs.switches import switch_drivers


# -- the extra -----------------------------------------------------------------------------------------------------
def test_without_ncclient_the_driver_names_the_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    import importlib

    real = importlib.import_module

    def no_ncclient(name: str, package: str | None = None) -> object:
        if name == "ncclient" or name.startswith("ncclient."):
            raise ModuleNotFoundError(f"No module named {name!r}", name="ncclient")
        return real(name, package)

    monkeypatch.setattr("labctl.core.extras.importlib.import_module", no_ncclient)
    entry = switch_drivers.get("polatis-netconf")
    config = entry.config.model_validate(
        {"driver": "polatis-netconf", "address": "192.0.2.1", "user": "admin", "size": "8x8"}
    )
    assert entry.open is not None
    with pytest.raises(MissingExtra) as caught:
        entry.open("ocs1", config, lambda e: None)
    assert str(caught.value) == (
        "the polatis-netconf driver needs ncclient (it is not installed): " + install_hint("netconf")
    )


def test_the_host_key_policy_is_checked_in_the_inventory() -> None:
    config_model = switch_drivers.get("polatis-netconf").config
    base = {"driver": "polatis-netconf", "address": "192.0.2.1", "user": "admin"}
    with pytest.raises(ValueError, match="host_key: pinned needs host_key_sha256"):
        config_model.model_validate({**base, "host_key": "pinned"})
    with pytest.raises(ValueError, match="ssh-keygen -l prints it"):
        config_model.model_validate({**base, "host_key": "pinned", "host_key_sha256": "abc"})
    with pytest.raises(ValueError, match="only read with host_key: pinned"):
        config_model.model_validate({**base, "host_key_sha256": "SHA256:" + "A" * 43})
    ok = config_model.model_validate({**base, "host_key": "pinned", "host_key_sha256": "SHA256:" + "A" * 43})
    assert ok.port is None  # the driver's default, 830
