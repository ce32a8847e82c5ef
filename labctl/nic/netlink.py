"""`NetlinkLinkControl`: the LinkControl of a real host's own ports, through ethtool generic netlink.

A real lab's agent runs it on its host (PortRef.host is the inventory's name for that host and is used only
in messages; the port is PortRef.ifname in this process's network namespace, or `netns` when given).
support() reads LINKMODES (supported modes, autoneg), FEC and PRIVFLAGS; read() returns every setting the
port holds; apply() sends LINKMODES_SET, FEC_SET and PRIVFLAGS_SET for the fields set (nothing else), reads
the port back and raises LinkSettingMismatch on any difference. A request the kernel or the driver refuses
raises LinkSettingUnsupported: one line with host, port, setting and the kernel's extack message.

Every call opens its own socket in a worker thread (asyncio.to_thread) and closes it before returning: a
driver may hold the call for a long time (a link-mode change can retrain the link under the RTNL lock), and
settings are read and changed a few times per sweep point, so a socket per call costs nothing that matters.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
from collections.abc import Callable, Mapping
from dataclasses import replace
from typing import TypeVar, cast

from labctl.core.errors import HardwareError, InputError
from labctl.linux import ethtool_msgs as m
from labctl.linux.ethtool_link import EthtoolLink
from labctl.linux.netlink import NetlinkError
from labctl.nic.settings import (
    FEC_MODES,
    Duplex,
    FecMode,
    LinkSettingMismatch,
    LinkSettings,
    LinkSettingUnsupported,
    LinkSupport,
    PortRef,
)

T = TypeVar("T")
REFUSALS = frozenset({errno.EOPNOTSUPP, errno.EINVAL, errno.ERANGE, errno.ENOENT, errno.EPERM})
"""Errors that mean the port (or this process) does not take the setting, as opposed to a failure."""


def _one_line(text: str) -> str:
    return " ".join(text.split())


def _why(e: NetlinkError) -> str:
    """`Operation not supported` or `Invalid argument (kernel: requested speed not supported)`."""
    base = _one_line(e.strerror or str(e))
    message = e.kernel_message
    if message and base.endswith(f": {_one_line(message)}"):
        base = base[: -len(message) - 2]
    return f"{base} (kernel: {_one_line(message)})" if message else base


def management_ports(netns: str | None = None, towards: str | None = None) -> dict[str, str]:
    """The interfaces that carry this host's management path, each with why: the main table's default
    routes, and the route to `towards` (the broker's host name or address: the agent's own connection),
    read from the kernel's routing table (rtnetlink) in `netns`. Blocking: call it from a worker thread."""
    import ipaddress
    import socket

    from labctl.linux.netns import entered
    from labctl.linux.rtnl import Rtnl

    out: dict[str, str] = {}
    with entered(netns):
        rtnl = Rtnl.here()
        try:
            for index in sorted(rtnl.default_route_ifindexes()):
                with contextlib.suppress(OSError):
                    out.setdefault(socket.if_indextoname(index), "the default route")
            if towards:
                try:
                    address = str(ipaddress.ip_address(towards))
                except ValueError:
                    try:
                        address = str(socket.getaddrinfo(towards, None)[0][4][0])
                    except OSError:
                        address = ""
                via = rtnl.route_ifindex(address) if address else None
                if via is not None and not ipaddress.ip_address(address).is_loopback:
                    with contextlib.suppress(OSError):
                        out.setdefault(socket.if_indextoname(via), f"the route to the broker {towards}")
        finally:
            rtnl.close()
    return out


