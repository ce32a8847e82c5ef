"""The agents' `link` command (decision 0079): validated arguments, each bad input refused in one line
(counted as the agent's rejection), a setting the port does not take answered as a refusal the controller
raises as a local LinkControl would, and the settings kept by the agent between commands."""

from __future__ import annotations

import asyncio
import dataclasses
from pathlib import Path
from typing import Any

import msgspec
import pytest

from labctl.agents.agent import Agent
from labctl.agents.broker import BrokerSettings
from labctl.agents.hub import AgentHub
from labctl.agents.wire import Command, Reply
from labctl.inventory.schema import load_inventory
from labctl.nic.settings import PortRef
from tests.helpers import agents as helpers
from tests.helpers.agents import _running, _status, broker_section, write_lab

hub, lost = helpers.hub, helpers.lost  # fixtures


@pytest.fixture
def agent(tmp_path: Path) -> Agent:
    inv_path, _ = write_lab(tmp_path, broker_section("mqtt://127.0.0.1:1"))
    inventory = load_inventory(inv_path)
    return Agent(inventory, "h1", BrokerSettings.from_inventory(inventory))


async def ask(agent: Agent, args: dict[str, Any]) -> Reply:
    """One `link` command as it would arrive; its reply as it would be published."""
    sent: list[bytes] = []

    async def publish(topic_name: str, body: bytes, *, retain: bool = False) -> bool:
        sent.append(body)
        return True

    agent._publish = publish  # type: ignore[method-assign]
    await agent._command(Command(id=len(agent._handled) + 1, op="link", args=args), 0)
    await asyncio.gather(*agent._replying)
    (body,) = sent
    return msgspec.json.decode(body, type=Reply)


BAD = [
    ({"op": "write", "port": "p0"}, "malformed", "bad arguments: Invalid enum value 'write' - at `$.op`"),
    ({"port": "p0"}, "malformed", "bad arguments: Object missing required field `op`"),
    ({"op": "read", "port": "p9"}, "unauthorised", "p9 is not a port of h1"),
    ({"op": "read", "port": "../p0"}, "malformed", "bad arguments: Expected `str` matching regex"),
    ({"op": "read", "port": "p0", "mtu": 9000}, "malformed", "unknown field `mtu`"),
    ({"op": "apply", "port": "p0"}, "malformed", "settings go with apply, and only with it"),
    ({"op": "read", "port": "p0", "settings": {}}, "malformed", "settings go with apply, and only with it"),
    (
        {"op": "apply", "port": "p0", "settings": {"autoneg": "yes"}},
        "malformed",
        "Expected `bool | null`, got `str` - at `$.settings.autoneg`",
    ),
    (
        {"op": "apply", "port": "p0", "settings": {"fec": "fast"}},
        "malformed",
        "Invalid enum value 'fast' - at `$.settings.fec`",
    ),
    (
        {"op": "apply", "port": "p0", "settings": {"speed_mbps": -5}},
        "malformed",
        "Expected `int` >= 1 - at `$.settings.speed_mbps`",
    ),
    (
        {"op": "apply", "port": "p0", "settings": {"priv_flags": {"rx_cqe_compress": 1}}},
        "malformed",
        "Expected `bool`, got `int`",
    ),
    (
        {"op": "apply", "port": "p0", "settings": {"link_modes": ["100000baseSR4/Full", "a b"]}},
        "malformed",
        "at `$.settings.link_modes[1]`",
    ),
    (
        {"op": "apply", "port": "p0", "settings": {"duplex": "full", "ethertype": 1}},
        "malformed",
        "unknown field `ethertype` - at `$.settings`",
    ),
]


@pytest.mark.parametrize(("args", "kind", "says"), BAD, ids=[str(i) for i in range(len(BAD))])
async def test_bad_input_is_refused_in_one_line_and_counted(
    agent: Agent, args: dict[str, Any], kind: str, says: str
) -> None:
    reply = await ask(agent, args)
    assert not reply.ok and reply.error is not None
    assert says in reply.error and "\n" not in reply.error, reply.error
    assert agent.rejections.as_dict()[kind] == 1
    assert agent.link_control is not None
    held = await agent.link_control.read(PortRef("h1", "p0"))
    assert held.autoneg is True, "nothing was changed"


