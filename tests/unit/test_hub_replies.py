"""The controller matches a reply only against the commands sent to the host that answers (decision 0072):
replies handed to a hub that never connects, signed as each host's agent signs them (per-host keys)."""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import AsyncIterator
from pathlib import Path

import msgspec
import pytest

from labctl.agents.broker import BrokerSettings
from labctl.agents.hub import AgentHub
from labctl.agents.hub_commands import REFUSALS, refused_replies_line
from labctl.agents.hub_connection import _Outgoing
from labctl.agents.wire import Command, Reply, Signer, decode, topic
from labctl.core.errors import HardwareError
from labctl.inventory.schema import load_inventory
from tests.helpers.agents import broker_section, write_lab

HOSTS = ("h1", "h2", "h3", "h4")


@pytest.fixture
async def hub(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[AgentHub]:
    for name in ("controller", *HOSTS):
        monkeypatch.setenv(f"LABCTL_TEST_MQTT_{name.upper()}", f"secret-of-{name}")
    ids = "  identities: {secret_env: LABCTL_TEST_MQTT}\n"
    inv_path, _ = write_lab(tmp_path, broker_section("mqtt://127.0.0.1:1", extra=ids))
    inventory = load_inventory(inv_path)
    hub = AgentHub(inventory, BrokerSettings.from_inventory(inventory))  # never started
    try:
        yield hub
    finally:
        await hub.stop()


def sent(hub: AgentHub) -> Command:
    """The next command the hub queued for the broker, as the agent would read it."""
    item = hub._outgoing.get_nowait()
    command: Command = decode(Command, item.body())
    return command


def answer(hub: AgentHub, host: str, reply: Reply, *, on: str | None = None, t_rx: int = 1) -> None:
    """`host`'s agent publishes `reply`, signed with its own key, on its own reply topic (or on `on`'s)."""
    name = topic(hub.lab, on or host, "reply")
    signer = Signer(hub.broker.key_for(host), host)
    hub._on_message(name, signer.seal(name, msgspec.json.encode(reply)), t_rx)


def _item(hub: AgentHub, host: str, cmd: Command) -> _Outgoing:
    """The queued message of a command, as the sender counts each time it hands one to the client."""
    return _Outgoing(topic(hub.lab, host, "cmd"), lambda: b"", None, host, cmd.id)


def refused(hub: AgentHub) -> dict[str, int]:
    return {reason: n for reason, n in hub.report()["agents"]["replies_refused"].items() if n}


async def test_a_hosts_reply_never_answers_a_command_sent_to_another_host(hub: AgentHub) -> None:
    stop = asyncio.create_task(hub.request("h2", "stop", {}, timeout_s=5))
    await asyncio.sleep(0)
    to_h2 = sent(hub)
    forged = Reply(host="h1", id=to_h2.id, op="stop", ok=True, seq=0, n=0, data={"probes": {"by": "h1"}})
    answer(hub, "h1", forged)
    await asyncio.sleep(0)
    assert not stop.done(), "h1's reply must not answer h2's command"
    assert refused(hub) == {"forged": 1}
    assert hub.rejections.forged == 1
    honest = Reply(host="h2", id=to_h2.id, op="stop", ok=True, seq=3, n=7, data={"probes": {}})
    answer(hub, "h2", honest)
    assert (await stop).data == {"probes": {}}  # h2's own answer still counts


async def test_a_reply_with_another_operation_is_refused_and_the_command_still_waits(hub: AgentHub) -> None:
    stop = asyncio.create_task(hub.request("h2", "stop", {}, timeout_s=5))
    await asyncio.sleep(0)
    cmd = sent(hub)
    answer(hub, "h2", Reply(host="h2", id=cmd.id, op="ping", ok=True))
    answer(hub, "h2", Reply(host="h2", id=cmd.id, op="window", ok=True))  # a second try, any operation
    await asyncio.sleep(0)
    assert not stop.done()
    assert refused(hub) == {"wrong_op": 2}
    answer(hub, "h2", Reply(host="h2", id=cmd.id, op="stop", ok=True, seq=0, n=0))
    assert (await stop).op == "stop"


async def test_a_second_answer_to_a_command_sent_once_is_a_replay(hub: AgentHub) -> None:
    hub.post("h1", "window", {"open": ["nic:h1/p0"]})
    cmd = sent(hub)
    hub._count_send(_item(hub, "h1", cmd))  # the sender handed it to the client once
    answer(hub, "h1", Reply(host="h1", id=cmd.id, op="window", ok=True))
    assert refused(hub) == {}
    answer(hub, "h1", Reply(host="h1", id=cmd.id, op="window", ok=True))
    assert refused(hub) == {"replayed": 1}


async def test_a_command_sent_again_after_an_outage_may_be_answered_again(hub: AgentHub) -> None:
    """The hub resends what the broker never acknowledged: the agent answers each copy (acting once)."""
    hub.post("h3", "switched", {"sources": ["nic:h3/p0"]})
    cmd = sent(hub)
    for _ in range(2):  # sent, and sent again on the new connection
        hub._count_send(_item(hub, "h3", cmd))
    for _ in range(2):
        answer(hub, "h3", Reply(host="h3", id=cmd.id, op="switched", ok=True))
    assert refused(hub) == {} and hub.duplicate_replies == 1
    answer(hub, "h3", Reply(host="h3", id=cmd.id, op="switched", ok=True))  # a third: no copy asked for it
    assert refused(hub) == {"replayed": 1}


async def test_command_ids_do_not_follow_from_each_other(hub: AgentHub) -> None:
    ids = []
    for host in HOSTS * 4:
        hub.post(host, "window", {})
        ids.append(sent(hub).id)
    assert len(set(ids)) == len(ids)
    steps = {b - a for a, b in itertools.pairwise(ids)}
    assert not steps & set(range(-1000, 1001)), "an id must not be a small step from the one before"


async def test_replies_to_nothing_sent_or_on_another_hosts_topic_are_refused_by_reason(hub: AgentHub) -> None:
    hub.post("h4", "window", {})
    cmd = sent(hub)
    answer(hub, "h1", Reply(host="h1", id=cmd.id + 1, op="window", ok=True))  # a guess next to a seen id
    answer(hub, "h1", Reply(host="h2", id=cmd.id, op="window", ok=True))  # names h2 on its own topic
    answer(hub, "h1", Reply(host="h4", id=cmd.id, op="window", ok=True), on="h4")  # h1's key on h4's topic
    assert refused(hub) == {"unsolicited": 1, "off_topic": 2}
    assert set(hub.report()["agents"]["replies_refused"]) == set(REFUSALS)
    answer(hub, "h4", Reply(host="h4", id=cmd.id, op="window", ok=True))
    assert refused(hub) == {"unsolicited": 1, "off_topic": 2}  # h4's own answer is accepted


async def test_another_hosts_answer_to_a_clock_ping_moves_nothing(hub: AgentHub) -> None:
    """A forged pong could name another clock responder, and move the host's clock exchange off UDP."""
    ping = asyncio.create_task(hub.ping("h2", timeout_s=0.5))
    await asyncio.sleep(0)
    cmd = sent(hub)
    assert cmd.op == "ping"
    bogus = {"clock": {"boot_id": "h1s"}, "clock_udp": ["192.0.2.1", 9]}
    answer(hub, "h1", Reply(host="h1", id=cmd.id, op="ping", ok=True, t2=1, t3=2, data=bogus), t_rx=3)
    assert await ping is None  # unanswered: the forged pong is no sample
    link = hub.links["h2"]
    assert link.clock_udp is None and link.identity is None
    assert refused(hub) == {"forged": 1}


async def test_a_late_answer_to_a_request_that_timed_out_is_no_forgery(hub: AgentHub) -> None:
    with pytest.raises(HardwareError, match="no reply to stop"):
        await hub.request("h2", "stop", {}, timeout_s=0.01)
    cmd = sent(hub)
    answer(hub, "h2", Reply(host="h2", id=cmd.id, op="stop", ok=True, seq=0, n=0))
    assert refused(hub) == {}


async def test_the_end_of_a_run_says_how_many_replies_were_refused_and_why(hub: AgentHub) -> None:
    assert refused_replies_line(hub.report()["agents"]) is None  # nothing refused: nothing said
    assert hub.report()["status_notes"] == []
    hub.post("h1", "window", {})
    cmd = sent(hub)
    for guess in (cmd.id + 1, cmd.id + 2):
        answer(hub, "h1", Reply(host="h1", id=guess, op="window", ok=True))
    answer(hub, "h1", Reply(host="h1", id=cmd.id, op="stop", ok=True))
    assert refused_replies_line(hub.report()["agents"]) == (
        "3 agent replies refused (2 unsolicited, 1 wrong_op): an agent answered commands not sent to it; "
        "none was used (run.json agents.replies_refused)"
    )
    # labctl run adds the lab's status notes to its status line
    assert hub.report()["status_notes"] == [refused_replies_line(hub.report()["agents"])]