class NetlinkLinkControl:
    """LinkControl over ethtool netlink for the ports of the host it runs on."""

    def __init__(
        self,
        netns: str | None = None,
        timeout_s: float = 5.0,
        *,
        open_link: Callable[[], EthtoolLink] | None = None,
        management: Callable[[], Mapping[str, str]] | None = None,
    ) -> None:
        """`open_link`: opens the driver for one call (tests give one over a scripted kernel); by default
        an EthtoolLink in `netns` (None: this process's namespace). `management`: the interfaces carrying
        this host's management path, ifname → why (blocking; `management_ports` by default, read again at
        every call): their settings are never changed, support() says so in its note and apply() refuses."""
        self.netns = netns
        self.timeout_s = timeout_s
        self.open_link = open_link or (lambda: EthtoolLink(self.netns, self.timeout_s))
        self.management = management or (lambda: management_ports(self.netns))

    async def _guarded(self, port: PortRef) -> str | None:
        """Why this port's settings must not change (it carries the management path); None: they may."""
        why = (await asyncio.to_thread(self.management)).get(port.ifname)
        if why is None:
            return None
        return (
            f"{port.ifname} carries {why}: labctl never changes its link settings (the host would be cut off)"
        )

    async def _run(self, port: PortRef, work: Callable[[EthtoolLink], T]) -> T:
        def call() -> T:
            with self.open_link() as link:
                return work(link)

        try:
            return await asyncio.to_thread(call)
        except NetlinkError as e:
            if e.errno == errno.ENODEV:
                where = f" (netns {self.netns})" if self.netns else ""
                raise InputError(f"{port.label}: no such interface{where}") from None
            raise HardwareError(f"{port.label}: ethtool netlink: {_why(e)}") from None
        except (TimeoutError, m.EthtoolCodecError) as e:
            raise HardwareError(
                f"{port.label}: ethtool netlink: {_one_line(str(e)) or 'timed out'}"
            ) from None

    # -- support ---------------------------------------------------------------------------------------

    async def support(self, port: PortRef) -> LinkSupport:
        support = await self._run(port, lambda link: self._support(link, port))
        guarded = await self._guarded(port)
        return support if guarded is None else replace(support, note=guarded)

    def _support(self, link: EthtoolLink, port: PortRef) -> LinkSupport:
        modes = _optional(lambda: link.linkmodes(port.ifname))
        ours = modes.ours if modes is not None else None
        supported = ours.mask if ours is not None and ours.mask is not None else frozenset()
        link_modes = tuple(n for n in _named(ours, supported, link, port.ifname) if m.is_link_mode(n))
        autoneg = m.ETHTOOL_LINK_MODE_AUTONEG_BIT in supported
        fec_modes: tuple[FecMode, ...] = ()
        if _optional(lambda: link.fec(port.ifname)) is not None:
            held = {name for name, bit in m.FEC_BITS.items() if bit in supported}
            fec_modes = tuple(f for f in FEC_MODES if f in held or f == "auto")
        flags = _optional(lambda: link.privflags(port.ifname))
        priv_flags = tuple(name for name, _ in flags.flags) if flags is not None else ()
        note = None
        if not (link_modes or autoneg or fec_modes or priv_flags):
            driver = link.driver(port.ifname) or port.ifname
            note = f"{driver} has no link modes, FEC or private flags to set"
        return LinkSupport(autoneg, link_modes, fec_modes, priv_flags, note)

    # -- read ------------------------------------------------------------------------------------------

    async def read(self, port: PortRef) -> LinkSettings:
        return await self._run(port, lambda link: _read(link, port.ifname))

    # -- apply -----------------------------------------------------------------------------------------

    async def apply(self, port: PortRef, settings: LinkSettings) -> LinkSettings:
        guarded = await self._guarded(port)
        if guarded is not None:
            raise LinkSettingUnsupported(port, settings, guarded)
        asked, actual = await self._run(port, lambda link: self._apply(link, port, settings))
        differences = asked.differences(actual)
        if differences:
            raise LinkSettingMismatch(port, differences)
        return actual

    def _apply(
        self, link: EthtoolLink, port: PortRef, settings: LinkSettings
    ) -> tuple[LinkSettings, LinkSettings]:
        ifname = port.ifname
        asked = settings
        try:
            if (settings.autoneg, settings.speed_mbps, settings.duplex, settings.link_modes) != (None,) * 4:
                ours = None
                if settings.link_modes is not None:
                    ours, ordered = _advertise(link, ifname, settings.link_modes)
                    asked = replace(asked, link_modes=ordered)
                link.set_linkmodes(
                    ifname,
                    autoneg=settings.autoneg,
                    speed_mbps=settings.speed_mbps,
                    duplex=settings.duplex,
                    ours=ours,
                )
            if settings.fec is not None:
                link.set_fec(ifname, settings.fec)
            if settings.priv_flags:
                link.set_privflags(ifname, list(settings.priv_flags))
        except NetlinkError as e:
            if e.errno in REFUSALS:
                raise LinkSettingUnsupported(port, settings, _why(e)) from None
            raise
        return asked, _read(link, ifname)


def _optional(get: Callable[[], T]) -> T | None:
    """`get()`, or None where the driver has no such operation (EOPNOTSUPP)."""
    try:
        return get()
    except NetlinkError as e:
        if e.errno == errno.EOPNOTSUPP:
            return None
        raise


def _named(bits: m.Bitset | None, which: frozenset[int], link: EthtoolLink, ifname: str) -> list[str]:
    """Names of `which`: the verbose reply's own, else the kernel's link-mode string set (fetched then)."""
    if bits is None or not which:
        return []
    names = {} if all(i in bits.names for i in which) else link.link_mode_names(ifname)
    return bits.named(which, names)


def _read(link: EthtoolLink, ifname: str) -> LinkSettings:
    """Every setting; a device without link settings at all (EOPNOTSUPP: loopback) reads as None for
    autoneg, speed and duplex and no link modes."""
    modes = _optional(lambda: link.linkmodes(ifname)) or m.LinkModes(None, None, None, None, None)
    advertised = modes.ours.value if modes.ours is not None else frozenset()
    link_modes = tuple(n for n in _named(modes.ours, advertised, link, ifname) if m.is_link_mode(n))
    fec = _optional(lambda: link.fec(ifname))
    fec_name = None
    if fec is not None:
        fec_name = m.fec_name(fec.modes.value if fec.modes is not None else frozenset(), fec.auto)
    flags = _optional(lambda: link.privflags(ifname))
    return LinkSettings(
        autoneg=modes.autoneg,
        speed_mbps=modes.speed_mbps,
        duplex=cast(Duplex | None, modes.duplex),
        link_modes=link_modes,
        fec=cast(FecMode | None, fec_name),
        priv_flags=flags.flags if flags is not None else (),
    )


def _advertise(
    link: EthtoolLink, ifname: str, wanted: tuple[str, ...]
) -> tuple[list[tuple[int | str, bool]], tuple[str, ...]]:
    """The OURS bits that make `wanted` the advertised link modes (every link mode the kernel names, set or
    cleared; the pause, autoneg and FEC bits left alone), and `wanted` in the kernel's bit order (the order
    a read returns them in). A name the kernel does not know goes as a name, and the kernel refuses it."""
    names = link.link_mode_names(ifname)
    index = {name: i for i, name in names.items()}
    bits: list[tuple[int | str, bool]] = [
        (i, name in wanted) for i, name in sorted(names.items()) if m.is_link_mode(name)
    ]
    bits += [(name, True) for name in wanted if name not in index]
    ordered = tuple(sorted(wanted, key=lambda n: (index.get(n, len(index)), n)))
    return bits, ordered
