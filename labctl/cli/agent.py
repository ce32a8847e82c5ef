"""`labctl agent`: one host's probes for the controller, over MQTT."""

from __future__ import annotations

from typing import Annotated

import typer

from labctl.cli.common import DEFAULT_INVENTORY, InventoryOpt, LogFormatOpt, LogLevelOpt, start_logging


def agent(
    host: Annotated[str, typer.Option("--host", help="This host's name in the inventory.")],
    broker: Annotated[
        str | None,
        typer.Option("--broker", help="mqtt://HOST:PORT or mqtts://HOST:PORT (default: the inventory's)."),
    ] = None,
    inventory: InventoryOpt = DEFAULT_INVENTORY,
    clock_offset_ns: Annotated[
        int,
        typer.Option(
            "--clock-offset-ns",
            hidden=True,
            help="Rehearsal only: stamp with CLOCK_MONOTONIC shifted by this (a second host's clock).",
        ),
    ] = 0,
    clock_drift_ppb: Annotated[
        int,
        typer.Option(
            "--clock-drift-ppb",
            hidden=True,
            help="Rehearsal only: and running this many parts per billion fast.",
        ),
    ] = 0,
    log_level: LogLevelOpt = "info",
    log_format: LogFormatOpt = None,
) -> None:
    """Run this host's probes for the controller, over MQTT, until Ctrl-C/SIGTERM.

    Events go to labctl/<lab>/<host>/events (QoS 1, sequence-numbered). Only `start`/`stop` of named probes,
    `set_circuits`, reconfiguration `window`s, clock `ping` and a read-only `inspect` are accepted, with
    validated arguments; credentials, TLS and the message signing key come from the inventory's `broker:`
    section (${ENV} references). A restarted agent is a new process to the controller: a run whose probes
    it was running fails, naming the host; the next run uses the new one.
    """
    import asyncio
    import contextlib
    import logging
    import signal

    from labctl.agents.agent import Agent
    from labctl.agents.broker import BrokerSettings
    from labctl.inventory.schema import load_inventory
    from labctl.labs import check

    start_logging(log_level, log_format)
    log = logging.getLogger("labctl.agents")
    inv = load_inventory(inventory)
    check(inv, secrets=False)
    settings = BrokerSettings.from_inventory(inv, broker)
    if abs(clock_drift_ppb) > 10_000_000:
        raise typer.BadParameter("at most 10,000,000 ppb (1 %)", param_hint="--clock-drift-ppb")
    # refuses a host not in the inventory, a lab kind without agents
    node = Agent(inv, host, settings, skew_ns=clock_offset_ns, drift_ppb=clock_drift_ppb)

    async def main() -> None:
        loop = asyncio.get_running_loop()
        task = asyncio.ensure_future(node.run())
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, task.cancel)
        # Where it connects, never how it logs in: the broker's credentials and the signing key stay out.
        log.info(
            "agent %s: %d ports, broker %s:%d",
            host,
            len(node.ports),
            settings.hostname,
            settings.port,
            extra={
                "host": host,
                "lab": settings.lab,
                "ports": len(node.ports),
                "broker": f"{settings.hostname}:{settings.port}",
                "tls": settings.tls,
                "signed": settings.auth_key is not None,
            },
        )
        with contextlib.suppress(asyncio.CancelledError):
            await task
        log.info("agent %s: stopped", host, extra={"host": host})

    asyncio.run(main())


def register(app: typer.Typer) -> None:
    app.command()(agent)
