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
    section (${ENV} references; with `identities:`, this host's own secret, e.g. LABCTL_MQTT_SECRET_H1). A
    broker that refuses the login, or TLS that fails, ends the agent with one line naming the host. SIGTERM
    or SIGINT ends it within 2 s in every state (decision 0068). A restarted agent is a new process to the
    controller: a run whose probes it was running fails, naming the host; the next run uses the new one.
    """
    import asyncio
    import contextlib
    import logging
    import os
    import signal
    import threading

    from labctl.agents.agent import STOP_BUDGET_S, Agent, DaemonThreads
    from labctl.agents.broker import BrokerSettings
    from labctl.core.errors import InputError
    from labctl.inventory.schema import load_inventory
    from labctl.labs import check

    start_logging(log_level, log_format)
    log = logging.getLogger("labctl.agents")
    inv = load_inventory(inventory)
    check(inv, secrets=False)
    if host not in inv.model.hosts:
        raise InputError(f"--host {host!r}: not a host of {inventory} (known: {', '.join(inv.hosts)})")
    settings = BrokerSettings.from_inventory(inv, broker, identity=host)
    if abs(clock_drift_ppb) > 10_000_000:
        raise typer.BadParameter("at most 10,000,000 ppb (1 %)", param_hint="--clock-drift-ppb")
    # refuses a host not in the inventory, a lab kind without agents
    node = Agent(inv, host, settings, skew_ns=clock_offset_ns, drift_ppb=clock_drift_ppb)

    def hard_exit() -> None:
        # The last resort, from a thread of its own (the loop may be the thing that is stuck): the agent
        # said it would be gone within 2 s of the signal.
        log.error("agent %s: not stopped %.1f s after the signal: exiting now", host, STOP_BUDGET_S + 0.3)
        logging.shutdown()
        os._exit(1)

    async def main() -> None:
        loop = asyncio.get_running_loop()
        # A connect blocked on a broker that does not answer runs in an executor thread (aiomqtt): a daemon
        # thread that the exit does not wait for (the default pool's workers are joined at exit).
        loop.set_default_executor(DaemonThreads())
        task = asyncio.ensure_future(node.run())
        watchdog: list[threading.Timer] = []

        def on_signal() -> None:
            if not watchdog:
                watchdog.append(threading.Timer(STOP_BUDGET_S + 0.3, hard_exit))
                watchdog[0].daemon = True
                watchdog[0].start()
            node.stop()

        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, on_signal)
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
                "signed": settings.auth_key is not None or settings.per_host,
                "identity": settings.login,
            },
        )
        with contextlib.suppress(asyncio.CancelledError):
            await task
        log.info("agent %s: stopped", host, extra={"host": host})

    asyncio.run(main())


def register(app: typer.Typer) -> None:
    app.command()(agent)
