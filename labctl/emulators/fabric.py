"""The kernel-real emulated fabric: one network namespace per host, one veth pair per NIC port.

Per NIC port, the NIC end lives in its host's namespace, named as the inventory says and carrying its
address; the fiber end lives in the `ocs` namespace. The OCS is tc: a patch ingress i → egress e is a u32
match-all + mirred redirect on the ingress of the fiber end of the port whose transmit fiber lands on i,
sending every frame out of the fiber end of the port whose receive fiber comes from e. The fabric follows
a `SwitchModel` through its light listener, so it moves the same way whichever driver (in-process sim,
TL1 over TCP to the emulator) commands the model.

A NIC's link needs light both ways with the same partner (training is two-sided, decision 0011): when a
duplex link is lit, the fabric waits the profile's firmware link-up delay and then brings both fiber ends up
(the veth peers then get carrier, a real kernel event); when light is lost, both fiber ends go down at once.
`link.firmware` events are stamped right before the netlink request that brings the fiber end up or down.

Lifecycle calls (`create`, `reset`, `destroy`) block and use pyroute2; run them off the event loop thread
(asyncio.to_thread). Runtime calls (the light listener, firmware timers) run on the loop and use the raw
rtnetlink codec (~0.1 ms a request).
"""

from __future__ import annotations

import functools
import hashlib
import ipaddress
import json
import os
import random
import socket
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from labctl.core.clock import now_ns
from labctl.core.errors import HardwareError, InputError
from labctl.core.events import Event, Kind
from labctl.inventory.profiles import Profile
from labctl.inventory.schema import Inventory, NicPort
from labctl.linux import netns
from labctl.linux.rtnl import Rtnl, open_route_socket
from labctl.ocs.protocol import EventSink

if TYPE_CHECKING:  # named in types only: checking a kernel inventory (FabricLayout) loads no model (numpy)
    import asyncio

    from labctl.models.switch import SwitchModel

REDIRECT_PRIO = 1
INDEX_BASE = 1000
OCS_NETNS = "ocs"
# Same-ifindex veth ends are "non-urgent" for linkwatch, like a physical NIC: carrier-down notifications
# are deferred up to 1 s, exactly what the carrier probe must cope with on real hardware (probes.md §2).
HOST_SYSCTLS = {
    "net/ipv6/conf/all/disable_ipv6": "1",  # no ND/MLD chatter crossing the OCS
    "net/ipv6/conf/default/disable_ipv6": "1",
    "net/ipv4/conf/all/arp_ignore": "1",  # answer ARP only on the port that owns the address
    "net/ipv4/conf/default/arp_ignore": "1",
    "net/ipv4/conf/all/arp_announce": "2",
    "net/ipv4/conf/default/arp_announce": "2",
    "net/ipv4/conf/all/rp_filter": "0",  # several ports share a subnet; the path decides, not the route
    "net/ipv4/conf/default/rp_filter": "0",
}


@dataclass(frozen=True, slots=True)
class FabricPort:
    """Where one inventory NIC port lives in the fabric."""

    port: NicPort
    host_netns: str
    fiber: str
    index: int
    """ifindex of both veth ends (NIC end in the host namespace, fiber end in the ocs namespace)."""
    nic_mac: bytes
    fiber_mac: bytes
    interface: ipaddress.IPv4Interface

    @property
    def ip(self) -> str:
        return str(self.interface.ip)


MANAGEMENT_NET = ipaddress.IPv4Network("10.254.0.0/16")
"""Reserved for emulated fabrics' management links (no NIC address may overlap it)."""
MANAGEMENT_BLOCK_PREFIXLEN = 24
"""Each fabric's management links come from one /24 of MANAGEMENT_NET, chosen by its layout hash, so two
labs' fabrics up at once get different subnets in the root namespace (a clash is refused, not shared)."""
MANAGEMENT_MAX_HOSTS = 2 ** (32 - MANAGEMENT_BLOCK_PREFIXLEN) // 4 - 1  # its /30s but the first
MANAGEMENT_IF = "mgmt0"
IFNAMSIZ = 15  # longest Linux interface name


