"""Agents without a broker: clock offset estimation, the hub's loss decisions on the messages it is given,
the world mirror's timeline, event stamps. Agents over MQTT are tests/integration/test_agents.py."""

from __future__ import annotations

import random
from pathlib import Path

import msgspec
import pytest

from labctl.agents.agent import Agent
from labctl.agents.broker import BrokerSettings
from labctl.agents.clock import OffsetSample, estimate_offset
from labctl.agents.hub import AgentHub
from labctl.agents.mirror import FabricMirror
from labctl.agents.wire import Reply, WorldItem, shift_stamps, topic
from labctl.core.clock import now_ns
from labctl.core.events import Event, Kind
from labctl.inventory.schema import load_inventory
from tests.conftest import REPO
from tests.helpers import agents as helpers
from tests.helpers.agents import (
    _loss,
    _running,
    broker_section,
    write_lab,
)

hub, lost = helpers.hub, helpers.lost  # fixtures


# -- clock offset estimation (no broker) ------------------------------------------------------------------------
def test_offset_estimate_keeps_fastest_round_trips_and_bounds_the_error() -> None:
    rng = random.Random(7)
    true_offset = 1_234_567
    samples = []
    for i in range(64):
        t1 = i * 1_000_000
        clean = i % 4 == 0  # a quarter of the round trips meet no queue; the rest wait on one leg or both
        up = 20_000 + rng.randrange(0, 5_000 if clean else 2_000_000)  # queueing only ever adds delay
        down = 20_000 + rng.randrange(0, 5_000 if clean else 2_000_000)
        t2 = t1 + up + true_offset
        t3 = t2 + 3_000
        t4 = t3 - true_offset + down
        samples.append(OffsetSample(t1, t2, t3, t4))
    est = estimate_offset(samples)
    assert est.kept == 16 and est.samples == 64
    assert abs(est.offset_ns - true_offset) <= est.uncertainty_ns
    assert est.uncertainty_ns < 100_000  # the slow samples were not used
    naive = sorted(s.offset_ns for s in samples)[len(samples) // 2]
    assert abs(est.offset_ns - true_offset) < abs(naive - true_offset) or abs(naive - true_offset) < 10_000


async def test_a_reply_from_a_new_agent_process_is_a_loss(hub: AgentHub) -> None:
    """Its `online` may come after its first reply (to a command the old one never saw)."""
    link = _running(hub, "h1", "A")
    name = topic(hub.lab, "h1", "reply")
    same = msgspec.json.encode(Reply(host="h1", id=1, op="window", ok=True, incarnation="A"))
    hub._on_message(name, hub.signer.seal(name, same), 5)
    assert _loss(link) == (None, None)
    new = msgspec.json.encode(Reply(host="h1", id=2, op="window", ok=True, incarnation="B"))
    hub._on_message(name, hub.signer.seal(name, new), 6)
    assert _loss(link) == (6, "restarted") and link.lost_seen == "successor"


async def test_a_lagging_mirror_applies_what_it_learned_within_its_lag_at_the_model_time(
    tmp_path: Path,
) -> None:
    """A mirror running `lag` behind the model (decision 0046) applies a change that reached it up to `lag`
    after its model time as if on time: light and link changes alike, in model order on its timeline, each
    `lag` later on the mirror's clock (the agent stamps what its probes saw `lag` earlier). Learned later
    than that, a change is applied at once and counted late."""
    inv_path, _ = write_lab(tmp_path, broker_section("mqtt://127.0.0.1:1"))
    inventory = load_inventory(inv_path)
    lag = 30_000_000
    mirror = FabricMirror(inventory, inventory.profile(), random.Random(1), lag_ns=lag)
    port, peer = mirror.by_source["nic:h1/p0"], mirror.by_source["nic:h2/p0"]
    st = mirror.state(port)
    mirror.apply(WorldItem("light", port.source, 0, 0, peer.source, 0, -2.0), 0, snapshot=True)
    mirror.apply(WorldItem(Kind.CARRIER, port.source, 0, 1), 0, snapshot=True)
    seen: list[tuple[str, int, int]] = []
    mirror.add_listener(lambda p, kind, value, t: seen.append((kind, value, t)))
    t_lost = now_ns() - 10_000_000  # it happened 10 ms before the feed brought it
    mirror.apply(WorldItem("light", port.source, t_lost, 0, None), t_lost)
    mirror.apply(WorldItem(Kind.CARRIER, port.source, t_lost + 1, 0), t_lost + 1)
    assert st.light_from is peer and seen == [], "not before its time on the mirror's clock"
    mirror.sync_optics(t_lost + lag + 1)  # a reader at that time catches the mirror up
    assert st.light_from is None and st.light_t_ns == t_lost + lag
    assert seen == [(Kind.CARRIER, 0, t_lost + 1 + lag)]
    t_old = now_ns() - lag - 5_000_000  # later than the lag allows
    mirror.apply(WorldItem(Kind.CARRIER, port.source, t_old, 1), t_old)
    assert seen[-1] == (Kind.CARRIER, 1, t_old + lag)
    stats = mirror.stats()
    assert stats["lag_ns"] == lag and stats["light_lost_on_time"] == 1 and stats["light_lost_late"] == 0
    assert (stats["transitions_on_time"], stats["transitions_late"]) == (1, 1)
    assert stats["transitions_late_max_ns"] >= 5_000_000
    mirror.cancel_pending()


def test_a_lagging_mirror_applies_a_notice_at_the_controllers_moment(tmp_path: Path) -> None:
    """A circuit, window or switch notice carries the controller's clock when it acted (`wire.NOTICE_T`): a
    mirror running `lag` behind the model applies it there, in order with the model's changes, however late
    the broker brought it. (A re-target that waited 75 ms for a busy broker left an agent pinging the old
    circuit that long past the model's re-target: the new circuit's traffic was marked late by that, with
    a bracket of one ping.) Later than the lag, it runs at the next reading, counted late; with no stamp (an
    older controller), `lag` after it arrived, as before."""
    inv_path, _ = write_lab(tmp_path, broker_section("mqtt://127.0.0.1:1"))
    inventory = load_inventory(inv_path)
    agent = Agent(inventory, "h1", BrokerSettings.from_inventory(inventory))
    lag = 30_000_000
    mirror = agent.mirror = FabricMirror(inventory, inventory.profile(), random.Random(1), lag_ns=lag)
    agent.world_offset_ns = 0
    ran: list[str] = []
    arrived = now_ns()
    acted = arrived - 20_000_000  # the controller re-targeted 20 ms before the notice got here
    agent._after_lag(lambda: ran.append("stamped"), arrived, acted)
    agent._after_lag(lambda: ran.append("unstamped"), arrived, None)
    mirror.sync_optics(acted + lag - 1)
    assert ran == [], "not before the controller's moment on the mirror's clock"
    mirror.sync_optics(acted + lag)
    assert ran == ["stamped"], "at the controller's moment, not when the broker brought it"
    mirror.sync_optics(arrived + lag)
    assert ran == ["stamped", "unstamped"]
    stale = now_ns() - lag - 5_000_000  # older than the lag covers: the mirror's readers are past it
    agent._after_lag(lambda: ran.append("late"), now_ns(), stale)
    mirror.sync_optics(arrived + lag + 1)
    assert ran[-1] == "late"
    stats = mirror.stats()
    assert (stats["notices_on_time"], stats["notices_late"]) == (1, 1)
    assert stats["notices_late_max_ns"] >= lag + 5_000_000 - (now_ns() - arrived)
    mirror.cancel_pending()


def test_agent_stamps_in_event_meta_move_with_the_event() -> None:
    """Times a probe writes into meta (the previous sample a mark's bracket starts at, when a ping was sent
    or given up on) are on the observing host's clock like t_ns, and go onto the run timebase with it;
    durations stay as they are."""
    ev = Event(
        t_ns=5_000,
        source="nic:h1/p0",
        kind="rx_power",
        meta={"prev_ns": 4_000, "detected_ns": 7_000, "sampling_period_ns": 1_000, "lane": 1},
    )
    shift_stamps(ev, -1_000)
    assert ev.t_ns == 4_000
    assert ev.meta == {"prev_ns": 3_000, "detected_ns": 6_000, "sampling_period_ns": 1_000, "lane": 1}


def test_agents_build_a_world_mirror_only_for_modeled_probes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A real lab's agents read their host's interfaces: no mirror of a behaviour model, no world feed.
    Each agent is its own process to the controller: a fresh incarnation per agent."""
    for identity in ("CONTROLLER", "H1", "H2", "H3", "H4"):  # the rehearsal's per-host broker secrets
        monkeypatch.setenv(f"LABCTL_REHEARSAL_MQTT_{identity}", f"secret-{identity.lower()}")
    inv_path, _ = write_lab(tmp_path, broker_section("mqtt://127.0.0.1:1"))
    modeled = load_inventory(inv_path)
    settings = BrokerSettings.from_inventory(modeled)
    one, two = Agent(modeled, "h1", settings), Agent(modeled, "h1", settings)
    assert one.mirrors_world and one.incarnation != two.incarnation
    real = load_inventory(REPO / "experiments" / "inventories" / "rehearsal.yaml")
    on_host = Agent(real, "h1", BrokerSettings.from_inventory(real))
    assert not on_host.mirrors_world and on_host.mirror is None


async def test_an_agent_back_from_a_broker_restart_gets_the_world_again(hub: AgentHub) -> None:
    """A broker restart loses the agents' wills and retained statuses, so the hub never sees them go
    offline; the same process online again mid-run gets a fresh snapshot, whichever of hub and agent
    reconnected first (one sent before the agent resubscribed never reached its stale mirror)."""
    sent: list[bool] = []
    hub.world_snapshot = lambda: [WorldItem("light", "nic:h1/p0", 0)]
    hub.world_now = lambda items, *, snapshot=False: sent.append(snapshot)  # type: ignore[method-assign]
    _running(hub, "h1", "A")
    assert sent == [], "the online status a run starts with is no outage"
    helpers._status(hub, "h1", "online A", 2)
    assert sent == [True]
