"""A Keysight N77xx multiport optical power meter over SCPI (TCP, newline framing), reading the light of the
lab's switch models: the emulator the power-meter probe talks to over real TCP (decision 0034).

The command set is the part of the N77xx's that labctl uses (reference §3.2), in its SCPI grammar
(labctl.emulators.meter_scpi: short or long mnemonics in any case, numeric suffixes for slot and channel,
units on numbers, compound messages: `FETC1:POW?;:FETC2:POW?` answers `v1;v2`), with an error queue read by
`SYST:ERR?` (`+0,"No error"` when empty; a query in error answers nothing, as a real instrument does, so
the client times out and asks why).

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
The light is each channel's tap (labctl.emulators.meter_light): in a lab, its switch egress port as the
switch model lights it (`SwitchLight`: the launch power of the NIC whose transmit fiber the port's patch
connects, less the switch's insertion loss), a step at the model's light-change time; on top comes the
detector's noise floor (about -90 dBm, so a dark port reads near it, never -inf) and a little reading
noise. The wavelength is stored, not modeled.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import random
import zlib
from collections import deque
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from labctl.core.clock import now_ns
from labctl.core.version import __version__
from labctl.emulators.meter_light import Dark, LightTap, SwitchLight
from labctl.emulators.meter_scpi import (
    LENGTH_UNITS,
    OPTIONAL_NODES,
    TIME_UNITS,
    ScpiError,
    boolean,
    header_nodes,
    number,
    required,
    split_units,
    undefined_header,
)
from labctl.inventory.schema import MeterChannel
from labctl.models.switch import SwitchModel

__all__ = ["DEFAULT_PORT", "N77xxEmulator", "Slot", "meter_emulator"]

DEFAULT_PORT = 5025  # SCPI over raw TCP (reference §3.1, §3.2)
NOISE_FLOOR_MW = 1e-9  # -90 dBm: what a dark port reads, give or take
READING_NOISE_DB = 0.01  # peak-to-peak spread of a lit reading
ATIM_MIN_NS, ATIM_MAX_NS = 1_000, 10_000_000_000  # 1 us .. 10 s (reference §3.2)
WAVELENGTH_NM = (1250.0, 1625.0)
MAX_LINE = 64 * 1024  # bytes of unterminated input a session may buffer before it is hung up
ERROR_QUEUE = 30
NOT_A_NUMBER = 9.91e37  # SCPI's NaN: a slot with no measurement yet


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
        for unit in split_units(line):
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
        nodes = header_nodes(header, nodes_text, prefix)
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
            elif mnemonic not in OPTIONAL_NODES:
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
            slot.continuous = boolean(required(argument))
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
            metres = number(required(argument), LENGTH_UNITS, minimum=low * 1e-9, maximum=high * 1e-9)
            if not low - 1e-6 <= metres * 1e9 <= high + 1e-6:
                raise ScpiError(-222, "Data out of range")
            slot.wavelength_m = metres
            return None
        if rest == ("POW", "UNIT"):
            if query:
                return "1" if slot.unit_watt else "0"
            word = required(argument).upper()
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
            seconds = number(
                required(argument), TIME_UNITS, minimum=ATIM_MIN_NS / 1e9, maximum=ATIM_MAX_NS / 1e9
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
            slot.auto_range = boolean(required(argument))
            return None
        if rest == ("CORR",):
            if query:
                return f"{slot.correction_db:+.6E}"
            slot.correction_db = number(required(argument), {"": 1.0, "DB": 1.0}, minimum=-200, maximum=200)
            return None
        raise undefined_header(header)


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
