"""A port's link settings through ethtool generic netlink: the blocking driver over one socket.

Transport labctl.linux.genl (one request, one reply or ACK), codec labctl.linux.ethtool_msgs, this module
the requests a caller makes: read LINKINFO, LINKMODES, FEC and PRIVFLAGS of a device, and send the SETs.
Replies come in compact bitsets (smaller, cheaper to parse) unless `compact=False`; the names of compact
bits come from the kernel's string sets: ETH_SS_LINK_MODES, global, fetched once per socket, and the
device's ETH_SS_PRIV_FLAGS, fetched with each PRIVFLAGS read. A refusal raises NetlinkError with the
kernel's extack message (`kernel_message`), as labctl.linux.genl parses it.
"""

from __future__ import annotations

import ctypes
import fcntl
import socket
import struct
from dataclasses import dataclass

from labctl.linux import ethtool_msgs as m
from labctl.linux.genl import GenericNetlink
from labctl.linux.netns import sockets_in_netns
from labctl.linux.readonly import check_write


@dataclass(frozen=True, slots=True)
class PrivFlags:
    """A device's private flags: (name, on) in the driver's order."""

    flags: tuple[tuple[str, bool], ...]


class EthtoolLink:
    """ethtool netlink for the link settings of devices in one network namespace (None: this one)."""

    def __init__(
        self,
        netns: str | None = None,
        timeout_s: float = 2.0,
        *,
        compact: bool = True,
        nl: GenericNetlink | None = None,
    ) -> None:
        """`nl`: a transport already open (tests give one on a scripted socket); else a socket in `netns`."""
        self.netns = netns
        self.compact = compact
        if nl is None:
            (sock,) = sockets_in_netns(netns, [GenericNetlink.new_socket])
            nl = GenericNetlink(sock, timeout_s)
        self.nl = nl
        try:
            self.family = self.nl.resolve_family(m.ETHTOOL_GENL_NAME)
        except BaseException:
            self.nl.close()
            raise
        self._link_mode_names: dict[int, str] | None = None

    def __enter__(self) -> EthtoolLink:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        self.nl.close()

    def driver(self, ifname: str) -> str | None:
        """The device's driver name (the legacy ETHTOOL_GDRVINFO ioctl: netlink has no request for it)."""
        return driver_name(ifname, self.netns)

    # -- GET ---------------------------------------------------------------------------------------------

    def _get(self, cmd: int, ifname: str) -> memoryview:
        return self.nl.request(m.get_request(self.family, cmd, ifname, compact=self.compact))

    def strings(self, ifname: str, set_id: int) -> dict[int, str]:
        return m.decode_strset(self.nl.request(m.strset_request(self.family, ifname, set_id)), set_id)

    def link_mode_names(self, ifname: str) -> dict[int, str]:
        """ETH_SS_LINK_MODES (the same for every device), fetched once."""
        if self._link_mode_names is None:
            self._link_mode_names = self.strings(ifname, m.ETH_SS_LINK_MODES)
        return self._link_mode_names

    def linkinfo(self, ifname: str) -> m.LinkInfo:
        return m.decode_linkinfo(self._get(m.ETHTOOL_MSG_LINKINFO_GET, ifname))

    def linkmodes(self, ifname: str) -> m.LinkModes:
        return m.decode_linkmodes(self._get(m.ETHTOOL_MSG_LINKMODES_GET, ifname))

    def fec(self, ifname: str) -> m.FecState:
        return m.decode_fec(self._get(m.ETHTOOL_MSG_FEC_GET, ifname))

    def privflags(self, ifname: str) -> PrivFlags:
        bits = m.decode_privflags(self._get(m.ETHTOOL_MSG_PRIVFLAGS_GET, ifname))
        every = bits.mask if bits.mask is not None else bits.value
        names = bits.names if len(bits.names) >= len(every) else self.strings(ifname, m.ETH_SS_PRIV_FLAGS)
        return PrivFlags(
            tuple((bits.names.get(i) or names.get(i) or f"bit{i}", i in bits.value) for i in sorted(every))
        )

    # -- SET (each answered by an ACK, or refused with NetlinkError; WritesForbidden under read-only) ----

    def set_linkmodes(
        self,
        ifname: str,
        *,
        autoneg: bool | None = None,
        speed_mbps: int | None = None,
        duplex: str | None = None,
        ours: list[tuple[int | str, bool]] | None = None,
    ) -> None:
        check_write(f"set the link modes of {ifname} (LINKMODES_SET)")
        msg = m.linkmodes_set_request(
            self.family, ifname, autoneg=autoneg, speed_mbps=speed_mbps, duplex=duplex, ours=ours
        )
        self.nl.request(msg)

    def set_fec(self, ifname: str, fec: str) -> None:
        check_write(f"set the FEC of {ifname} (FEC_SET)")
        self.nl.request(m.fec_set_request(self.family, ifname, fec))

    def set_privflags(self, ifname: str, flags: list[tuple[str, bool]]) -> None:
        check_write(f"set the private flags of {ifname} (PRIVFLAGS_SET)")
        self.nl.request(m.privflags_set_request(self.family, ifname, flags))


SIOCETHTOOL = 0x8946
ETHTOOL_GDRVINFO = 0x03
IFNAMSIZ = 16
_DRVINFO = struct.Struct("=I32s32s32s32s32s12x5I")  # cmd, driver, version, fw, bus, erom, reserved2, counts


def driver_name(ifname: str, netns: str | None = None) -> str | None:
    """The device's driver (ETHTOOL_GDRVINFO: `veth`, `mlx5_core`), None when it does not say."""
    (sock,) = sockets_in_netns(
        netns, [lambda: socket.socket(socket.AF_INET, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC)]
    )
    try:
        buf = ctypes.create_string_buffer(
            _DRVINFO.pack(ETHTOOL_GDRVINFO, b"", b"", b"", b"", b"", 0, 0, 0, 0, 0)
        )
        ifreq = struct.pack(f"@{IFNAMSIZ}sP", ifname.encode()[:IFNAMSIZ], ctypes.addressof(buf)).ljust(
            40, b"\0"
        )
        try:
            fcntl.ioctl(sock.fileno(), SIOCETHTOOL, ifreq)
        except OSError:
            return None
        name = _DRVINFO.unpack_from(buf.raw)[1].split(b"\0", 1)[0].decode(errors="replace")
        return name or None
    finally:
        sock.close()