def management_block(inventory: Inventory) -> ipaddress.IPv4Network:
    """The /24 of MANAGEMENT_NET holding this inventory's management links, derived from the same hash as
    the fabric's prefix (lc-<hash>-): the same block every time the fabric comes up, and another lab's
    fabric almost always gets another one (1 in 256 share it; `create` then refuses, naming the clash)."""
    blocks = 2 ** (MANAGEMENT_BLOCK_PREFIXLEN - MANAGEMENT_NET.prefixlen)
    block_size = 2 ** (32 - MANAGEMENT_BLOCK_PREFIXLEN)
    first = int(MANAGEMENT_NET.network_address) + (int(layout_hash(inventory), 16) % blocks) * block_size
    return ipaddress.IPv4Network((first, MANAGEMENT_BLOCK_PREFIXLEN))


@dataclass(frozen=True, slots=True)
class ManagementLink:
    """A host's management network, as on a real lab: not the OCS data plane. One veth pair from the root
    namespace (`root_if`, `root_ip`: where the host reaches the controller, its broker, its switches) to
    the host's namespace (`mgmt0`, `host_ip`); a /30 per host in the fabric's block (`management_block`)."""

    host: str
    root_if: str
    root_ip: ipaddress.IPv4Interface
    host_ip: ipaddress.IPv4Interface


@dataclass(frozen=True)
class FabricLayout:
    prefix: str
    ocs_netns: str
    host_netns: dict[str, str]
    ports: list[FabricPort]
    management: dict[str, ManagementLink] = field(default_factory=dict)
    management_block: ipaddress.IPv4Network | None = None
    """The /24 the management links come from (`management_block`); None when they do not fit."""
    _by_port: dict[NicPort, FabricPort] = field(default_factory=dict, compare=False, repr=False)

    @classmethod
    def of(cls, inventory: Inventory, prefix: str) -> FabricLayout:
        hosts = {host: f"{prefix}{host}" for host in inventory.hosts}
        for host, name in hosts.items():
            try:
                netns.netns_path(name)
            except InputError:
                raise inventory.fail(
                    ("hosts", host), f"host name gives an unusable namespace name {name!r}"
                ) from None
        addresses = inventory.port_addresses("the kernel fabric")
        ports = []
        for k, port in enumerate(inventory.ports):
            interface = addresses[port]
            ports.append(
                FabricPort(
                    port=port,
                    host_netns=hosts[port.host],
                    fiber=f"fib{k}",
                    index=INDEX_BASE + k,
                    nic_mac=bytes((0x02, 0x6C, 0x00, 0x00, k >> 8, k & 0xFF)),
                    fiber_mac=bytes((0x02, 0x6C, 0x01, 0x00, k >> 8, k & 0xFF)),
                    interface=interface,
                )
            )
        # Management links only where they fit: a kernel-kind run never asks for them, so a lab too big
        # for a block is refused by `create(management=True)`, not here.
        management = {}
        block_net = management_block(inventory) if len(inventory.hosts) <= MANAGEMENT_MAX_HOSTS else None
        if block_net is not None:
            block = int(block_net.network_address)
            for k, host in enumerate(inventory.hosts, start=1):
                base = block + 4 * k  # the k-th /30 of the block: .1 root side, .2 host side
                root_ip, host_ip = (
                    ipaddress.IPv4Interface((base + 1, 30)),
                    ipaddress.IPv4Interface((base + 2, 30)),
                )
                management[host] = ManagementLink(host, f"{prefix}m{k}", root_ip, host_ip)
        clash = [fp.port.label for fp in ports if fp.interface.network.overlaps(MANAGEMENT_NET)]
        if clash:
            raise inventory.fail(
                (*inventory.port_loc(next(fp.port for fp in ports if fp.port.label == clash[0])), "address"),
                f"{MANAGEMENT_NET} is the emulated fabric's management network; use other NIC addresses",
            )
        layout = cls(prefix, f"{prefix}{OCS_NETNS}", hosts, ports, management, block_net)
        layout._by_port.update({p.port: p for p in ports})
        return layout

    def port(self, port: NicPort) -> FabricPort:
        return self._by_port[port]

    def netns_names(self) -> list[str]:
        return [self.ocs_netns, *self.host_netns.values()]


