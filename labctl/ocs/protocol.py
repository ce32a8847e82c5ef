"""The `OpticalSwitch` capability, timed results, the one timeout policy, and apply-with-verify.

Every driver (labctl/ocs/drivers/sim, labctl/ocs/drivers/polatis_tl1, ...) satisfies `OpticalSwitch`. The
algorithm that moves a switch to a mapping lives here once: validate → diff against the switch's own
read-back → send only the changes → read back → retry a bounded number of times → raise with what still
differs.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable, Iterable
from contextlib import AbstractAsyncContextManager, asynccontextmanager, nullcontext
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import Any, Generic, Protocol, TypeVar, runtime_checkable

from labctl.core.clock import now_ns
from labctl.core.errors import HardwareError, InputError, MappingError, SwitchStateMismatch
from labctl.core.events import Event, Kind
from labctl.inventory.mapping import Mapping, MappingDiff, PortSpace, diff_mapping, ports_of, validate_mapping

__all__ = [  # the public surface (docs/architecture.md, "Public surface"); the rest is internal
    "ApplyResult",
    "EventSink",
    "OpticalSwitch",
    "SwitchOps",
    "Timed",
    "TimeoutPolicy",
    "VariableAttenuator",
    "VerifiedSwitch",
    "attenuator_of",
    "check_attenuation",
    "check_owned",
    "check_ports",
    "converge",
    "refuse_crossing",
    "send_mapping",
]

T = TypeVar("T")
EventSink = Callable[[Event], object]


@dataclass(frozen=True, slots=True)
class Timed(Generic[T]):
    """A driver call's result with when it started and ended on the run timebase."""

    value: T
    start_ns: int
    end_ns: int

    @property
    def elapsed_ns(self) -> int:
        return self.end_ns - self.start_ns


@dataclass(frozen=True, slots=True)
class ApplyResult:
    switch: str
    removed: frozenset[tuple[int, int]]
    added: frozenset[tuple[int, int]]
    mapping: Mapping
    """The switch's read-back after the change."""
    attempts: int
    command_ns: int | None = None
    """When the (first) change was sent; None when nothing had to change."""
    complete_ns: int | None = None
    """When the switch acknowledged the last change."""


@dataclass(frozen=True)
class TimeoutPolicy:
    """The single source of deadlines for a driver: connecting, and any one operation.

    An operation is everything the caller awaited (all commands, retries and read-backs of one `apply`);
    when its deadline passes the operation is abandoned and a HardwareError says which one and how long.
    """

    connect_s: float = 10.0
    operation_s: float = 10.0

    @asynccontextmanager
    async def deadline(
        self, switch: str, operation: str, seconds: float | None = None
    ) -> AsyncIterator[None]:
        import asyncio  # here, not at the top: loading an inventory (TimeoutPolicy) imports no asyncio

        limit = self.operation_s if seconds is None else seconds
        try:
            async with asyncio.timeout(limit):
                yield
        except TimeoutError:
            raise HardwareError(f"{switch}: {operation} did not finish within {limit:g} s") from None


@runtime_checkable
class OpticalSwitch(Protocol):
    """An optical circuit switch. Ports: ingress 1..N, egress N+1..N+M; light flows ingress → egress."""

    name: str
    space: PortSpace

    async def connect(self) -> None: ...

    async def close(self) -> None: ...

    async def get_mapping(self) -> Timed[Mapping]: ...

    async def apply(
        self,
        mapping: Iterable[tuple[int, int]],
        *,
        scope: Iterable[int] | None = None,
        context: dict[str, Any] | None = None,
    ) -> Timed[ApplyResult]:
        """Make every port in `scope` (default: the ports `mapping` names) as `mapping` says; verify."""
        ...

    async def disconnect(
        self, ports: Iterable[int], *, context: dict[str, Any] | None = None
    ) -> Timed[ApplyResult]: ...

    async def port_power(self, ports: Iterable[int]) -> Timed[dict[int, float | None]]:
        """Optical power (dBm) the switch measures at each port; None where there is no light."""
        ...


