"""Optical Rx power from a live transceiver's DOM, read through ethtool netlink, polled per port.

Reading: `NetlinkModuleEeprom` speaks generic netlink directly (family "ethtool", resolved once per
socket; ETHTOOL_MSG_MODULE_EEPROM_GET with page, bank, I2C address, ≤128 bytes within one half page).
Requests are pre-built per read and only their sequence number changes, so one sample is one
sendto/recv pair with no library in the hot path. Kernels or drivers without the netlink request fall
back to the legacy ETHTOOL_GMODULEEEPROM ioctl (`IoctlModuleEeprom`), which can address only the flat
layouts (SFF-8472 A0h/A2h, SFF-8636 pages 0–3), not CMIS banks or page 11h. `open_module_eeprom()` picks
one; on an interface without a module (e.g. a veth) it raises NoModuleEepromError, message exactly
"no module EEPROM on <IF>" (plus " (netns <NS>)" when a namespace was given).

Polling: `RxPowerProbe` (one per port) identifies the module once, then at `hz` reads only the Rx power
words its ModuleInfo names (QSFP28: lower page 0 bytes 34–41; SFP: A2h 104–105; CMIS: page 11h 186–201
per bank) and emits `rx_power` events per lane (source `nic:<host>/<ifname>`, value dBm or None for no
light, meta lane and mw) on change (deadband) and as a heartbeat (labctl.sampling.ReportGate).

Latched flags: SFF-8636 and CMIS LOS/LOL flags are latched and clear on read; a 1 kHz poller would
consume them before the NIC driver or any monitoring daemon sees them. The probe therefore never reads
them unless `consume_latched_flags=True`, in which case it reads them every sample (SFF-8636 byte 3,
CMIS page 11h byte 147 per bank) and adds `meta.los`. SFP's Rx_LOS (A2h 110) is a live bit, not latched.

Reads run on the event loop: they are synchronous kernel calls (the genetlink handler runs inside
sendto). That costs microseconds on drivers that answer from a cache and on the emulated module; on
firmware-mediated NICs (mlx5: several MCIA register reads per half page) each read can take
milliseconds, which both caps the useful rate and delays other probes on the loop. Measure with
bench/dom.py on the target NIC before raising `hz` there.
"""

from __future__ import annotations

import ctypes
import errno
import fcntl
import os
import socket
import struct
import threading
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass
from types import TracebackType
from typing import Self

from labctl.clock import now_ns
from labctl.errors import HardwareError, InputError
from labctl.events import Event
from labctl.linux import netns as netns_mod
from labctl.ocs import OpticalSwitch, TimeoutPolicy
from labctl.sampling import LightWindow, QueueProbe, ReportGate, power_moved, ticks
from labctl.transceiver import (
    A0H,
    A2H,
    DomDecodeError,
    DomReading,
    EepromRead,
    ModuleEeprom,
    ModuleInfo,
    ModuleKind,
    check_request,
    module_info,
    mw_to_dbm,
    read_dom,
)

# -- errors ----------------------------------------------------------------------------------------------


class ModuleEepromError(HardwareError):
    """Reading a module's EEPROM failed (driver error, I2C error, timeout)."""


class NoModuleEepromError(ModuleEepromError):
    """The interface has no module EEPROM to read (no cage, empty cage, virtual device)."""


class NoSuchInterfaceError(InputError):
    """The interface (or network namespace) named on input does not exist."""


def _where(ifname: str, netns: str | None) -> str:
    return f"{ifname} (netns {netns})" if netns else ifname


# -- network namespaces ----------------------------------------------------------------------------------