def layout_hash(inventory: Inventory) -> str:
    """Six hex digits identifying the fabric an inventory describes (lab, hosts, ports, addresses, switches):
    two labs never share one."""
    shape = {
        "lab": inventory.lab,
        "switches": {n: s.size for n, s in inventory.switches.items()},
        "ports": [[p.host, p.ifname, p.switch, p.tx, p.rx, p.address] for p in inventory.ports],
    }
    return hashlib.sha1(json.dumps(shape, sort_keys=True).encode()).hexdigest()[:6]


def managed_prefix(inventory: Inventory) -> str:
    """Prefix of the fabric `labctl emulate fabric up` keeps for this inventory (reused by runs)."""
    return f"lc-{layout_hash(inventory)}-"


def run_prefix() -> str:
    """Prefix of a fabric a run brings up for itself (unique per process, swept when the process is gone)."""
    return f"lr-{os.getpid()}-"


class KernelFabric:
    """Builds, resets and removes the fabric of one layout, and moves light through it at runtime."""

    def __init__(self, layout: FabricLayout, profile: Profile, rng: random.Random, emit: EventSink) -> None:
        self.layout = layout
        self.profile = profile
        self.rng = rng
        self.emit = emit
        self._by_tx: dict[tuple[str, int], FabricPort] = {}
        self._by_rx: dict[tuple[str, int], FabricPort] = {}
        for fp in layout.ports:
            self._by_tx[(fp.port.switch, fp.port.tx)] = fp
            self._by_rx[(fp.port.switch, fp.port.rx)] = fp
        self._rt: Rtnl | None = None
        self._lit: dict[tuple[str, int], int] = {}
        self._redirect: dict[int, int] = {}  # fiber ifindex → fiber ifindex its frames are redirected to
        self.light_from: dict[FabricPort, FabricPort | None] = dict.fromkeys(layout.ports)
        self.fiber_up: dict[FabricPort, bool] = dict.fromkeys(layout.ports, False)
        self._generation: dict[FabricPort, int] = dict.fromkeys(layout.ports, 0)
        self._timers: set[asyncio.TimerHandle] = set()

    # -- lifecycle (blocking) ------------------------------------------------------------------------------
    def exists(self) -> bool:
        return all(netns.exists(n) for n in self.layout.netns_names())

    def create(self, *, management: bool = False) -> None:
        """Create every namespace and link (and, with `management`, each host's management veth to the root
        namespace); on any failure remove everything created, then re-raise."""
        names = self.layout.netns_names()
        clash = [n for n in names if netns.exists(n)]
        if clash:
            raise HardwareError(
                f"network namespace(s) {', '.join(clash)} already exist; remove them with "
                f"`labctl emulate fabric down` (prefix {self.layout.prefix})"
            )
        if management:
            self._check_management()  # before anything is built: a refusal leaves nothing to undo
        try:
            for name in names:
                netns.create(name)
            for name in names:
                for key, value in HOST_SYSCTLS.items():
                    netns.write_sysctl(name, key, value)
            self._create_links()
            for host, ns in self.layout.host_netns.items():
                self._configure_host(host, ns)
            if management:
                self._create_management()
        except BaseException:
            self.destroy()
            raise

    def _check_management(self) -> None:
        """Refuse management links that cannot be made, or would share a subnet with an address already in
        the root namespace (another fabric's management links, or the machine's own network): the kernel
        would accept both, and the broker then answers on whichever route wins."""
        from pyroute2 import IPRoute

        links = self.layout.management
        if len(links) != len(self.layout.host_netns):
            raise HardwareError(
                f"fabric {self.layout.prefix}: {len(self.layout.host_netns)} hosts; management links fit "
                f"{MANAGEMENT_MAX_HOSTS} hosts per fabric"
            )
        long = [link.root_if for link in links.values() if len(link.root_if) > IFNAMSIZ]
        if long:
            raise InputError(
                f"fabric prefix {self.layout.prefix!r} is too long for management interface names "
                f"({', '.join(long)}: at most {IFNAMSIZ} characters)"
            )
        with IPRoute() as ipr:
            present = [
                (
                    ipaddress.IPv4Interface((a.get_attr("IFA_ADDRESS"), a["prefixlen"])),
                    a.get_attr("IFA_LABEL") or str(a["index"]),
                )
                for a in ipr.get_addr(family=socket.AF_INET)
            ]
        for link in links.values():
            for address, ifname in present:
                if address.network.overlaps(link.root_ip.network):
                    raise HardwareError(
                        f"fabric {self.layout.prefix}: management subnet {link.root_ip.network} of host "
                        f"{link.host} collides with {address} on {ifname} in the root namespace (another "
                        f"fabric of the same layout, or of a lab whose hash picks the same block "
                        f"{self.layout.management_block}?); bring that one down first"
                    )

    def management_present(self) -> dict[str, ManagementLink]:
        """The management links that exist: their root end in the root namespace, carrying its address
        (a fabric built without them, e.g. by a kernel-kind run or an older labctl, has none)."""
        from pyroute2 import IPRoute

        found = {}
        with IPRoute() as ipr:
            for host, link in self.layout.management.items():
                indices = ipr.link_lookup(ifname=link.root_if)
                if not indices:
                    continue
                addresses = {
                    (a.get_attr("IFA_ADDRESS"), a["prefixlen"])
                    for a in ipr.get_addr(family=socket.AF_INET, index=indices[0])
                }
                if (str(link.root_ip.ip), link.root_ip.network.prefixlen) in addresses:
                    found[host] = link
        return found

    def _create_management(self) -> None:
        """The management veths. Their root ends go away with the host namespaces (a veth pair dies with
        either end), so `destroy` removes them too."""
        from pyroute2 import IPRoute

        rt = Rtnl(open_route_socket())
        ipr = IPRoute()
        try:
            for k, link in enumerate(self.layout.management.values(), start=1):
                fd = netns.open_fd(self.layout.host_netns[link.host])
                try:
                    rt.add_veth(
                        link.root_if,
                        0,
                        bytes((0x02, 0x6C, 0x02, 0, k >> 8, k & 0xFF)),
                        MANAGEMENT_IF,
                        0,
                        bytes((0x02, 0x6C, 0x03, 0, k >> 8, k & 0xFF)),
                        fd,
                    )
                finally:
                    os.close(fd)
                index = socket.if_nametoindex(link.root_if)
                ipr.addr("add", index=index, address=str(link.root_ip.ip), prefixlen=30)
                ipr.link("set", index=index, state="up")
                with netns.entered(self.layout.host_netns[link.host]):
                    inner = IPRoute()
                try:
                    host_index = inner.link_lookup(ifname=MANAGEMENT_IF)[0]
                    inner.addr("add", index=host_index, address=str(link.host_ip.ip), prefixlen=30)
                    inner.link("set", index=host_index, state="up")
                finally:
                    inner.close()
        finally:
            ipr.close()
            rt.close()

    def _create_links(self) -> None:
        with netns.entered(self.layout.ocs_netns):
            rt = Rtnl(open_route_socket())
        try:
            for fp in self.layout.ports:
                fd = netns.open_fd(fp.host_netns)
                try:
                    rt.add_veth(fp.fiber, fp.index, fp.fiber_mac, fp.port.ifname, fp.index, fp.nic_mac, fd)
                finally:
                    os.close(fd)
                rt.add_ingress_qdisc(fp.index)
        finally:
            rt.close()

    def _configure_host(self, host: str, ns: str) -> None:
        """Addresses, admin up, and pinned neighbours for every port light could bring to each NIC port."""
        from pyroute2 import IPRoute

        mine = [fp for fp in self.layout.ports if fp.port.host == host]
        with netns.entered(ns):
            ipr = IPRoute()
        try:
            ipr.link("set", index=1, state="up")
            for fp in mine:
                ipr.addr("add", index=fp.index, address=fp.ip, prefixlen=fp.interface.network.prefixlen)
                ipr.link("set", index=fp.index, state="up")
                # Pinned ARP: the transport phase then measures the path, not the kernel's 1 s ARP retry
                # timer after a probe lost while the far fiber end was still down (decision 0011).
                for other in self.layout.ports:
                    if other is fp or other.port.switch != fp.port.switch:
                        continue
                    ipr.neigh(
                        "add",
                        dst=other.ip,
                        lladdr=":".join(f"{b:02x}" for b in other.nic_mac),
                        ifindex=fp.index,
                        state=0x80,  # NUD_PERMANENT
                    )
        finally:
            ipr.close()

    def reset(self) -> None:
        """Put an existing fabric into the all-dark state (fiber ends down, no cross-connects); verify it."""
        missing = [n for n in self.layout.netns_names() if not netns.exists(n)]
        if missing:
            raise HardwareError(f"fabric {self.layout.prefix}: namespace(s) {', '.join(missing)} missing")
        for fp in self.layout.ports:
            with netns.entered(fp.host_netns):
                try:
                    index = socket.if_nametoindex(fp.port.ifname)
                except OSError:
                    index = -1
            if index != fp.index:
                raise HardwareError(
                    f"fabric {self.layout.prefix}: {fp.port.label} is not the fabric's NIC end (ifindex "
                    f"{index}, expected {fp.index}); run `labctl emulate fabric down` and up again"
                )
        with netns.entered(self.layout.ocs_netns):
            rt = Rtnl(open_route_socket())
        try:
            for fp in self.layout.ports:
                rt.delete_filters(fp.index, REDIRECT_PRIO)
                rt.set_up(fp.index, False)
        finally:
            rt.close()

    def destroy(self) -> list[str]:
        return netns.cleanup(self.layout.prefix)

    # -- runtime (event loop thread) -------------------------------------------------------------------
    def open(self) -> None:
        if self._rt is None:
            with netns.entered(self.layout.ocs_netns):
                self._rt = Rtnl(open_route_socket())

    def follow(self, switch: str, model: SwitchModel) -> None:
        """Move light through the fabric as `model` does, from its current state on."""
        model.add_listener(functools.partial(self._on_light, switch))
        for egress, ingress in list(model.lit.items()):
            self._on_light(switch, egress, ingress, now_ns())

    def close(self) -> None:
        for handle in self._timers:
            handle.cancel()
        self._timers.clear()
        if self._rt is not None:
            self._rt.close()
            self._rt = None

    def _control(self) -> Rtnl:
        if self._rt is None:
            raise HardwareError(f"fabric {self.layout.prefix}: not opened")
        return self._rt

    def _error(self, what: str) -> None:
        """A kernel operation the fabric could not carry out: an event, never an exception in a timer."""
        self.emit(
            Event(t_ns=now_ns(), kind=Kind.OCS_ERROR, source=f"fabric:{self.layout.prefix}", value=what)
        )

    def _on_light(self, switch: str, egress: int, ingress: int | None, t_ns: int) -> None:
        try:
            self._cross_connect(switch, egress, ingress)
            self._light_changed(switch, egress, ingress, t_ns)
        except (OSError, HardwareError) as e:
            self._error(f"{switch} egress {egress}: {e}")

    def _cross_connect(self, switch: str, egress: int, ingress: int | None) -> None:
        """Program the tc redirect of one patch (one direction of light)."""
        rt = self._control()
        key = (switch, egress)
        old = self._lit.get(key)
        if old == ingress:
            return
        dst = self._by_rx.get(key)
        if old is not None:
            src = self._by_tx.get((switch, old))
            if src is not None and dst is not None and self._redirect.get(src.index) == dst.index:
                rt.delete_filters(src.index, REDIRECT_PRIO)
                del self._redirect[src.index]
        if ingress is None:
            self._lit.pop(key, None)
            return
        self._lit[key] = ingress
        src = self._by_tx.get((switch, ingress))
        if src is None or dst is None:
            return  # light from or to a port with no NIC attached
        if src.index in self._redirect:
            rt.delete_filters(src.index, REDIRECT_PRIO)
        rt.add_redirect(src.index, dst.index, REDIRECT_PRIO)
        self._redirect[src.index] = dst.index

    def _light_changed(self, switch: str, egress: int, ingress: int | None, t_ns: int) -> None:
        port = self._by_rx.get((switch, egress))
        if port is None:
            return
        source = self._by_tx.get((switch, ingress)) if ingress is not None else None
        old = self.light_from[port]
        if old == source:
            return
        self.light_from[port] = source
        if old is not None:
            self._link_down(port, old)
        if source is not None and self.light_from[source] == port:
            self._link_lit(port, source, t_ns)

    def _link_down(self, a: FabricPort, b: FabricPort) -> None:
        """Light from b no longer reaches a: the a-b link drops at both ends, now."""
        for fp, peer in ((a, b), (b, a)) if a is not b else ((a, a),):
            self._generation[fp] += 1
            if self.fiber_up[fp]:
                self._set_fiber(fp, peer, False)

    def _link_lit(self, a: FabricPort, b: FabricPort, t_ns: int) -> None:
        """Both directions of the a-b link are lit from t_ns: firmware link-up after the profile's delay."""
        t_fw = t_ns + self.profile.draw_ns(self.rng, "firmware_up_ms")
        pairs = ((a, b), (b, a)) if a is not b else ((a, a),)
        generations = {}
        for fp, _ in pairs:
            self._generation[fp] += 1
            generations[fp] = self._generation[fp]
        import asyncio  # here, not at the top: checking a kernel inventory (FabricLayout) needs no asyncio

        loop = asyncio.get_running_loop()

        def fire() -> None:
            self._timers.discard(handle)
            try:
                for fp, peer in pairs:
                    if self._generation[fp] == generations[fp] and not self.fiber_up[fp]:
                        self._set_fiber(fp, peer, True, (t_ns, t_fw))
            except (OSError, HardwareError) as e:
                self._error(f"firmware link-up {a.port.label}<->{b.port.label}: {e}")

        handle = loop.call_at(t_fw / 1e9, fire)
        self._timers.add(handle)

    def _set_fiber(
        self, fp: FabricPort, peer: FabricPort, up: bool, plan: tuple[int, int] | None = None
    ) -> None:
        """Flip one fiber end; a link-up carries its plan: when both directions were lit, and the flip time
        that the profile's firmware delay gave (the flip itself runs on the loop, at or after that time)."""
        t = now_ns()
        self._control().set_up(fp.index, up)
        self.fiber_up[fp] = up
        meta: dict[str, object] = {"peer": peer.port.source, "fiber": fp.fiber}
        if plan is not None:
            meta["lit_ns"], meta["planned_ns"] = plan
        self.emit(
            Event(
                t_ns=t,
                kind=Kind.LINK_FIRMWARE,
                source=fp.port.source,
                host=fp.port.host,
                value=1 if up else 0,
                meta=meta,
            )
        )