VOA_MODES = (
    "VOA_MODE_NONE",
    "VOA_MODE_RELATIVE",
    "VOA_MODE_ABSOLUTE",
    "VOA_MODE_CONVERGED",
    "VOA_MODE_MAXIMUM",
    "VOA_MODE_FIXED",
)
"""The Polatis optical-switch YANG's `voa/port/atten-mode` values (revision 2016-02-17 on): what the
NETCONF codec sends and the switch model holds."""

OCS_VOA = Kind.OCS_VOA
"""The event an attenuator change writes (value: the dB set, None for "no attenuation"; meta: port, mode,
level)."""


@runtime_checkable
class VariableAttenuator(Protocol):
    """A switch whose egress ports have variable optical attenuators (a Polatis VOA option): the light
    leaving an egress port is lowered by the dB set, relative to the light that reaches it through its
    patch. Every call returns a `Timed` result and writes an `ocs.voa` event per port set."""

    name: str
    space: PortSpace

    async def set_attenuation(self, ports: Iterable[int], atten_db: float) -> Timed[None]:
        """Attenuate each egress port's light by `atten_db` dB (0: no attenuation)."""
        ...

    async def read_attenuation(self, ports: Iterable[int]) -> Timed[dict[int, float | None]]:
        """Each port's attenuation in dB below its patched light (0.0: none); None where the attenuator
        is set another way (a target output power, maximum, fixed)."""
        ...


def attenuator_of(switch: object) -> VariableAttenuator | None:
    """The switch's attenuator capability, or None: the switch itself, or the driver inside a wrapper
    that serves its emulator (`labctl.ocs.switches.ServedSwitch.switch`)."""
    for candidate in (switch, getattr(switch, "switch", None)):
        if isinstance(candidate, VariableAttenuator):
            return candidate
    return None


def check_attenuation(name: str, space: PortSpace, ports: Iterable[int], atten_db: float) -> list[int]:
    """The egress ports of an attenuation request, sorted, or InputError (the same rule for every driver)."""
    wanted = check_ports(name, space, ports)
    ingress = [p for p in wanted if not space.is_egress(p)]
    if ingress:
        raise InputError(f"{name}: port(s) {ingress} are ingress ports; attenuators sit on egress ports")
    if not 0.0 <= atten_db <= 40.0:
        raise InputError(f"{name}: attenuation {atten_db:g} dB is outside 0..40 dB")
    return wanted


async def send_mapping(
    switch: OpticalSwitch,
    mapping: Iterable[tuple[int, int]],
    *,
    scope: Iterable[int] | None = None,
    context: dict[str, Any] | None = None,
    timeout_s: float | None = None,
) -> Timed[ApplyResult]:
    """The one place labctl sends a mapping to a switch: a run's rails (the controller), a replayed job's
    topology writes and its giant-ring fallback (labctl.workload), the scheduler's restore after a crash,
    and `labctl ocs`. The switch works the change out and verifies it (`converge`); `timeout_s` bounds
    the whole call, on top of the driver's own per-operation policy (`TimeoutPolicy`), where a caller has
    a deadline of its own. tests/unit/test_one_apply_path.py holds every other module to calling this."""
    import asyncio

    if timeout_s is None:
        return await switch.apply(mapping, scope=scope, context=context)
    async with asyncio.timeout(timeout_s):
        return await switch.apply(mapping, scope=scope, context=context)


def check_ports(switch: str, space: PortSpace, ports: Iterable[int]) -> list[int]:
    """The ports of a per-port query (power, shutters), sorted, or InputError: none given, or out of range.
    Every driver applies the same rule, so a caller gets the same answer from any switch."""
    wanted = sorted(set(ports))
    if not wanted:
        raise InputError(f"{switch}: no ports given")
    bad = [p for p in wanted if p not in space.all_ports]
    if bad:
        raise InputError(f"{switch}: ports {bad} are outside 1..{space.all_ports.stop - 1}")
    return wanted


