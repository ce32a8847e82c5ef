"""The carrier probe's minimal RTM_NEWLINK decoding and flap accounting, on hand-built messages (no root)."""

from __future__ import annotations

import socket

from labctl.linux.rtnl import (
    IFF_LOWER_UP,
    IFF_UP,
    IFINFOMSG,
    IFLA_CARRIER,
    IFLA_CARRIER_DOWN_COUNT,
    IFLA_CARRIER_UP_COUNT,
    IFLA_IFNAME,
    IFLA_OPERSTATE,
    RTM_NEWLINK,
    attr,
    cstr,
    iter_messages,
    message,
    nested,
    parse_link,
    u32,
)
from labctl.probes.carrier import CarrierTarget, NetlinkCarrierProbe, _Watched


def link_msg(index: int, carrier: int, up: int, down: int, *, seq: int = 0, operstate: int = 6) -> bytes:
    flags = IFF_UP | (IFF_LOWER_UP if carrier else 0)
    body = (
        IFINFOMSG.pack(socket.AF_UNSPEC, 1, index, flags, 0)
        + attr(IFLA_IFNAME, cstr("ens1f0np0"))
        + nested(99, attr(1, b"\x01\x02\x03"))  # an attribute the parser must skip
        + attr(IFLA_OPERSTATE, bytes([operstate]))
        + attr(IFLA_CARRIER, bytes([carrier]))
        + attr(IFLA_CARRIER_UP_COUNT, u32(up))
        + attr(IFLA_CARRIER_DOWN_COUNT, u32(down))
    )
    return message(RTM_NEWLINK, 0, seq, body)


def test_parse_link_reads_only_the_fields_it_needs() -> None:
    data = link_msg(1007, 1, 5, 4) + link_msg(1008, 0, 2, 3, operstate=2)
    msgs = list(iter_messages(data))
    assert [m[0] for m in msgs] == [RTM_NEWLINK, RTM_NEWLINK]
    first = parse_link(data, msgs[0][3], msgs[0][4])
    assert (first.ifindex, first.carrier, first.operstate, first.up_count, first.down_count) == (
        1007,
        1,
        6,
        5,
        4,
    )
    assert first.flags & IFF_LOWER_UP
    second = parse_link(data, msgs[1][3], msgs[1][4])
    assert (second.ifindex, second.carrier, second.operstate) == (1008, 0, 2)


def _feed(probe: NetlinkCarrierProbe, w: _Watched, data: bytes, t: int, via: str = "event") -> None:
    for _kind, _flags, _seq, start, end in iter_messages(data):
        probe._update(w, data, start, end, t, via)


def test_counters_reveal_flaps_that_notifications_coalesced() -> None:
    probe = NetlinkCarrierProbe([CarrierTarget(None, "ens1f0np0", "nic:h1/ens1f0np0", "h1")])
    w = _Watched(probe.targets[0], 1007, b"")
    _feed(probe, w, link_msg(1007, 1, 1, 0), 100, "dump")
    _feed(probe, w, link_msg(1007, 0, 1, 1), 200)  # a plain down: no flap
    _feed(probe, w, link_msg(1007, 1, 3, 2), 300)  # up, but the counters moved by 3: one hidden flap
    _feed(probe, w, link_msg(1007, 1, 5, 4), 400)  # no change, two hidden flaps
    _feed(probe, w, link_msg(1007, 1, 5, 4), 500)  # nothing new: no event
    events = [e for e in probe.queue._items if e.kind == "carrier"]
    assert [(e.t_ns, e.value, e.meta.get("flaps"), e.meta.get("coalesced")) for e in events] == [
        (100, 1, None, None),
        (200, 0, None, None),
        (300, 1, 1, None),
        (400, 1, 2, True),
    ]
    assert events[0].meta["initial"] is True
    assert all(e.source == "nic:h1/ens1f0np0" and e.host == "h1" for e in events)
    operstates = [e.value for e in probe.queue._items if e.kind == "operstate"]
    assert operstates == ["up"]


def test_poll_replies_are_bounded_by_the_previous_poll() -> None:
    probe = NetlinkCarrierProbe([CarrierTarget(None, "x", "nic:h/x")])
    w = _Watched(probe.targets[0], 7, b"")
    _feed(probe, w, link_msg(7, 1, 1, 0), 10, "poll")
    _feed(probe, w, link_msg(7, 1, 1, 0), 20, "poll")
    _feed(probe, w, link_msg(7, 0, 1, 1), 30, "poll")
    last = [e for e in probe.queue._items if e.kind == "carrier"][-1]
    assert (last.value, last.meta["via"], last.meta["after_ns"]) == (0, "poll", 20)
