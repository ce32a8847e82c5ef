"""Causality (decision 0044): the NIC model passes no traffic on a link that is down, and the invariant
checker (labctl.analysis.invariants) flags a run where traffic was seen on one, allowing only for what the
measurement cannot tell. tests/conftest.py applies the checker to every run the test suite makes."""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from labctl.analysis.invariants import check_events, check_file
from labctl.core.clock import Timebase
from labctl.core.events import Event, EventLog, Kind
from labctl.inventory.profiles import resolve_profile
from labctl.inventory.schema import Inventory, NicPort, load_inventory
from labctl.models.fabric import SimFabric
from labctl.models.switch import SwitchModel

FAST = resolve_profile("fast")


MS = 1_000_000


T = 10**12


def _lab(inventory_path: Path) -> tuple[Inventory, SwitchModel, SimFabric, dict[str, NicPort]]:
    inv = load_inventory(inventory_path)
    model = SwitchModel("ocs1", inv.switches["ocs1"].space, FAST, random.Random(3))
    fabric = SimFabric(inv, {"ocs1": model}, FAST, random.Random(3))
    ports = {h: inv.rail_ports(0)[h][0] for h in ("h1", "h2", "h3", "h4")}
    return inv, model, fabric, ports


def _patch(model: SwitchModel, t: int, pairs: list[tuple[NicPort, NicPort]]) -> None:
    """Both directions of each pair lit at model time t, in one batch (as one command's changes)."""
    egress = [b.rx for a, b in pairs] + [a.rx for a, b in pairs]
    ingress: list[int | None] = [a.tx for a, b in pairs] + [b.tx for a, b in pairs]
    model._at([t] * len(egress), egress, ingress)


async def test_a_new_circuit_passes_no_traffic_before_its_link_is_up(inventory_path: Path) -> None:
    """Issue 23: h1-h2 and h3-h4 carry traffic; the switch swaps to h1-h3 and h2-h4. A reader that caught
    only the optics up to just after the swap, before the fabric's timeline had run the link reactions (a
    busy loop: the samplers read first), saw the old links' transport flags with the new light and passed
    traffic from h1 to h3 on links that were about to go down, ~50 ms before either had carrier. A link is
    trusted only while neither end's light has changed since it lit, so the verdict needs no link reaction
    to have run (decision 0052; before it, decision 0046: readers ran them all)."""
    _inv, model, fabric, p = _lab(inventory_path)
    slot = fabric.slot
    _patch(model, T, [(p["h1"], p["h2"]), (p["h3"], p["h4"])])
    fabric.sync_optics(T)
    fabric.timeline.run_due(T + 10**9)
    old = np.array([slot[p["h1"]], slot[p["h3"]]]), np.array([slot[p["h2"]], slot[p["h4"]]])
    assert fabric.traffic_ok(*old, T + 10**9).all()

    swap = T + 2 * 10**9
    _patch(model, swap, [(p["h1"], p["h3"]), (p["h2"], p["h4"])])
    fabric.sync_optics(swap + 1)  # a reader at swap + 1 ns catches the optics up (Rx power, a ping)
    new = np.array([slot[p["h1"]], slot[p["h3"]]]), np.array([slot[p["h3"]], slot[p["h1"]]])
    assert not fabric.traffic_ok(*new, swap + 1).any()  # the optics moved, the links did not react yet
    assert not fabric.traffic_ok(*old, swap + 1).any()
    assert not fabric.passes(slot[p["h1"]], slot[p["h3"]], swap + 1)
    # ...without working through the link reactions inside the ping's read (hundreds of ports: a sampler's
    # tick of 10 ms): they are still the fabric timeline's to run.
    assert fabric.state(p["h1"]).transport == 1 and fabric.timeline.next_due_ns() == swap

    fabric.timeline.run_due(swap + 1)  # the link reactions: the old links drop
    assert fabric.state(p["h1"]).carrier == 1 and not fabric.traffic_ok(*new, swap + 1).any()
    fabric.timeline.run_due(swap + 10**9)  # the new links come up
    assert fabric.state(p["h1"]).carrier == fabric.state(p["h3"]).carrier == 1
    assert fabric.traffic_ok(*new, swap + 10**9).all()
    assert fabric.passes(slot[p["h1"]], slot[p["h3"]], swap + 10**9)
    fabric.cancel_pending()
    model.cancel_pending()


# -- the checker -------------------------------------------------------------------------------------------
A, B = "nic:h1/p0", "nic:h2/p0"


def _link(t: int, source: str, value: int, kind: str = Kind.CARRIER, **meta: Any) -> Event:
    return Event(t_ns=t, kind=kind, source=source, value=value, meta=meta)


def _ok(t: int, source: str = A, peer: str = B, reconfig: int = 1, **meta: Any) -> Event:
    return Event(
        t_ns=t,
        kind=Kind.TRAFFIC_OK,
        source=source,
        value=9_000,
        reconfig=reconfig,
        meta={"peer": peer, **meta},
    )


def _down_then_up(up_at: int, **up_meta: Any) -> list[Event]:
    """Both ports: carrier up at 0, down at 10 ms, up again at `up_at`."""
    events = []
    for source in (A, B):
        events += [_link(0, source, 1), _link(10 * MS, source, 0), _link(up_at, source, 1, **up_meta)]
    return events


def test_traffic_while_a_carrier_is_down_is_a_violation_and_says_where() -> None:
    events = [*_down_then_up(60 * MS), _ok(5 * MS), _ok(14 * MS), _ok(61 * MS)]
    violations = check_events(events)
    assert [(v.source, v.peer, v.t_ns, v.reconfig) for v in violations] == [(A, B, 14 * MS, 1)]
    line = violations[0].line()
    assert A in line and "down" in line and "4.000 ms before" in line and "46.000 ms after" in line


