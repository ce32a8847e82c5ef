"""Readers of the NIC model and the work they do (decision 0052): a ping reads its link from the optics
alone, so it never works through the fabric's link reactions (at 512 ports, 10 ms inside a sampler's tick);
its verdict is the one the model reaches once every reaction has run, however late they run; the switch
model draws a command's delays as it did port by port."""

from __future__ import annotations

import copy
import random
from pathlib import Path

import numpy as np
import pytest

from labctl.inventory.profiles import resolve_profile
from labctl.inventory.schema import load_inventory
from labctl.models.fabric import SimFabric
from labctl.models.port_arrays import NEVER
from labctl.models.switch import SwitchModel

FAST = resolve_profile("fast")
MS = 1_000_000
T = 10**12


def _pulled_lab(inventory_path: Path, seed: int) -> tuple[SwitchModel, SimFabric]:
    """A switch and NIC model whose timelines run only when read (no loop timer): a loop that never got
    round to the fabric's reactions, or got round to them late, as the test chooses."""
    inv = load_inventory(inventory_path)
    rng = random.Random(seed)
    model = SwitchModel("ocs1", inv.switches["ocs1"].space, FAST, rng)
    fabric = SimFabric(inv, {"ocs1": model}, FAST, rng)
    model.timeline.pull = fabric.timeline.pull = True
    return model, fabric


def test_a_ping_reads_the_transport_time_drawn_when_the_link_lit(inventory_path: Path) -> None:
    model, fabric = _pulled_lab(inventory_path, 1)
    inv = load_inventory(inventory_path)
    h1, h2 = (inv.rail_ports(0)[h][0] for h in ("h1", "h2"))
    model._at([T, T], [h2.rx, h1.rx], [h1.tx, h2.tx])
    a, b = np.array([fabric.slot[h1]]), np.array([fabric.slot[h2]])
    assert not fabric.traffic_ok(a, b, T).any()  # lit, not up: firmware, carrier and transport to come
    up = int(fabric.arrays.transport_up_ns[fabric.slot[h1]])
    assert up == int(fabric.arrays.transport_up_ns[fabric.slot[h2]])
    low = sum(FAST.range_ns(k)[0] for k in ("firmware_up_ms", "carrier_after_firmware_us"))
    assert T + low + FAST.range_ns("transport_after_carrier_ms")[0] <= up < NEVER
    assert not fabric.traffic_ok(a, b, up - 1).any()
    assert fabric.traffic_ok(a, b, up).all() and fabric.passes_each([(a[0], b[0])], up) == [True]
    # ...read without running a single reaction: they are all still the fabric timeline's to run, and the
    # transitions they schedule come at the times the ping already read.
    assert fabric.state(h1).transport == 0 and fabric.timeline.next_due_ns() == T
    seen: list[tuple[str, str, int]] = []
    fabric.add_listener(lambda port, kind, value, t: seen.append((port.label, kind, t)))
    fabric.timeline.run_due(up)
    assert (h1.label, "transport", up) in seen and (h2.label, "transport", up) in seen
    assert fabric.state(h1).transport == fabric.state(h2).transport == 1


@pytest.mark.parametrize("seed", range(8))
def test_a_pings_verdict_is_the_models_however_late_the_link_reactions_run(
    inventory_path: Path, seed: int
) -> None:
    """Random re-patches of six ports (links moving, going dark, coming back a few ms apart, one end at a
    time); at each sample the ping's verdict, with the fabric's reactions run only up to a random point in
    the past (or not at all), equals the verdict of a copy of the model that ran every reaction due."""
    model, fabric = _pulled_lab(inventory_path, seed)
    inv = load_inventory(inventory_path)
    ports = [p for h in ("h1", "h2", "h3", "h4") for p in inv.rail_ports(0)[h]][:6]
    slots = [fabric.slot[p] for p in ports]
    src = np.array([s for s in slots for d in slots if s != d])
    dst = np.array([d for s in slots for d in slots if s != d])
    rng = random.Random(seed)
    t = T
    compared = ups = drops = 0
    before: list[bool] = []
    for _ in range(300):
        t += rng.randint(1, 16) * MS // 4
        if rng.random() < 0.025:  # a re-patch: a random matching, some ports dark, each change at its time
            order = rng.sample(ports, len(ports))
            peer = {}
            for i in range(0, len(order) - 1, 2):
                if rng.random() < 0.8:
                    peer[order[i]], peer[order[i + 1]] = order[i + 1], order[i]
            changes = sorted(
                (t + rng.randint(0, 3 * MS), p.rx, peer[p].tx if p in peer else None) for p in ports
            )
            model._at([c[0] for c in changes], [c[1] for c in changes], [c[2] for c in changes])
        if rng.random() < 0.3:  # the fabric's own timer got round to part of its reactions
            fabric.timeline.run_due(t - rng.randint(0, 80 * MS))
        verdict = fabric.traffic_ok(src, dst, t)
        twin_model, twin = copy.deepcopy((model, fabric))
        twin.sync_optics(t)
        twin.timeline.run_due(t)
        states = [twin._states[s] for s in range(len(twin.port_at))]
        lit_from = twin.arrays.lit_from
        truth = [
            bool(
                twin.arrays.transport[s]
                and twin.arrays.transport[d]
                and states[s].peer_slot == d
                and states[d].peer_slot == s
                and lit_from[s] == d
                and lit_from[d] == s
            )
            for s, d in zip(src.tolist(), dst.tolist(), strict=True)
        ]
        assert verdict.tolist() == truth, f"at {t - T} ns"
        compared += 1
        ups += sum(truth)
        drops += sum(a and not b for a, b in zip(before, truth, strict=False))
        before = truth
        del twin_model
    assert compared == 300 and ups > 100 and drops > 0  # links came up, and went while up


