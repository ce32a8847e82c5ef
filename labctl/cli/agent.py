"""`labctl agent`: one host's probes for the controller, over MQTT."""

from __future__ import annotations

import asyncio
import contextlib
from typing import Annotated

import typer

from labctl.cli.common import DEFAULT_INVENTORY, InventoryOpt, err
from labctl.errors import InputError


def agent(
    host: Annotated[str, typer.Option("--host", help="This host's name in the inventory.")],
    broker: Annotated[
        str | None,
        typer.Option("--broker", help="mqtt://HOST:PORT or mqtts://HOST:PORT (default: the inventory's)."),
    ] = None,
    inventory: InventoryOpt = DEFAULT_INVENTORY,
) -> None:
    """Run this host's probes for the controller, over MQTT, until Ctrl-C/SIGTERM.

    Events go to labctl/<lab>/<host>/events (QoS 1, sequence-numbered). Only `start`/`stop` of named probes,
    `set_circuits` and clock `ping` are accepted, with validated arguments; credentials, TLS and the message
    signing key come from the inventory's `broker:` section (${ENV} references).
    """
    import signal

    from labctl.agents.agent import Agent
    from labctl.agents.broker import BrokerSettings
    from labctl.inventory import load_inventory
    from labctl.labs import check, kinds_with_agents

    inv = load_inventory(inventory)
    if not check(inv, secrets=False).agent_probes:
        with_agents = ", ".join(kinds_with_agents())
        raise InputError(f"{inventory}: a {inv.kind} lab runs no agents (lab kinds that do: {with_agents})")
    settings = BrokerSettings.from_inventory(inv, broker)

    async def main() -> None:
        node = Agent(inv, host, settings)
        loop = asyncio.get_running_loop()
        task = asyncio.ensure_future(node.run())
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, task.cancel)
        err.print(f"agent {host}: {len(node.ports)} ports, broker {settings.hostname}:{settings.port}")
        with contextlib.suppress(asyncio.CancelledError):
            await task

    asyncio.run(main())


def register(app: typer.Typer) -> None:
    app.command()(agent)
