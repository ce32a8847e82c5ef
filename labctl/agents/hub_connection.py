"""The controller's MQTT connection: one client for the hub's life, every message sent until acknowledged.

Reconnected after every outage; each message is handed to the client as soon as it is queued, sealed with
its host's key, and handed again after a failed publish or a reconnect until the broker acknowledges it.
`HubConnection` is a part of `labctl.agents.hub.AgentHub` (a mixin): the hub's `__init__` sets the state
named below, and the hub reads what comes in (`_on_message`) and counts each command sent
(`_count_send`, labctl.agents.hub_commands).
"""

from __future__ import annotations

import asyncio
import functools
import itertools
import logging
import os
import secrets
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import aiomqtt

from labctl.agents.broker import BrokerSettings, login_failure
from labctl.agents.wire import CONTROLLER, Rejected, Sealed, Signer, topic
from labctl.core.clock import now_ns
from labctl.inventory.schema import Inventory

log = logging.getLogger("labctl.agents")


@dataclass
class _Outgoing:
    topic: str
    body: Callable[[], bytes]  # built at send time, so a ping's t1 is stamped as it leaves
    # A request's caller gives up at its timeout: a command still unsent then (no broker) is dropped, so a
    # `start` the controller already reported as failed cannot reach an agent after a reconnect.
    expires_ns: int | None = None
    host: str | None = None  # whose key signs it (None: every host's, the world feed)
    cmd_id: int | None = None  # a command's id: each send of it may be answered once


_RESEND = _Outgoing("", lambda: b"")
"""Queued by a publish that failed: the sender hands everything unacknowledged to the client again."""
PENDING_PUBLISH_WARNING = 1000
"""aiomqtt warns ("There are N pending publish calls") past 10 publishes awaiting their PUBACK, a sign of a
leak in most clients. The hub's sender keeps every unacknowledged message in flight by design (a
reconfiguration's commands and world updates go out together, tens of messages): warn only past this."""