def test_a_commands_delays_are_the_draws_a_port_at_a_time_would_make() -> None:
    """SwitchModel._times draws a command's light-loss times in one call: the same stream of draws, in the
    same order, as one `draw_ns` per port; the new paths share one switching draw."""
    for seed in range(3):
        model = SwitchModel("ocs1", None, FAST, random.Random(seed))  # type: ignore[arg-type]
        rng = random.Random(seed)
        lost = model._times(T, [3, 1, 2], [None, None, None], "light_loss_ms")
        assert lost == [T + FAST.draw_ns(rng, "light_loss_ms") for _ in range(3)]
        back = model._times(T, [4, 5], [7, 8], "switching_ms")
        assert back == [T + FAST.draw_ns(rng, "switching_ms")] * 2
        assert model._times(T, [], [], "switching_ms") == []
        assert model.rng.random() == rng.random()  # nothing more was drawn


def test_a_reader_catching_up_over_two_commands_moves_their_light_in_model_time_order() -> None:
    """A command sent while an earlier one's light is still moving: a reader that catches the switch model
    up over both applies the changes in model-time order, not one command's and then the other's (the
    port lit by the first and darkened by the second at a later time ends dark)."""
    model = SwitchModel("ocs1", None, FAST, random.Random(1))  # type: ignore[arg-type]
    model.timeline.pull = True
    seen: list[tuple[int, int | None, int]] = []
    model.add_listener(lambda egress, ingress, t: seen.append((egress, ingress, t)))
    model._at([T + 1, T + 3], [5, 6], [1, None])
    model._at([T + 2, T + 4], [5, 7], [None, 2])
    model.timeline.run_due(T + 10)
    assert seen == [(5, 1, T + 1), (5, None, T + 2), (6, None, T + 3), (7, 2, T + 4)]
    assert 5 not in model.lit and model.lit[7] == 2


def test_the_model_traffic_probes_circuits_are_set_a_rail_at_a_time(inventory_path: Path) -> None:
    """SimTrafficProbe.set_circuits looks a whole rail up at once: a source it does not ping is left
    alone, None stops a port's pings, a peer it does not know is an error, and each port told its circuit
    reports its next ping."""
    from labctl.probes.model import SimTrafficProbe

    _model, fabric = _pulled_lab(inventory_path, 1)
    inv = load_inventory(inventory_path)
    a, b, c = inv.ports[:3]
    probe = SimTrafficProbe(fabric, inv.ports, report_interval_ns=10**12)
    slot = fabric.slot
    probe.set_circuits({a.source: b.source, b.source: a.source, "nic:elsewhere/x": a.source})
    assert sorted(probe._pairs) == sorted([(slot[a], slot[b]), (slot[b], slot[a])])
    probe._ping_all(T)
    assert len(probe.queue) == 2  # each one's first ping is reported
    probe.queue.drain()
    probe._ping_all(T + MS)
    assert len(probe.queue) == 0  # unchanged, no heartbeat due
    probe.set_circuits({a.source: None, c.source: b.source})
    assert sorted(probe._pairs) == sorted([(slot[b], slot[a]), (slot[c], slot[b])])
    probe._ping_all(T + 2 * MS)
    assert sorted(e.source for e in probe.queue.drain()) == [c.source]  # b's circuit did not change
    with pytest.raises(KeyError, match="nic:nowhere/y"):
        probe.set_circuits({a.source: "nic:nowhere/y"})
