"""Commands to the agents and the replies that answer them (decision 0072).

Each command gets a random id; a reply is matched only against the commands sent to the host that
answers, and refused otherwise, saying why (`REFUSALS`). `CommandChannel` is a part of
`labctl.agents.hub.AgentHub` (a mixin): the hub's `__init__` sets the state named below; the commands go
out through its connection (labctl.agents.hub_connection).
"""

from __future__ import annotations

import asyncio
import secrets
from collections import Counter, OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import msgspec

from labctl.agents.hub_connection import _Outgoing
from labctl.agents.hub_streams import HostLink
from labctl.agents.wire import Command, Rejected, Reply, _enc, decode, topic
from labctl.core.clock import now_ns
from labctl.core.errors import HardwareError


@dataclass
class _Pending:
    """A command sent to one host and not answered yet."""

    op: str
    future: asyncio.Future[Reply] | None = None  # a request waiting for the reply (None: posted only)
    sends: int = 0  # handed to the client this often (a broker outage resends it): as many answers come
    t4: int = 0  # a ping's reply, stamped as it came off the socket


@dataclass
class _Answered:
    op: str
    duplicates_left: int  # answers still expected to the resends of the command


class RefusedReply(Rejected):
    """A reply that answers no command sent to the host that sent it; `refusal` says how (REFUSALS)."""

    def __init__(self, kind: str, refusal: str, reason: str) -> None:
        super().__init__(kind, reason)
        self.refusal = refusal


REFUSALS = {
    "forged": "the id of a command sent to another host",
    "unsolicited": "the id of no command sent",
    "replayed": "a command already answered (a stamp seen before, or a second answer to one sending)",
    "wrong_op": "another operation than the command's",
    "off_topic": "another host's signature, or another host named, on the replying host's topic",
    "unauthorised": "a signature that does not check",
    "malformed": "does not decode",
}
"""Why the controller refused a reply (run.json `agents.replies_refused`)."""


def refused_replies_line(agents: dict[str, Any]) -> str | None:
    """For the end of a run (run.json `agents`): the replies the controller refused, by reason; None if
    none. Each is an agent's answer to no command sent to it: a host answering for another, a replay."""
    refused = {reason: n for reason, n in (agents.get("replies_refused") or {}).items() if n}
    if not refused:
        return None
    total = sum(refused.values())
    reasons = ", ".join(f"{n} {reason}" for reason, n in refused.items())
    return (
        f"{total} agent repl{'y' if total == 1 else 'ies'} refused ({reasons}): an agent answered commands "
        "not sent to it; none was used (run.json agents.replies_refused)"
    )


_REFUSAL_OF_KIND = {"forged": "off_topic", "replayed": "replayed", "malformed": "malformed"}
MAX_PENDING = 4096
"""Commands per host kept waiting for their reply (replies that never came), and answered ids kept."""


