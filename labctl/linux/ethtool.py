"""A live transceiver's EEPROM, read through ethtool: generic netlink first, the legacy ioctl as fallback.

`NetlinkModuleEeprom` speaks generic netlink directly (family "ethtool", resolved once per socket;
ETHTOOL_MSG_MODULE_EEPROM_GET with page, bank, I2C address, ≤128 bytes within one half page). Requests are
pre-built per read and only their sequence number changes, so one read is one sendto/recv pair. Kernels or
drivers without the netlink request fall back to the legacy ETHTOOL_GMODULEEEPROM ioctl
(`IoctlModuleEeprom`), which can address only the flat layouts (SFF-8472 A0h/A2h, SFF-8636 pages 0–3),
not CMIS banks or page 11h. `open_module_eeprom()` picks one; on an interface without a module (e.g. a
veth) it raises NoModuleEepromError, message exactly "no module EEPROM on <IF>" (plus " (netns <NS>)" when
a namespace was given). Both satisfy `labctl.linux.transceiver.ModuleEeprom`; decoding is
labctl.linux.transceiver's.
"""

from __future__ import annotations

import ctypes
import errno
import fcntl
import socket
import struct

from labctl.core.errors import HardwareError, InputError
from labctl.linux.genl import GenericNetlink
from labctl.linux.netlink import NLA_F_NESTED, NetlinkError, attr, cstr, parse_attrs, u32
from labctl.linux.netns import sockets_in_netns
from labctl.linux.transceiver import A0H, A2H, DomReading, check_request, read_dom

ETHTOOL_GENL_NAME = "ethtool"
ETHTOOL_GENL_VERSION = 1
ETHTOOL_MSG_MODULE_EEPROM_GET = 31
ETHTOOL_A_HEADER_DEV_NAME = 2
ETHTOOL_A_MODULE_EEPROM_HEADER = 1
ETHTOOL_A_MODULE_EEPROM_OFFSET = 2
ETHTOOL_A_MODULE_EEPROM_LENGTH = 3
ETHTOOL_A_MODULE_EEPROM_PAGE = 4
ETHTOOL_A_MODULE_EEPROM_BANK = 5
ETHTOOL_A_MODULE_EEPROM_I2C_ADDRESS = 6
ETHTOOL_A_MODULE_EEPROM_DATA = 7


# -- errors ------------------------------------------------------------------------------------------------


class ModuleEepromError(HardwareError):
    """Reading a module's EEPROM failed (driver error, I2C error, timeout)."""


class NoModuleEepromError(ModuleEepromError):
    """The interface has no module EEPROM to read (no cage, empty cage, virtual device)."""


class NoSuchInterfaceError(InputError):
    """The interface (or network namespace) named on input does not exist."""


def _where(ifname: str, netns: str | None) -> str:
    return f"{ifname} (netns {netns})" if netns else ifname


# -- generic netlink -----------------------------------------------------------------------------------


