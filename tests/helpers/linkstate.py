"""Shared by tests/integration/test_linkstate.py and tests/unit/test_linkstate.py."""

from __future__ import annotations

import struct

from labctl.linux.linkstate import (
    ETHTOOL_A_LINKSTATE_EXT_DOWN_CNT,
    ETHTOOL_A_LINKSTATE_EXT_STATE,
    ETHTOOL_A_LINKSTATE_EXT_SUBSTATE,
    ETHTOOL_A_LINKSTATE_HEADER,
    ETHTOOL_A_LINKSTATE_LINK,
)
from labctl.linux.netlink import NLA_F_NESTED, attr, cstr

HEADER = attr(ETHTOOL_A_LINKSTATE_HEADER | NLA_F_NESTED, attr(2, cstr("ens1f0np0")))


def reply(link: int, ext: tuple[int, int] | None = None, down_count: int | None = None) -> bytes:
    """The attributes of an ETHTOOL_MSG_LINKSTATE_GET_REPLY as the kernel lays them out."""
    out = HEADER + attr(ETHTOOL_A_LINKSTATE_LINK, bytes([link]))
    if ext is not None:
        out += attr(ETHTOOL_A_LINKSTATE_EXT_STATE, bytes([ext[0]]))
        out += attr(ETHTOOL_A_LINKSTATE_EXT_SUBSTATE, bytes([ext[1]]))
    if down_count is not None:
        out += attr(ETHTOOL_A_LINKSTATE_EXT_DOWN_CNT, struct.pack("=I", down_count))
    return out