def sockets_in_netns(
    netns: str | None, factories: Sequence[Callable[[], socket.socket]]
) -> list[socket.socket]:
    """Create sockets inside a named network namespace. A socket stays in the namespace it was created in,
    so only a short-lived helper thread enters the namespace (setns is per thread); this process and
    its event loop stay where they are."""
    if netns is None:
        return [f() for f in factories]
    path = netns_mod.netns_path(netns)  # a bad name is one clear InputError, not a failed setns
    if not path.exists():
        raise NoSuchInterfaceError(f"network namespace {netns!r} does not exist ({path})")
    result: list[socket.socket] = []
    failure: list[BaseException] = []

    def enter_and_create() -> None:
        try:
            with netns_mod.entered(netns):
                result.extend(f() for f in factories)
        except BaseException as e:  # handed to the caller's thread
            failure.append(e)

    worker = threading.Thread(target=enter_and_create, name=f"netns:{netns}")
    worker.start()
    worker.join()
    if failure:
        raise failure[0]
    return result


# -- raw generic netlink ---------------------------------------------------------------------------------

NETLINK_GENERIC = 16
NETLINK_CAP_ACK = 10
NETLINK_EXT_ACK = 11
SOL_NETLINK = 270
NLM_F_REQUEST = 0x1
NLMSG_ERROR = 0x2
NLMSG_DONE = 0x3
NLM_F_ACK_TLVS = 0x200
NLA_F_NESTED = 0x8000
NLA_TYPE_MASK = 0x3FFF
NLMSGERR_ATTR_MSG = 1
GENL_ID_CTRL = 0x10
CTRL_CMD_GETFAMILY = 3
CTRL_ATTR_FAMILY_ID = 1
CTRL_ATTR_FAMILY_NAME = 2
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

_NLMSGHDR = struct.Struct("=IHHII")  # len, type, flags, seq, pid (host byte order)
_GENLHDR = struct.Struct("=BBH")  # cmd, version, reserved
_NLATTR = struct.Struct("=HH")  # len, type
_U32 = struct.Struct("=I")
_S32 = struct.Struct("=i")
_SEQ_AT = 8  # byte offset of nlmsg_seq in a message


def _attr(kind: int, payload: bytes) -> bytes:
    raw = _NLATTR.pack(_NLATTR.size + len(payload), kind) + payload
    return raw + b"\0" * (-len(raw) % 4)


def _attrs(data: bytes | bytearray | memoryview, start: int, end: int) -> dict[int, memoryview]:
    out: dict[int, memoryview] = {}
    view = memoryview(data)
    at = start
    while at + _NLATTR.size <= end:
        length, kind = _NLATTR.unpack_from(view, at)
        if length < _NLATTR.size:
            break
        out[kind & NLA_TYPE_MASK] = view[at + _NLATTR.size : at + length]
        at += (length + 3) & ~3
    return out


class NetlinkError(OSError):
    """An NLMSG_ERROR reply: errno plus the kernel's extended-ack message when it sent one."""

    def __init__(self, code: int, message: str | None) -> None:
        super().__init__(code, os.strerror(code) + (f": {message}" if message else ""))
        self.kernel_message = message


