"""The plugin's driver and probe against labctl's contract suites, through labctl's pytest plugin (the
`labctl` pytest11 entry point): no file of labctl's tests/ is needed."""

from labctl.testing.probe_contract import MODEL_PORTS, ProbeContract
from labctl.testing.switch_contract import SwitchContract


class TestLoopbackDriver(SwitchContract):
    driver = "loopback"


class TestPolledCarrierProbe(ProbeContract):
    probe = "polled-carrier"
    harness = MODEL_PORTS
