"""Polatis SCPI driver: `PolatisScpiSwitch`, an `OpticalSwitch` over SCPI (pyvisa, pyvisa-py, raw socket).

`*IDN?` and its product code's size checked against the inventory at connect; apply-with-verify through
`labctl.ocs.protocol.converge` (`OXC:SWIT:CONN:STAT?` to read, the minimal diff as `CONN:SUB` of the pairs
that go
then `CONN:ADD` of the new ones), `SYST:ERR?` after every change, one `*OPC?` after the last so the change
completes when the mirrors have settled; port power from `:PMON:POW?`. Layers: codec.py (text ↔
messages), connection.py (the pyvisa resource on its own thread), this module. Decision 0032.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import functools
import time
from collections.abc import AsyncIterator, Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
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

from . import DEFAULT_PORT
from .codec import (
    CLEAR_STATUS,
    CONNECTIONS_QUERY,
    ERROR_QUERY,
    ERROR_QUEUE_DEPTH,
    IDENTITY_QUERY,
    OPERATION_COMPLETE_QUERY,
    DeviceError,
    Identity,
    ScpiError,
    connection_commands,
    describe_errors,
    parse_connections,
    parse_error,
    parse_identity,
    parse_operation_complete,
    parse_power,
    power_queries,
)
from .connection import ScpiConnection, ScpiConnectionLost, ScpiNotSent, Worker, load_pyvisa

T = TypeVar("T")

WIRE_SLACK_S = 0.5
"""A read on the worker waits this much past the operation's deadline: the deadline itself ends it (the
caller gives up and the socket is shut), the worker's own timeout only backs that up."""
REPLY_CHARS_IN_EVENTS = 200

_deadline: contextvars.ContextVar[float | None] = contextvars.ContextVar("scpi_deadline", default=None)
"""When the operation the current task is in must end (time.monotonic), for the wire timeouts."""


class ScpiCommandError(HardwareError):
    """The switch put errors in its queue for a command (`SYST:ERR?`): it did not do it."""

    def __init__(self, switch: str, command: str, errors: Sequence[DeviceError]) -> None:
        self.switch = switch
        self.command = command
        self.errors = tuple(errors)
        super().__init__(describe_errors(switch, command, errors))

    @property
    def codes(self) -> tuple[int, ...]:
        return tuple(e.code for e in self.errors)


@dataclass(frozen=True)
class ScpiEndpoint:
    host: str
    port: int = DEFAULT_PORT


