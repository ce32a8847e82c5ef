"""DiCon 3D MEMS matrix switch over RS-232 (the `dicon-serial` driver): `DiconSerialSwitch`.

Layers: codec.py (ASCII lines <-> commands and replies), port.py (the pyserial port on one worker thread),
this module (the `OpticalSwitch`). Connect checks who answers (`*IDN?`, `SYST:CONF?`) and its size
(`X1 DIM?`); apply goes through `labctl.ocs.protocol.converge` with the read-back `X1 CH <in>?` per input
and the
changes as `X1 CH <in> <out>` followed by `SYST:ERR?`, whose reply (after the mirrors settle) is the
switch's acknowledgement. Every wire command is an `ocs.io` event. Replies carry no tag: each query
recognises its own reply line, noise is counted and skipped, a batch left unanswered is asked again after
the line has been resynchronised (decision 0033).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterable, Sequence
from typing import Any, TypeVar

from labctl.core.clock import now_ns
from labctl.core.errors import HardwareError, InputError
from labctl.core.events import Kind
from labctl.inventory.mapping import Mapping, MappingDiff, PortSpace
from labctl.ocs.protocol import (
    EventSink,
    Timed,
    TimeoutPolicy,
    VerifiedSwitch,
    check_ports,
)

from .codec import (
    CONF_QUERY,
    DIM_QUERY,
    ERROR_QUERY,
    IDN_QUERY,
    NO_ERROR,
    Query,
    SwitchError,
    change_commands,
    channel_query,
    encode_all,
    mapping_from_channels,
    printable,
)
from .port import LineSettings, PortLost, SerialLine, Transaction

T = TypeVar("T")

QUERIES_PER_WRITE = 16  # queries written before their replies are read (the device's input buffer is small)
TRIES = 3  # times a query batch is asked before the driver gives up on it
MAX_ERRORS_READ = 16  # error-queue entries drained after a failed change


class DiconSerialSwitch(VerifiedSwitch):
    """A DiCon 3D MEMS matrix switch (GP600/GP700 `X1`) on a serial line. Satisfies `OpticalSwitch`.

    Ports: switch input i is ingress i, switch output o is egress N_in + o. The switch has no optical power
    monitor in its documented command set: `port_power` answers None (nothing measured) for every port."""

    read_operation = "X1 CH read-back"

    def __init__(
        self,
        name: str,
        space: PortSpace,
        *,
        url: str,
        settings: LineSettings,
        emit: EventSink,
        timeouts: TimeoutPolicy | None = None,
        reply_timeout_s: float = 1.0,
        settle_timeout_s: float = 2.0,
        attempts: int = 3,
        owned: frozenset[int] | None = None,
        console_login: bool = False,
    ) -> None:
        self.name = name
        self.console_login = console_login
        self.space = space
        self.url = url
        self.settings = settings
        self.timeouts = timeouts or TimeoutPolicy()
        self.reply_timeout_s = reply_timeout_s
        self.settle_timeout_s = settle_timeout_s
        self.attempts = attempts
        self.owned = owned
        self.identity: tuple[str, ...] = ()
        self.reconnects = 0
        self.noise_lines = 0
        self._emit_sink = emit
        self._source = f"ocs:{name}"
        self._line: SerialLine | None = None
        self._lock = asyncio.Lock()
        self._closed = True
        self._last_read: Mapping = frozenset()

    # -- events ------------------------------------------------------------------------------------------

    def _apply_meta(self) -> dict[str, Any]:
        return {"driver": "dicon-serial", "url": self.url}

    def _conversation(self) -> asyncio.Lock:
        return self._lock  # one conversation on the line at a time: replies are matched by order

    def _io(self, command: str, sent_ns: int, end_ns: int, status: str, reply: str | None = None) -> None:
        self._emit(Kind.OCS_IO, end_ns - sent_ns, end_ns, command=command, status=status, reply=reply)

    def _noise(self, data: bytes, t_ns: int) -> None:
        self.noise_lines += 1
        self._emit(Kind.OCS_SESSION, "noise", t_ns, text=repr(data[:64]), length=len(data))

    # -- the line ------------------------------------------------------------------------------------------
    def _require_conn(self) -> SerialLine:
        if self._closed or self._line is None:
            raise HardwareError(f"{self.name}: not connected")
        return self._line

    async def _transact(
        self, payload: bytes, done: Callable[[Sequence[bytes]], bool], first_s: float
    ) -> Transaction:
        """One batch on the line; a port that failed is reopened first (once per failure)."""
        line = self._require_conn()
        if not line.is_open:
            await self._reopen_line("the port had failed")
        return await line.transact(payload, done, first_s, self.reply_timeout_s)

    async def _reopen_line(self, reason: str) -> None:
        line = self._require_conn()
        await self._reopen(line.open, PortLost, reason, self.url)
        self._emit(Kind.OCS_SESSION, "reconnected", url=self.url)

    async def _ask(self, queries: Sequence[Query[T]]) -> list[T]:
        """Each query's answer, in order. Written `QUERIES_PER_WRITE` at a time; a reply is the first line
        after the previous answer that the query recognises, so noise (and a reply garbled by it) is skipped;
        what is still unanswered is asked again, after the line has been resynchronised, up to `TRIES`
        times. A lost port is reopened and the batch asked again (queries change nothing)."""
        answers: dict[int, T] = {}
        for start in range(0, len(queries), QUERIES_PER_WRITE):
            chunk = list(range(start, min(start + QUERIES_PER_WRITE, len(queries))))
            for _ in range(TRIES):
                pending = [i for i in chunk if i not in answers]
                if not pending:
                    break
                await self._ask_once([queries[i] for i in pending], pending, answers)
            missing = [queries[i].text for i in chunk if i not in answers]
            if missing:
                raise HardwareError(
                    f"{self.name}: no valid reply to {', '.join(missing[:4])}"
                    + (f" (+{len(missing) - 4} more)" if len(missing) > 4 else "")
                    + f" after {TRIES} tries on {self.url} ({self.settings.describe()}): line noise, a "
                    "device that stopped answering, or line settings that differ from the switch's"
                )
        return [answers[i] for i in range(len(queries))]

    async def _ask_once(self, batch: list[Query[T]], index: list[int], answers: dict[int, T]) -> None:
        last = batch[-1]

        def done(lines: Sequence[bytes]) -> bool:  # in order: once the last query is answered, all are
            return any(last.match(data) is not None for data in lines)

        payload = encode_all((q.text for q in batch), self.settings.line_ending)
        try:
            result = await self._transact(payload, done, self.reply_timeout_s)
        except PortLost as e:
            for q in batch:
                self._io(q.text, now_ns(), now_ns(), "lost")
            await self._reopen_line(str(e))
            return
        cursor = 0
        for line in result.lines:
            for j in range(cursor, len(batch)):
                value = batch[j].match(line.data)
                if value is not None:
                    for skipped in batch[cursor:j]:  # their replies were lost or garbled
                        self._io(skipped.text, result.sent_ns, line.t_ns, "no reply")
                    answers[index[j]] = value
                    self._io(batch[j].text, result.sent_ns, line.t_ns, "ok", printable(line.data))
                    cursor = j + 1
                    break
            else:
                self._noise(line.data, line.t_ns)
        end = now_ns()
        for q in batch[cursor:]:
            self._io(q.text, result.sent_ns, end, "no reply")
        if cursor < len(batch):
            self._require_conn().mark_dirty()

    async def _change(self, commands: list[str]) -> None:
        """Send `X1 CH` commands and `SYST:ERR?` in one write; its reply comes once the switch has carried
        them out (its mirrors settled). Raises HardwareError for any error the switch queued, a missing
        reply or a lost port: `converge` then reads back what the switch did and retries the rest."""
        payload = encode_all([*commands, ERROR_QUERY.text], self.settings.line_ending)

        def done(lines: Sequence[bytes]) -> bool:
            return any(ERROR_QUERY.match(data) is not None for data in lines)

        try:
            result = await self._transact(payload, done, self.settle_timeout_s + self.reply_timeout_s)
        except PortLost as e:
            end = now_ns()
            for command in [*commands, ERROR_QUERY.text]:
                self._io(command, end, end, "lost")
            await self._reopen_line(str(e))
            raise HardwareError(
                f"{self.name}: {self.url} lost during {commands[0]}"
                + (f" (+{len(commands) - 1} more)" if len(commands) > 1 else "")
                + "; reopened, the read-back decides what took effect"
            ) from None
        error: SwitchError | None = None
        t_reply = now_ns()
        for line in result.lines:
            value = ERROR_QUERY.match(line.data)
            if value is None:
                self._noise(line.data, line.t_ns)
            elif error is None:
                error, t_reply = value, line.t_ns
        status = "ok" if error is not None else "no reply"
        for command in commands:
            self._io(command, result.sent_ns, t_reply, status)
        self._io(ERROR_QUERY.text, result.sent_ns, t_reply, status, None if error is None else str(error))
        if error is None:
            self._require_conn().mark_dirty()
            raise HardwareError(
                f"{self.name}: no valid reply to SYST:ERR? after {len(commands)} change(s) (line noise or a "
                "device that stopped answering); the read-back decides what took effect"
            )
        if error.code != NO_ERROR:
            errors = [error]
            while len(errors) < MAX_ERRORS_READ:
                (more,) = await self._ask([ERROR_QUERY])
                if more.code == NO_ERROR:
                    break
                errors.append(more)
            raise HardwareError(f"{self.name}: the switch refused: {'; '.join(str(e) for e in errors)}")

    # -- session -------------------------------------------------------------------------------------------
    async def connect(self) -> None:
        if not self._closed:
            return
        if self.console_login:
            raise InputError(
                f"switch {self.name}: a console-server login (user/password) is not supported by the "
                "dicon-serial driver; use a port that needs none (raw TCP or RFC 2217) or a local device"
            )
        self._closed = False
        self._line = SerialLine(self.name, self.url, self.settings, quiet_s=min(self.reply_timeout_s, 0.1))
        try:
            async with self.timeouts.deadline(self.name, "connect", self.timeouts.connect_s):
                await self._line.open()
                await self._check_identity()
        except BaseException:
            await self._shut()
            raise
        self._emit(
            Kind.OCS_SESSION,
            "connected",
            url=self.url,
            line=self.settings.describe(),
            identity=list(self.identity),
        )

    async def _check_identity(self) -> None:
        (idn,) = await self._ask([IDN_QUERY])
        (conf,) = await self._ask([CONF_QUERY])
        (size,) = await self._ask([DIM_QUERY])
        self.identity = idn
        if "dicon" not in idn[0].lower():
            raise InputError(
                f"switch {self.name}: {self.url} is not a DiCon switch (*IDN? says {', '.join(idn)})"
            )
        if "X1" not in [part.strip().upper() for part in conf.split(",")]:
            raise InputError(
                f"switch {self.name}: the DiCon at {self.url} has no 3D matrix X1 (SYST:CONF? says {conf!r})"
            )
        if size != self.space:
            raise InputError(
                f"switch {self.name}: the inventory says {self.space} but the switch reports {size}"
            )

    async def close(self) -> None:
        if self._closed:
            return
        await self._shut()
        self._emit(Kind.OCS_SESSION, "closed")

    async def _shut(self) -> None:
        self._closed = True
        line, self._line = self._line, None
        if line is not None:
            await line.close()

    # -- OpticalSwitch ---------------------------------------------------------------------------------------
    async def _read(self) -> Mapping:
        inputs = list(self.space.ingress)
        outputs = await self._ask([channel_query(i) for i in inputs])
        return mapping_from_channels(self.space, dict(zip(inputs, outputs, strict=True)), self.name)

    diff_from_verified = False  # the order of its commands is worked out from a read just before them

    async def _read_for_apply(self) -> Mapping:
        self._last_read = await self._read()
        return self._last_read

    async def _send(self, diff: MappingDiff) -> None:
        # `converge` diffed against the read-back it took just before: the order of the commands (who lets
        # go of an output first) is worked out from that same read-back
        await self._change(change_commands(self.space, self._last_read, diff))

    async def port_power(self, ports: Iterable[int]) -> Timed[dict[int, float | None]]:
        """No power monitor in the protocol: None (nothing measured) for every port, at no wire cost; the
        readings are still events, marked `monitor: none`, so a power probe shows why it sees no light."""
        wanted = check_ports(self.name, self.space, ports)
        self._require_conn()
        start = now_ns()
        powers: dict[int, float | None] = dict.fromkeys(wanted)
        self._emit_powers(powers, start, monitor="none")
        return Timed(powers, start, now_ns())
