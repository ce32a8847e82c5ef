"""A Keysight N77xx multiport optical power meter over SCPI (TCP, newline framing), reading the light of the
lab's switch models: the emulator the power-meter probe talks to over real TCP (decision 0034).

The command set is the part of the N77xx's that labctl uses (reference §3.2), with its SCPI grammar:
short or long mnemonics in any case (`FETC1:CHAN1:POW?` = `fetch1:channel1:power?`), an optional leading
colon, numeric suffixes (slot, channel), compound messages (`FETC1:POW?;:FETC2:POW?` answers `v1;v2`),
units on numbers (`1310NM`, `0.5MS`), and an error queue read by `SYST:ERR?` (`+0,"No error"` when empty;
a query in error answers nothing, as a real instrument does, so the client times out and asks why).

    *IDN? *RST *CLS *OPC? *OPC *WAI *ESR? *STB?           SYSTem:ERRor[:NEXT]?
    SENSe<n>:POWer:WAVelength <x>[NM|UM|M] / ?  (meters)   SENSe<n>:POWer:UNIT 0|1|DBM|W / ?
    SENSe<n>:POWer:ATIMe <x>[S|MS|US] / ?  (seconds)       SENSe<n>:POWer:RANGe:AUTO 0|1 / ?
    SENSe<n>:CORRection <x>[DB] / ?                         INITiate<n>[:CHANnel1]:CONTinuous 0|1 / ?
    INITiate<n>[:CHANnel1][:IMMediate]                      FETCh<n>[:CHANnel1][:SCALar]:POWer[:DC]?
    READ<n>[:CHANnel1][:SCALar]:POWer[:DC]?

Averaging is modeled: a slot measuring continuously integrates back-to-back windows of its averaging time
(no gap between them), and `FETC` returns the mean power over the last window completed before the query
arrived; `READ` starts a window and answers when it ends; `INIT:IMM` starts one whose result a later
`FETC` returns. So a reading is the mean over one averaging time and lags the light by up to two of them.
The light is each channel's tapped switch egress port as the switch model lights it (`SwitchLight`: the
launch power of the NIC whose transmit fiber the port's patch connects, less the switch's insertion loss),
a step at the model's light-change time; on top comes the detector's noise floor (about -90 dBm, so a dark
port reads near it, never -inf) and a little reading noise. The wavelength is stored, not modeled.
"""

from __future__ import annotations

import asyncio
import bisect
import contextlib
import math
import os
import random
import re
import socket
import struct
import zlib
from collections import deque
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol

from labctl.core.clock import now_ns
from labctl.core.version import __version__
from labctl.inventory.schema import MeterChannel, NicPort
from labctl.models.switch import INSERTION_LOSS_DB, SwitchModel

if TYPE_CHECKING:
    from labctl.emulators.fabric import FabricLayout

DEFAULT_PORT = 5025  # SCPI over raw TCP (reference §3.1, §3.2)
NOISE_FLOOR_MW = 1e-9  # -90 dBm: what a dark port reads, give or take
READING_NOISE_DB = 0.01  # peak-to-peak spread of a lit reading
ATIM_MIN_NS, ATIM_MAX_NS = 1_000, 10_000_000_000  # 1 us .. 10 s (reference §3.2)
WAVELENGTH_NM = (1250.0, 1625.0)
HISTORY_NS = 30_000_000_000  # light history kept per port: longer than any averaging window
MAX_LINE = 64 * 1024  # bytes of unterminated input a session may buffer before it is hung up
ERROR_QUEUE = 30
NOT_A_NUMBER = 9.91e37  # SCPI's NaN: a slot with no measurement yet
RTMGRP_TC = 0x8  # 1 << (RTNLGRP_TC - 1): tc qdisc, class and filter changes
RTM_GETTFILTER = 46


