"""`labctl lab check`: is the lab ready for a run? Switches and hosts, one row per fact."""

from __future__ import annotations

import contextlib
import json
from pathlib import Path
from typing import Annotated

import typer

from labctl.cli.common import DEFAULT_INVENTORY, InventoryOpt, JsonOpt, bounded, out

lab_app = typer.Typer(
    help="The lab as a whole: check that it is ready for a run; write its broker's configuration.",
    no_args_is_help=True,
)


@lab_app.command("check")
def lab_check(
    inventory: InventoryOpt = DEFAULT_INVENTORY,
    as_json: JsonOpt = False,
    timeout_s: Annotated[
        float,
        typer.Option(
            "--timeout", callback=bounded(0.5, 600), help="Seconds to wait for each agent's answer."
        ),
    ] = 10.0,
) -> None:
    """Preflight: for each switch, reachable, login, size as declared, its current patches (and, on a
    shared switch, none crossing the owned ports); for each host of a lab with agents, the agent online and
    its version, every NIC port's interface, carrier, address, transceiver and Rx power per lane. Reads
    only. Exit 0 when nothing failed, 1 otherwise, 2 for an inventory its lab kind refuses."""
    import asyncio

    from rich.table import Table

    from labctl.labs import load
    from labctl.run.preflight import preflight

    inv = load(inventory)
    checks = asyncio.run(preflight(inv, timeout_s=timeout_s))
    failed = [c for c in checks if c.ok is False]
    if as_json:
        print(
            json.dumps({"lab": inv.lab, "ok": not failed, "checks": [c.as_dict() for c in checks]}, indent=2)
        )
    else:
        table = Table(title=f"lab check: {inv.lab} ({inv.kind})", title_justify="left")
        for col in ("what", "check", "", "detail"):
            table.add_column(col)
        for c in checks:
            mark = {True: "[green]ok[/]", False: "[red]FAIL[/]", None: "·"}[c.ok]
            table.add_row(c.subject, c.item, mark, c.detail)
        out.print(table)
        out.print(f"[red]{len(failed)} check(s) failed[/]" if failed else "[green]ready[/]")
    if failed:
        raise typer.Exit(1)


@lab_app.command("broker-config")
def broker_config(
    out_dir: Annotated[
        Path, typer.Option("--out", help="Directory to write passwd, acl, mosquitto.conf into.")
    ],
    inventory: InventoryOpt = DEFAULT_INVENTORY,
    listen: Annotated[
        list[str] | None,
        typer.Option(
            "--listen",
            help="ADDRESS:PORT of a listener, repeatable (default: the inventory's broker address).",
        ),
    ] = None,
    tls_cert: Annotated[
        Path | None, typer.Option("--tls-cert", help="The broker's certificate (PEM).")
    ] = None,
    tls_key: Annotated[Path | None, typer.Option("--tls-key", help="The broker's private key (PEM).")] = None,
    tls_ca: Annotated[
        Path | None,
        typer.Option("--tls-ca", help="CA of the clients' certificates (with --require-client-cert)."),
    ] = None,
    require_client_cert: Annotated[
        bool, typer.Option("--require-client-cert", help="Clients must present a certificate the CA signed.")
    ] = False,
) -> None:
    """Write mosquitto's password file, ACL file and a configuration using them, for the inventory's
    per-host identities (`broker: {identities: ...}`, decision 0067): a user and secret per agent and one
    for the controller; each agent may publish only its own host's topics and read only its own commands,
    the controller alone publishes commands. Every identity's secret must be in the environment
    (LABCTL_MQTT_SECRET_CONTROLLER, LABCTL_MQTT_SECRET_<HOST>, ...); the password file holds their hashes
    (mode 0600), never a secret. Run mosquitto with `-c OUT/mosquitto.conf`."""
    from labctl.agents.brokerconf import ServerTls, parse_listener, write_broker_config
    from labctl.core.errors import InputError
    from labctl.inventory.schema import load_inventory

    inv = load_inventory(inventory)
    if (tls_cert is None) != (tls_key is None):
        raise InputError("--tls-cert and --tls-key go together")
    if (tls_ca is not None or require_client_cert) and tls_cert is None:
        raise InputError("--tls-ca and --require-client-cert need --tls-cert and --tls-key")
    if require_client_cert and tls_ca is None:
        raise InputError(
            "--require-client-cert needs --tls-ca (the CA that signed the clients' certificates)"
        )
    tls = (
        ServerTls(
            tls_cert.resolve(), tls_key.resolve(), tls_ca.resolve() if tls_ca else None, require_client_cert
        )
        if tls_cert is not None and tls_key is not None
        else None
    )
    listeners = [parse_listener(text) for text in listen] if listen else None
    paths = write_broker_config(inv, out_dir, listeners, tls)
    users = 1 + len(inv.hosts)
    out.print(
        f"{paths['conf']}: {users} users (the controller and {len(inv.hosts)} agents), ACL {paths['acl']}, "
        f"passwords {paths['passwd']}{' over TLS' if tls else ''}; run `mosquitto -c {paths['conf']}`"
    )


@lab_app.command("restore")
def lab_restore(
    run: Annotated[Path, typer.Argument(help="A run directory holding link-settings-before.json.")],
    inventory: Annotated[
        Path | None,
        typer.Option(
            "--inventory",
            "-i",
            help="The run's lab (default: the inventory the run itself used, as its run.json names it).",
        ),
    ] = None,
    profile: Annotated[
        str | None, typer.Option("--profile", help="The profile the run used (default: its run.json's).")
    ] = None,
) -> None:
    """Put every NIC port a tune run swept back to the link settings it held before the run
    (RUN/link-settings-before.json), through the lab's link settings control: each host's agent on an
    agents or real lab. For a run whose process died (`labctl serve` does it by itself for its queued
    runs). One line per port; exit 1 naming each port not restored and what it holds."""
    import asyncio

    from labctl.core.errors import InputError
    from labctl.core.events import EventLog
    from labctl.labs import load
    from labctl.run.tune import BEFORE_FILE, NotRestored, restore_run_link_settings, saved_ports

    if saved_ports(run) is None:
        raise InputError(f"{run / BEFORE_FILE}: no saved link settings (not a tune run's directory?)")
    meta: dict[str, object] = {}
    with contextlib.suppress(OSError, ValueError):
        meta = json.loads((run / "run.json").read_text(encoding="utf-8"))
    if inventory is None:
        named = meta.get("inventory_file")
        if not isinstance(named, str):
            raise InputError(f"{run / 'run.json'}: names no inventory_file: give --inventory")
        inventory = Path(named)
    if profile is None and isinstance(meta.get("profile"), str):
        profile = str(meta["profile"])
    inv = load(inventory)
    from labctl.core.clock import Timebase

    events = EventLog(None, Timebase.capture())
    try:
        lines = asyncio.run(restore_run_link_settings(run, inv, inv.profile(profile), events.record))
    except NotRestored as e:
        for line in e.restored:
            out.print(line, highlight=False)
        for line in e.failed:
            out.print(f"[red]NOT restored[/]: {line}", highlight=False)
        out.print(f"[red]{len(e.failed)} port(s) not restored[/]")
        raise typer.Exit(1) from None
    finally:
        events.close()
    for line in lines:
        out.print(line, highlight=False)
    out.print(f"[green]{len(lines)} port(s) restored[/]")


def register(app: typer.Typer) -> None:
    app.add_typer(lab_app, name="lab")
