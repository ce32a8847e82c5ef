"""The simulated switch and converge(): validation before sending, diff-only changes, read-back, retries,
timeouts, events. Plus the NIC model's recovery order."""

from __future__ import annotations

import asyncio
import random

import numpy as np
import pytest

from labctl.core.errors import HardwareError, MappingError, SwitchStateMismatch
from labctl.core.events import Event
from labctl.inventory.mapping import Mapping, MappingDiff, apply_diff
from labctl.inventory.schema import load_inventory
from labctl.models.fabric import SimFabric
from labctl.models.switch import SwitchModel
from labctl.ocs.protocol import OpticalSwitch, SwitchOps, TimeoutPolicy, VerifiedSwitch, converge
from tests.helpers.sim_switch import FAST, SPACE, make_switch


async def test_sim_switch_satisfies_protocol_and_applies_only_changes() -> None:
    events: list[Event] = []
    sw = make_switch(events)
    assert isinstance(sw, OpticalSwitch)
    await sw.connect()
    first = await sw.apply([(1, 9), (2, 10)], context={"rail": 0})
    assert first.value.added == {(1, 9), (2, 10)} and first.value.removed == frozenset()
    assert first.start_ns < first.end_ns
    assert first.value.attempts == 1
    second = await sw.apply([(1, 10), (2, 9)])
    assert second.value.removed == {(1, 9), (2, 10)}
    assert second.value.added == {(1, 10), (2, 9)}
    same = await sw.apply([(1, 10), (2, 9)])
    assert same.value.attempts == 0  # nothing to send
    assert sw.model.commands == 2
    commands = [e for e in events if e.kind == "ocs.command"]
    completes = [e for e in events if e.kind == "ocs.complete"]
    assert len(commands) == 2 and len(completes) == 2
    assert commands[0].meta["rail"] == 0 and commands[0].meta["add"] == [(1, 9), (2, 10)]
    assert all(c.t_ns < d.t_ns for c, d in zip(commands, completes, strict=True))
    assert (await sw.get_mapping()).value == {(1, 10), (2, 9)}
    await sw.close()
    sw.model.cancel_pending()


async def test_invalid_mapping_is_refused_before_anything_is_sent() -> None:
    events: list[Event] = []
    sw = make_switch(events)
    await sw.connect()
    with pytest.raises(MappingError, match="egress port 9 is used twice"):
        await sw.apply([(1, 9), (2, 9)])
    with pytest.raises(MappingError, match="not an egress port"):
        await sw.apply([(1, 2)])
    assert sw.model.commands == 0
    assert not [e for e in events if e.kind.startswith("ocs.")]


async def test_scope_leaves_other_circuits_alone_and_disconnect() -> None:
    events: list[Event] = []
    sw = make_switch(events)
    await sw.connect()
    await sw.apply([(1, 9), (2, 10), (5, 13)])
    # Rail "A" owns ports 1, 2, 9, 10: re-patch it, leave (5, 13) alone, unpatch 2.
    await sw.apply([(1, 10)], scope={1, 2, 9, 10})
    assert (await sw.get_mapping()).value == {(1, 10), (5, 13)}
    await sw.disconnect([5])
    assert (await sw.get_mapping()).value == {(1, 10)}
    sw.model.cancel_pending()


async def test_not_connected_is_a_clear_error() -> None:
    sw = make_switch([])
    with pytest.raises(HardwareError, match="ocs1: not connected"):
        await sw.get_mapping()


class FlakySwitch:
    """A behavioural fake: loses the first `lose` patches it is asked to make."""

    def __init__(self, lose: int) -> None:
        self.patches: Mapping = frozenset()
        self.lose = lose
        self.sent: list[MappingDiff] = []

    async def read(self) -> Mapping:
        return self.patches

    async def send(self, diff: MappingDiff) -> None:
        self.sent.append(diff)
        self.patches = apply_diff(self.patches, diff)
        while self.lose and self.patches:
            self.patches = frozenset(sorted(self.patches)[1:])
            self.lose -= 1


async def test_converge_retries_until_read_back_matches() -> None:
    events: list[Event] = []
    fake = FlakySwitch(lose=1)
    result = await converge(
        "ocs1", SPACE, SwitchOps(fake.read, fake.send), [(1, 9), (2, 10)], None, events.append
    )
    assert result.attempts == 2
    assert fake.sent[1].add == {(1, 9)}  # the retry sends only what is still missing
    assert result.mapping == {(1, 9), (2, 10)}


