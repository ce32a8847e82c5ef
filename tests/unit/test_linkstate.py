"""The ethtool link state: the reply decoder against constructed LINKSTATE_GET replies, and the probe
polling a replayed sequence of them through a reconfiguration window (decision 0023)."""

from __future__ import annotations

import asyncio
import itertools
import struct

from labctl.events import Event
from labctl.linux.linkstate import (
    ETHTOOL_A_LINKSTATE_EXT_DOWN_CNT,
    ETHTOOL_A_LINKSTATE_EXT_STATE,
    ETHTOOL_A_LINKSTATE_EXT_SUBSTATE,
    ETHTOOL_A_LINKSTATE_HEADER,
    ETHTOOL_A_LINKSTATE_LINK,
    LinkState,
    parse_linkstate,
)
from labctl.linux.netlink import NLA_F_NESTED, attr, cstr
from labctl.probes.linkstate import LinkStateProbe, LinkTarget

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


class Replay:
    """A reader that answers with recorded replies, one per poll, the last one forever after."""

    def __init__(self, replies: list[bytes]) -> None:
        self.replies = list(replies)
        self.closed = False

    def read(self) -> LinkState:
        payload = self.replies.pop(0) if len(self.replies) > 1 else self.replies[0]
        return parse_linkstate(payload)

    def close(self) -> None:
        self.closed = True


async def test_a_window_records_the_inside_of_the_firmware_phase() -> None:
    """Light back → auto-negotiation → link training → up: one event per change, each with the poll before."""
    replay = Replay(
        [reply(1)]  # the initial read, before the reconfiguration
        + [reply(0, (0, 1))] * 3  # autoneg, no partner yet
        + [reply(0, (0, 2))] * 2  # autoneg, ack not received
        + [reply(0, (1, 1))] * 4  # link training
        + [reply(1, down_count=1)]  # up
    )
    target = LinkTarget("nic:h1/ens1f0np0", "h1", "ens1f0np0")
    probe = LinkStateProbe([target], hz=1000, open_reader=lambda t: replay)
    seen: list[Event] = []
    async with probe:

        async def pump() -> None:
            async for event in probe.events():
                seen.append(event)

        reader = asyncio.create_task(pump())
        await asyncio.sleep(0.05)
        assert [e.value for e in seen] == ["up"], "outside a window only the first reading"
        probe.open_window(["nic:h1/ens1f0np0"])
        for _ in range(200):
            if seen[-1].value == "up" and len(seen) > 1:
                break
            await asyncio.sleep(0.01)
        probe.close_window()
    await reader
    assert replay.closed
    assert [e.value for e in seen] == [
        "up",
        "autoneg/no_partner_detected",
        "autoneg/ack_not_received",
        "link_training_failure/kr_frame_lock_not_acquired",
        "up",
    ]
    assert all(e.kind == "link.state" and e.source == "nic:h1/ens1f0np0" for e in seen)
    assert [e.meta.get("ext_state") for e in seen] == [None, 0, 0, 1, None]
    assert seen[-1].meta["down_count"] == 1
    for before, after in itertools.pairwise(seen):
        assert before.t_ns <= after.meta["after_ns"] < after.t_ns  # the change fell between two polls
    assert probe.polls >= 11