class LightTap(Protocol):
    """The optical power on one fiber over time, as a meter channel sees it."""

    def mean_mw(self, start_ns: int, end_ns: int) -> float:
        """The mean power (mW) over [start_ns, end_ns] (its value at start_ns if the window is empty)."""
        ...


class Dark:
    """A slot with nothing connected."""

    def mean_mw(self, start_ns: int, end_ns: int) -> float:
        return 0.0


class SwitchLight:
    """The light leaving some egress ports of one switch model, as a history of steps per port: one model
    listener for all of them, each change recorded at its model time."""

    def __init__(self, model: SwitchModel, egresses: Iterable[int]) -> None:
        self.model = model
        model.timeline.run_due(now_ns())  # the patches as they stand now, then every change from here on
        self._t: dict[int, list[int]] = {}
        self._mw: dict[int, list[float]] = {}
        for egress in egresses:
            self._t[egress] = [0]
            self._mw[egress] = [self._power_mw(model.lit.get(egress))]
        model.add_listener(self._on_light)

    def _power_mw(self, ingress: int | None) -> float:
        launch_dbm = self.model.transmitting.get(ingress) if ingress is not None else None
        return 0.0 if launch_dbm is None else math.pow(10.0, (launch_dbm - INSERTION_LOSS_DB) / 10.0)

    def _on_light(self, egress: int, ingress: int | None, t_ns: int) -> None:
        times = self._t.get(egress)
        if times is None:
            return
        values = self._mw[egress]
        at = bisect.bisect_right(times, t_ns)  # in model-time order, even if delivered out of it
        times.insert(at, t_ns)
        values.insert(at, self._power_mw(ingress))
        keep = bisect.bisect_right(times, t_ns - HISTORY_NS) - 1
        if keep > 0:  # the step in force at the start of the kept history stays
            del times[:keep], values[:keep]

    def tap(self, egress: int) -> LightTap:
        return _PortTap(self, egress)

    def mean_mw(self, egress: int, start_ns: int, end_ns: int) -> float:
        # A reading stamped now must see every light change due by now (the model delivers a burst of them
        # a time slice per loop turn).
        self.model.timeline.run_due(now_ns())
        return _mean_of_steps(self._t[egress], self._mw[egress], start_ns, end_ns)


def _mean_of_steps(times: list[int], values: list[float], start_ns: int, end_ns: int) -> float:
    """The mean of a step function (values[i] from times[i] on) over [start_ns, end_ns]."""
    i = max(bisect.bisect_right(times, start_ns) - 1, 0)
    if end_ns <= start_ns:
        return values[i]
    total = 0.0
    t = start_ns
    while t < end_ns:
        step_end = times[i + 1] if i + 1 < len(times) else end_ns
        until = min(step_end, end_ns)
        total += values[i] * (until - t)
        t = until
        i += 1
    return total / (end_ns - start_ns)