@dataclass
class SwitchOps:
    """What a driver must provide for `converge` to move its switch: read the patches, send a diff."""

    read: Callable[[], Awaitable[Mapping]]
    send: Callable[[MappingDiff], Awaitable[None]]
    attempts: int = 3
    extra_meta: dict[str, Any] = field(default_factory=dict)
    owned: frozenset[int] | None = None
    """On a shared switch, the ports this lab owns: nothing outside them is ever patched or unpatched."""
    known: Mapping | None = None
    """What this session last verified the switch to hold (its previous apply's read-back): the first diff
    is taken against it instead of a read of its own. A change made behind our back since then makes a
    command fail or the read-back differ, and the retry diffs against what was read (decision 0050)."""


def check_owned(name: str, owned: frozenset[int] | None, ports: Iterable[int], what: str) -> None:
    if owned is None:
        return
    foreign = sorted(set(ports) - owned)
    if foreign:
        raise MappingError(f"{name}: {what} names port(s) {foreign} that this lab does not own")


def crossing_patches(patches: Iterable[tuple[int, int]], owned: frozenset[int]) -> list[tuple[int, int]]:
    """The patches joining an owned port to a foreign one, sorted. Such a patch is another lab's as much as
    ours: neither lab may remove it (`converge`, the TL1 driver's DLT-PATCH) and `labctl lab check` fails
    while one exists. The one definition all three use."""
    return sorted(p for p in patches if len(set(p) & owned) == 1)


def refuse_crossing(name: str, patches: Iterable[tuple[int, int]], owned: frozenset[int] | None) -> None:
    """HardwareError if removing `patches` would remove one that crosses into another lab's ports."""
    crossing = [] if owned is None else crossing_patches(patches, owned)
    if crossing:
        raise HardwareError(
            f"{name}: patch(es) {crossing} join owned ports to ports of another lab; refusing to remove "
            "them (free the foreign end first)"
        )


YIELD_ABOVE_PORTS = 64
"""A change of more ports than this gives the loop a turn before its diff and before its read-back (each
is then a millisecond or more of Python); a smaller one goes straight through: each loop turn costs
whatever samplers are due (a replay's control path is counted in turns, decision 0050)."""

command_not_before: ContextVar[int | None] = ContextVar("command_not_before", default=None)
"""Set by a caller that announced a change for a moment (the agents lab's world feed, decision 0041): the
first command of an apply in this context goes out at that moment, not before, and t0 is stamped then."""


async def _not_before(t_ns: int | None) -> None:
    """Until t_ns, to within microseconds: the loop's timers wake up to a millisecond late, so sleep to
    1.2 ms short of it and spin the rest (once per announced apply)."""
    if t_ns is None:
        return
    coarse = (t_ns - now_ns() - 1_200_000) / 1e9
    if coarse > 0:
        import asyncio

        await asyncio.sleep(coarse)
    while now_ns() < t_ns:
        pass