class CommandChannel:
    """Sends commands to one host's agent (`post`, `request`) and matches the replies that come back."""

    lab: str
    links: dict[str, HostLink]
    replies_refused: Counter[str]
    duplicate_replies: int
    _pending: dict[str, dict[int, _Pending]]
    _answered: dict[str, OrderedDict[int, _Answered]]
    _outgoing: asyncio.Queue[_Outgoing]

    if TYPE_CHECKING:

        def _lost(self, link: HostLink, t_rx: int, reason: str) -> None: ...

    def post(
        self,
        host: str,
        op: str,
        args: dict[str, Any],
        stamp: Callable[[], dict[str, Any]] | None = None,
        expires_ns: int | None = None,
    ) -> int:
        return self._send_command(host, op, args, stamp, expires_ns)[0]

    def _send_command(
        self,
        host: str,
        op: str,
        args: dict[str, Any],
        stamp: Callable[[], dict[str, Any]] | None = None,
        expires_ns: int | None = None,
        future: asyncio.Future[Reply] | None = None,
    ) -> tuple[int, _Pending]:
        # Random per command (not a counter): a host sees the ids of its own commands only, and no id
        # of another host's follows from them (decision 0072); nor does an agent that outlives a run
        # answer a new run's command from its reply cache. Collisions at 63 bits: none in practice.
        cmd_id = secrets.randbits(63)
        pending = self._pending[host]
        sent = pending[cmd_id] = _Pending(op, future)
        while len(pending) > MAX_PENDING:  # replies that never came
            del pending[next(iter(pending))]

        def body() -> bytes:
            return _enc.encode(Command(id=cmd_id, op=op, args={**args, **(stamp() if stamp else {})}))

        self._outgoing.put_nowait(_Outgoing(topic(self.lab, host, "cmd"), body, expires_ns, host, cmd_id))
        return cmd_id, sent

    async def request(
        self, host: str, op: str, args: dict[str, Any], timeout_s: float = 10.0, *, check: bool = True
    ) -> Reply:
        """Send a command and wait for its reply; one the agent refused raises HardwareError with its
        error (`check`), or is returned as it came (`check=False`: the caller reads its `data`)."""
        fut: asyncio.Future[Reply] = asyncio.get_running_loop().create_future()
        self._send_command(host, op, args, expires_ns=now_ns() + round(timeout_s * 1e9), future=fut)
        try:
            reply = await asyncio.wait_for(fut, timeout_s)
        except TimeoutError:
            raise HardwareError(f"agent {host}: no reply to {op} within {timeout_s:g} s") from None
        if check and not reply.ok:
            raise HardwareError(f"agent {host}: {op} refused: {reply.error}")
        return reply

    def _count_send(self, item: _Outgoing) -> None:
        """One more answer may come to this command: an agent answers every copy it gets (acting once)."""
        assert item.host is not None and item.cmd_id is not None
        pending = self._pending[item.host].get(item.cmd_id)
        if pending is not None:
            pending.sends += 1
            return
        answered = self._answered[item.host].get(item.cmd_id)
        if answered is not None:  # answered already, sent again (its PUBACK was lost with the connection)
            answered.duplicates_left += 1

    def _on_reply(self, link: HostLink, body: bytes, t_rx: int) -> None:
        try:
            reply: Reply = decode(Reply, body)
        except msgspec.DecodeError as e:
            raise Rejected("malformed", f"reply: {e}") from None
        if reply.host != link.host:
            raise RefusedReply(
                "unauthorised", "off_topic", f"reply from {reply.host!r} on {link.host}'s topic"
            )
        if link.probes_running and link.incarnation is not None and reply.incarnation != link.incarnation:
            # A new agent process answering (its `online` may not have reached us yet): a restart.
            self._lost(link, t_rx if link.offline_since is None else link.offline_since, "restarted")
        pending = self._pending[link.host]
        sent = pending.get(reply.id)
        if sent is None:
            self._unmatched(link.host, reply)
            return
        if sent.op != reply.op:  # refused, and the command still waits for its own answer
            raise RefusedReply("forged", "wrong_op", f"a {reply.op} reply to a {sent.op} command")
        del pending[reply.id]
        answered = self._answered[link.host]
        answered[reply.id] = _Answered(reply.op, max(0, sent.sends - 1))
        while len(answered) > MAX_PENDING:
            answered.popitem(last=False)
        sent.t4 = t_rx  # (a ping's t4, stamped as the reply came off the socket)
        if sent.future is not None and not sent.future.done():
            sent.future.set_result(reply)

    def _unmatched(self, host: str, reply: Reply) -> None:
        """A reply to no command waiting on `host`: the expected answer to a command sent again, or
        refused, saying why."""
        answered = self._answered[host].get(reply.id)
        if answered is not None:
            if answered.op != reply.op:
                raise RefusedReply("forged", "wrong_op", f"a {reply.op} reply to a {answered.op} command")
            if answered.duplicates_left > 0:
                answered.duplicates_left -= 1
                self.duplicate_replies += 1
                return
            raise RefusedReply("replayed", "replayed", "a second reply to a command sent once")
        if any(
            reply.id in self._pending[other] or reply.id in self._answered[other]
            for other in self.links
            if other != host
        ):
            raise RefusedReply("forged", "forged", "a reply to a command sent to another host")
        raise RefusedReply("forged", "unsolicited", "a reply to no command sent")