class FabricLight:
    """The light a kernel fabric's OCS sends into NIC receive fibers, learnt from the kernel itself, for a
    meter that is its own process (`labctl emulate power-meter`).

    In the fabric (labctl.emulators.fabric) one direction of light is a tc u32 + mirred redirect in its
    `ocs` namespace, from the fiber end of the port whose transmit fiber lands on the patched ingress to the
    fiber end of the port whose receive fiber leaves the egress; the switch's process (`labctl emulate ocs
    --fabric`) programs it at the switch model's light-change time. This subscribes to that namespace's tc
    notifications (RTNLGRP_TC), reads the redirects already there, and keeps for each measured receive fiber
    a history of steps: the launch power less the switch's insertion loss while some fiber end is
    redirected to it, dark otherwise. A change is stamped when this process reads it (the socket is read
    on the loop as it becomes readable, and again before every reading), so the meter never sees light
    before the kernel carried it, and at most a loop turn after. Blocking at `open`; on the loop after."""

    def __init__(self, layout: FabricLayout, measured: Iterable[NicPort], launch_dbm: float = -1.0) -> None:
        self.layout = layout
        self._lit_mw = math.pow(10.0, (launch_dbm - INSERTION_LOSS_DB) / 10.0)
        self._fibers = {fp.index for fp in layout.ports}
        self._measured = [layout.port(port).index for port in measured]
        self._to: dict[int, int] = {}  # fiber end → the fiber end its frames (its light) are redirected to
        self._t: dict[int, list[int]] = {index: [0] for index in self._measured}
        self._mw: dict[int, list[float]] = {index: [0.0] for index in self._measured}
        self._sock: socket.socket | None = None
        self._loop: asyncio.AbstractEventLoop | None = None

    def open(self) -> None:
        """Subscribe, then read every fiber end's redirects (a change between the two is applied after)."""
        from labctl.linux import netns
        from labctl.linux.rtnl import open_route_socket

        with netns.entered(self.layout.ocs_netns):
            sock = open_route_socket(RTMGRP_TC, blocking=False)
            dump = open_route_socket()
        try:
            dump.settimeout(2.0)
            for seq, index in enumerate(sorted(self._fibers), start=1):
                self._dump(dump, seq, index)
        except BaseException:
            sock.close()
            raise
        finally:
            dump.close()
        self._sock = sock
        for index in self._measured:  # the state found: in force from the start of the history
            self._mw[index] = [self._power(index)]
        self.drain()

    def _dump(self, dump: socket.socket, seq: int, index: int) -> None:
        from labctl.core.errors import HardwareError
        from labctl.linux.netlink import NLM_F_DUMP, NLM_F_REQUEST, NLMSG_DONE, NLMSG_ERROR, iter_messages
        from labctl.linux.netlink import message as netlink_message
        from labctl.linux.rtnl import INGRESS_HANDLE, TCMSG

        body = TCMSG.pack(socket.AF_UNSPEC, index, 0, INGRESS_HANDLE, 0)
        dump.send(netlink_message(RTM_GETTFILTER, NLM_F_REQUEST | NLM_F_DUMP, seq, body))
        while True:
            data = dump.recv(1 << 16)
            for kind, _flags, mseq, start, end in iter_messages(data):
                if mseq != seq:
                    continue
                if kind == NLMSG_DONE:
                    return
                if kind == NLMSG_ERROR:
                    (code,) = struct.unpack_from("=i", data, start)
                    if code == 0:
                        return
                    raise HardwareError(
                        f"fabric {self.layout.prefix}: reading the cross-connects of fiber end {index}: "
                        f"{os.strerror(-code)}"
                    )
                self._message(kind, data, start, end)

    def attach(self, loop: asyncio.AbstractEventLoop) -> None:
        """Read tc changes as they come, on `loop`."""
        assert self._sock is not None, "open() first"
        self._loop = loop
        loop.add_reader(self._sock, self.drain)

    def close(self) -> None:
        if self._sock is not None:
            if self._loop is not None:
                self._loop.remove_reader(self._sock)
            self._sock.close()
            self._sock = None

    def drain(self) -> None:
        """Apply every tc change the kernel has sent so far, stamped now."""
        from labctl.core.errors import HardwareError
        from labctl.linux.netlink import iter_messages

        if self._sock is None:
            return
        while True:
            try:
                data = self._sock.recv(1 << 16)
            except BlockingIOError:
                return
            except OSError as e:  # ENOBUFS: changes were lost, the light is no longer known
                raise HardwareError(f"fabric {self.layout.prefix}: tc notifications lost: {e}") from None
            t = now_ns()
            for kind, _flags, _seq, start, end in iter_messages(data):
                self._message(kind, data, start, end, t)

    def _message(self, kind: int, data: bytes, start: int, end: int, t: int | None = None) -> None:
        from labctl.linux.rtnl import RTM_DELTFILTER, RTM_NEWTFILTER, TCMSG

        if kind not in (RTM_NEWTFILTER, RTM_DELTFILTER):
            return
        _family, index, _handle, _parent, _info = TCMSG.unpack_from(data, start)
        if index not in self._fibers:
            return
        if kind == RTM_DELTFILTER:  # the fabric removes a fiber end's redirect with its whole prio
            if self._to.pop(index, None) is None:
                return
        else:
            target = _mirred_target(data, start + TCMSG.size, end)
            if target is None:  # the u32 hash table itself, or a filter that redirects nowhere
                return
            self._to[index] = target
        if t is not None:
            self._relight(t)

    def _power(self, index: int) -> float:
        return self._lit_mw if index in self._to.values() else 0.0

    def _relight(self, t: int) -> None:
        for index in self._measured:
            mw = self._power(index)
            times, values = self._t[index], self._mw[index]
            if mw == values[-1]:
                continue
            times.append(max(t, times[-1]))
            values.append(mw)
            keep = bisect.bisect_right(times, t - HISTORY_NS) - 1
            if keep > 0:
                del times[:keep], values[:keep]

    def tap(self, port: NicPort) -> LightTap:
        return _PortTap(self, self.layout.port(port).index)

    def mean_mw(self, index: int, start_ns: int, end_ns: int) -> float:
        self.drain()  # a reading stamped now sees every change the kernel made before it
        return _mean_of_steps(self._t[index], self._mw[index], start_ns, end_ns)


