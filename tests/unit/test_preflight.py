"""`labctl lab check` (labctl.preflight) agrees with what a run does: the owned-ports test is converge's."""

from __future__ import annotations

import random

import pytest

from labctl.drivers.sim import DRIVER as SIM
from labctl.mapping import MappingDiff
from labctl.models.switch import SwitchModel
from labctl.ocs import crossing_patches
from labctl.preflight import Check, _read_switch
from labctl.profiles import resolve_profile
from labctl.switches import emulate_switch

FAST = resolve_profile("fast")


@pytest.mark.parametrize(
    ("patches", "crossing"),
    [
        ({(1, 9), (2, 10)}, []),  # both ends owned
        ({(5, 13)}, []),  # both ends another lab's
        ({(2, 14), (5, 10), (1, 9)}, [(2, 14), (5, 10)]),  # owned ingress → foreign egress, and back
    ],
)
async def test_the_switch_check_reports_the_patches_converge_refuses_to_remove(
    patches: set[tuple[int, int]], crossing: list[tuple[int, int]]
) -> None:
    config = SIM.config.model_validate({"driver": "sim", "size": "8x8", "owned_ports": ["1-4", "9-12"]})
    owned = config.owned
    assert owned is not None
    model = SwitchModel("ocs1", config.space, FAST, random.Random(0))
    await model.execute(MappingDiff(remove=frozenset(), add=frozenset(patches)))
    out: list[Check] = []
    try:
        await _read_switch(
            "switch ocs1", config, emulate_switch("ocs1", config, model, lambda e: None), "model", out
        )
    finally:
        model.cancel_pending()
    [row] = [c for c in out if c.item == "owned ports"]
    assert crossing_patches(patches, owned) == crossing
    assert row.ok is (not crossing)
    if crossing:
        assert str(crossing) in row.detail
