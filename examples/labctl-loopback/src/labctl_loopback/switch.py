"""The loopback driver: `LoopbackSwitch`, an `OpticalSwitch` over the transport and the codec."""

from __future__ import annotations

from collections.abc import Iterable

from labctl.core.clock import now_ns
from labctl.core.errors import HardwareError, InputError
from labctl.core.events import Kind
from labctl.inventory.mapping import Mapping, MappingDiff, PortSpace
from labctl.ocs.protocol import EventSink, Timed, TimeoutPolicy, VerifiedSwitch, check_ports

from . import codec
from .connection import LoopbackConnection


class LoopbackSwitch(VerifiedSwitch):
    read_operation = "PATCHES?"  # how a read-back's deadline error names it

    def __init__(
        self,
        name: str,
        space: PortSpace,
        connection: LoopbackConnection,
        emit: EventSink,
        timeouts: TimeoutPolicy | None = None,
        *,
        attempts: int = 3,
        owned: frozenset[int] | None = None,
    ) -> None:
        # What VerifiedSwitch reads: the switch's name and ports, the one deadline policy, how many
        # times `converge` may send, the ports this lab owns, and where events go.
        self.name = name
        self.space = space
        self.timeouts = timeouts or TimeoutPolicy()
        self.attempts = attempts
        self.owned = owned
        self.reconnects = 0
        self._generation = 0
        self._source = f"ocs:{name}"
        self._emit_sink = emit
        self._connection = connection
        self._connected = False

    # -- the session -------------------------------------------------------------------------------------
    async def connect(self) -> None:
        async with self.timeouts.deadline(self.name, "connect", self.timeouts.connect_s):
            size = codec.parse_size(await self._connection.request(codec.query_size()))
        if size != self.space:
            raise InputError(
                f"switch {self.name}: the inventory says {self.space} but the switch reports {size}"
            )
        self._connected = True
        self._emit(Kind.OCS_SESSION, "connected")

    async def close(self) -> None:
        if self._connected:
            self._connected = False
            self._emit(Kind.OCS_SESSION, "closed")

    def _require_conn(self) -> LoopbackConnection:
        if not self._connected:
            raise HardwareError(f"{self.name}: not connected")
        return self._connection

    async def _request(self, line: str) -> str:
        """One command: timed, recorded as an `ocs.io` event, a refusal raised as a HardwareError. (Where a
        session can be lost, this goes through `self._under_loss_policy`, as TL1's `_call` does.)"""
        start = now_ns()
        reply = await self._require_conn().request(line)
        end = now_ns()
        self._emit(Kind.OCS_IO, end - start, end, command=line, reply=reply)
        if reply.startswith("ERR"):
            raise HardwareError(f"{self.name}: {line} refused: {reply[4:]}")
        return reply

    # -- what VerifiedSwitch builds get_mapping, apply and disconnect on -----------------------------------
    async def _read(self) -> Mapping:
        return codec.parse_patches(await self._request(codec.query_patches()))

    async def _send(self, diff: MappingDiff) -> None:
        for ingress, _ in sorted(diff.remove):
            await self._request(codec.disconnect(ingress))
        for ingress, egress in sorted(diff.add):
            await self._request(codec.connect(ingress, egress))

    async def port_power(self, ports: Iterable[int]) -> Timed[dict[int, float | None]]:
        wanted = check_ports(self.name, self.space, ports)

        async def read() -> dict[int, float | None]:
            return {p: codec.parse_power(await self._request(codec.query_power(p))) for p in wanted}

        result = await self._timed("POWER?", read)
        self._emit_powers(result.value, result.end_ns)
        return result