def _mirred_target(data: bytes, start: int, end: int) -> int | None:
    """The ifindex a u32 filter's mirred action sends frames to (None: no such action)."""
    from labctl.linux.netlink import parse_attrs
    from labctl.linux.rtnl import (
        TC_MIRRED,
        TCA_ACT_KIND,
        TCA_ACT_OPTIONS,
        TCA_MIRRED_PARMS,
        TCA_OPTIONS,
        TCA_U32_ACT,
    )

    options = parse_attrs(data, start, end).get(TCA_OPTIONS)
    if options is None:
        return None
    actions = parse_attrs(options, 0, len(options)).get(TCA_U32_ACT)
    if actions is None:
        return None
    for action in parse_attrs(actions, 0, len(actions)).values():
        fields = parse_attrs(action, 0, len(action))
        kind, opts = fields.get(TCA_ACT_KIND), fields.get(TCA_ACT_OPTIONS)
        if kind is None or opts is None or bytes(kind).rstrip(b"\0") != b"mirred":
            continue
        parms = parse_attrs(opts, 0, len(opts)).get(TCA_MIRRED_PARMS)
        if parms is not None and len(parms) >= TC_MIRRED.size:
            target: int = TC_MIRRED.unpack_from(parms, 0)[6]
            return target
    return None


class _Light(Protocol):
    def mean_mw(self, port: int, start_ns: int, end_ns: int) -> float: ...


@dataclass(frozen=True)
class _PortTap:
    light: _Light
    egress: int
    """The switch egress port (SwitchLight) or the receive fiber end's ifindex (FabricLight)."""

    def mean_mw(self, start_ns: int, end_ns: int) -> float:
        return self.light.mean_mw(self.egress, start_ns, end_ns)


class ScpiError(Exception):
    """One SCPI error-queue entry: `code,"message"`."""

    def __init__(self, code: int, message: str) -> None:
        super().__init__(f'{code},"{message}"')
        self.code = code


def undefined_header(header: str) -> ScpiError:
    return ScpiError(-113, f"Undefined header;{header}")


# Mnemonics: the upper-case part is the short form; either form matches, in any case.
_KEYWORDS = (
    *("SYSTem", "ERRor", "NEXT", "SENSe", "CHANnel", "POWer", "WAVelength", "UNIT", "ATIMe", "RANGe"),
    *("AUTO", "CORRection", "LOSS", "INPut", "MAGNitude", "INITiate", "CONTinuous", "IMMediate"),
    *("FETCh", "READ", "SCALar", "DC"),
)
_MNEMONIC: dict[str, str] = {}
for _word in _KEYWORDS:
    _short = "".join(c for c in _word if c.isupper())
    _MNEMONIC[_short] = _short
    _MNEMONIC[_word.upper()] = _short
