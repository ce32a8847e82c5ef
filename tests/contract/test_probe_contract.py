"""The probe contract (labctl.testing.probe_contract) on every registered probe (labctl.core.registry.PROBES).

The suite itself ships in the wheel, so that a lab's own probe runs it too; here it runs once per name in
`probe_kinds.names()`, so a probe enters the suite by being registered, and fails it until HARNESSES
(labctl/testing/harnesses.py) says how to run it here: `test_every_registered_probe_has_a_harness` fails,
and so does every case that runs it.
"""

from __future__ import annotations

from labctl.probes.base import probe_kinds
from labctl.testing import harnesses
from labctl.testing.harnesses import HARNESSES, Harness
from labctl.testing.probe_contract import ProbeContract


class TestEveryProbe(ProbeContract):
    probe = probe_kinds.names()

    def harness_for(self, name: str) -> Harness | None:
        return HARNESSES.get(name)


def test_every_registered_probe_has_a_harness() -> None:
    registered = set(probe_kinds.names())
    missing = sorted(registered - set(HARNESSES))
    assert not missing, (
        f"registered probe(s) {missing} have no harness in {harnesses.__file__}: add an entry to HARNESSES "
        "that opens a ProbeContext the probe can run in here, so that the contract suite covers it"
    )
    stale = sorted(set(HARNESSES) - registered)
    assert not stale, f"HARNESSES has entries for probes that are not registered: {stale}"