async def test_converge_raises_with_remaining_diff_and_records_error() -> None:
    events: list[Event] = []
    fake = FlakySwitch(lose=100)
    with pytest.raises(SwitchStateMismatch) as info:
        await converge(
            "ocs1", SPACE, SwitchOps(fake.read, fake.send, attempts=3), [(1, 9), (2, 10)], None, events.append
        )
    assert len(fake.sent) == 3
    assert info.value.missing
    assert "read-back differs" in str(info.value)
    assert events[-1].kind == "ocs.error"


class LostInFlight:
    """A switch whose every command is lost with the connection while in flight: whether it took effect
    (`applies`) only the read-back can tell."""

    def __init__(self, applies: bool) -> None:
        self.applies = applies
        self.state: Mapping = frozenset()
        self.sends = 0

    async def read(self) -> Mapping:
        return self.state

    async def send(self, diff: MappingDiff) -> None:
        self.sends += 1
        if self.applies:
            self.state = apply_diff(self.state, diff)
        raise HardwareError("ocs1: connection lost during ENT-PATCH")


async def test_a_last_command_lost_in_flight_that_took_effect_is_a_verified_success() -> None:
    events: list[Event] = []
    switch = LostInFlight(applies=True)
    result = await converge(
        "ocs1", SPACE, SwitchOps(switch.read, switch.send, attempts=1), [(1, 9)], None, events.append
    )
    assert result.mapping == {(1, 9)} and switch.sends == 1
    assert [e.kind for e in events] == ["ocs.command", "ocs.error"]  # the loss is on record all the same


async def test_a_last_command_lost_in_flight_that_did_not_take_effect_raises_its_own_error() -> None:
    switch = LostInFlight(applies=False)
    with pytest.raises(HardwareError, match="connection lost during ENT-PATCH"):
        await converge(
            "ocs1", SPACE, SwitchOps(switch.read, switch.send, attempts=2), [(1, 9)], None, [].append
        )
    assert switch.sends == 2


async def test_nic_model_is_causal_even_when_the_loop_delivers_late(inventory_path) -> None:
    """A loaded event loop can deliver a light change before a carrier-down that happened earlier in model
    time; the model must still apply transitions in model-time order (carrier goes down, then up)."""
    inv = load_inventory(inventory_path)
    rng = random.Random(5)
    model = SwitchModel("ocs1", inv.switches["ocs1"].space, FAST, rng)
    fabric = SimFabric(inv, {"ocs1": model}, FAST, rng)
    seen: list[tuple[str, str, int, int]] = []
    fabric.add_listener(lambda port, kind, value, t: seen.append((port.label, kind, value, t)))
    h1, h2, h3 = (inv.rail_ports(0)[h][0] for h in ("h1", "h2", "h3"))
    t = 10**12
    # h1<->h2 lit, and let it come up fully.
    fabric._on_light("ocs1", h1.rx, h2.tx, t)
    fabric._on_light("ocs1", h2.rx, h1.tx, t)
    fabric.timeline.run_due(t + 10**9)
    assert fabric.state(h1).carrier == 1
    # Re-patch to h1<->h3 with no loop iteration in between: light loss at +1 ms, new light at +3 ms.
    fabric._on_light("ocs1", h1.rx, None, t + 10**9 + 1_000_000)
    fabric._on_light("ocs1", h1.rx, h3.tx, t + 10**9 + 3_000_000)
    fabric._on_light("ocs1", h3.rx, h1.tx, t + 10**9 + 3_000_000)
    fabric.timeline.run_due(t + 2 * 10**9)
    h1_carrier = [(value, at) for label, kind, value, at in seen if label == h1.label and kind == "carrier"]
    assert [v for v, _ in h1_carrier] == [1, 0, 1]
    assert [at for _, at in h1_carrier] == sorted(at for _, at in h1_carrier)
    fabric.cancel_pending()


async def test_disconnect_of_ports_out_of_range_is_refused() -> None:
    sw = make_switch([])
    await sw.connect()
    with pytest.raises(MappingError, match=r"port\(s\) \[0, 77\] out of range 1..16"):
        await sw.disconnect([0, 77])
    assert sw.model.commands == 0


