"""An agent host turned hostile, for tests of what the controller accepts (decision 0072).

`AdversarialAgent` holds one host's real credentials (its broker user and message key, nothing else) and
runs that host's probes honestly, so a run through it completes. Alongside, for every command it gets, it
tries what a compromised host could, all before its honest answer (they reach the controller in order,
on one topic, so every attempt is in before the run ends):

- answers another operation than the command's (`wrong_op`), before the honest answer;
- answers ids next to the ones it sees, which are other hosts' commands where ids count up
  (`unsolicited` where they are random), and ids the test says leaked (`leaked_ids`: `forged`);
- names another host as the replier on its own topic (`off_topic`);
- replays its own earlier replies, signed again and as they were (`replayed`);
- publishes on topics its ACL forbids: other hosts' replies, events and status, commands, the world feed
  (`off_acl`: the broker drops them, the controller never sees them).

`attempts` counts each by the reason the controller's `agents.replies_refused` should give; `off_acl` those
the broker should drop. Forged replies carry `forged_by` in their data, so a record holding one shows it.
"""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import Callable, Iterable
from typing import Any

import aiomqtt

from labctl.agents.agent import Agent
from labctl.agents.broker import BrokerSettings
from labctl.agents.wire import Batch, Command, Reply, _enc, topic, world_topic
from labctl.core.events import Event, Kind
from labctl.inventory.schema import Inventory

__all__ = ["AdversarialAgent"]

FAKE_COUNT = 1_000_000_000
"""The batch and event counts a forged start or stop reply claims: a stream that far ahead would make
every real batch of the host look like a duplicate, or all of them lost."""


