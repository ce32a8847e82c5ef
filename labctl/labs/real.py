"""The real lab: switches at their network addresses, and a `labctl agent` on every host running real probes
on its own interfaces.

Each switch is its driver opened at the inventory's address (Polatis TL1 today; every registered driver
with an `open`). Each host runs `labctl agent` (labctl.agents), which samples its ports with the probes
in `PROBES`: the netlink carrier probe, the module-EEPROM Rx-power poller (ethtool netlink, every lane),
the UDP ping-pong between the two ends of each circuit, from the ports' inventory addresses, and the
ethtool link state with the firmware's reason while a link is down (decision 0023). The
controller forwards each reconfiguration's window to the agents, measures their clock offsets and
counts every event lost on the way. Nothing here models anything: `profile` is not used.
"""

from __future__ import annotations

from labctl.agents.broker import BrokerSettings
from labctl.agents.hub import run_probes_on_agents
from labctl.inventory import Inventory
from labctl.labs.base import Lab, LabContext, LabKind, require_transport
from labctl.models.fabric import SimFabric
from labctl.probes import PortSite, ProbeContext
from labctl.sampling import ProbeSettings
from labctl.switches import open_switch, switch_drivers

PROBES = ("carrier", "rx-power", "traffic", "link-state")
"""What each host's agent runs on its interfaces."""


def check(inventory: Inventory) -> None:
    if inventory.model.broker is None:
        raise inventory.fail(("broker",), "a real lab needs a `broker:` section (url: mqtt://HOST:PORT)")
    for name, spec in inventory.switches.items():
        if switch_drivers.get(spec.driver).open is None:
            raise inventory.fail(
                ("switches", name, "driver"),
                f"a real lab drives switches at their addresses; a {spec.driver} switch is only a model",
            )
        if spec.over_model:
            raise inventory.fail(
                ("switches", name),
                f"a real lab drives switches at their addresses; this {spec.driver} switch is emulated (drop "
                "`emulate: true` and give its address)",
            )
    inventory.port_addresses("the traffic probe")  # both ends of every circuit ping from their address
    BrokerSettings.check_names(inventory)


def build(ctx: LabContext) -> Lab:
    require_transport(ctx.probes, "real")
    lab = Lab(
        switches={name: open_switch(name, spec, ctx.emit) for name, spec in ctx.inventory.switches.items()}
    )
    run_probes_on_agents(lab, ctx, PROBES)
    return lab


def agent_context(
    inventory: Inventory, host: str, settings: ProbeSettings, mirror: SimFabric | None
) -> ProbeContext:
    """An agent runs in its host's own network namespace: the ports are its interfaces, each reached at
    its inventory address; every port of the lab is a possible traffic peer. (No mirror: nothing modeled.)"""
    addresses = inventory.port_addresses("the traffic probe")
    sites = [PortSite(port, ip=str(addresses[port].ip)) for port in inventory.ports]
    return ProbeContext(settings, ports=[site for site in sites if site.port.host == host], peers=sites)


KIND = LabKind(
    "real",
    "switches at their network addresses; a `labctl agent` on every host, running real probes on its NICs",
    check,
    build,
    agent_probes=PROBES,
    agents_probe_interfaces=True,
    agent_context=agent_context,
)