_NODE = re.compile(r"^([A-Za-z]+)(\d*)$")
_NUMBER = re.compile(r"^([+-]?(?:\d+\.?\d*|\.\d+)(?:[eE][+-]?\d+)?)\s*([A-Za-z]*)$")
_TIME_UNITS = {"": 1.0, "S": 1.0, "MS": 1e-3, "US": 1e-6, "NS": 1e-9}
_LENGTH_UNITS = {"": 1.0, "M": 1.0, "MM": 1e-3, "UM": 1e-6, "NM": 1e-9, "PM": 1e-12}
_OPTIONAL = {"SCAL", "DC", "IMM", "NEXT", "LOSS", "INP", "MAGN"}


def _number(text: str, units: Mapping[str, float], *, minimum: float, maximum: float) -> float:
    """A numeric parameter in base units (MIN/MAX/DEF allowed): -224 if it is not one, -131 for a bad unit."""
    word = text.strip().upper()
    if word in ("MIN", "MINIMUM"):
        return minimum
    if word in ("MAX", "MAXIMUM"):
        return maximum
    match = _NUMBER.match(text.strip())
    if match is None:
        raise ScpiError(-224, "Illegal parameter value")
    unit = match.group(2).upper()
    if unit not in units:
        raise ScpiError(-131, "Invalid suffix")
    return float(match.group(1)) * units[unit]


def _boolean(text: str) -> bool:
    word = text.strip().upper()
    if word in ("1", "ON"):
        return True
    if word in ("0", "OFF"):
        return False
    raise ScpiError(-224, "Illegal parameter value")


@dataclass
class Slot:
    """One power-meter port (`slot` in N77xx SCPI) and its measurement state."""

    tap: LightTap
    wavelength_m: float = 1550e-9
    unit_watt: bool = False
    atim_ns: int = 1_000_000
    auto_range: bool = True
    correction_db: float = 0.0
    continuous: bool = True
    phase_ns: int = field(default_factory=now_ns)
    """Where the continuous windows are aligned (set when measuring starts or its averaging changes)."""
    single: tuple[int, int] | None = None
    """A triggered measurement's window, until a fetch after its end takes its result."""
    last_mw: float | None = None


