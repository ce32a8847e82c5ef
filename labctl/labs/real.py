"""The real lab: switches at their network addresses, and a `labctl agent` on every host running real probes
on its own interfaces.

Each switch is its driver opened at the inventory's address (Polatis TL1 today; every registered driver
with an `open`). Each host runs `labctl agent` (labctl.agents), which samples its ports with the probes
in `PROBES`: the netlink carrier probe, the module-EEPROM Rx-power poller (ethtool netlink, every lane),
the UDP ping-pong between the two ends of each circuit, from the ports' inventory addresses (with
`probes.transport: rdma`: the verbs RC ping-pong on the ports' RDMA devices instead, decision 0029), and the
ethtool link state with the firmware's reason while a link is down (decision 0023). The
controller forwards each reconfiguration's window to the agents, measures their clock offsets and
counts every event lost on the way. Nothing here models anything: `profile` is not used.
"""

from __future__ import annotations

from labctl.agents.broker import BrokerSettings
from labctl.agents.hub import run_probes_on_agents
from labctl.agents.linkctl import AgentLinkControl
from labctl.inventory.schema import Inventory
from labctl.labs.base import Lab, LabContext, LabKind, require_transport
from labctl.labs.world import add_power_meters, check_power_meters, no_extra_probes
from labctl.models.fabric import SimFabric
from labctl.nic.netlink import NetlinkLinkControl, management_ports
from labctl.nic.settings import LinkControl
from labctl.ocs.switches import open_switch, switch_drivers
from labctl.probes.base import PortSite, ProbeContext
from labctl.probes.sampling import ProbeSettings

PROBES = ("carrier", "rx-power", "traffic", "link-state")
"""What each host's agent runs on its interfaces (with `traffic` as the experiment's transport says)."""
TRAFFIC_PROBE = {"udp": "traffic", "rdma": "verbs-rc"}
"""The probe that carries the ping-pong marking t5, by the experiment's `probes.transport`."""
AGENT_PROBES = (*PROBES, "verbs-rc")
"""The agents' allow-list: every probe a run of this kind may start on them."""


def probes_for(settings: ProbeSettings) -> tuple[str, ...]:
    return tuple(TRAFFIC_PROBE[settings.transport] if name == "traffic" else name for name in PROBES)


def require_rdma_ports(inventory: Inventory) -> None:
    """With `transport: rdma` every NIC port names its RDMA device: one line at the first that does not."""
    for port in inventory.ports:
        if port.rdma is None:
            raise inventory.fail(
                (*inventory.port_loc(port), "rdma"),
                f"probes.transport: rdma runs the verbs RC ping-pong on every NIC port: {port.label} needs "
                "`rdma: {device: mlx5_0, port: 1, gid_index: 3}` (ibv_devices, rdma link show, show_gids)",
            )


def check(inventory: Inventory) -> None:
    """What a real lab refuses. A switch-only inventory (no hosts) is valid, as `labctl ocs` takes it: no
    agents, so no broker; only a run needs hosts (`build` says so)."""
    if inventory.hosts and inventory.model.broker is None:
        raise inventory.fail(
            ("broker",), "a real lab with hosts needs a `broker:` section (url: mqtt://HOST:PORT)"
        )
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
    check_power_meters(inventory, "real", over_models=False)
    BrokerSettings.check_names(inventory)


def build(ctx: LabContext) -> Lab:
    if not ctx.inventory.hosts:
        raise ctx.inventory.fail(
            ("hosts",),
            "a run on a real lab needs hosts, each with its agent, and a `broker:` section; this inventory "
            "has switches only (it serves `labctl ocs`)",
        )
    require_transport(ctx.probes, "real", tuple(TRAFFIC_PROBE))
    no_extra_probes(ctx.probes, "real")
    if ctx.probes.transport == "rdma":
        require_rdma_ports(ctx.inventory)
    lab = Lab(
        switches={name: open_switch(name, spec, ctx.emit) for name, spec in ctx.inventory.switches.items()}
    )
    lab.link_control = AgentLinkControl(run_probes_on_agents(lab, ctx, probes_for(ctx.probes)))
    add_power_meters(lab, ctx, None)  # polled from the controller, at their addresses
    return lab


def agent_context(
    inventory: Inventory, host: str, settings: ProbeSettings, mirror: SimFabric | None
) -> ProbeContext:
    """An agent runs in its host's own network namespace: the ports are its interfaces, each reached at
    its inventory address; every port of the lab is a possible traffic peer. (No mirror: nothing modeled.)"""
    addresses = inventory.port_addresses("the traffic probe")
    sites = [PortSite(port, ip=str(addresses[port].ip)) for port in inventory.ports]
    return ProbeContext(settings, ports=[site for site in sites if site.port.host == host], peers=sites)


def agent_link_control(inventory: Inventory, host: str, broker_host: str) -> LinkControl:
    """The agent's host's own ports over ethtool netlink; the interfaces carrying its management path (the
    default route, the route to the broker) are refused, read from the routing table at every call."""
    return NetlinkLinkControl(management=lambda: management_ports(None, broker_host))


KIND = LabKind(
    "real",
    "switches at their network addresses; a `labctl agent` on every host, running real probes on its NICs",
    check,
    build,
    agent_probes=AGENT_PROBES,
    agents_probe_interfaces=True,
    agent_context=agent_context,
    agent_link_control=agent_link_control,
    no_link_control=None,
)