class NetlinkModuleEeprom:
    """ETHTOOL_MSG_MODULE_EEPROM_GET for one interface; the `ModuleEeprom` read interface."""

    def __init__(self, ifname: str, netns: str | None = None, timeout_s: float = 1.0) -> None:
        self.ifname = ifname
        self.netns = netns
        (sock,) = sockets_in_netns(netns, [GenericNetlink.new_socket])
        self.nl = GenericNetlink(sock, timeout_s)
        try:
            self.family = self.nl.resolve_family(ETHTOOL_GENL_NAME)
        except BaseException:
            self.nl.close()
            raise
        self._header = attr(
            ETHTOOL_A_MODULE_EEPROM_HEADER | NLA_F_NESTED,
            attr(ETHTOOL_A_HEADER_DEV_NAME, cstr(ifname)),
        )
        self._requests: dict[tuple[int, int, int, int, int], bytearray] = {}

    def _request(self, key: tuple[int, int, int, int, int]) -> bytearray:
        i2c, page, bank, offset, length = key
        check_request(i2c, page, bank, offset, length)
        attrs = b"".join(
            (
                self._header,
                attr(ETHTOOL_A_MODULE_EEPROM_OFFSET, u32(offset)),
                attr(ETHTOOL_A_MODULE_EEPROM_LENGTH, u32(length)),
                attr(ETHTOOL_A_MODULE_EEPROM_PAGE, bytes([page])),
                attr(ETHTOOL_A_MODULE_EEPROM_BANK, bytes([bank])),
                attr(ETHTOOL_A_MODULE_EEPROM_I2C_ADDRESS, bytes([i2c])),
            )
        )
        msg = GenericNetlink.message(self.family, ETHTOOL_MSG_MODULE_EEPROM_GET, ETHTOOL_GENL_VERSION, attrs)
        self._requests[key] = msg
        return msg

    def read_raw(self, i2c_address: int, page: int, bank: int, offset: int, length: int) -> bytes:
        """One request; raises NetlinkError as the kernel answered it (bench/dom.py times this)."""
        key = (i2c_address, page, bank, offset, length)
        msg = self._requests.get(key) or self._request(key)
        payload = self.nl.request(msg)
        data = parse_attrs(payload, 0, len(payload)).get(ETHTOOL_A_MODULE_EEPROM_DATA)
        if data is None:
            raise NetlinkError(errno.EPROTO, "reply without ETHTOOL_A_MODULE_EEPROM_DATA")
        return bytes(data)

    def read(self, i2c_address: int, page: int, bank: int, offset: int, length: int) -> bytes:
        try:
            return self.read_raw(i2c_address, page, bank, offset, length)
        except NetlinkError as e:
            raise _read_error(e, self.ifname, self.netns, i2c_address, page, bank, offset, length) from None
        except TimeoutError:
            raise ModuleEepromError(
                f"{_where(self.ifname, self.netns)}: module EEPROM read timed out "
                f"(I2C {i2c_address:#x} page {page:#x} bank {bank} offset {offset} length {length})"
            ) from None

    def close(self) -> None:
        self.nl.close()


def _read_error(
    e: OSError, ifname: str, netns: str | None, i2c: int, page: int, bank: int, offset: int, length: int
) -> ModuleEepromError | NoSuchInterfaceError:
    where = _where(ifname, netns)
    if e.errno == errno.EOPNOTSUPP:
        return NoModuleEepromError(f"no module EEPROM on {where}")
    if e.errno == errno.ENODEV:
        return NoSuchInterfaceError(f"no interface {where}")
    return ModuleEepromError(
        f"{where}: module EEPROM read failed (I2C {i2c:#x} page {page:#x} bank {bank} offset {offset} "
        f"length {length}): {e.strerror}"
    )


# -- legacy ioctl -----------------------------------------------------------------------------------------

SIOCETHTOOL = 0x8946
ETHTOOL_GMODULEINFO = 0x42
ETHTOOL_GMODULEEEPROM = 0x43
ETH_MODULE_SFF_8079 = 1
ETH_MODULE_SFF_8472 = 2
ETH_MODULE_SFF_8636 = 3
ETH_MODULE_SFF_8436 = 4
IFNAMSIZ = 16