def test_the_peer_being_down_is_a_violation_too() -> None:
    events = [_link(0, A, 1), _link(0, B, 1), _link(10 * MS, B, 0), _ok(12 * MS)]
    (violation,) = check_events(events)
    assert violation.down == B


def test_both_ends_must_be_up_at_the_same_moment() -> None:
    """A up until 5 ms, B from 6 ms: a ping that travelled from 4 to 7 ms saw each up, never both."""
    links = [_link(0, A, 1), _link(0, B, 0), _link(5 * MS, A, 0), _link(6 * MS, B, 1)]
    (violation,) = check_events([*links, _ok(7 * MS, sent_ns=4 * MS)])
    assert "never both up" in violation.down
    links[-1] = _link(4 * MS, B, 1)  # B up from 4 ms: both were, from 4 to 5 ms
    assert check_events([*links, _ok(7 * MS, sent_ns=4 * MS)]) == []


def test_the_firmware_link_counts_like_carrier() -> None:
    events = [_link(0, A, 1), _link(0, B, 1), _link(1 * MS, A, 0, Kind.LINK_FIRMWARE), _ok(2 * MS)]
    (violation,) = check_events(events)
    assert violation.down == A


def test_a_sampled_up_mark_allows_for_its_bracket() -> None:
    """An up mark seen by a poll at 60 ms, whose previous poll at 58 ms saw down: traffic at 59 ms is
    within the bracket (the change happened between the polls), at 57 ms it is not."""
    events = _down_then_up(60 * MS, via="poll", after_ns=58 * MS)
    assert check_events([*events, _ok(59 * MS)]) == []
    assert [v.t_ns for v in check_events([*events, _ok(57 * MS)])] == [57 * MS]
    model_probe = _down_then_up(60 * MS, prev_ns=58 * MS)  # the same bracket, by its other name
    assert check_events([*model_probe, _ok(59 * MS)]) == []


def test_a_netlink_up_mark_allows_back_to_the_previous_observation_and_the_firmware_bounds_it() -> None:
    """A netlink message is stamped on receipt with no kernel time: the carrier may have risen at any time
    since the message before it. Where the lab stamps the firmware link before it changes it (the kernel
    lab), that bounds the port exactly."""
    events = _down_then_up(60 * MS, via="event")
    assert check_events([*events, _ok(30 * MS)]) == []
    assert len(check_events([*events, _ok(9 * MS, sent_ns=9 * MS), _ok(10 * MS + 1)])) == 0  # before the down
    firmware = [
        _link(t, s, v, Kind.LINK_FIRMWARE) for s in (A, B) for t, v in ((0, 1), (10 * MS, 0), (59 * MS, 1))
    ]
    assert [v.t_ns for v in check_events([*events, *firmware, _ok(30 * MS), _ok(59 * MS + 10)])] == [30 * MS]


def test_an_answer_counts_for_the_time_it_travelled() -> None:
    """A pong received after the link dropped was sent while it was up: fine. One sent after the down
    observation, never."""
    events = _down_then_up(60 * MS)
    assert check_events([*events, _ok(10 * MS + 50_000, sent_ns=10 * MS - 20_000)]) == []
    assert len(check_events([*events, _ok(10 * MS + 90_000, sent_ns=10 * MS + 20_000)])) == 1


def test_before_a_ports_first_observation_nothing_is_known() -> None:
    assert check_events([_ok(1 * MS), _link(2 * MS, A, 0), _link(2 * MS, B, 0)]) == []
    assert check_events([_ok(1 * MS, peer="nic:h9/p0")]) == []


def test_after_its_agent_was_lost_a_ports_link_is_unknown_from_its_last_observation() -> None:
    """B's agent went away mid-run (its last report: still down at 30 ms): traffic A -> B at 70 ms, which
    the lab may well have carried, is no violation; while B's agent still watched (at 20 ms), it is."""
    events = [_link(0, A, 1), _link(0, B, 1), _link(10 * MS, B, 0), _link(30 * MS, B, 0)]
    for e in events:
        e.host = "h1" if e.source == A else "h2"
    lost = Event(t_ns=50 * MS, kind=Kind.AGENT_LOST, source="agent:h2", host="h2", value=3)
    assert [v.t_ns for v in check_events([*events, _ok(20 * MS), _ok(70 * MS)])] == [20 * MS, 70 * MS]
    assert [v.t_ns for v in check_events([*events, lost, _ok(20 * MS), _ok(70 * MS)])] == [20 * MS]
    # Another host's loss changes nothing for B.
    other = Event(t_ns=50 * MS, kind=Kind.AGENT_LOST, source="agent:h3", host="h3", value=3)
    assert [v.t_ns for v in check_events([*events, other, _ok(70 * MS)])] == [70 * MS]


@pytest.mark.acausal("made up to break the invariant: this test checks that the checker sees it")
def test_a_run_file_is_checked_streaming_and_a_torn_tail_is_skipped(tmp_path: Path) -> None:
    log = EventLog(tmp_path / "events.jsonl", Timebase.capture())
    for e in [*_down_then_up(60 * MS), _ok(14 * MS), _ok(61 * MS)]:
        log.record(e)
        log.emit(e.t_ns, Kind.RX_POWER, e.source, -3.0)
    log.close()
    with open(tmp_path / "events.jsonl", "ab") as f:
        f.write(b'{"seq":99,"t_ns":1,"kind":"traffic.ok","sou')
    assert [v.t_ns for v in check_file(tmp_path / "events.jsonl")] == [14 * MS]