async def test_a_commands_light_changes_apply_each_at_its_own_time_and_a_link_comes_up_once(
    inventory_path,
) -> None:
    """Light changes come to the NIC model as one batch per command; a reader catching the model up to t
    applies those due by t and no later one, and where both ends of a link light up in one batch the
    link-up sequence is scheduled once (one firmware-up per end, not two)."""
    inv = load_inventory(inventory_path)
    model = SwitchModel("ocs1", inv.switches["ocs1"].space, FAST, random.Random(3))
    fabric = SimFabric(inv, {"ocs1": model}, FAST, random.Random(3))
    seen: list[tuple[str, str, int]] = []
    fabric.add_listener(lambda port, kind, value, t: seen.append((port.label, kind, value)))
    h1, h2 = (inv.rail_ports(0)[h][0] for h in ("h1", "h2"))
    t = 10**12
    model._at([t, t], [h1.rx, h2.rx], [h2.tx, h1.tx])  # both directions in one batch
    fabric.timeline.run_due(t)  # no-op: nothing of the fabric's is due before the light
    fabric.sync_optics(t)
    assert fabric.state(h1).light_from == h2 and fabric.state(h2).light_from == h1
    fabric.timeline.run_due(t + 10**9)
    firmware_up = sorted(label for label, kind, v in seen if kind == "link.firmware" and v == 1)
    assert firmware_up == sorted([h1.label, h2.label])  # once per end
    assert fabric.state(h1).carrier == fabric.state(h2).carrier == 1
    # Light lost at two different times in one batch: a reader between them sees only the first.
    model._at([t + 2 * 10**9, t + 3 * 10**9], [h1.rx, h2.rx], [None, None])
    fabric.sync_optics(t + 2 * 10**9 + 1)
    assert fabric.state(h1).light_from is None and fabric.state(h2).light_from == h1
    fabric.sync_optics(t + 3 * 10**9)
    assert fabric.state(h2).light_from is None
    fabric.cancel_pending()
    model.cancel_pending()


async def test_a_batch_of_link_reactions_interleaves_in_model_time_with_other_entries(inventory_path) -> None:  # type: ignore[no-untyped-def]
    """A command's link reactions are one timeline entry; it must still run each reaction only after every
    other entry due before it (a transition scheduled between two of its reactions runs between them)."""
    from labctl.models.fabric import _LinkBatch

    inv = load_inventory(inventory_path)
    model = SwitchModel("ocs1", inv.switches["ocs1"].space, FAST, random.Random(1))
    fabric = SimFabric(inv, {"ocs1": model}, FAST, random.Random(1))
    order: list[tuple[str, int]] = []
    fabric._link = lambda port, was, source, t_ns, up: order.append(("link", t_ns))  # type: ignore[method-assign]
    base = 10**15  # far in the future: nothing else of the model is due
    batch = _LinkBatch([(base + 10, 0, -1, -1, None), (base + 30, 0, -1, -1, None)])
    fabric.timeline.at(base + 10, fabric._link_batch, batch)
    fabric.timeline.at(base + 20, lambda: order.append(("other", base + 20)))
    fabric.timeline.run_due(base + 40)
    assert order == [("link", base + 10), ("other", base + 20), ("link", base + 30)]
    assert len(fabric.timeline) == 0
    fabric.cancel_pending()
    model.cancel_pending()


class CountingSwitch(FlakySwitch):
    """FlakySwitch that loses nothing and counts its reads."""

    def __init__(self, patches: Mapping = frozenset()) -> None:
        super().__init__(lose=0)
        self.patches = patches
        self.reads = 0

    async def read(self) -> Mapping:
        self.reads += 1
        return self.patches


async def test_converge_diffs_against_what_it_last_verified_without_a_read() -> None:
    """Decision 0050: with `known`, the first command goes out with no read before it; only the
    read-back reads."""
    fake = CountingSwitch({(1, 9)})
    result = await converge(
        "ocs1", SPACE, SwitchOps(fake.read, fake.send, known={(1, 9)}), [(1, 10)], None, [].append
    )
    assert result.mapping == {(1, 10)} and fake.reads == 1  # the read-back alone
    assert fake.sent[0].remove == {(1, 9)} and fake.sent[0].add == {(1, 10)}


async def test_an_empty_diff_against_what_was_verified_is_checked_by_a_read() -> None:
    """Nothing to send by what we remember: the switch may have changed since, so it is read."""
    fake = CountingSwitch(frozenset())  # another client removed (1, 9) since we verified it
    result = await converge(
        "ocs1", SPACE, SwitchOps(fake.read, fake.send, known={(1, 9)}), [(1, 9)], None, [].append
    )
    assert result.mapping == {(1, 9)} and result.attempts == 1 and fake.reads == 2


async def test_a_stale_memory_is_corrected_by_the_read_back_and_the_retry() -> None:
    """We remember (1, 9); the switch holds (2, 10) too. The first diff misses (2, 10)'s removal under the
    scope, the read-back shows it, and the retry removes it."""
    fake = CountingSwitch({(1, 9), (2, 10)})
    result = await converge(
        "ocs1", SPACE, SwitchOps(fake.read, fake.send, known={(1, 9)}), [(1, 10)], {1, 2, 9, 10}, [].append
    )
    assert result.mapping == {(1, 10)} == fake.patches and result.attempts == 2