class IoctlModuleEeprom:
    """ETHTOOL_GMODULEINFO/GMODULEEEPROM: one flat blob, mapped onto (I2C address, page) where it can be."""

    def __init__(self, ifname: str, netns: str | None = None) -> None:
        self.ifname = ifname
        self.netns = netns
        (self.sock,) = sockets_in_netns(
            netns, [lambda: socket.socket(socket.AF_INET, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC)]
        )
        try:
            info = ctypes.create_string_buffer(struct.pack("=3I32x", ETHTOOL_GMODULEINFO, 0, 0))
            self._ioctl(info)
            _, self.type, self.eeprom_len = struct.unpack_from("=3I", info.raw)
        except BaseException:
            self.sock.close()
            raise

    def _ioctl(self, buf: ctypes.Array[ctypes.c_char]) -> None:
        ifreq = struct.pack(f"@{IFNAMSIZ}sP", self.ifname.encode(), ctypes.addressof(buf)).ljust(40, b"\0")
        fcntl.ioctl(self.sock.fileno(), SIOCETHTOOL, ifreq)

    def flat_offset(self, i2c_address: int, page: int, bank: int, offset: int) -> int:
        if self.type in (ETH_MODULE_SFF_8079, ETH_MODULE_SFF_8472):
            if page == 0 and bank == 0 and i2c_address == A0H:
                return offset
            if page == 0 and bank == 0 and i2c_address == A2H and self.type == ETH_MODULE_SFF_8472:
                return 256 + offset
        elif self.type in (ETH_MODULE_SFF_8636, ETH_MODULE_SFF_8436) and i2c_address == A0H and bank == 0:
            return offset if page == 0 else page * 128 + offset
        raise ModuleEepromError(
            f"{_where(self.ifname, self.netns)}: I2C {i2c_address:#x} page {page:#x} bank {bank} is not "
            f"reachable through the legacy ethtool ioctl (module type {self.type})"
        )

    def read(self, i2c_address: int, page: int, bank: int, offset: int, length: int) -> bytes:
        check_request(i2c_address, page, bank, offset, length)
        start = self.flat_offset(i2c_address, page, bank, offset)
        if start + length > self.eeprom_len:
            raise ModuleEepromError(
                f"{_where(self.ifname, self.netns)}: flat offset {start}+{length} beyond the module's "
                f"{self.eeprom_len} bytes"
            )
        buf = ctypes.create_string_buffer(
            struct.pack("=4I", ETHTOOL_GMODULEEEPROM, 0, start, length) + bytes(length)
        )
        try:
            self._ioctl(buf)
        except OSError as e:
            raise _read_error(e, self.ifname, self.netns, i2c_address, page, bank, offset, length) from None
        return buf.raw[16 : 16 + length]

    def close(self) -> None:
        self.sock.close()


# -- choosing a reader -----------------------------------------------------------------------------------


def open_module_eeprom(
    ifname: str, netns: str | None = None, timeout_s: float = 1.0
) -> NetlinkModuleEeprom | IoctlModuleEeprom:
    """Netlink when the kernel and driver answer it; the legacy ioctl otherwise; NoModuleEepromError when
    neither has a module to read."""
    where = _where(ifname, netns)
    nl: NetlinkModuleEeprom | None = None
    try:
        nl = NetlinkModuleEeprom(ifname, netns, timeout_s)
        nl.read_raw(A0H, 0, 0, 0, 1)
        return nl
    except NetlinkError as e:
        if nl is not None:
            nl.close()
        # ENOENT: no "ethtool" genl family (kernel < 5.6); EOPNOTSUPP: no MODULE_EEPROM_GET (< 5.13) or
        # no module EEPROM op on the device. The ioctl tells these apart from a real read failure.
        if e.errno not in (errno.ENOENT, errno.EOPNOTSUPP):
            raise _read_error(e, ifname, netns, A0H, 0, 0, 0, 1) from None
    except BaseException:
        if nl is not None:
            nl.close()
        raise
    try:
        return IoctlModuleEeprom(ifname, netns)
    except OSError as e:
        if e.errno in (errno.EOPNOTSUPP, errno.EINVAL):
            raise NoModuleEepromError(f"no module EEPROM on {where}") from None
        raise _read_error(e, ifname, netns, A0H, 0, 0, 0, 1) from None


def read_module(ifname: str, netns: str | None = None, *, latched: bool = False) -> DomReading:
    """Decode every monitor of a live module once (`labctl dom read`)."""
    mem = open_module_eeprom(ifname, netns)
    try:
        return read_dom(mem, latched=latched)
    finally:
        mem.close()
