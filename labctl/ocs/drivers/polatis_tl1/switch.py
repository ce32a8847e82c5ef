"""Polatis TL1 driver: `PolatisTl1Switch`, an `OpticalSwitch` over the TL1 transport and codec.

Login, commands, apply-with-verify through `labctl.ocs.protocol.converge`, reconnect after a lost connection,
keep-alive, timing and `ocs.*` events. Layers (like scrapli's driver → channel → transport): codec.py
(bytes ↔ messages), connection.py (one TCP stream, ctag matching), this module (the switch). Decisions:
docs/decisions/0007 (framing and ctag matching), 0008 (pipelining, the emulated lab).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
from collections.abc import Awaitable, Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

from labctl.core.clock import now_ns
from labctl.core.errors import HardwareError, InputError
from labctl.core.events import Kind
from labctl.inventory.config import Secret, SecretRef
from labctl.inventory.mapping import Mapping, MappingDiff, PortSpace
from labctl.ocs.connect_errors import ConnectFailed, format_address
from labctl.ocs.protocol import (
    OCS_VOA,
    EventSink,
    Timed,
    TimeoutPolicy,
    VerifiedSwitch,
    check_attenuation,
    check_owned,
    check_ports,
    refuse_crossing,
)

from . import DEFAULT_PORT
from .codec import (
    ERROR_CODES,
    Tl1Ack,
    Tl1Autonomous,
    Tl1Command,
    Tl1Error,
    Tl1Message,
    Tl1Response,
    format_ports,
    parse_attenuation,
    parse_patches,
    parse_port_values,
    parse_power,
    parse_size,
)
from .connection import Tl1Connection, Tl1ConnectionLost, log

T = TypeVar("T")

MAX_PORTS_PER_COMMAND = 64  # keeps AIDs short; a DLT-PATCH list longer than this is split


class Tl1LoginRefused(ConnectFailed):
    """The switch refused ACT-USER (wrong user or password). Not retried: another try is refused too."""

    def __init__(self, switch: str, address: str, user: str, code: str | None) -> None:
        self.code = code
        super().__init__(
            switch,
            address,
            f"authentication failed for user {user!r} (wrong user or password: the switch answered "
            f"{code or 'DENY'})",
        )


class Tl1Deny(HardwareError):
    """The switch refused a command (`M <ctag> DENY`). Carries the error code and the command (redacted)."""

    def __init__(self, switch: str, command: str, code: str | None, comments: Sequence[str] = ()) -> None:
        self.switch = switch
        self.command = command
        self.code = code
        self.comments = tuple(comments)
        meaning = ERROR_CODES.get(code or "")
        text = f"{switch}: {command} denied: {code or 'no error code'}"
        if meaning:
            text += f" ({meaning})"
        if self.comments:
            text += " — " + "; ".join(self.comments)
        super().__init__(text)


@dataclass(frozen=True)
class Tl1Endpoint:
    host: str
    port: int = DEFAULT_PORT


class PolatisTl1Switch(VerifiedSwitch):
    """A Polatis switch over TL1. Satisfies `OpticalSwitch`; every call returns a `Timed` result and
    writes events (`ocs.io` per command, `ocs.session`, `ocs.report`, `ocs.read`, `rx_power`, and the
    `ocs.command`/`ocs.complete`/`ocs.error` of `converge`)."""

    read_operation = "RTRV-PATCH"
    lost_noun = "connection"

    def _apply_meta(self) -> dict[str, Any]:
        return {"driver": "polatis-tl1", "pipeline_depth": self.pipeline_depth}

    def __init__(
        self,
        name: str,
        space: PortSpace,
        *,
        endpoint: Tl1Endpoint,
        user: str,
        password: SecretRef | Secret | None,
        emit: EventSink,
        timeouts: TimeoutPolicy | None = None,
        pipeline_depth: int = 16,
        keepalive_s: float | None = 20.0,
        attempts: int = 3,
        owned: frozenset[int] | None = None,
    ) -> None:
        if pipeline_depth < 1:
            raise ValueError("pipeline_depth must be at least 1")
        self.name = name
        self.space = space
        self.endpoint = endpoint
        self.user = user
        self.timeouts = timeouts or TimeoutPolicy()
        self.pipeline_depth = pipeline_depth
        self.keepalive_s = keepalive_s
        self.attempts = attempts
        self.owned = owned
        self.sid: str = ""
        self.reconnects = 0
        self._password = password
        self._secret: Secret | None = None
        self._emit_sink = emit
        self._source = f"ocs:{name}"
        self._conn: Tl1Connection | None = None
        self._generation = 0
        self._recover_lock = asyncio.Lock()
        self._keepalive_task: asyncio.Task[None] | None = None
        self._last_io_ns = 0
        self._closed = True

    # -- events ----------------------------------------------------------------------------------------------
    def _scrub(self, text: str) -> str:
        """Never let the password through, even if a switch echoed it back in a comment."""
        if self._secret is not None and self._secret.reveal():
            text = text.replace(self._secret.reveal(), "********")
        return text

    def _on_message(self, message: Tl1Message) -> None:
        if isinstance(message, Tl1Autonomous):
            self._emit(
                Kind.OCS_REPORT,
                message.verb,
                alarm=message.alarm,
                atag=message.atag,
                lines=[self._scrub(x) for x in message.lines[:64]],
            )
        elif isinstance(message, Tl1Response):
            self._emit(Kind.OCS_SESSION, "unmatched-reply", ctag=message.ctag, status=message.status)
        elif isinstance(message, Tl1Ack):
            self._emit(Kind.OCS_SESSION, "ack", ctag=message.ctag, code=message.code)
        else:
            self._emit(Kind.OCS_SESSION, "noise", text=self._scrub(message.text))

    # -- one command ---------------------------------------------------------------------------------------
    async def _exchange(self, conn: Tl1Connection, command: Tl1Command) -> Tl1Response:
        """Send one command on `conn`, await its reply; time it, write `ocs.io`, raise `Tl1Deny` on DENY."""
        start = now_ns()
        try:
            response = await conn.request(command)
        except Tl1ConnectionLost as e:
            end = now_ns()
            self._emit(
                Kind.OCS_IO,
                end - start,
                end,
                command=str(command),
                ctag=command.ctag,
                status="lost",
                error=self._scrub(str(e)),
            )
            raise
        end = self._last_io_ns = now_ns()
        self._emit(
            Kind.OCS_IO,
            end - start,
            end,
            command=str(command),
            ctag=command.ctag,
            status=response.status,
            code=response.error_code,
        )
        if response.status == "DENY":
            raise Tl1Deny(
                self.name, str(command), response.error_code, [self._scrub(c) for c in response.comments]
            )
        return response

    async def _call(
        self, verb: str, aid: str = "", blocks: tuple[str, ...] = ("",), *, idempotent: bool
    ) -> Tl1Response:
        """One command with the loss policy: a connection found dead before sending is re-established
        first; one lost while the command was in flight is re-established (reconnect, re-login, re-read
        the patches) and then the command is repeated if it only reads, or reported as lost if it changes
        the switch, so that the caller decides from the re-read state."""
        return await self._under_loss_policy(
            f"{verb}:{aid}" if aid else verb,
            lambda conn: self._exchange(conn, Tl1Command(verb, conn.next_ctag(), aid=aid, blocks=blocks)),
            Tl1ConnectionLost,
            idempotent=idempotent,
        )

    def _require_conn(self) -> Tl1Connection:
        if self._closed or self._conn is None:
            raise HardwareError(f"{self.name}: not connected")
        return self._conn

    # -- session -------------------------------------------------------------------------------------------
    async def _open(self) -> None:
        """TCP, ACT-USER, check the switch size against the inventory."""
        if self._secret is None and isinstance(self._password, SecretRef):
            self._secret = self._password.resolve(f"switch {self.name}")
        elif isinstance(self._password, Secret):
            self._secret = self._password
        conn = Tl1Connection(self.name, self._on_message)
        await conn.open(self.endpoint.host, self.endpoint.port)
        try:
            login = Tl1Command(
                "ACT-USER",
                conn.next_ctag(),
                aid=self.user,
                blocks=("", self._secret if self._secret is not None else ""),
            )
            try:
                reply = await self._exchange(conn, login)
            except Tl1Deny as e:  # a refused login: said as such, and not retried (it would be refused again)
                raise Tl1LoginRefused(
                    self.name, format_address(self.endpoint.host, self.endpoint.port), self.user, e.code
                ) from None
            self.sid = reply.sid
            size = parse_size((await self._exchange(conn, self._size_command(conn))).lines)
        except BaseException:
            await conn.close()
            raise
        if size != self.space:
            await conn.close()
            raise InputError(
                f"switch {self.name}: the inventory says {self.space} but the switch reports {size}"
            )
        if self._closed:  # close() ran while we were (re)connecting: this connection must not outlive it
            await conn.close()
            raise Tl1ConnectionLost(f"{self.name}: driver closed while connecting")
        old, self._conn = self._conn, conn
        self._generation += 1
        self._last_io_ns = now_ns()
        if old is not None:
            await old.close()

    @staticmethod
    def _size_command(conn: Tl1Connection) -> Tl1Command:
        return Tl1Command("RTRV-EQPT", conn.next_ctag(), aid="SYSTEM", blocks=("", "", "PARAMETER=SIZE"))

    async def _recover(self, generation: int, reason: str) -> Mapping | None:
        """Reconnect, log in again and re-read the patches; once per lost connection, however many
        commands noticed it. Bounded by the caller's deadline (and by connect_s)."""
        async with self._recover_lock:
            if self._generation != generation or self._closed:
                return None
            await self._reopen(self._open, Tl1ConnectionLost, reason, "connection")
            assert self._conn is not None
            patches = parse_patches((await self._exchange(self._conn, self._patch_command(self._conn))).lines)
            self._emit(Kind.OCS_SESSION, "reconnected", patches=len(patches))
            self._emit(Kind.OCS_READ, len(patches), patches=sorted(patches), after="reconnect")
            return patches

    @staticmethod
    def _patch_command(conn: Tl1Connection, aid: str = "") -> Tl1Command:
        return Tl1Command("RTRV-PATCH", conn.next_ctag(), aid=aid)

    async def connect(self) -> None:
        if not self._closed:
            return
        self._closed = False
        try:
            async with self.timeouts.deadline(self.name, "connect", self.timeouts.connect_s):
                await self._open()
        except BaseException:
            self._closed = True
            raise
        self._emit(
            Kind.OCS_SESSION, "connected", host=self.endpoint.host, port=self.endpoint.port, sid=self.sid
        )
        if self.keepalive_s:
            self._keepalive_task = asyncio.create_task(self._keepalive(), name=f"tl1-keepalive:{self.name}")

    async def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        task, self._keepalive_task = self._keepalive_task, None
        if task is not None:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
        conn, self._conn = self._conn, None
        if conn is None:
            return
        if conn.lost is None:
            with contextlib.suppress(HardwareError, TimeoutError):
                async with asyncio.timeout(min(1.0, self.timeouts.operation_s)):
                    await self._exchange(conn, Tl1Command("CANC-USER", conn.next_ctag(), aid=self.user))
        await conn.close()
        self._emit(Kind.OCS_SESSION, "closed")

    async def _keepalive(self) -> None:
        """RTRV-HDR whenever the session has been idle for `keepalive_s`, so that the switch's session
        timeout never logs us out; also notices a connection lost while idle and re-establishes it."""
        assert self.keepalive_s is not None
        period_ns = int(self.keepalive_s * 1e9)
        while True:
            idle_ns = now_ns() - self._last_io_ns
            await asyncio.sleep(max(period_ns - idle_ns, period_ns // 10) / 1e9)
            conn = self._conn
            if conn is None:
                return
            if conn.lost is None and now_ns() - self._last_io_ns < period_ns:
                continue
            try:
                async with self.timeouts.deadline(self.name, "keep-alive"):
                    await self._call("RTRV-HDR", idempotent=True)
            except (HardwareError, InputError) as e:
                log.warning("%s: keep-alive failed: %s", self.name, self._scrub(str(e)))
                self._emit(Kind.OCS_ERROR, self._scrub(f"keep-alive failed: {e}"))

    # -- OpticalSwitch ---------------------------------------------------------------------------------------
    async def _read(self) -> Mapping:
        reply = await self._call("RTRV-PATCH", idempotent=True)
        patches = parse_patches(reply.lines)
        for ingress, egress in patches:
            if ingress not in self.space.all_ports or egress not in self.space.all_ports:
                raise Tl1Error(
                    f"{self.name}: RTRV-PATCH reports port outside {self.space}: ({ingress}, {egress})"
                )
        return patches

    async def _each(self, calls: Sequence[Callable[[], Awaitable[T]]]) -> list[T]:
        """Run commands one at a time, or up to `pipeline_depth` in flight (distinct ctags). All finish
        before the first failure is raised, so nothing is left in flight."""
        if self.pipeline_depth == 1 or len(calls) == 1:
            return [await c() for c in calls]
        window = asyncio.Semaphore(self.pipeline_depth)

        async def one(call: Callable[[], Awaitable[T]]) -> T:
            async with window:
                return await call()

        results = await asyncio.gather(*(one(c) for c in calls), return_exceptions=True)
        for r in results:
            if isinstance(r, BaseException):
                raise r
        return results  # type: ignore[return-value]

    async def _send(self, diff: MappingDiff) -> None:
        """DLT-PATCH the ingress ends of the patches that go (one `&` list per 64 ports), then ENT-PATCH
        each new pair (bulk ENT-PATCH is unverified on real firmware, §1.2)."""
        removals = sorted(ingress for ingress, _ in diff.remove)
        for i in range(0, len(removals), MAX_PORTS_PER_COMMAND):
            chunk = format_ports(removals[i : i + MAX_PORTS_PER_COMMAND])
            await self._call("DLT-PATCH", chunk, idempotent=False)
        adds = sorted(diff.add)
        await self._each(
            [functools.partial(self._call, "ENT-PATCH", f"{i},{e}", idempotent=False) for i, e in adds]
        )

    async def port_power(self, ports: Iterable[int]) -> Timed[dict[int, float | None]]:
        wanted = sorted(set(ports))
        self._check_ports(wanted)

        async def read() -> dict[int, float | None]:
            powers = parse_power(
                (await self._call("RTRV-PORT-POWER", format_ports(wanted), idempotent=True)).lines
            )
            return {p: powers.get(p) for p in wanted}

        result = await self._timed("RTRV-PORT-POWER", read)
        self._emit_powers(result.value, result.end_ns)
        return result

    # -- variable optical attenuators (VariableAttenuator) ---------------------------------------------------
    async def set_attenuation(self, ports: Iterable[int], atten_db: float) -> Timed[None]:
        """SET-PORT-ATTEN: each egress port's light `atten_db` dB below what its patch brings (MODE=RELATIVE
        to the patched ingress; 0 dB: MODE=NONE). Writes an `ocs.voa` event per port."""
        wanted = check_attenuation(self.name, self.space, ports, atten_db)
        check_owned(self.name, self.owned, wanted, "the attenuation")
        params = "MODE=NONE" if atten_db == 0 else f"MODE=RELATIVE,LEVEL={atten_db:.2f}"

        async def run() -> None:
            await self._call("SET-PORT-ATTEN", format_ports(wanted), ("", "", params), idempotent=True)

        result = await self._timed("SET-PORT-ATTEN", run)
        mode = "VOA_MODE_NONE" if atten_db == 0 else "VOA_MODE_RELATIVE"
        for port in wanted:
            self._emit(OCS_VOA, float(atten_db), result.end_ns, port=port, mode=mode, level=atten_db)
        return result

    async def read_attenuation(self, ports: Iterable[int]) -> Timed[dict[int, float | None]]:
        """RTRV-PORT-ATTEN: dB below each egress port's patched light (None: a setting of another kind)."""
        wanted = check_attenuation(self.name, self.space, ports, 0.0)

        async def read() -> dict[int, float | None]:
            reply = await self._call("RTRV-PORT-ATTEN", format_ports(wanted), idempotent=True)
            levels = parse_attenuation(reply.lines)
            return {p: levels.get(p, 0.0) for p in wanted}

        return await self._timed("RTRV-PORT-ATTEN", read)

    # -- the rest of the TL1 command set ---------------------------------------------------------------------
    def _check_ports(self, ports: Sequence[int]) -> None:
        check_ports(self.name, self.space, ports)

    async def retrieve_patches(self, ports: Iterable[int] | None = None) -> Timed[Mapping]:
        """RTRV-PATCH, optionally only the patches touching `ports`."""
        aid = ""
        if ports is not None:
            wanted = sorted(set(ports))
            self._check_ports(wanted)
            aid = format_ports(wanted)
        return await self._timed(
            "RTRV-PATCH",
            lambda: self._parsed("RTRV-PATCH", aid, parse_patches),
        )

    async def _parsed(
        self, verb: str, aid: str, parse: Callable[[Sequence[str]], T], blocks: tuple[str, ...] = ("",)
    ) -> T:
        return parse((await self._call(verb, aid, blocks, idempotent=True)).lines)

    async def delete_patches(self, ports: Iterable[int] | str) -> Timed[None]:
        """DLT-PATCH on ports (an `&`/`&&` list) or "ALL". Bypasses apply-with-verify: prefer `disconnect`."""
        if isinstance(ports, str):
            if ports.upper() != "ALL":
                raise InputError(f"{self.name}: DLT-PATCH takes ports or ALL, not {ports!r}")
            if self.owned is not None:
                raise InputError(
                    f"{self.name}: DLT-PATCH ALL on a shared switch would remove other labs' patches"
                )
            aid = "ALL"
        else:
            wanted = sorted(set(ports))
            self._check_ports(wanted)
            check_owned(self.name, self.owned, wanted, "DLT-PATCH")
            aid = format_ports(wanted)

        async def run() -> None:
            if self.owned is not None:
                # DLT-PATCH on an owned port also removes its patch to a foreign port (another lab's patch
                # too): read what the named ports hold and refuse as `converge` does. The whole table, as
                # `converge` reads it, rather than trusting how the firmware filters RTRV-PATCH by port.
                # (Another lab could still patch in between; the switch has no compare-and-delete.)
                named = set(wanted)
                held = [p for p in await self._read() if named & set(p)]
                refuse_crossing(self.name, held, self.owned)
            await self._call("DLT-PATCH", aid, idempotent=False)

        return await self._timed("DLT-PATCH", run)

    async def enter_patch(self, ingress: int, egress: int) -> Timed[None]:
        """One ENT-PATCH. Bypasses apply-with-verify: prefer `apply`."""
        self._check_ports([ingress, egress])
        check_owned(self.name, self.owned, [ingress, egress], "ENT-PATCH")

        async def run() -> None:
            await self._call("ENT-PATCH", f"{ingress},{egress}", idempotent=False)

        return await self._timed("ENT-PATCH", run)

    async def _shutter(self, verb: str, ports: Iterable[int]) -> Timed[None]:
        wanted = sorted(set(ports))
        self._check_ports(wanted)

        async def run() -> None:
            await self._call(verb, format_ports(wanted), idempotent=True)

        return await self._timed(verb, run)

    async def close_shutters(self, ports: Iterable[int]) -> Timed[None]:
        """OPR-PORT-SHUTTER: block light on the ports."""
        return await self._shutter("OPR-PORT-SHUTTER", ports)

    async def open_shutters(self, ports: Iterable[int]) -> Timed[None]:
        """RLS-PORT-SHUTTER: let light through again."""
        return await self._shutter("RLS-PORT-SHUTTER", ports)

    async def shutter_states(self, ports: Iterable[int]) -> Timed[dict[int, str]]:
        """RTRV-PORT-SHUTTER: the switch's state token per port (`OPEN`/`CLOSED` here; unverified, §1.4)."""
        wanted = sorted(set(ports))
        self._check_ports(wanted)
        return await self._timed(
            "RTRV-PORT-SHUTTER",
            lambda: self._parsed(
                "RTRV-PORT-SHUTTER",
                format_ports(wanted),
                lambda lines: {
                    p: v.upper() for p, v in parse_port_values(lines, "RTRV-PORT-SHUTTER").items()
                },
            ),
        )

    async def retrieve_size(self) -> Timed[PortSpace]:
        """RTRV-EQPT::SYSTEM:::PARAMETER=SIZE."""
        return await self._timed(
            "RTRV-EQPT", lambda: self._parsed("RTRV-EQPT", "SYSTEM", parse_size, ("", "", "PARAMETER=SIZE"))
        )

    async def retrieve_netype(self) -> Timed[tuple[str, ...]]:
        """RTRV-NETYPE: `vendor,model,type,version`."""

        def parse(lines: Sequence[str]) -> tuple[str, ...]:
            if not lines:
                raise Tl1Error(f"{self.name}: RTRV-NETYPE returned no line")
            return tuple(part.strip() for part in lines[0].split(","))

        return await self._timed("RTRV-NETYPE", lambda: self._parsed("RTRV-NETYPE", "", parse))

    async def retrieve_header(self) -> Timed[str]:
        """RTRV-HDR: the switch's SID (`( nil )` when it has no name)."""

        async def run() -> str:
            return (await self._call("RTRV-HDR", idempotent=True)).sid

        return await self._timed("RTRV-HDR", run)