class WireSwitch(VerifiedSwitch):
    """The smallest session-based driver: `_read` and `_send` on an in-memory switch, reads counted."""

    def __init__(self) -> None:
        self.name, self.space, self.timeouts = "ocs1", SPACE, TimeoutPolicy()
        self.attempts, self.owned, self.reconnects = 3, None, 0
        self._source, self._emit_sink = "ocs:ocs1", [].append
        self.patches: Mapping = frozenset()
        self.reads = 0

    def _require_conn(self) -> object:
        return self

    async def _read(self) -> Mapping:
        self.reads += 1
        return self.patches

    async def _send(self, diff: MappingDiff) -> None:
        self.patches = apply_diff(self.patches, diff)


async def test_a_driver_diffs_against_its_last_verified_apply_in_the_same_session_only() -> None:
    sw = WireSwitch()
    await sw.apply([(1, 9)])
    assert sw.reads == 2  # nothing verified yet: a read, then the read-back
    await sw.apply([(1, 10)])
    assert sw.reads == 3  # the read-back alone
    sw._generation += 1  # a reconnect: what the old session verified is not trusted
    await sw.apply([(1, 9)])
    assert sw.reads == 5
    await sw.get_mapping()  # a read is verified state too
    await sw.apply([(1, 10)])
    assert sw.reads == 7 and sw.patches == {(1, 10)}


async def test_a_link_lit_by_light_applied_out_of_model_time_order_still_passes_traffic(
    inventory_path,
) -> None:  # type: ignore[no-untyped-def]
    """A busy loop can apply a link's two light changes in the reverse of their model times (a switch's
    acknowledgement puts its light on the timeline when its alarm is handled, and a reader may catch the
    model up between two alarms). The link lights when both directions carry light, the later of the two:
    its ends must come up and pass traffic, not stay up with traffic lost for good."""
    inv = load_inventory(inventory_path)
    model = SwitchModel("ocs1", inv.switches["ocs1"].space, FAST, random.Random(2))
    fabric = SimFabric(inv, {"ocs1": model}, FAST, random.Random(2))
    h1, h2 = (inv.rail_ports(0)[h][0] for h in ("h1", "h2"))
    t = 10**12
    fabric._on_light("ocs1", h1.rx, h2.tx, t + 3_000_000)  # applied first, the later light
    fabric.timeline.run_due(t + 3_000_000)
    fabric._on_light("ocs1", h2.rx, h1.tx, t + 2_000_000)  # applied second, the earlier light
    fabric.timeline.run_due(t + 10**9)
    s1, s2 = fabric.slot[h1], fabric.slot[h2]
    assert fabric.state(h1).carrier == fabric.state(h2).carrier == 1
    assert fabric.passes(s1, s2, t + 10**9) and fabric.passes_each([(s1, s2)], t + 10**9) == [True]
    assert fabric.traffic_ok(np.array([s1]), np.array([s2]), t + 10**9).all()
    # ...and not before the later light: the link's timing counts from it
    assert int(fabric.arrays.link_t_ns[s1]) == int(fabric.arrays.link_t_ns[s2]) == t + 3_000_000
    fabric.cancel_pending()


async def test_a_reader_past_the_switching_time_sees_the_light_before_the_acknowledgement_is_handled(
    inventory_path,  # type: ignore[no-untyped-def]
) -> None:
    """The switch's light reaches its timeline a loop turn after its acknowledgement. A late loop can run a
    sampler's tick first: reading at a time past the switching time, it must see the light (read dark, the
    optical mark would move a stall later and claim a sampling period's resolution)."""
    from labctl.core.clock import now_ns

    inv = load_inventory(inventory_path)
    model = SwitchModel("ocs1", inv.switches["ocs1"].space, FAST, random.Random(4))
    fabric = SimFabric(inv, {"ocs1": model}, FAST, random.Random(4))
    h1, h2 = (inv.rail_ports(0)[h][0] for h in ("h1", "h2"))
    task = asyncio.create_task(model.execute(MappingDiff(frozenset(), frozenset({(h2.tx, h1.rx)}))))
    await asyncio.sleep(0)  # the command is taken: its acknowledgement's alarm is armed
    assert fabric.state(h1).light_from is None
    # A reader past the switching time (as a stalled loop's first tick would be) before the alarm's turn:
    fabric.sync_optics(now_ns() + round(FAST.switching_ms[1] * 1e6) + 1_000_000)
    assert fabric.state(h1).light_from == h2
    _, t_done = await task
    assert fabric.state(h1).light_from == h2 and fabric.arrays.light_t_ns[fabric.slot[h1]] == t_done
    fabric.cancel_pending()
    model.cancel_pending()