class AdversarialAgent(Agent):
    """`host`'s agent, honest for its own host, hostile to every other (module docstring).

    `leaked_ids`: called at each command, (id, op) of commands sent to other hosts that the attacker
    learned somehow (a test's worst case; ids are random, so none follow from its own). `guesses`: ids on
    each side of a command's own that it answers."""

    def __init__(
        self,
        inventory: Inventory,
        host: str,
        broker: BrokerSettings,
        *,
        leaked_ids: Callable[[], Iterable[tuple[int, str]]] | None = None,
        guesses: int = 2,
        **kwargs: Any,
    ) -> None:
        super().__init__(inventory, host, broker, **kwargs)
        self.leaked_ids = leaked_ids
        self.guesses = guesses
        self.attempts: Counter[str] = Counter()
        """Forgeries that reach the controller, by the reason it should refuse them for."""
        self.off_acl: Counter[str] = Counter()
        """Publishes on topics this host's ACL forbids, by leaf (the broker drops them)."""
        self.others = [h for h in inventory.hosts if h != host]
        self._last_reply: tuple[bytes, bytes] | None = None  # (body, payload as published): to replay
        self._leaked_used: set[int] = set()

    async def _publish(self, topic_name: str, body: bytes, *, retain: bool = False) -> bool:
        """As the honest agent publishes; its replies kept, to replay later."""
        client = self._client
        if client is None:
            return False
        payload = self.signer.seal(topic_name, body)
        if topic_name == self._topics["reply"]:
            self._last_reply = (body, payload)
        try:
            await client.publish(topic_name, payload, qos=1, retain=retain, timeout=5)
        except aiomqtt.MqttError:
            return False
        return True

    async def _command(self, cmd: Command, t_rx: int) -> None:
        client = self._client
        if client is not None:
            self._attack(client, cmd)
        await super()._command(cmd, t_rx)

    def _forged(self, cmd_id: int, op: str, host: str | None = None) -> bytes:
        """A reply as damaging as its operation allows: a stream far ahead (start, stop), another clock
        responder (ping); marked as forged."""
        data: dict[str, Any] = {"forged_by": self.host}
        if op == "stop":
            data |= {"probes": {"forged_by": self.host}, "rejected": {"forged_by": self.host}}
        if op == "ping":
            data |= {"clock": {"boot_id": f"forged-by-{self.host}"}, "clock_udp": ["192.0.2.1", 9]}
        reply = Reply(
            host=host or self.host,
            id=cmd_id,
            op=op,
            ok=True,
            t2=0 if op == "ping" else None,
            t3=0 if op == "ping" else None,
            seq=FAKE_COUNT if op in ("start", "stop") else None,
            n=FAKE_COUNT if op in ("start", "stop") else None,
            data=data,
            incarnation=self.incarnation,
        )
        return _enc.encode(reply)

    def _attack(self, client: aiomqtt.Client, cmd: Command) -> None:
        """Every attempt, published before the honest answer to `cmd` (which follows them on the topic)."""
        reply_topic = self._topics["reply"]
        sent: list[tuple[str, bytes]] = []  # (reason, sealed payload)

        def forge(reason: str, body: bytes) -> None:
            sent.append((reason, self.signer.seal(reply_topic, body)))

        never_sent = "inspect" if cmd.op != "inspect" else "ping"
        forge("wrong_op", self._forged(cmd.id, never_sent))
        for k in range(1, self.guesses + 1):
            for guess in (cmd.id + k, cmd.id - k):
                forge("unsolicited", self._forged(guess, cmd.op))
        for cmd_id, op in list(self.leaked_ids() if self.leaked_ids is not None else ()):
            if cmd_id not in self._leaked_used:
                self._leaked_used.add(cmd_id)
                forge("forged", self._forged(cmd_id, op))
        if self.others:
            forge("off_topic", self._forged(cmd.id, cmd.op, host=self.others[0]))
        if self._last_reply is not None:
            body, payload = self._last_reply
            forge("replayed", body)  # signed again: a second answer to a command answered once
            sent.append(("replayed", payload))  # as it was: a stamp the controller has seen
        for reason, payload in sent:
            self._spawn(client, reply_topic, payload)
            self.attempts[reason] += 1
        if not self.off_acl:  # once: the broker's answer does not change
            self._off_acl(client, cmd)

    def _spawn(self, client: aiomqtt.Client, name: str, payload: bytes) -> None:
        """Publish without waiting for the broker's PUBACK (the honest agent's pace): tasks start in order
        and each hands its packet to the client on its first step, so the honest answer still comes last."""

        async def publish() -> bool:
            try:
                await client.publish(name, payload, qos=1, timeout=5)
            except aiomqtt.MqttError:
                return False
            return True

        task = asyncio.create_task(publish(), name=f"adversary:{self.host}")
        self._replying.add(task)  # awaited, or cancelled, when the agent stops
        task.add_done_callback(self._replying.discard)

    def _off_acl(self, client: aiomqtt.Client, cmd: Command) -> None:
        """Another host's replies, events and status, its commands, and the world feed: all refused by
        the broker's ACL (MQTT 3.1.1 has no way to say so: the PUBACK comes, nothing is delivered)."""
        lab = self.broker.lab
        for other in self.others:
            events = Batch(
                host=other,
                seq=0,
                n0=0,
                dropped=0,
                events=[Event(t_ns=0, source=f"nic:{other}/p0", host=other, kind=Kind.CARRIER)],
            )
            for leaf, body in (
                ("reply", self._forged(cmd.id, cmd.op, host=other)),
                ("events", _enc.encode(events)),
                ("status", f"offline forged-by-{self.host}".encode()),
                ("cmd", _enc.encode(Command(id=cmd.id, op="stop"))),
            ):
                name = topic(lab, other, leaf)
                self._spawn(client, name, self.signer.seal(name, body))
                self.off_acl[leaf] += 1
        name = world_topic(lab)
        self._spawn(client, name, self.signer.seal(name, b'{"items": []}'))
        self.off_acl["world"] += 1

    @property
    def forgeries(self) -> int:
        return sum(self.attempts.values())