async def test_read_apply_and_read_back_through_the_command(agent: Agent) -> None:
    before = await ask(agent, {"op": "read", "port": "p1"})
    assert before.ok and before.data is not None
    assert before.data["settings"]["autoneg"] is True and before.data["settings"]["fec"] == "rs"
    support = await ask(agent, {"op": "support", "port": "p1"})
    assert support.ok and support.data is not None and "off" in support.data["support"]["fec_modes"]
    applied = await ask(agent, {"op": "apply", "port": "p1", "settings": {"autoneg": False, "fec": "off"}})
    assert applied.ok and applied.data is not None
    assert applied.data["settings"]["autoneg"] is False and applied.data["settings"]["fec"] == "off"
    # kept by the agent: another controller asking later reads what this one set
    again = await ask(agent, {"op": "read", "port": "p1"})
    assert again.data is not None and again.data["settings"] == applied.data["settings"]
    # settings_to_json's own output (with its label) is what the hub sends back for a restore
    restored = await ask(agent, {"op": "apply", "port": "p1", "settings": before.data["settings"]})
    assert restored.ok and restored.data is not None and restored.data["settings"] == before.data["settings"]
    assert sum(agent.rejections.as_dict()[k] for k in ("malformed", "unauthorised")) == 0


async def test_a_setting_the_port_does_not_take_is_an_answer_not_a_rejection(agent: Agent) -> None:
    reply = await ask(agent, {"op": "apply", "port": "p0", "settings": {"fec": "llrs"}})
    assert not reply.ok and reply.data is not None
    assert reply.data == {"refusal": "unsupported", "why": reply.data["why"]}
    assert reply.error == "h1/p0: cannot set fec=llrs: " + reply.data["why"]
    assert "llrs" in reply.data["why"] and agent.rejections.as_dict()["malformed"] == 0


async def test_a_lost_agent_that_does_not_return_fails_its_ports_naming_each(hub: AgentHub) -> None:
    """An agent declared lost mid-sweep and still gone: its ports' restore waits the broker's
    `agent_return_s` for it, then fails naming the port, so the run says which ports hold which setting."""
    from labctl.agents.linkctl import AgentLinkControl
    from labctl.core.errors import HardwareError
    from labctl.nic.settings import LinkSettings, LinkSettingUnsupported

    hub.broker = dataclasses.replace(hub.broker, agent_return_s=0.05)
    _running(hub, "h2", "A")
    _status(hub, "h2", "online B", 2)  # a new process: lost at once (decision 0024)
    _status(hub, "h2", "offline B", 3)  # and gone too
    control = AgentLinkControl(hub)
    with pytest.raises(HardwareError) as exc:
        await control.apply(PortRef("h2", "p0"), LinkSettings(autoneg=True))
    assert str(exc.value) == (
        "h2/p0: agent h2 is lost (restarted) and did not return within 0.05 s: its link settings can be "
        "neither read nor set until it is back"
    )
    assert hub._outgoing.empty(), "nothing is sent to a host that is not there"
    with pytest.raises(LinkSettingUnsupported, match="no such port in the lab"):
        await control.read(PortRef("h2", "p7"))


async def test_a_lost_agent_that_returns_is_asked_again(hub: AgentHub) -> None:
    """The agent comes back (a restarted process, or the same one after a partition) while the restore
    waits for it: the request goes to it (on a real host the NIC still holds what the sweep set)."""
    from labctl.agents.linkctl import AgentLinkControl
    from labctl.core.errors import HardwareError
    from labctl.nic.settings import LinkSettings

    _running(hub, "h2", "A")
    _status(hub, "h2", "offline A", 2)
    hub._lost(hub.links["h2"], 2, "offline")  # past the grace
    control = AgentLinkControl(hub, timeout_s=0.05)
    asked = asyncio.create_task(control.apply(PortRef("h2", "p0"), LinkSettings(autoneg=True)))
    for _ in range(3):  # the request starts and waits on the host (no real-clock sleep in this tier)
        await asyncio.sleep(0)
    assert not asked.done() and hub._outgoing.empty(), "waiting for the host, not asking it"
    _status(hub, "h2", "online C", 4)
    with pytest.raises(HardwareError, match=r"agent h2: no reply to link within 0\.05 s"):
        await asked  # asked (the hub here is never connected, so no reply comes)
    sent = hub._outgoing.get_nowait()
    assert sent.topic.endswith("/h2/cmd")