class N77xxEmulator:
    """An N77xx power meter on TCP (127.0.0.1, ephemeral port by default): `taps[n]` is the light at slot n.

    One instrument state for every connection, as on the real meter; each connection's commands run in
    order (a READ holds its connection for one averaging time). `transcript` keeps the last lines received
    with their replies (None: no reply), for tests."""

    def __init__(
        self,
        taps: Mapping[int, LightTap],
        *,
        host: str = "127.0.0.1",
        port: int = 0,
        slots: int | None = None,
        serial: str = "EMU0001",
        seed: int = 0,
        averaging_quantum_ns: int = 1_000,
    ) -> None:
        n = slots if slots is not None else (4 if max(taps, default=1) <= 4 else 8)
        if any(not 1 <= s <= n for s in taps):
            raise ValueError(f"slots {sorted(taps)} do not fit a {n}-port meter")
        self.model = "N7744A" if n <= 4 else "N7745A"
        self.idn = f"Keysight Technologies,{self.model},{serial},labctl-emulator-{__version__}"
        self.host = host
        self.port = port
        self.averaging_quantum_ns = averaging_quantum_ns
        self._taps = {s: taps.get(s, Dark()) for s in range(1, n + 1)}
        self.slots: dict[int, Slot] = {}
        self.errors: deque[ScpiError] = deque()
        self.transcript: deque[tuple[str, str | None]] = deque(maxlen=10_000)
        self._rng = random.Random(seed)
        self._server: asyncio.Server | None = None
        self._sessions: dict[asyncio.Task[None], asyncio.StreamWriter] = {}
        self._closing = False
        self.reset()

    # -- lifecycle -------------------------------------------------------------------------------------------
    async def start(self) -> None:
        self._server = await asyncio.start_server(self._serve, self.host, self.port)
        self.port = self._server.sockets[0].getsockname()[1]

    @property
    def address(self) -> tuple[str, int]:
        return self.host, self.port

    async def close(self) -> None:
        server, self._server = self._server, None
        if server is not None:
            server.close()
        self._closing = True
        sessions = dict(self._sessions)
        for writer in sessions.values():
            writer.transport.abort()  # each session's read then ends and its handler finishes by itself
        if sessions:
            _, stuck = await asyncio.wait(sessions, timeout=1.0)
            for task in stuck:  # inside a READ's averaging window
                task.cancel()
            await asyncio.gather(*sessions, return_exceptions=True)
        if server is not None:
            await server.wait_closed()

    async def __aenter__(self) -> N77xxEmulator:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    # -- instrument state ------------------------------------------------------------------------------------
    def reset(self) -> None:
        """*RST: every slot at its defaults, measuring continuously."""
        self.slots = {n: Slot(tap) for n, tap in self._taps.items()}

    def push_error(self, error: ScpiError) -> None:
        if len(self.errors) >= ERROR_QUEUE:
            self.errors[-1] = ScpiError(-350, "Queue overflow")
            return
        self.errors.append(error)

    def _reading(self, slot: Slot, start_ns: int, end_ns: int) -> float:
        """What the detector reports for a window: the light's mean, the noise floor, a little noise."""
        mean = float(slot.tap.mean_mw(start_ns, end_ns))
        floor = NOISE_FLOOR_MW * (1.0 + 0.2 * abs(self._rng.gauss(0.0, 1.0)))
        spread = math.pow(10.0, (self._rng.random() - 0.5) * READING_NOISE_DB / 10.0)
        return (mean * spread + floor) * math.pow(10.0, slot.correction_db / 10.0)

    def fetch_mw(self, slot: Slot, t_ns: int) -> float | None:
        """The last completed measurement at t_ns (None: none yet)."""
        if slot.continuous:
            completed = (t_ns - slot.phase_ns) // slot.atim_ns
            end = slot.phase_ns + completed * slot.atim_ns
            return self._reading(slot, end - slot.atim_ns, end)
        if slot.single is not None and t_ns >= slot.single[1]:
            slot.last_mw = self._reading(slot, *slot.single)
            slot.single = None
        return slot.last_mw

    def _format_power(self, slot: Slot, mw: float | None) -> str:
        if mw is None:
            return f"{NOT_A_NUMBER:+.6E}"
        if slot.unit_watt:
            return f"{mw / 1e3:+.6E}"
        return f"{10.0 * math.log10(mw):+.6E}"

    # -- one connection --------------------------------------------------------------------------------------
    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._sessions[task] = writer
        buf = bytearray()
        try:
            while True:
                data = await reader.read(4096)
                if not data:
                    break
                buf += data
                while (end := buf.find(b"\n")) >= 0:
                    line = bytes(buf[:end]).decode("ascii", "replace").strip("\r\t ")
                    del buf[: end + 1]
                    if not line:
                        continue
                    reply = await self.execute(line)
                    self.transcript.append((line, reply))
                    if reply is not None:
                        writer.write(reply.encode("ascii") + b"\n")
                        await writer.drain()
                if len(buf) > MAX_LINE:
                    break
        except (ConnectionError, OSError):
            pass
        except asyncio.CancelledError:
            if not self._closing:
                raise
            # Stopped by close(): end like a hung-up session (asyncio's server callback would log a
            # cancelled handler as an error).
        finally:
            self._sessions.pop(task, None)
            writer.close()
            with contextlib.suppress(ConnectionError, OSError):
                await writer.wait_closed()

    async def execute(self, line: str) -> str | None:
        """One program message (units separated by `;`): the responses joined by `;`, None if there are
        none. An erroneous unit queues its error and answers nothing; the others still run."""
        responses: list[str] = []
        path: list[str] = []
        for unit in _split_units(line):
            try:
                response, path = await self._unit(unit, path)
            except ScpiError as e:
                self.push_error(e)
                continue
            if response is not None:
                responses.append(response)
        return ";".join(responses) if responses else None

    async def _unit(self, unit: str, path: list[str]) -> tuple[str | None, list[str]]:
        header, _, argument = unit.partition(" ")
        header, argument = header.strip(), argument.strip()
        if header.startswith("*"):
            return self._common(header.upper(), argument), path
        query = header.endswith("?")
        text = header.removesuffix("?")
        if text.startswith(":"):
            nodes_text, prefix = text[1:], []
        else:
            prefix = path  # a unit after `;` without a colon continues the previous one's branch
            nodes_text = text
        nodes: list[tuple[str, int | None]] = list(prefix_nodes(prefix))
        for token in nodes_text.split(":"):
            match = _NODE.match(token)
            mnemonic = _MNEMONIC.get(match.group(1).upper()) if match else None
            if match is None or mnemonic is None:
                raise undefined_header(header)
            nodes.append((mnemonic, int(match.group(2)) if match.group(2) else None))
        branch = [f"{m}{s if s is not None else ''}" for m, s in nodes[:-1]]
        return await self._dispatch(header, nodes, query, argument), branch

    def _common(self, header: str, argument: str) -> str | None:
        if header == "*IDN?":
            return self.idn
        if header == "*RST":
            self.reset()
            return None
        if header == "*CLS":
            self.errors.clear()
            return None
        if header == "*OPC?":
            return "1"
        if header in ("*OPC", "*WAI"):
            return None
        if header in ("*ESR?", "*STB?"):
            return "+0"
        raise undefined_header(header)

    def _slot(self, suffix: int | None) -> Slot:
        slot = self.slots.get(1 if suffix is None else suffix)
        if slot is None:
            raise ScpiError(-114, "Header suffix out of range")
        return slot

    async def _dispatch(
        self, header: str, nodes: Sequence[tuple[str, int | None]], query: bool, argument: str
    ) -> str | None:
        root, suffix = nodes[0]
        rest: list[str] = []
        for mnemonic, sub in nodes[1:]:
            if mnemonic == "CHAN":
                if sub not in (None, 1):  # one detector per N77xx slot: CHANnel1
                    raise ScpiError(-114, "Header suffix out of range")
            elif mnemonic not in _OPTIONAL:
                rest.append(mnemonic)
        key = (root, *rest)
        if key == ("SYST", "ERR") and query:
            error = self.errors.popleft() if self.errors else None
            return str(error) if error is not None else '+0,"No error"'
        if root == "SENS":
            return self._sense(self._slot(suffix), tuple(rest), query, argument, header)
        if key == ("INIT", "CONT"):
            slot = self._slot(suffix)
            if query:
                return "1" if slot.continuous else "0"
            slot.continuous = _boolean(_required(argument))
            slot.phase_ns = now_ns()
            return None
        if key == ("INIT",) and not query:
            slot = self._slot(suffix)
            start = now_ns()
            slot.continuous = False
            slot.single = (start, start + slot.atim_ns)
            return None
        if key == ("FETC", "POW") and query:
            slot = self._slot(suffix)
            return self._format_power(slot, self.fetch_mw(slot, now_ns()))
        if key == ("READ", "POW") and query:
            slot = self._slot(suffix)
            start = now_ns()
            await asyncio.sleep(slot.atim_ns / 1e9)
            slot.last_mw = self._reading(slot, start, start + slot.atim_ns)
            return self._format_power(slot, slot.last_mw)
        raise undefined_header(header)

    def _sense(
        self, slot: Slot, rest: tuple[str, ...], query: bool, argument: str, header: str
    ) -> str | None:
        if rest == ("POW", "WAV"):
            if query:
                return f"{slot.wavelength_m:+.6E}"
            low, high = WAVELENGTH_NM
            metres = _number(_required(argument), _LENGTH_UNITS, minimum=low * 1e-9, maximum=high * 1e-9)
            if not low - 1e-6 <= metres * 1e9 <= high + 1e-6:
                raise ScpiError(-222, "Data out of range")
            slot.wavelength_m = metres
            return None
        if rest == ("POW", "UNIT"):
            if query:
                return "1" if slot.unit_watt else "0"
            word = _required(argument).upper()
            if word in ("0", "DBM"):
                slot.unit_watt = False
            elif word in ("1", "W", "WATT"):
                slot.unit_watt = True
            else:
                raise ScpiError(-224, "Illegal parameter value")
            return None
        if rest == ("POW", "ATIM"):
            if query:
                return f"{slot.atim_ns / 1e9:+.6E}"
            seconds = _number(
                _required(argument), _TIME_UNITS, minimum=ATIM_MIN_NS / 1e9, maximum=ATIM_MAX_NS / 1e9
            )
            ns = seconds * 1e9
            if not ATIM_MIN_NS * (1 - 1e-9) <= ns <= ATIM_MAX_NS * (1 + 1e-9):
                raise ScpiError(-222, "Data out of range")
            quantum = self.averaging_quantum_ns
            slot.atim_ns = max(quantum, round(ns / quantum) * quantum)
            slot.phase_ns = now_ns()
            return None
        if rest == ("POW", "RANG", "AUTO"):
            if query:
                return "1" if slot.auto_range else "0"
            slot.auto_range = _boolean(_required(argument))
            return None
        if rest == ("CORR",):
            if query:
                return f"{slot.correction_db:+.6E}"
            slot.correction_db = _number(_required(argument), {"": 1.0, "DB": 1.0}, minimum=-200, maximum=200)
            return None
        raise undefined_header(header)


