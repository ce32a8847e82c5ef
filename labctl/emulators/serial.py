"""The serial front end of the switch emulator: a DiCon 3D MEMS matrix switch (GP600/GP700 `X1`) speaking
its RS-232 ASCII command set, reachable three ways:

- a local pseudo-terminal (`os.openpty`): the slave is set up as a real serial line (raw mode, the
  configured baud rate, character size, parity and stop bits through termios) and its path is what a
  driver opens with pyserial, as it would /dev/ttyUSB0. The emulator reads the line settings the opener
  left on the tty before every command: a driver that opened it at another speed or framing gets what a
  real mismatched line gives, bytes that are no replies.
- raw TCP on 127.0.0.1 (the core's server): what a serial console server's raw port looks like, so
  `socket://127.0.0.1:PORT` works.
- RFC 2217 on 127.0.0.1 (optional): a console server in front of the pty, built on pyserial's
  `serial.rfc2217.PortManager`, so `rfc2217://127.0.0.1:PORT` works and the driver's baud rate reaches the
  pty's termios through the telnet option negotiation.

Switch model, fault plan, command order and delivery are the core's (labctl.emulators.core); this module
frames lines (CR, LF or CRLF) and implements the commands. Set commands have no reply; errors go to a
SCPI-style error queue read with `SYST:ERR?`, whose reply waits until every mirror move commanded before it
has settled (so it is the switch's acknowledgement); other queries answer at once. Replies end in CRLF.
Faults on the pty, where there is no connection to close: a drop is the device going silent and losing
what it had buffered (as after a brown-out), a mid-reply drop sends half a reply first; garbage is bytes
outside printable ASCII, as a glitch or a wrong baud rate produces. What no source shows (error codes and
texts, the `Settings conflict` refusal of an output in use, reply line ends) is an emulator choice listed
in docs/decisions/0033.

Written independently of the driver's codec (labctl/ocs/drivers/dicon_serial/codec.py), like the TL1 pair.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import termios
import tty
from collections import deque
from typing import Any

from labctl.core.errors import InputError
from labctl.core.extras import require
from labctl.emulators.core import CommandFaults, FaultPlan, Session, SwitchEmulator, load_faults
from labctl.inventory.mapping import MappingDiff
from labctl.models.switch import ChangeRefused, SwitchModel

__all__ = ["DiconSerialEmulator", "load_faults"]

IDN = "Dicon Fiberoptics Inc, GP600, {serial}, 7.0"  # the shape of a real GP600's reply (decision 0033)
VERSION = "7.0"
WAVELENGTHS = (1310.0, 1550.0)
NO_ERROR = "+0, No Error"
ERROR_QUEUE = 32
# Garbage is never printable ASCII or a line end: noise on a serial line, which cannot forge a reply.
_NOT_GARBAGE = bytes(range(0x20, 0x7F)) + b"\r\n"

_BITS = {5: termios.CS5, 6: termios.CS6, 7: termios.CS7, 8: termios.CS8}


def termios_speed(baudrate: int) -> int:
    speed = getattr(termios, f"B{baudrate}", None)
    if not isinstance(speed, int):
        raise InputError(f"baud rate {baudrate} is not one a tty can be set to (e.g. 9600, 57600, 115200)")
    return speed


class _PtyWriter(asyncio.StreamWriter):
    """The pty master's writer. A session ending (a drop) must not close the device: only `shut` does."""

    def close(self) -> None:
        pass

    def shut(self) -> None:
        self.transport.close()


class _PtySession(Session):
    """A session on the pty: nothing to hang up, so a drop is the device going silent (the core's session
    loop then ends, losing the input buffered so far, and a fresh session takes the next bytes)."""

    def abort(self) -> None:
        self.closed = True