class GenericNetlink:
    """A blocking generic netlink socket that sends one request and reads its single reply."""

    def __init__(self, sock: socket.socket, timeouts: TimeoutPolicy) -> None:
        self.sock = sock
        sock.setsockopt(SOL_NETLINK, NETLINK_EXT_ACK, 1)
        sock.setsockopt(SOL_NETLINK, NETLINK_CAP_ACK, 1)  # errors don't echo our request back
        sock.settimeout(timeouts.operation_s)
        sock.bind((0, 0))
        self._seq = 0
        self._buf = bytearray(65536)

    @staticmethod
    def new_socket() -> socket.socket:
        return socket.socket(socket.AF_NETLINK, socket.SOCK_RAW | socket.SOCK_CLOEXEC, NETLINK_GENERIC)

    @staticmethod
    def message(family: int, cmd: int, version: int, attrs: bytes) -> bytearray:
        body = _GENLHDR.pack(cmd, version, 0) + attrs
        return bytearray(_NLMSGHDR.pack(_NLMSGHDR.size + len(body), family, NLM_F_REQUEST, 0, 0) + body)

    def request(self, msg: bytearray) -> memoryview:
        """Send `msg` (its seq is stamped here) and return the payload after the genl header of the reply."""
        self._seq = (self._seq + 1) & 0xFFFFFFFF
        _U32.pack_into(msg, _SEQ_AT, self._seq)
        self.sock.send(msg)
        while True:
            n = self.sock.recv_into(self._buf)
            at = 0
            while at + _NLMSGHDR.size <= n:
                length, kind, flags, seq, _pid = _NLMSGHDR.unpack_from(self._buf, at)
                if length < _NLMSGHDR.size:
                    break
                if seq == self._seq:
                    if kind == NLMSG_ERROR:
                        raise self._error(at, length, flags)
                    if kind != NLMSG_DONE:
                        start = at + _NLMSGHDR.size + _GENLHDR.size
                        return memoryview(self._buf)[start : at + length]
                at += (length + 3) & ~3  # a stale reply to a request that timed out: skip it

    def _error(self, at: int, length: int, flags: int) -> NetlinkError:
        code = -_S32.unpack_from(self._buf, at + _NLMSGHDR.size)[0]
        message = None
        if flags & NLM_F_ACK_TLVS:
            tlv_at = at + _NLMSGHDR.size + 4 + _NLMSGHDR.size  # error code + our header (CAP_ACK)
            msg = _attrs(self._buf, tlv_at, at + length).get(NLMSGERR_ATTR_MSG)
            if msg is not None:
                message = bytes(msg).split(b"\0", 1)[0].decode(errors="replace")
        return NetlinkError(code, message)

    def resolve_family(self, name: str) -> int:
        msg = self.message(
            GENL_ID_CTRL, CTRL_CMD_GETFAMILY, 1, _attr(CTRL_ATTR_FAMILY_NAME, name.encode() + b"\0")
        )
        payload = self.request(msg)
        family = _attrs(payload, 0, len(payload)).get(CTRL_ATTR_FAMILY_ID)
        if family is None:
            raise NetlinkError(errno.EPROTO, f"no family id in the reply for {name!r}")
        return int(struct.unpack_from("=H", family)[0])

    def close(self) -> None:
        self.sock.close()