async def converge(
    name: str,
    space: PortSpace,
    ops: SwitchOps,
    mapping: Iterable[tuple[int, int]],
    scope: Iterable[int] | None,
    emit: EventSink,
    context: dict[str, Any] | None = None,
) -> ApplyResult:
    """Apply-with-verify, shared by every driver. Emits `ocs.command`, `ocs.complete`, `ocs.error`."""
    import asyncio

    desired = validate_mapping(mapping, space, switch=name)
    scope_ports = ports_of(desired) | set(scope or ())
    ports = space.all_ports  # a property making a range: not once per port (hundreds, before every t0)
    outside = sorted(p for p in scope_ports if p not in ports)
    if outside:
        raise MappingError(
            f"{name}: port(s) {outside} out of range 1..{space.all_ports.stop - 1} ({space} switch)"
        )
    check_owned(name, ops.owned, scope_ports, "the change")
    source = f"ocs:{name}"
    meta_base = {**(context or {}), **ops.extra_meta}
    # Validating hundreds of patches takes a millisecond or two of loop time: let samplers due now run
    # before the command goes out (t0 is stamped when it does). A few dozen take microseconds: no turn.
    large = len(scope_ports) > YIELD_ABOVE_PORTS
    if large:
        await asyncio.sleep(0)
    current = ops.known if ops.known is not None else await ops.read()
    first_diff = diff_mapping(current, desired, scope_ports)
    if ops.known is not None and first_diff.empty:
        # Nothing to send by what we last verified: only a read can say nothing changed since.
        current = await ops.read()
        first_diff = diff_mapping(current, desired, scope_ports)
    command_ns: int | None = None
    complete_ns: int | None = None
    diff = first_diff
    attempts = 0
    failed: HardwareError | None = None  # the last command's failure, if it failed
    while not diff.empty and attempts < ops.attempts:
        # Every diff, not only the first: another lab may patch into one of our ports while our change is
        # in flight (the switch then refuses ours), and the retry's read-back must not "repair" that away.
        try:
            refuse_crossing(name, diff.remove, ops.owned)
        except HardwareError as e:
            if attempts:  # commands were sent: the record says why this apply ends here
                emit(Event(t_ns=now_ns(), kind=Kind.OCS_ERROR, source=source, value=str(e), meta=meta_base))
            raise
        attempts += 1
        meta = {
            **meta_base,
            "attempt": attempts,
            "remove": sorted(diff.remove),
            "add": sorted(diff.add),
        }
        not_before = command_not_before.get()
        await _not_before(not_before)
        t_cmd = now_ns()
        if not_before is not None and attempts == 1:
            # The announced moment is when the model's switch moves: a busy loop sends the command after it,
            # and the record says by how much (the switch phase and the marks after t0 read short by it).
            meta["late_ns"] = t_cmd - not_before
        command_ns = command_ns or t_cmd
        emit(
            Event(
                t_ns=t_cmd,
                kind=Kind.OCS_COMMAND,
                source=source,
                value=len(diff.remove) + len(diff.add),
                meta=meta,
            )
        )
        failed = None
        try:
            await ops.send(diff)
        except HardwareError as e:
            emit(Event(t_ns=now_ns(), kind=Kind.OCS_ERROR, source=source, value=str(e), meta=meta))
            failed = e
        else:
            complete_ns = now_ns()
            emit(
                Event(
                    t_ns=complete_ns,
                    kind=Kind.OCS_COMPLETE,
                    source=source,
                    value=complete_ns - t_cmd,
                    meta=meta,
                )
            )
        if large:
            await asyncio.sleep(0)  # the read-back and diff of hundreds of patches: after samplers due now
        try:
            current = await ops.read()
        except HardwareError:
            if failed is not None and attempts == ops.attempts:
                raise failed from None  # the last command's own failure says most
            raise
        diff = diff_mapping(current, desired, scope_ports)
    # A last command that failed (a connection lost with it in flight) may still have taken effect: the
    # read-back decides, so a switch verified to hold the mapping is a success, not that failure.
    if not diff.empty and failed is not None:
        raise failed
    if not diff.empty:
        in_scope = {p for p in current if p[0] in scope_ports or p[1] in scope_ports}
        err = SwitchStateMismatch(name, set(desired - current), set(in_scope - desired))
        emit(Event(t_ns=now_ns(), kind=Kind.OCS_ERROR, source=source, value=str(err), meta=meta_base))
        raise err
    return ApplyResult(
        switch=name,
        removed=first_diff.remove,
        added=first_diff.add,
        mapping=current,
        attempts=attempts,
        command_ns=command_ns,
        complete_ns=complete_ns,
    )