class HubConnection:
    """The hub's one MQTT client: connected, and reconnected, for the hub's life; every command and world
    update goes out in order, pipelined, and is retried across broker restarts until acknowledged."""

    inventory: Inventory
    broker: BrokerSettings
    lab: str
    signer: Signer
    reconnects: int
    expired_commands: int
    connected: asyncio.Event
    client_id: str | None
    _outgoing: asyncio.Queue[_Outgoing]
    _unacked: dict[int, _Outgoing]
    _keys: itertools.count[int]
    _publishing: set[asyncio.Task[None]]
    _client: aiomqtt.Client | None
    _last_error: aiomqtt.MqttError | None
    _refused: asyncio.Event
    _refusal: str | None

    if TYPE_CHECKING:

        def _on_message(self, topic_name: str, payload: Any, t_rx: int) -> None: ...
        def _count_send(self, item: _Outgoing) -> None: ...
        def resnapshot(self) -> None: ...

    @functools.cached_property
    def signers(self) -> dict[str, Signer]:
        """What signs the messages to each host and checks those from it: the host's own key with per-host
        identities (decision 0067), else the shared one. Read from the environment when first needed."""
        return {host: Signer(self.broker.key_for(host), CONTROLLER) for host in self.inventory.hosts}

    async def _connection(self) -> None:
        while True:
            try:
                # (A broker with `use_username_as_clientid` replaces it with the controller's user.)
                ident = self.client_id = f"labctl-controller-{self.lab}-{os.getpid()}-{secrets.token_hex(3)}"
                async with self.broker.client(ident) as client:
                    client.pending_calls_threshold = PENDING_PUBLISH_WARNING
                    for leaf in ("events", "reply", "status"):
                        await client.subscribe(topic(self.lab, "+", leaf), qos=1)
                    self._client = client
                    self._last_error = None
                    self.connected.set()
                    if self.reconnects:
                        self.resnapshot()  # what the agents' mirrors missed while we were away
                    async for message in client.messages:
                        t_rx = now_ns()
                        self._on_message(str(message.topic), message.payload, t_rx)
            except aiomqtt.MqttError as e:
                refusal = login_failure(self.broker, e)
                if refusal is not None:
                    self._refusal = refusal
                    self._refused.set()
                # Once per outage at warning level; the retries of a long outage only at debug.
                (log.debug if self._last_error is not None else log.warning)(
                    "controller: broker connection lost: %s", e
                )
                self._last_error = e
            else:
                self._last_error = None
            finally:
                self._client = None
                self.connected.clear()
            self.reconnects += 1
            await asyncio.sleep(0.2)

    async def _sender(self) -> None:
        """Commands and world updates go out in order and are retried across broker restarts.

        Pipelined: whatever is queued is handed to the client as soon as it is queued, without waiting for
        the PUBACKs of what went before. (Waiting for the previous batch's acknowledgements, as this did,
        held every light change behind a broker round trip, and behind a burst of commands several: the
        agents' mirrors, hence their sampled Rx power, lagged the model by ~5-15 ms on a loaded host.)
        What is not acknowledged stays in `_unacked`, in send order, and is handed to the client again
        when a publish fails or a new connection is up: the agent answers a repeated command id without
        acting twice, and world updates are states (a repeated one changes nothing)."""
        last_client: aiomqtt.Client | None = None
        while True:
            batch = [await self._outgoing.get()]
            while not self._outgoing.empty():
                batch.append(self._outgoing.get_nowait())
            resend = _RESEND in batch
            batch = [item for item in batch if item is not _RESEND]
            if resend:
                await asyncio.sleep(0.05)  # a failed publish: give the connection a moment to be seen gone
            while True:
                await self.connected.wait()
                client = self._client
                if client is not None:
                    break
                await asyncio.sleep(0.01)
            if resend or client is not last_client:
                # Everything the broker has not acknowledged goes again, first and in its order.
                batch = [*self._unacked.values(), *batch]
                self._unacked.clear()
            last_client = client
            for item in self._unexpired(batch):
                if item.cmd_id is not None:
                    self._count_send(item)
                key = next(self._keys)
                self._unacked[key] = item
                # Tasks start in order, and each hands its packet to the client on its first step.
                task = asyncio.create_task(self._publish(client, key, item), name="hub:publish")
                self._publishing.add(task)
                task.add_done_callback(self._publishing.discard)

    async def _publish(self, client: aiomqtt.Client, key: int, item: _Outgoing) -> None:
        try:
            await client.publish(item.topic, self._seal(item), qos=1, timeout=5)
        except aiomqtt.MqttError:
            if client is self._client:  # (a new connection already got everything unacknowledged)
                self._outgoing.put_nowait(_RESEND)
        else:
            self._unacked.pop(key, None)

    def _seal(self, item: _Outgoing) -> bytes:
        body = item.body()
        if item.host is not None:
            return self.signers[item.host].seal(item.topic, body)
        if self.broker.per_host:  # the world feed: one MAC per host, each agent checks its own
            return self.signer.seal_for(item.topic, body, self.signers)
        return self.signer.seal(item.topic, body)

    def _open(self, host: str, topic_name: str, payload: bytes) -> Sealed:
        """Check a message on `host`'s topics with the key of whoever it says signed it: the host's own
        (its messages), or, where another host's key checks it, that host posing as this one: forged."""
        mine = self.signers[host]
        claimed = Signer.peek(payload)
        if not mine.keyed:  # unsigned lab: who signed is only a claim, nothing can check it
            return claimed
        if claimed.signer == host:
            return mine.open_sealed(topic_name, payload)
        other = self.signers.get(claimed.signer)
        if other is not None and other.keyed:
            other.open_sealed(topic_name, payload)  # raises unless that host's key really signed it
            raise Rejected("forged", f"{claimed.signer} signed a message on {host}'s topic")
        raise Rejected("unauthorised", f"signed as {claimed.signer!r} on {host}'s topic")

    async def drain(self, timeout_s: float = 2.0) -> bool:
        """Until everything queued has been sent and acknowledged by the broker (or `timeout_s`): a clean
        stop leaves no publish in flight. False if something was still unacknowledged."""
        deadline = now_ns() + round(timeout_s * 1e9)
        while (not self._outgoing.empty() or self._unacked) and now_ns() < deadline:
            if not self.connected.is_set():
                break  # no broker: what is unsent stays unsent (counted by the agents' stream accounting)
            await asyncio.sleep(0.005)
        return self._outgoing.empty() and not self._unacked

    def _unexpired(self, batch: list[_Outgoing]) -> list[_Outgoing]:
        now = now_ns()
        keep = [item for item in batch if item.expires_ns is None or item.expires_ns > now]
        self.expired_commands += len(batch) - len(keep)
        return keep