class DiconSerialEmulator(SwitchEmulator):
    """The DiCon X1 front end. `start()` opens the transports asked for (`tcp`, `pty`, `rfc2217`); their
    addresses are `port` (TCP), `pty_path`, `rfc2217_port`, and all of them as URLs in `endpoints`."""

    change_verbs = frozenset({"X1 CH", "RESET"})

    def __init__(
        self,
        model: SwitchModel,
        *,
        host: str = "127.0.0.1",
        port: int = 0,
        faults: FaultPlan | None = None,
        session_timeout_s: float | None = None,
        tcp: bool = True,
        pty: bool = True,
        rfc2217: bool = False,
        rfc2217_port: int = 0,
        baudrate: int = 115200,
        bytesize: int = 8,
        parity: str = "N",
        stopbits: float = 1,
        serial_number: str = "LABCTL-EMU-0001",
    ) -> None:
        super().__init__(
            model, users={}, host=host, port=port, faults=faults, session_timeout_s=session_timeout_s
        )
        if bytesize not in _BITS or parity not in ("N", "E", "O") or stopbits not in (1, 2):
            raise InputError(
                f"emulated line {bytesize}{parity}{stopbits:g}: use 5-8 bits, N/E/O parity, 1 or 2 stop bits"
            )
        self.serve_tcp = tcp
        self.serve_pty = pty or rfc2217  # the RFC 2217 server fronts the pty
        self.serve_rfc2217 = rfc2217
        self.baudrate = baudrate
        self.bytesize = bytesize
        self.parity = parity
        self.stopbits = stopbits
        self.idn = IDN.format(serial=serial_number)
        self.errors: deque[str] = deque(maxlen=ERROR_QUEUE)
        self.write_enable = 1
        self.wavelength = WAVELENGTHS[-1]
        self.mismatched_commands = 0
        """Commands that arrived over a tty whose line settings were not the emulator's (answered noise)."""
        self.pty_path: str | None = None
        self.rfc2217_port: int | None = rfc2217_port if rfc2217 else None
        self._speed = termios_speed(baudrate)
        self._moves: set[asyncio.Task[tuple[int, int]]] = set()
        self._master: int | None = None
        self._slave: int | None = None
        self._pty_reader: asyncio.ReadTransport | None = None
        self._pty_writer: _PtyWriter | None = None
        self._pty_task: asyncio.Task[None] | None = None
        self._pty_closing = False
        self._bridge: Rfc2217Bridge | None = None

    # -- lifecycle ---------------------------------------------------------------------------------------
    async def start(self) -> None:
        try:
            if self.serve_tcp:
                await super().start()
            if self.serve_pty:
                await self._open_pty()
            if self.serve_rfc2217:
                assert self.pty_path is not None
                self._bridge = Rfc2217Bridge(self.pty_path, self.host, self.rfc2217_port or 0)
                await self._bridge.start()
                self.rfc2217_port = self._bridge.port
        except BaseException:
            await self.close()
            raise

    @property
    def endpoints(self) -> list[str]:
        """Every way in, as pyserial URLs (a device path for the pty)."""
        out = []
        if self.pty_path is not None:
            out.append(self.pty_path)
        if self.serve_tcp and self.port:
            out.append(f"socket://{self.host}:{self.port}")
        if self.serve_rfc2217 and self.rfc2217_port:
            out.append(f"rfc2217://{self.host}:{self.rfc2217_port}")
        return out

    async def _open_pty(self) -> None:
        master, slave = os.openpty()
        self._master, self._slave = master, slave
        # The emulator keeps the slave open itself: the master then never reads EIO when a driver closes
        # its end, so the device stays, at the same path, for the next opener (as a real serial port does).
        tty.setraw(slave)
        attrs = termios.tcgetattr(slave)
        cflag = attrs[2] & ~(termios.CSIZE | termios.PARENB | termios.PARODD | termios.CSTOPB)
        cflag |= _BITS[self.bytesize] | termios.CREAD | termios.CLOCAL
        if self.parity != "N":
            cflag |= termios.PARENB | (termios.PARODD if self.parity == "O" else 0)
        if self.stopbits == 2:
            cflag |= termios.CSTOPB
        attrs[2] = cflag
        attrs[4] = attrs[5] = self._speed  # ispeed, ospeed: what cfsetispeed/cfsetospeed set in C
        termios.tcsetattr(slave, termios.TCSANOW, attrs)
        self.pty_path = os.ttyname(slave)
        loop = asyncio.get_running_loop()
        reader = asyncio.StreamReader(limit=2**16)
        read_file = os.fdopen(os.dup(master), "rb", buffering=0)
        self._pty_reader, _ = await loop.connect_read_pipe(
            lambda: asyncio.StreamReaderProtocol(reader), read_file
        )
        write_file = os.fdopen(os.dup(master), "wb", buffering=0)
        transport, protocol = await loop.connect_write_pipe(asyncio.Protocol, write_file)
        self._pty_writer = _PtyWriter(transport, protocol, reader, loop)
        self._pty_task = asyncio.create_task(
            self._serve_pty(reader, self._pty_writer), name="serial-emulator:pty"
        )

    async def _serve_pty(self, reader: asyncio.StreamReader, writer: _PtyWriter) -> None:
        while not self._pty_closing and not reader.at_eof():
            await self._serve(reader, writer, session=_PtySession(writer))

    async def close(self) -> None:
        self._pty_closing = True
        if self._bridge is not None:
            bridge, self._bridge = self._bridge, None
            await bridge.close()
        if self._pty_reader is not None:
            self._pty_reader.close()  # the pty session's read ends (EOF); its loop then stops
            self._pty_reader = None
        task, self._pty_task = self._pty_task, None
        if task is not None:
            with contextlib.suppress(asyncio.CancelledError):
                try:
                    await asyncio.wait_for(asyncio.shield(task), 1.0)
                except TimeoutError:
                    task.cancel()
                    await asyncio.gather(task, return_exceptions=True)
        await super().close()
        moves = list(self._moves)
        for move in moves:
            move.cancel()
        await asyncio.gather(*moves, return_exceptions=True)
        if self._pty_writer is not None:
            self._pty_writer.shut()
            self._pty_writer = None
        for fd in (self._master, self._slave):
            if fd is not None:
                with contextlib.suppress(OSError):
                    os.close(fd)
        self._master = self._slave = None
        await asyncio.sleep(0)  # the pipe transports close their fds on the next loop turn
        await asyncio.sleep(0)

    # -- the line ------------------------------------------------------------------------------------------
    def line_matches(self) -> bool:
        """Whether the tty is set as the emulator's line is (speed, character size, parity, stop bits)."""
        if self._slave is None:
            return True
        try:
            attrs = termios.tcgetattr(self._slave)
        except termios.error:
            return True
        wanted = _BITS[self.bytesize] | (termios.PARENB if self.parity != "N" else 0)
        wanted |= (termios.PARODD if self.parity == "O" else 0) | (
            termios.CSTOPB if self.stopbits == 2 else 0
        )
        framing = attrs[2] & (termios.CSIZE | termios.PARENB | termios.PARODD | termios.CSTOPB)
        return bool(attrs[4] == attrs[5] == self._speed and framing == wanted)

    def next_command(self, buf: bytearray) -> str | None:
        """A command ends at CR or LF (CRLF is a command and an empty line, which is ignored)."""
        for i, byte in enumerate(buf):
            if byte in (0x0D, 0x0A):
                text = buf[:i].decode("latin-1")
                del buf[: i + 1]
                return text
        return None

    async def handle(self, session: Session, text: str) -> None:
        text = text.strip()
        if not text:
            return  # an empty line (a driver resynchronising, or the LF of a CRLF): not a command
        faults = self.arrived()
        if faults.drop:
            session.abort()
            return
        if isinstance(session, _PtySession) and not self.line_matches():
            self.mismatched_commands += 1
            # At another speed or framing the device reads garbage and the host reads garbage back.
            session.write(bytes(0x80 | (b ^ 0x5A) for b in text.encode("latin-1")) + b"\x8d\x8a")
            return
        reply, moving = await self._execute(text)
        if reply is None:
            if faults.drop_mid_reply:
                session.abort()
            return
        data = reply.encode("ascii", errors="replace") + b"\r\n"
        self._send(session, data, moving, faults)

    def _send(
        self,
        session: Session,
        data: bytes,
        moving: asyncio.Task[tuple[int, int]] | None,
        faults: CommandFaults,
    ) -> None:
        self.deliver(session, data, moving, faults, garbage_at=max(1, len(data) // 2), forbidden=_NOT_GARBAGE)

    # -- commands ------------------------------------------------------------------------------------------
    def _error(self, code: int, message: str) -> None:
        self.errors.append(f"{code:+d}, {message}")

    async def _execute(self, text: str) -> tuple[str | None, asyncio.Task[tuple[int, int]] | None]:
        """One command: its reply line (None: a set command, no reply) and, for `SYST:ERR?`, what its reply
        waits for."""
        upper = re.sub(r"\s+", " ", text.upper()).lstrip(":")
        space = self.model.space
        if upper == "*IDN?":
            return self.idn, None
        if upper in ("VER?", "SYST:VERS?"):
            return VERSION, None
        if upper in ("SYST:CONF?", "SYSTEM:CONFIG?"):
            return "X1", None
        if upper in ("SYST:ERR?", "SYSTEM:ERROR?", "ERR?"):
            reply = self.errors.popleft() if self.errors else NO_ERROR
            return reply, self._settling()
        if upper == "X1 DIM?":
            return f"{space.n_ingress},{space.n_egress}", None
        if upper == "X1 WAVESAVAIL?":
            return ",".join(f"{w:g}" for w in WAVELENGTHS), None
        if upper == "X1 W?":
            return f"{self.wavelength:g}", None
        if upper == "WEN?":
            return str(self.write_enable), None
        if m := re.fullmatch(r"X1 CH (\d{1,6}) ?\?|X1 CH\? (\d{1,6})", upper):
            ingress = int(m[1] or m[2])
            if not 1 <= ingress <= space.n_ingress:
                self._error(-222, f"Data out of range; input {ingress} is not 1..{space.n_ingress}")
                return None, None
            return f"{ingress},{self._output_of(ingress)}", None
        if m := re.fullmatch(r"X1 CH (\d{1,6}) (\d{1,6})", upper):
            await self._set_channel(int(m[1]), int(m[2]))
            return None, None
        if upper == "RESET":
            await self._change("RESET", MappingDiff(remove=self.model.patches, add=frozenset()))
            return None, None
        if m := re.fullmatch(r"WEN ([01])", upper):
            self.write_enable = int(m[1])
            return None, None
        if m := re.fullmatch(r"X1 W (\d{3,4}(?:\.\d+)?)", upper):
            if float(m[1]) not in WAVELENGTHS:
                self._error(-222, f"Data out of range; calibrated wavelengths are {WAVELENGTHS}")
            else:
                self.wavelength = float(m[1])
            return None, None
        self._error(-113, f"Undefined header; {text[:40]!r}")
        return None, None

    def _output_of(self, ingress: int) -> int:
        for i, egress in self.model.patches:
            if i == ingress:
                return egress - self.model.space.n_ingress
        return 0

    async def _set_channel(self, ingress: int, output: int) -> None:
        space = self.model.space
        if not 1 <= ingress <= space.n_ingress or not 0 <= output <= space.n_egress:
            self._error(
                -222,
                f"Data out of range; X1 CH {ingress} {output} (inputs 1..{space.n_ingress}, "
                f"outputs 0..{space.n_egress})",
            )
            return
        patches = self.model.patches
        current = {(i, e) for i, e in patches if i == ingress}
        add: set[tuple[int, int]] = set()
        if output:
            egress = space.n_ingress + output
            holder = next((i for i, e in patches if e == egress and i != ingress), None)
            if holder is not None:
                self._error(-221, f"Settings conflict; output {output} is in use by input {holder}")
                return
            add = {(ingress, egress)} - current
            current -= {(ingress, egress)}
        await self._change("X1 CH", MappingDiff(remove=frozenset(current), add=frozenset(add)))

    async def _change(self, verb: str, diff: MappingDiff) -> None:
        if diff.empty:
            return
        if self.refuse(verb):
            self._error(-200, "Execution error; injected refusal")
            return
        try:
            move = await self.move(diff)
        except ChangeRefused as e:
            self._error(-200, f"Execution error; {e}")
            return
        self._moves.add(move)
        move.add_done_callback(self._moves.discard)

    def _settling(self) -> asyncio.Task[tuple[int, int]] | None:
        """A task done when every mirror move commanded so far has settled (None: none is moving)."""
        moving = [m for m in self._moves if not m.done()]
        if not moving:
            return None

        async def settled() -> tuple[int, int]:
            await asyncio.wait(moving)  # waits without cancelling the moves if this reply is abandoned
            return 0, 0

        return asyncio.create_task(settled(), name="serial-emulator:settled")


class Rfc2217Bridge:
    """An RFC 2217 console server in front of the pty, on 127.0.0.1: each client gets the pty slave opened
    with pyserial, and pyserial's `PortManager` speaks the telnet side, so the client's SET-BAUDRATE (and
    data size, parity, stop bits) lands on the pty's termios as on a real console server's port. Runs on
    the event loop (the slave is read with `add_reader`); needs the [serial] extra."""

    def __init__(self, pty_path: str, host: str = "127.0.0.1", port: int = 0) -> None:
        self.pty_path = pty_path
        self.host = host
        self.port = port
        self._server: asyncio.Server | None = None
        self._clients: set[asyncio.Task[None]] = set()

    async def start(self) -> None:
        require("serial", "serial", "the RFC 2217 emulator")
        self._server = await asyncio.start_server(self._client, self.host, self.port)
        self.port = self._server.sockets[0].getsockname()[1]

    async def close(self) -> None:
        server, self._server = self._server, None
        if server is not None:
            server.close()
        clients = list(self._clients)
        for task in clients:
            task.cancel()
        await asyncio.gather(*clients, return_exceptions=True)
        if server is not None:
            await server.wait_closed()

    async def _client(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._clients.add(task)
        loop = asyncio.get_running_loop()
        port: Any = None
        try:
            port = _pty_port(self.pty_path)
            manager = require("serial.rfc2217", "serial", "the RFC 2217 emulator").PortManager(port, writer)

            def from_device() -> None:
                try:
                    data = os.read(port.fd, 4096)
                except BlockingIOError:
                    return
                except OSError:
                    loop.remove_reader(port.fd)
                    return
                if data:
                    writer.write(b"".join(manager.escape(data)))

            loop.add_reader(port.fd, from_device)
            try:
                while data := await reader.read(4096):
                    for chunk in manager.filter(data):
                        port.write(chunk)
            finally:
                loop.remove_reader(port.fd)
        except (ConnectionError, OSError):
            pass
        finally:
            if port is not None:
                with contextlib.suppress(Exception):
                    port.close()
            writer.close()
            self._clients.discard(task)


def _pty_port(path: str) -> Any:
    """The pty slave as a pyserial port for PortManager: a pty has no modem lines, so they read as a
    console server with a device attached reports them (CTS, DSR, CD up) and setting DTR/RTS/break is a
    no-op instead of an ioctl the pty refuses."""
    serial = require("serial", "serial", "the RFC 2217 emulator")

    class PtyPort(serial.Serial):  # type: ignore[misc, name-defined]
        cts = dsr = cd = True
        ri = False

        def _update_dtr_state(self) -> None:
            pass

        def _update_rts_state(self) -> None:
            pass

        def _update_break_state(self) -> None:
            pass

    return PtyPort(path, timeout=0)