class PolatisScpiSwitch(VerifiedSwitch):
    """A Polatis switch over SCPI. Satisfies `OpticalSwitch`; every call returns a `Timed` result and
    writes events (`ocs.io` per wire command, `ocs.session`, `ocs.read`, `rx_power`, and the
    `ocs.command`/`ocs.complete`/`ocs.error` of `converge`)."""

    read_operation = CONNECTIONS_QUERY
    held_noun = "connections"

    def _apply_meta(self) -> dict[str, Any]:
        return {"driver": "polatis-scpi"}

    def __init__(
        self,
        name: str,
        space: PortSpace,
        *,
        endpoint: ScpiEndpoint,
        emit: EventSink,
        timeouts: TimeoutPolicy | None = None,
        attempts: int = 3,
        owned: frozenset[int] | None = None,
    ) -> None:
        load_pyvisa()  # a missing extra is one line when the switch is built, not at its first command
        self.name = name
        self.space = space
        self.endpoint = endpoint
        self.timeouts = timeouts or TimeoutPolicy()
        self.attempts = attempts
        self.owned = owned
        self.identity: Identity | None = None
        self.reconnects = 0
        self._emit_sink = emit
        self._source = f"ocs:{name}"
        self._worker: Worker | None = None
        self._conn: ScpiConnection | None = None
        self._generation = 0
        self._recover_lock = asyncio.Lock()
        self._change_lock = asyncio.Lock()
        self._closed = True

    # -- events ----------------------------------------------------------------------------------------------
    # -- deadlines -------------------------------------------------------------------------------------------
    @contextlib.contextmanager
    def _until(self, seconds: float) -> Iterator[None]:
        token = _deadline.set(time.monotonic() + seconds)
        try:
            yield
        finally:
            _deadline.reset(token)

    @contextlib.asynccontextmanager
    async def _conversation(self) -> AsyncIterator[None]:
        """Each operation's wire reads wait at most until its deadline (the worker thread's socket timeout
        follows it)."""
        with self._until(self.timeouts.operation_s):
            yield

    def _wire_timeout(self) -> float:
        ends = _deadline.get()
        left = self.timeouts.operation_s if ends is None else ends - time.monotonic()
        return max(left, 0.0) + WIRE_SLACK_S

    # -- one wire command ------------------------------------------------------------------------------------
    async def _exchange(self, conn: ScpiConnection, command: str, *, reply: bool) -> str:
        """Write one command (and read its reply line if it is a query); time it and write `ocs.io`."""
        start = now_ns()
        try:
            if reply:
                text = await conn.query(command, self._wire_timeout())
            else:
                await conn.write(command, self._wire_timeout())
                text = ""
        except ScpiConnectionLost as e:
            end = now_ns()
            self._emit(Kind.OCS_IO, end - start, end, command=command, status="lost", error=str(e))
            raise
        except asyncio.CancelledError:
            end = now_ns()
            self._emit(Kind.OCS_IO, end - start, end, command=command, status="abandoned")
            raise
        end = now_ns()
        meta: dict[str, Any] = {"command": command, "status": "ok"}
        if reply:
            meta["reply"] = text[:REPLY_CHARS_IN_EVENTS]
        self._emit(Kind.OCS_IO, end - start, end, **meta)
        return text

    def _parsed(self, conn: ScpiConnection, command: str, text: str, parse: Callable[[str], T]) -> T:
        """A reply the query cannot return means replies and queries may no longer pair up: the session
        is ended (the caller's loss policy opens a new one)."""
        try:
            return parse(text)
        except ScpiError as e:
            conn.abort(str(e))
            raise ScpiConnectionLost(f"{self.name}: {command}: {e}") from None

    async def _query(self, conn: ScpiConnection, command: str, parse: Callable[[str], T]) -> T:
        return self._parsed(conn, command, await self._exchange(conn, command, reply=True), parse)

    async def _call(self, command: str, parse: Callable[[str], T], *, idempotent: bool) -> T:
        """One query with the loss policy: a session found ended before sending is re-established first;
        one lost while the query was out is re-established (reconnect, `*IDN?`, re-read the connections)
        and then the query is asked again if it only reads, or reported as lost (`*OPC?`: its wait is not
        the new session's), so the caller decides from the re-read state."""
        return await self._under_loss_policy(
            command,
            lambda conn: self._query(conn, command, parse),
            ScpiConnectionLost,
            idempotent=idempotent,
            not_sent=ScpiNotSent,
        )

    async def _change(self, command: str) -> None:
        """One change command and `SYST:ERR?` until the queue is empty, with nothing else of ours between
        them. Errors → ScpiCommandError (the switch did not make the change). A session lost after the
        command went out leaves the change unknown: reconnect, re-read, and raise, so that `converge`
        decides from the read-back."""

        async def change(conn: ScpiConnection) -> list[DeviceError]:
            async with self._change_lock:
                await self._exchange(conn, command, reply=False)
                try:
                    return await self._drain_errors(conn)
                except ScpiNotSent as e:  # SYST:ERR? found the session gone, after the change went out
                    raise ScpiConnectionLost(str(e)) from None  # so the change's fate is unknown

        errors = await self._under_loss_policy(
            command, change, ScpiConnectionLost, idempotent=False, not_sent=ScpiNotSent
        )
        if errors:
            raise ScpiCommandError(self.name, command, errors)

    async def _drain_errors(self, conn: ScpiConnection) -> list[DeviceError]:
        errors: list[DeviceError] = []
        for _ in range(ERROR_QUEUE_DEPTH):
            entry = await self._query(conn, ERROR_QUERY, parse_error)
            if entry.ok:
                return errors
            errors.append(entry)
        errors.append(DeviceError(-350, f"Queue overflow;still not empty after {ERROR_QUEUE_DEPTH} reads"))
        return errors

    def _require_conn(self) -> ScpiConnection:
        if self._closed or self._conn is None:
            raise HardwareError(f"{self.name}: not connected")
        return self._conn

    # -- session -------------------------------------------------------------------------------------------
    async def _open(self) -> None:
        """Open the resource, `*IDN?` (the size must be the inventory's), `*CLS` (errors queued by earlier
        sessions are not ours)."""
        assert self._worker is not None
        conn = ScpiConnection(self.name, self.endpoint.host, self.endpoint.port, self._worker)
        await conn.open(min(self.timeouts.connect_s, self._wire_timeout()))
        try:
            identity = await self._query(conn, IDENTITY_QUERY, parse_identity)
            if identity.space is None:
                raise HardwareError(
                    f"switch {self.name}: *IDN? product code {identity.model!r} has no -<in>x<out>- size; "
                    "cannot check it against the inventory"
                )
            if identity.space != self.space:
                raise InputError(
                    f"switch {self.name}: the inventory says {self.space} but the switch reports "
                    f"{identity.space} ({identity.model})"
                )
            await self._exchange(conn, CLEAR_STATUS, reply=False)
        except BaseException:
            await conn.close()
            raise
        if self._closed:  # close() ran while we were (re)connecting: this session must not outlive it
            await conn.close()
            raise ScpiConnectionLost(f"{self.name}: driver closed while connecting")
        old, self._conn = self._conn, conn
        self.identity = identity
        self._generation += 1
        if old is not None:
            await old.close()

    async def _recover(self, generation: int, reason: str) -> Mapping | None:
        """Open a new session and re-read the connections; once per lost session, however many commands
        noticed it. Bounded by connect_s and by the caller's deadline."""
        async with self._recover_lock:
            if self._generation != generation or self._closed:
                return None
            await self._reopen(self._open, ScpiConnectionLost, reason, "session")
            conn = self._require_conn()
            try:
                patches = await self._query(conn, CONNECTIONS_QUERY, parse_connections)
            except ScpiConnectionLost as e:  # the next command finds the session lost and starts again
                self._emit(Kind.OCS_SESSION, "reconnected", patches=None, error=str(e))
                return None
            self._emit(Kind.OCS_SESSION, "reconnected", patches=len(patches))
            self._emit(Kind.OCS_READ, len(patches), patches=sorted(patches), after="reconnect")
            return patches

    async def connect(self) -> None:
        if not self._closed:
            return
        self._closed = False
        self._worker = Worker(f"scpi:{self.name}")
        try:
            async with self.timeouts.deadline(self.name, "connect", self.timeouts.connect_s):
                with self._until(self.timeouts.connect_s):
                    await self._open()
        except BaseException:
            self._closed = True
            await self._release()
            raise
        assert self.identity is not None
        self._emit(
            Kind.OCS_SESSION,
            "connected",
            host=self.endpoint.host,
            port=self.endpoint.port,
            identity=str(self.identity),
        )

    async def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        await self._release()
        self._emit(Kind.OCS_SESSION, "closed")

    async def _release(self) -> None:
        conn, self._conn = self._conn, None
        worker, self._worker = self._worker, None
        if conn is not None:
            await conn.close()
        if worker is not None:
            await worker.stop()

    # -- OpticalSwitch ---------------------------------------------------------------------------------------
    async def _read(self) -> Mapping:
        patches = await self._call(CONNECTIONS_QUERY, parse_connections, idempotent=True)
        for ingress, egress in patches:
            if ingress not in self.space.all_ports or egress not in self.space.all_ports:
                raise ScpiError(
                    f"{self.name}: {CONNECTIONS_QUERY} reports a port outside {self.space}: "
                    f"({ingress}, {egress})"
                )
        return patches

    async def _send(self, diff: MappingDiff) -> None:
        """CONN:SUB the pairs that go, CONN:ADD the new ones (each checked with SYST:ERR?), then `*OPC?`:
        it answers once the mirrors have settled, so the change completes when the light has moved."""
        for command in connection_commands("SUB", diff.remove):
            await self._change(command)
        for command in connection_commands("ADD", diff.add):
            await self._change(command)
        await self._call(OPERATION_COMPLETE_QUERY, parse_operation_complete, idempotent=False)

    async def port_power(self, ports: Iterable[int]) -> Timed[dict[int, float | None]]:
        wanted = check_ports(self.name, self.space, ports)

        async def read() -> dict[int, float | None]:
            powers: dict[int, float | None] = {}
            for chunk, command in power_queries(wanted):
                powers.update(
                    await self._call(command, functools.partial(_power, ports=chunk), idempotent=True)
                )
            return powers

        result = await self._timed(":PMON:POW?", read)
        self._emit_powers(result.value, result.end_ns)
        return result

    # -- beyond the OpticalSwitch ----------------------------------------------------------------------------
    async def identify(self) -> Timed[Identity]:
        """`*IDN?` now (the identity read at connect is `identity`)."""
        return await self._timed(
            IDENTITY_QUERY, lambda: self._call(IDENTITY_QUERY, parse_identity, idempotent=True)
        )


def _power(reply: str, *, ports: Sequence[int]) -> dict[int, float | None]:
    return parse_power(reply, ports)
