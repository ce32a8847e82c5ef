"""The ethtool link state reply decoder against constructed LINKSTATE_GET replies. The probe polling them
through a reconfiguration window is tests/integration/test_linkstate.py."""

from __future__ import annotations

from labctl.linux.linkstate import (
    LinkState,
    parse_linkstate,
)
from tests.helpers.linkstate import HEADER, reply


def test_replies_decode_to_the_firmwares_reason() -> None:
    assert parse_linkstate(reply(1)) == LinkState(link=True)
    assert parse_linkstate(reply(1)).label == "up"
    down = parse_linkstate(reply(0, (0, 1), down_count=7))  # mlx5 PDDR opcode 2: AN, no partner detected
    assert (down.link, down.down_count, down.label) == (False, 7, "autoneg/no_partner_detected")
    assert parse_linkstate(reply(0, (1, 1))).label == "link_training_failure/kr_frame_lock_not_acquired"
    assert parse_linkstate(reply(0, (2, 5))).label == "link_logical_mismatch/rs_fec_is_not_locked"
    assert parse_linkstate(reply(0, (4, 0))).label == "no_cable"  # a state without a substate
    assert parse_linkstate(reply(0, (42, 3))).label == "ext_state_42/substate_3"  # a newer kernel: kept
    assert parse_linkstate(reply(0)).label == "down"  # a driver that does not say why (veth)
    assert parse_linkstate(HEADER).link is None
