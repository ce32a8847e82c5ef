"""Polatis NETCONF driver: `PolatisNetconfSwitch`, an `OpticalSwitch` over one ncclient SSH session.

Hello and capability check (the optical-switch module revision decides `pair` vs `pairs`), the switch size
from `product-information`, cross-connects read with a subtree filter, one `edit-config` per change through
`labctl.ocs.protocol.converge`, port power from `opm-power`, enable/disable with `port-set-state`, the
variable optical attenuators (`voa`: `set_attenuation`, `set_voa`, `read_voa`), the power monitors'
wavelength (`opm-config`), RFC 5277 notifications (`subscribe`, `notifications()`), `rpc-error` as one
line with its error-tag, timing and `ocs.*` events. A session that lost a request (its deadline passed, a
reply made no sense, the connection dropped) is replaced before the next request: NETCONF answers in order
(RFC 6241 §4.5), so a request still pending would hold up every later one. Layers: codec.py (the XML),
connection.py (ncclient on its own thread), this module (the switch). Decision: docs/decisions/0031.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncGenerator, Iterable, Sequence
from typing import Any, TypeVar

from labctl.core.clock import now_ns
from labctl.core.errors import HardwareError, InputError
from labctl.core.events import Kind
from labctl.inventory.config import Secret, SecretRef
from labctl.inventory.mapping import Mapping, MappingDiff, PortSpace
from labctl.ocs.protocol import (
    OCS_VOA,
    EventSink,
    Timed,
    TimeoutPolicy,
    VerifiedSwitch,
    check_attenuation,
    check_owned,
    check_ports,
)

from . import codec
from .codec import (
    NetconfReplyError,
    NetconfRpcError,
    Notification,
    OpmPort,
    ProductInformation,
    Reply,
    VoaPort,
)
from .connection import (
    Endpoint,
    HostKeyPolicy,
    HostKeyRefused,
    NetconfConnection,
    NetconfConnectionLost,
    NetconfLoginRefused,
    log,
)

T = TypeVar("T")

__all__ = [
    "HostKeyRefused",
    "NetconfConnectionLost",
    "NetconfLoginRefused",
    "NetconfReplyError",
    "NetconfRpcError",
    "Notification",
    "OpmPort",
    "PolatisNetconfSwitch",
    "VoaPort",
]

NOTIFICATION_QUEUE = 1024
"""Notifications held for `notifications()` before the oldest is dropped (and counted)."""


class PolatisNetconfSwitch(VerifiedSwitch):
    """A Polatis switch over NETCONF. Satisfies `OpticalSwitch`; every call returns a `Timed` result and
    writes events (`ocs.io` per RPC, `ocs.session`, `ocs.report`, `ocs.read`, `rx_power`, and the
    `ocs.command`/`ocs.complete`/`ocs.error` of `converge`)."""

    read_operation = "get cross-connects"
    held_noun = "cross-connects"

    def __init__(
        self,
        name: str,
        space: PortSpace,
        *,
        endpoint: Endpoint,
        user: str,
        password: SecretRef | Secret | None,
        host_keys: HostKeyPolicy,
        emit: EventSink,
        timeouts: TimeoutPolicy | None = None,
        attempts: int = 3,
        owned: frozenset[int] | None = None,
    ) -> None:
        self.name = name
        self.space = space
        self.endpoint = endpoint
        self.user = user
        self.host_keys = host_keys
        self.timeouts = timeouts or TimeoutPolicy()
        self.attempts = attempts
        self.owned = owned
        self.revision = ""
        self.list_name = "pair"
        self.product = ProductInformation()
        self.reconnects = 0
        self._password = password
        self._emit_sink = emit
        self._source = f"ocs:{name}"
        self._conn: NetconfConnection | None = None
        self._generation = 0
        self._recover_lock = asyncio.Lock()
        self._closed = True
        self.subscribed: str | None = None
        """The notification stream this driver subscribed to (renewed on every new session); None: none."""
        self.notifications_dropped = 0
        self._notes: asyncio.Queue[Notification | None] = asyncio.Queue(NOTIFICATION_QUEUE)

    # -- events ---------------------------------------------------------------------------------------------

    def _apply_meta(self) -> dict[str, Any]:
        return {"driver": "polatis-netconf", "revision": self.revision}

    def _on_message(self, kind: str, raw: str) -> None:
        """What no request waits for: a notification (`ocs.report`), a reply that came after its request was
        abandoned or anything else (`ocs.session`)."""
        if kind == "notification":
            try:
                note = codec.parse_notification(raw)
            except NetconfReplyError:
                log.debug("unparsable notification")
                self._emit(Kind.OCS_REPORT, _notification_name(raw), text=raw[:2000])
                return
            self._emit(
                Kind.OCS_REPORT,
                note.name,
                text=raw[:2000],
                event_time=note.event_time,
                fields={k: v[:500] for k, v in list(note.fields.items())[:32]},
            )
            self._queue_note(note)
        else:
            self._emit(Kind.OCS_SESSION, kind, text=raw[:500])

    def _queue_note(self, note: Notification | None) -> None:
        """Hand a notification (None: the end) to `notifications()`; when full, the oldest goes (counted)."""
        if self._notes.full():
            dropped = self._notes.get_nowait()
            if dropped is not None:
                self.notifications_dropped += 1
        self._notes.put_nowait(note)

    # -- one RPC --------------------------------------------------------------------------------------------
    async def _exchange(self, conn: NetconfConnection, operation: str, body: str) -> Reply:
        """One `<rpc>` on `conn`: time it, write `ocs.io`, raise `NetconfRpcError` on `<rpc-error>`. A request
        abandoned (its deadline) or answered with nonsense leaves the session marked broken."""
        message_id = conn.next_message_id()
        start = now_ns()
        try:
            raw = await conn.request(message_id, codec.rpc(message_id, body))
            reply = codec.parse_reply(raw)
            if reply.message_id != message_id:
                raise NetconfReplyError(f"reply to message-id {reply.message_id!r}, expected {message_id!r}")
        except asyncio.CancelledError:
            conn.broken(f"{operation} (message-id {message_id}) abandoned at its deadline")
            self._io(operation, message_id, start, "abandoned")
            raise
        except NetconfReplyError as e:
            conn.broken(str(e))
            self._io(operation, message_id, start, "bad-reply", error=str(e))
            raise NetconfConnectionLost(f"{self.name}: {operation}: {e}") from None
        except NetconfConnectionLost as e:
            self._io(operation, message_id, start, "lost", error=str(e))
            raise
        tags = [e.tag for e in reply.errors]
        status = "rpc-error" if reply.errors else ("ok" if reply.ok else "data")
        self._io(operation, message_id, start, status, **({"error_tags": tags} if tags else {}))
        if reply.errors:
            raise NetconfRpcError(self.name, operation, reply.errors)
        return reply

    def _io(self, operation: str, message_id: str, start_ns: int, status: str, **meta: Any) -> None:
        end = now_ns()
        self._emit(
            Kind.OCS_IO, end - start_ns, end, rpc=operation, message_id=message_id, status=status, **meta
        )

    async def _rpc(self, operation: str, body: str, *, idempotent: bool) -> Reply:
        """One RPC with the loss policy: a session found broken before sending is replaced first; one lost
        while the request was out is replaced (reconnect, hello, re-read the cross-connects), and then the
        request is repeated if it only reads, or reported as lost if it changes the switch, so that the
        caller (converge) decides from the re-read state."""
        return await self._under_loss_policy(
            operation,
            lambda conn: self._exchange(conn, operation, body),
            NetconfConnectionLost,
            idempotent=idempotent,
        )

    def _require_conn(self) -> NetconfConnection:
        if self._closed or self._conn is None:
            raise HardwareError(f"{self.name}: not connected")
        return self._conn

    # -- session --------------------------------------------------------------------------------------------
    def _secret(self) -> str:
        if isinstance(self._password, SecretRef):
            return self._password.resolve(f"switch {self.name}").reveal()
        return self._password.reveal() if isinstance(self._password, Secret) else ""

    async def _open(self) -> None:
        """SSH (host key checked), hello, capability check, product information and size."""
        conn = NetconfConnection(self.name, self._on_message)
        try:
            await conn.open(self.endpoint, self.user, self._secret(), self.host_keys, self.timeouts.connect_s)
            revision = self._check_capabilities(conn.capabilities)
            reply = await self._exchange(conn, "get product-information", codec.get(codec.product_filter()))
            product = codec.parse_product(reply.data)
        except BaseException:
            await conn.close()
            raise
        size = codec.size_from_model(product.model_name)
        if size is not None and size != self.space:
            await conn.close()
            raise InputError(
                f"switch {self.name}: the inventory says {self.space} but the switch reports {size}"
            )
        if self._closed:  # close() ran while we were (re)connecting: this session must not outlive it
            await conn.close()
            raise NetconfConnectionLost(f"{self.name}: driver closed while connecting")
        self.revision, self.list_name, self.product = revision, codec.list_name(revision), product
        old, self._conn = self._conn, conn
        self._generation += 1
        if old is not None:
            await old.close()

    def _check_capabilities(self, capabilities: Sequence[str]) -> str:
        if codec.CAP_BASE_10 not in capabilities and codec.CAP_BASE_11 not in capabilities:
            raise HardwareError(f"{self.name}: the server's hello names no NETCONF base capability")
        if codec.CAP_WRITABLE_RUNNING not in capabilities:
            raise HardwareError(
                f"{self.name}: the switch does not advertise :writable-running; cross-connects are edited on "
                "running"
            )
        revision = codec.module_revision(capabilities)
        if revision is None:
            raise HardwareError(
                f"{self.name}: not a Polatis optical switch: its hello advertises no {codec.NS_OPSW} module"
            )
        return revision

    async def _recover(self, generation: int, reason: str) -> Mapping | None:
        """Replace a lost session and re-read the cross-connects; once per loss, however many requests
        noticed it. Bounded by the caller's deadline (and by connect_s)."""
        async with self._recover_lock:
            if self._generation != generation or self._closed:
                return None
            await self._reopen(self._open, NetconfConnectionLost, reason, "session")
            assert self._conn is not None
            if self.subscribed is not None:  # a subscription lives as long as its session (RFC 5277)
                await self._exchange(
                    self._conn, "create-subscription", codec.create_subscription(self.subscribed)
                )
                self._emit(Kind.OCS_SESSION, "subscribed", stream=self.subscribed, after="reconnect")
            patches = await self._read_on(self._conn)
            self._emit(Kind.OCS_SESSION, "reconnected", patches=len(patches))
            self._emit(Kind.OCS_READ, len(patches), patches=sorted(patches), after="reconnect")
            return patches

    async def connect(self) -> None:
        if not self._closed:
            return
        self._closed = False
        try:
            async with self.timeouts.deadline(self.name, "connect", self.timeouts.connect_s):
                await self._open()
        except BaseException:
            self._closed = True
            conn, self._conn = self._conn, None
            if conn is not None:
                await conn.close()
            raise
        assert self._conn is not None
        self._emit(
            Kind.OCS_SESSION,
            "connected",
            host=self.endpoint.host,
            port=self.endpoint.port,
            session_id=self._conn.session_id,
            base=self._conn.base,
            revision=self.revision,
            model=self.product.model_name,
        )

    async def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        self._queue_note(None)  # ends every `notifications()` iterator
        conn, self._conn = self._conn, None
        if conn is None:
            return
        with contextlib.suppress(HardwareError):
            await conn.close(
                lambda message_id: codec.rpc(message_id, codec.close_session()),
                timeout_s=min(1.0, self.timeouts.operation_s),
            )
        self._emit(Kind.OCS_SESSION, "closed")

    # -- OpticalSwitch --------------------------------------------------------------------------------------
    async def _read_on(self, conn: NetconfConnection) -> Mapping:
        reply = await self._exchange(conn, "get cross-connects", codec.get(codec.cross_connects_filter()))
        return self._checked(codec.parse_cross_connects(reply.data))

    async def _read(self) -> Mapping:
        reply = await self._rpc(
            "get cross-connects", codec.get(codec.cross_connects_filter()), idempotent=True
        )
        return self._checked(codec.parse_cross_connects(reply.data))

    def _checked(self, patches: Mapping) -> Mapping:
        for ingress, egress in patches:
            if ingress not in self.space.all_ports or egress not in self.space.all_ports:
                raise NetconfReplyError(
                    f"{self.name}: cross-connects name a port outside {self.space}: ({ingress}, {egress})"
                )
        return patches

    async def _send(self, diff: MappingDiff) -> None:
        """The whole diff as one edit-config: delete the removed pairs, merge the new ones."""
        await self._rpc("edit-config", codec.edit_config(diff, self.list_name), idempotent=False)

    async def port_power(self, ports: Iterable[int]) -> Timed[dict[int, float | None]]:
        wanted = check_ports(self.name, self.space, ports)

        async def read() -> dict[int, float | None]:
            reply = await self._rpc(
                "get opm-power", codec.get(codec.opm_power_filter(wanted)), idempotent=True
            )
            powers = codec.parse_opm_power(reply.data)
            return {p: powers.get(p) for p in wanted}

        result = await self._timed("get opm-power", read)
        self._emit_powers(result.value, result.end_ns)
        return result

    # -- beyond OpticalSwitch: port admin state, product information ----------------------------------------
    async def set_port_state(self, *, enable: Iterable[int] = (), disable: Iterable[int] = ()) -> Timed[None]:
        """`port-set-state`: enable (let light through) and disable ports, in one RPC."""
        on, off = sorted(set(enable)), sorted(set(disable))
        both = set(on) & set(off)
        if both:
            raise InputError(f"{self.name}: port(s) {sorted(both)} both enabled and disabled")
        check_ports(self.name, self.space, on + off)
        check_owned(self.name, self.owned, on + off, "port-set-state")

        async def run() -> None:
            await self._rpc("port-set-state", codec.port_set_state(on, off), idempotent=True)

        return await self._timed("port-set-state", run)

    async def enable_ports(self, ports: Iterable[int]) -> Timed[None]:
        return await self.set_port_state(enable=ports)

    async def disable_ports(self, ports: Iterable[int]) -> Timed[None]:
        return await self.set_port_state(disable=ports)

    async def port_states(self, ports: Iterable[int]) -> Timed[dict[int, str]]:
        """`port-config/port/status` per port: ENABLED, DISABLED, FAILED or UNSUPPORTED (also if absent)."""
        wanted = check_ports(self.name, self.space, ports)

        async def read() -> dict[int, str]:
            reply = await self._rpc(
                "get port-config", codec.get(codec.port_status_filter(wanted)), idempotent=True
            )
            states = codec.parse_port_status(reply.data)
            return {p: states.get(p, "UNSUPPORTED") for p in wanted}

        return await self._timed("get port-config", read)

    # -- beyond OpticalSwitch: variable optical attenuators (VariableAttenuator) ---------------------------
    async def set_voa(
        self, ports: Iterable[int], mode: str, level: float | None = None, *, reference: int = 0
    ) -> Timed[None]:
        """One edit-config setting each egress port's attenuator: `atten-mode` (codec.VOA_MODES), with its
        `atten-level` (dBm for ABSOLUTE/CONVERGED, dB for RELATIVE) and, for RELATIVE, `reference-port`
        (0: the ingress patched to it). Writes an `ocs.voa` event per port."""
        wanted = check_ports(self.name, self.space, ports)
        ingress = [p for p in wanted if not self.space.is_egress(p)]
        if ingress:
            raise InputError(
                f"{self.name}: port(s) {ingress} are ingress ports; attenuators sit on egress ports"
            )
        check_owned(self.name, self.owned, wanted, "the attenuation")
        try:
            body = codec.voa_edit(wanted, mode, level, reference)
        except ValueError as e:
            raise InputError(f"{self.name}: {e}") from None

        async def run() -> None:
            await self._rpc("edit-config voa", body, idempotent=True)

        result = await self._timed("edit-config voa", run)
        relative = mode == "VOA_MODE_RELATIVE" and reference == 0
        value = 0.0 if mode == "VOA_MODE_NONE" else level if relative else None
        for port in wanted:
            self._emit(OCS_VOA, value, result.end_ns, port=port, mode=mode, level=level, reference=reference)
        return result

    async def set_attenuation(self, ports: Iterable[int], atten_db: float) -> Timed[None]:
        """Attenuate each egress port's light `atten_db` dB below what its patch brings (VOA_MODE_RELATIVE
        to the patched ingress; 0 dB: VOA_MODE_NONE)."""
        wanted = check_attenuation(self.name, self.space, ports, atten_db)
        if atten_db == 0:
            return await self.set_voa(wanted, "VOA_MODE_NONE")
        return await self.set_voa(wanted, "VOA_MODE_RELATIVE", atten_db)

    async def read_voa(self, ports: Iterable[int]) -> Timed[dict[int, VoaPort]]:
        """Each port's `voa/port` entry (VOA_MODE_NONE where the switch lists none)."""
        wanted = check_ports(self.name, self.space, ports)

        async def read() -> dict[int, VoaPort]:
            reply = await self._rpc("get voa", codec.get(codec.voa_filter(wanted)), idempotent=True)
            settings = codec.parse_voa(reply.data)
            return {p: settings.get(p, VoaPort()) for p in wanted}

        return await self._timed("get voa", read)

    async def read_attenuation(self, ports: Iterable[int]) -> Timed[dict[int, float | None]]:
        result = await self.read_voa(ports)
        return Timed({p: v.attenuation_db for p, v in result.value.items()}, result.start_ns, result.end_ns)

    # -- beyond OpticalSwitch: power monitor settings -------------------------------------------------------
    async def set_opm_config(
        self,
        ports: Iterable[int],
        *,
        wavelength_nm: float | None = None,
        offset_db: float | None = None,
        averaging_time: int | None = None,
    ) -> Timed[None]:
        """One edit-config of the ports' `opm-config` (only the leaves given; the YANG's ranges: 1260-1640
        nm, ±100 dB, averaging-time 1..8)."""
        wanted = check_ports(self.name, self.space, ports)
        check_owned(self.name, self.owned, wanted, "opm-config")
        if wavelength_nm is not None and not 1260.0 <= wavelength_nm <= 1640.0:
            raise InputError(f"{self.name}: wavelength {wavelength_nm:g} nm is outside 1260..1640")
        if offset_db is not None and not -100.0 <= offset_db <= 100.0:
            raise InputError(f"{self.name}: offset {offset_db:g} dB is outside -100..100")
        if averaging_time is not None and not 1 <= averaging_time <= 8:
            raise InputError(f"{self.name}: averaging-time {averaging_time} is outside 1..8")
        body = codec.opm_config_edit(
            wanted, wavelength_nm=wavelength_nm, offset_db=offset_db, averaging_time=averaging_time
        )

        async def run() -> None:
            await self._rpc("edit-config opm-config", body, idempotent=True)

        return await self._timed("edit-config opm-config", run)

    async def set_opm_wavelength(self, ports: Iterable[int], wavelength_nm: float) -> Timed[None]:
        """The wavelength the ports' power monitors are calibrated for (nm)."""
        return await self.set_opm_config(ports, wavelength_nm=wavelength_nm)

    async def read_opm_config(self, ports: Iterable[int]) -> Timed[dict[int, OpmPort]]:
        wanted = check_ports(self.name, self.space, ports)

        async def read() -> dict[int, OpmPort]:
            reply = await self._rpc(
                "get opm-config", codec.get(codec.opm_config_filter(wanted)), idempotent=True
            )
            configs = codec.parse_opm_config(reply.data)
            return {p: configs.get(p, OpmPort()) for p in wanted}

        return await self._timed("get opm-config", read)

    # -- beyond OpticalSwitch: notifications (RFC 5277) -----------------------------------------------------
    async def subscribe(self, stream: str = "Polatis") -> Timed[None]:
        """`create-subscription` on `stream` (Polatis sends on "Polatis"): from now on each notification is an
        `ocs.report` event and an item of `notifications()`. Renewed on every replacement session; a
        notification sent while the session was being replaced is lost (no replay)."""
        conn = self._require_conn()
        if codec.CAP_NOTIFICATION not in conn.capabilities:
            raise HardwareError(f"{self.name}: the switch does not advertise :notification (RFC 5277)")
        if self.subscribed is not None:
            raise InputError(f"{self.name}: already subscribed to {self.subscribed!r}")

        async def run() -> None:
            await self._rpc("create-subscription", codec.create_subscription(stream), idempotent=False)

        result = await self._timed("create-subscription", run)
        self.subscribed = stream
        self._emit(Kind.OCS_SESSION, "subscribed", result.end_ns, stream=stream)
        return result

    async def notifications(self) -> AsyncGenerator[Notification, None]:
        """The notifications of the subscription, in arrival order, until the driver closes (one consumer;
        at most NOTIFICATION_QUEUE held, the oldest dropped beyond that and counted in
        `notifications_dropped`)."""
        while True:
            note = await self._notes.get()
            if note is None:
                return
            yield note

    async def product_information(self) -> Timed[ProductInformation]:
        async def read() -> ProductInformation:
            reply = await self._rpc(
                "get product-information", codec.get(codec.product_filter()), idempotent=True
            )
            return codec.parse_product(reply.data)

        return await self._timed("get product-information", read)


def _notification_name(raw: str) -> str:
    """The event's element name (the child of <notification> after eventTime), for `ocs.report`."""
    try:
        root = codec.parse_xml(raw, "notification")
    except NetconfReplyError:
        log.debug("unparsable notification")
        return "notification"
    for child in root:
        name = child.tag.rsplit("}", 1)[-1]
        if name != "eventTime":
            return name
    return "notification"