class NetlinkModuleEeprom:
    """ETHTOOL_MSG_MODULE_EEPROM_GET for one interface; the `ModuleEeprom` read interface."""

    def __init__(self, ifname: str, netns: str | None = None, timeouts: TimeoutPolicy | None = None) -> None:
        self.ifname = ifname
        self.netns = netns
        (sock,) = sockets_in_netns(netns, [GenericNetlink.new_socket])
        self.nl = GenericNetlink(sock, timeouts or TimeoutPolicy(operation_s=1.0))
        try:
            self.family = self.nl.resolve_family(ETHTOOL_GENL_NAME)
        except BaseException:
            self.nl.close()
            raise
        self._header = _attr(
            ETHTOOL_A_MODULE_EEPROM_HEADER | NLA_F_NESTED,
            _attr(ETHTOOL_A_HEADER_DEV_NAME, ifname.encode() + b"\0"),
        )
        self._requests: dict[tuple[int, int, int, int, int], bytearray] = {}

    def _request(self, key: tuple[int, int, int, int, int]) -> bytearray:
        i2c, page, bank, offset, length = key
        check_request(i2c, page, bank, offset, length)
        attrs = b"".join(
            (
                self._header,
                _attr(ETHTOOL_A_MODULE_EEPROM_OFFSET, _U32.pack(offset)),
                _attr(ETHTOOL_A_MODULE_EEPROM_LENGTH, _U32.pack(length)),
                _attr(ETHTOOL_A_MODULE_EEPROM_PAGE, bytes([page])),
                _attr(ETHTOOL_A_MODULE_EEPROM_BANK, bytes([bank])),
                _attr(ETHTOOL_A_MODULE_EEPROM_I2C_ADDRESS, bytes([i2c])),
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
        data = _attrs(payload, 0, len(payload)).get(ETHTOOL_A_MODULE_EEPROM_DATA)
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


# -- legacy ioctl ----------------------------------------------------------------------------------------

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
    ifname: str, netns: str | None = None, timeouts: TimeoutPolicy | None = None
) -> NetlinkModuleEeprom | IoctlModuleEeprom:
    """Netlink when the kernel and driver answer it; the legacy ioctl otherwise; NoModuleEepromError when
    neither has a module to read."""
    where = _where(ifname, netns)
    nl: NetlinkModuleEeprom | None = None
    try:
        nl = NetlinkModuleEeprom(ifname, netns, timeouts)
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


# -- the poller ------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class LosPlan:
    """Where the per-lane LOS bits are: SFF-8472 live status, SFF-8636/CMIS latched (clear on read)."""

    reads: tuple[EepromRead, ...]

    @staticmethod
    def for_module(info: ModuleInfo) -> LosPlan:
        if info.module is ModuleKind.SFF8472:
            return LosPlan((EepromRead(A2H, 0, 0, 110, 1),))
        if info.module is ModuleKind.SFF8636:
            return LosPlan((EepromRead(A0H, 0, 0, 3, 1),))
        return LosPlan(tuple(EepromRead(A0H, 0x11, bank, 147, 1) for bank in info.banks))

    def decode(self, info: ModuleInfo, chunks: Sequence[bytes]) -> list[bool]:
        if info.module is ModuleKind.SFF8472:
            return [bool(chunks[0][0] & 0x02)]
        if info.module is ModuleKind.SFF8636:
            return [bool(chunks[0][0] >> i & 1) for i in range(4)]
        return [bool(c[0] >> i & 1) for c in chunks for i in range(8)]


class RxPowerProbe(QueueProbe):
    """Polls one port's module at `hz` and emits `rx_power` per lane on change and as a heartbeat."""

    name = "rx-power"
    counters = ("samples", "read_errors")

    def __init__(
        self,
        source: str,
        host: str,
        open_eeprom: Callable[[], ModuleEeprom],
        *,
        hz: float = 1000.0,
        deadband_db: float = 0.5,
        report_interval_ns: int = 100_000_000,
        consume_latched_flags: bool = False,
        max_error_streak_s: float = 1.0,
        queue_size: int = 65536,
    ) -> None:
        super().__init__(queue_size)
        self.name = f"rx-power:{source}"
        self.source = source
        self.host = host
        self.open_eeprom = open_eeprom
        self.period_ns = round(1e9 / hz)
        self.deadband_db = deadband_db
        self.gate = ReportGate(report_interval_ns)
        self.window = LightWindow(max(2 * self.period_ns, 1_000_000))
        self.consume_latched_flags = consume_latched_flags
        self.max_error_streak = max(1, round(max_error_streak_s * hz))
        self.mem: ModuleEeprom | None = None
        self.info: ModuleInfo | None = None
        self.samples = 0
        self.read_errors = 0

    @classmethod
    def for_interface(
        cls,
        host: str,
        ifname: str,
        *,
        netns: str | None = None,
        timeouts: TimeoutPolicy | None = None,
        hz: float = 1000.0,
        deadband_db: float = 0.5,
        report_interval_ns: int = 100_000_000,
        consume_latched_flags: bool = False,
    ) -> RxPowerProbe:
        """The probe of a live port: `nic:<host>/<ifname>`, read through netlink (or the ioctl)."""
        return cls(
            f"nic:{host}/{ifname}",
            host,
            lambda: open_module_eeprom(ifname, netns, timeouts),
            hz=hz,
            deadband_db=deadband_db,
            report_interval_ns=report_interval_ns,
            consume_latched_flags=consume_latched_flags,
        )

    async def __aenter__(self) -> Self:
        # Open and identify before the sampler starts, so a missing module fails `async with` itself.
        self.mem = self.open_eeprom()
        try:
            self.info = module_info(self.mem)
            if not self.info.rx_power_reads:
                raise DomDecodeError(
                    f"{self.source}: {self.info.identifier_name} module has no Rx power monitor"
                )
        except BaseException:
            self._close_mem()
            raise
        return await super().__aenter__()

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        try:
            await super().__aexit__(exc_type, exc, tb)
        finally:
            self._close_mem()

    def _close_mem(self) -> None:
        close = getattr(self.mem, "close", None)
        if close is not None:
            close()
        self.mem = None

    def open_window(self, sources: Collection[str] | None = None) -> None:
        """A reconfiguration moves this port's light: report densely until it is seen back (LightWindow)."""
        if sources is None or self.source in sources:
            lanes = self.info.lanes if self.info is not None else (1,)
            self.window.open((f"{self.source}#{lane}" for lane in lanes), now_ns())

    def close_window(self) -> None:
        self.window.close()

    async def _run(self) -> None:
        mem, info = self.mem, self.info
        assert mem is not None and info is not None
        reads = [(r.i2c_address, r.page, r.bank, r.offset, r.length) for r in info.rx_power_reads]
        los_plan = LosPlan.for_module(info) if self.consume_latched_flags else None
        los_reads = (
            [(r.i2c_address, r.page, r.bank, r.offset, r.length) for r in los_plan.reads] if los_plan else []
        )
        keys = [f"{self.source}#{lane}" for lane in info.lanes]
        reported = [False] * len(keys)
        last: list[float | None] = [None] * len(keys)
        streak = 0
        async for _tick in ticks(self.period_ns):
            try:
                chunks = [mem.read(*r) for r in reads]
                t = now_ns()  # observed: the words existed by the time the read returned
                los = los_plan.decode(info, [mem.read(*r) for r in los_reads]) if los_plan else None
                mws = info.decode_rx_power_mw(chunks)
            except (ModuleEepromError, DomDecodeError) as e:
                self.read_errors += 1
                streak += 1
                if streak >= self.max_error_streak:
                    raise ModuleEepromError(
                        f"{self.source}: {streak} consecutive failed reads, last: {e}"
                    ) from e
                continue
            streak = 0
            self.samples += 1
            for i, mw in enumerate(mws):
                dbm = mw_to_dbm(mw)
                changed = not reported[i] or power_moved(last[i], dbm, self.deadband_db)
                interval = self.window.interval(keys[i], dbm is not None, t)
                if not self.gate.due(keys[i], changed, t, interval):
                    continue
                reported[i] = True
                last[i] = dbm
                meta: dict[str, object] = {"lane": info.lanes[i], "mw": round(mw, 6)}
                if los is not None:
                    meta["los"] = los[i]
                if self.read_errors:
                    meta["read_errors"] = self.read_errors
                self.queue.put(
                    Event(
                        t_ns=t,
                        kind="rx_power",
                        source=self.source,
                        host=self.host,
                        value=None if dbm is None else round(dbm, 3),
                        meta=meta,
                    )
                )


class SwitchPowerProbe(QueueProbe):
    """The OCS's own per-port power monitor as a second Rx power source.

    Polls `OpticalSwitch.port_power(ports)` at `hz`; the driver call itself writes one `rx_power` event per
    port with source `ocs:<switch>/<port>` (every driver call feeds the event stream), so this probe only
    paces the calls. A failed read is recorded as an `ocs.error` event and polling goes on: the switch's
    monitor is a second opinion, never a reason to stop a run.
    """

    counters = ("reads", "errors")

    def __init__(self, switch: OpticalSwitch, ports: Sequence[int], hz: float) -> None:
        super().__init__(queue_size=16)
        self.switch = switch
        self.ports = sorted(set(ports))
        self.period_ns = round(1e9 / hz)
        self.name = f"switch-power:{switch.name}"
        self.reads = 0
        self.errors = 0

    async def _run(self) -> None:
        async for _ in ticks(self.period_ns):
            try:
                await self.switch.port_power(self.ports)
                self.reads += 1
            except HardwareError as e:
                self.errors += 1
                self.queue.put(
                    Event(
                        t_ns=now_ns(),
                        kind="ocs.error",
                        source=f"ocs:{self.switch.name}",
                        value=str(e),
                        meta={"operation": "port_power", "errors": self.errors},
                    )
                )