def prefix_nodes(path: Sequence[str]) -> Iterable[tuple[str, int | None]]:
    for node in path:
        match = _NODE.match(node)
        assert match is not None
        yield match.group(1), int(match.group(2)) if match.group(2) else None


def _required(argument: str) -> str:
    if not argument:
        raise ScpiError(-109, "Missing parameter")
    return argument


def _split_units(line: str) -> list[str]:
    """A program message's units: split at `;` outside quoted strings."""
    units: list[str] = []
    current: list[str] = []
    quote = ""
    for c in line:
        if quote:
            quote = "" if c == quote else quote
        elif c in "\"'":
            quote = c
        elif c == ";":
            units.append("".join(current).strip())
            current = []
            continue
        current.append(c)
    units.append("".join(current).strip())
    return [u for u in units if u]


def meter_emulator(
    meter: str,
    channels: Sequence[MeterChannel],
    models: Mapping[str, SwitchModel],
    *,
    quantum_ns: int = 1_000,
) -> N77xxEmulator:
    """The emulator of an inventory meter: each channel's slot reads its egress port on its switch's model
    (one light history per switch). Its noise is seeded by the meter's name: the same in every run."""
    by_switch: dict[str, list[MeterChannel]] = {}
    for ch in channels:
        by_switch.setdefault(ch.switch, []).append(ch)
    taps: dict[int, LightTap] = {}
    for switch, chans in by_switch.items():
        light = SwitchLight(models[switch], [ch.egress for ch in chans])
        taps.update({ch.channel: light.tap(ch.egress) for ch in chans})
    return N77xxEmulator(taps, seed=zlib.crc32(meter.encode()), averaging_quantum_ns=quantum_ns)