class VerifiedSwitch:
    """The `OpticalSwitch` methods every protocol driver writes alike, over its own wire read and send.

    A driver (TL1, NETCONF, SCPI, serial) sets `name`, `space`, `timeouts`, `attempts`, `owned`,
    `_source` and `_emit_sink` and implements `_read` (the switch's patches, off the wire) and `_send` (one
    diff), plus `_require_conn` (raise unless connected) and `port_power`; `get_mapping`, `apply` and
    `disconnect` are then the same for all: one deadline per operation (`_timed`), apply-with-verify
    through `converge`, an `ocs.read` event per read-back. One shallow base, not a tree: a driver adds
    what its protocol needs beside it (`_apply_meta`, `_conversation`, `_read_for_apply`)."""

    name: str
    space: PortSpace
    timeouts: TimeoutPolicy
    attempts: int
    owned: frozenset[int] | None
    _source: str
    _emit_sink: EventSink
    reconnects: int
    _generation: int = 0
    """Counts sessions: a loss noticed by several callers is recovered once (`_recover` compares it)."""
    diff_from_verified = True
    """The first diff of an apply is taken against the last verified mapping, without a read of its own
    (a driver whose commands are worked out from its own read, as DiCon's, sets False)."""
    _verified: tuple[int, Mapping] | None = None
    """(session, patches) the last apply verified: the next apply in that session diffs against it."""
    read_operation = "read"
    """How the deadline's error names a read-back (the protocol's own word: RTRV-PATCH, *IDN?...)."""

    def _require_conn(self) -> object:
        raise NotImplementedError

    async def _read(self) -> Mapping:
        raise NotImplementedError

    async def _send(self, diff: MappingDiff) -> None:
        raise NotImplementedError

    def _apply_meta(self) -> dict[str, Any]:
        """What `ocs.command`/`ocs.complete` carry about the driver (its name, protocol settings)."""
        return {}

    lost_noun = "session"
    """What the protocol calls what can be lost (TL1: a connection), in loss errors."""
    held_noun = "patches"
    """What the switch holds (NETCONF: cross-connects), in loss errors."""

    async def _recover(self, generation: int, reason: str) -> Mapping | None:
        """Replace the lost session `generation` (once, however many callers noticed) and re-read the
        switch: its patches, or None if another caller had already recovered it."""
        raise NotImplementedError

    async def _under_loss_policy(
        self,
        what: str,
        exchange: Callable[[Any], Awaitable[T]],
        lost: type[HardwareError],
        *,
        idempotent: bool,
        not_sent: type[HardwareError] | None = None,
    ) -> T:
        """One wire exchange (`exchange(session)`) with the loss policy of every session-based driver: a
        session found lost before sending is replaced first; one lost while the request was out is replaced
        (reconnect, log in, re-read the switch), and then the request is repeated if it only reads
        (`idempotent`) or went out on nothing (`not_sent`), or reported as lost if it may have changed the
        switch, so that the caller (converge) decides from the re-read state."""
        for attempt in (1, 2):
            conn: Any = self._require_conn()
            generation = self._generation
            if conn.lost is not None:
                await self._recover(generation, conn.lost)
                continue
            try:
                return await exchange(conn)
            except lost as e:
                patches = await self._recover(generation, str(e))
                if (not_sent is not None and isinstance(e, not_sent)) or (idempotent and attempt == 1):
                    continue
                held = f"; it now holds {len(patches)} {self.held_noun}" if patches is not None else ""
                reason = str(e).removeprefix(f"{self.name}: ")
                raise lost(
                    f"{self.name}: {self.lost_noun} lost during {what} ({reason}); reconnected and re-read "
                    f"the switch{held}"
                ) from None
        raise lost(f"{self.name}: {self.lost_noun} lost twice during {what}")

    def _conversation(self) -> AbstractAsyncContextManager[object]:
        """Held around each operation (a serial line takes one conversation at a time)."""
        return nullcontext()

    async def _read_for_apply(self) -> Mapping:
        """The read-back `converge` diffs against (a driver may remember it to order its commands)."""
        return await self._read()

    def _emit(self, kind: str, value: Any, t_ns: int | None = None, **meta: Any) -> None:
        self._emit_sink(Event(t_ns=t_ns or now_ns(), kind=kind, source=self._source, value=value, meta=meta))

    def _scrub(self, text: str) -> str:
        """What may be logged of a message (a driver holding a password removes it; see TL1)."""
        return text

    async def _reopen(
        self, open_session: Callable[[], Awaitable[None]], lost: type[HardwareError], reason: str, what: str
    ) -> None:
        """After `what` was lost: an `ocs.session` lost event, then `open_session()` again with backoff
        (20 ms doubling to 1 s, a `reconnect-failed` event per failure, `lost` the failures it retries)
        until the policy's connect_s; then `lost`, saying so. Counts `reconnects`."""
        self._emit(Kind.OCS_SESSION, "lost", reason=self._scrub(reason))
        import asyncio

        delay_s = 0.02
        try:
            async with asyncio.timeout(self.timeouts.connect_s):
                while True:
                    try:
                        await open_session()
                        break
                    except lost as e:
                        self._emit(Kind.OCS_SESSION, "reconnect-failed", reason=self._scrub(str(e)))
                        await asyncio.sleep(delay_s)
                        delay_s = min(delay_s * 2, 1.0)
        except TimeoutError:
            raise lost(
                f"{self.name}: {what} lost ({self._scrub(reason)}) and not re-established within "
                f"{self.timeouts.connect_s:g} s"
            ) from None
        self.reconnects += 1

    def _emit_powers(self, powers: dict[int, float | None], t_ns: int, monitor: str = "switch") -> None:
        """One `rx_power` event per port read (None: no light, or nothing measured for `monitor: none`)."""
        for port, dbm in powers.items():
            self._emit_sink(
                Event(
                    t_ns=t_ns,
                    kind=Kind.RX_POWER,
                    source=f"{self._source}/{port}",
                    value=dbm,
                    meta={"monitor": monitor},
                )
            )

    async def _timed(self, operation: str, coro: Callable[[], Awaitable[T]]) -> Timed[T]:
        self._require_conn()
        start = now_ns()
        async with self.timeouts.deadline(self.name, operation), self._conversation():
            value = await coro()
        return Timed(value, start, now_ns())

    async def get_mapping(self) -> Timed[Mapping]:
        result = await self._timed(self.read_operation, self._read)
        self._verified = (self._generation, result.value)  # what it holds now: the next apply's base
        self._emit(
            Kind.OCS_READ,
            len(result.value),
            result.end_ns,
            patches=sorted(result.value),
            elapsed_ns=result.elapsed_ns,
        )
        return result

    async def apply(
        self,
        mapping: Iterable[tuple[int, int]],
        *,
        scope: Iterable[int] | None = None,
        context: dict[str, Any] | None = None,
    ) -> Timed[ApplyResult]:
        verified, self._verified = self._verified, None
        ops = SwitchOps(
            self._read_for_apply,
            self._send,
            attempts=self.attempts,
            extra_meta=self._apply_meta(),
            owned=self.owned,
            known=verified[1]
            if self.diff_from_verified and verified is not None and verified[0] == self._generation
            else None,
        )
        result = await self._timed(
            "apply", lambda: converge(self.name, self.space, ops, mapping, scope, self._emit_sink, context)
        )
        # Only a verified apply is remembered: one that failed or was cancelled leaves the next to read.
        self._verified = (self._generation, result.value.mapping)
        return result

    async def disconnect(
        self, ports: Iterable[int], *, context: dict[str, Any] | None = None
    ) -> Timed[ApplyResult]:
        return await self.apply((), scope=ports, context=context)
