"""What every switch protocol emulator shares, so that a front end (TL1 today; NETCONF, SCPI, serial next)
only frames bytes into commands and commands into replies.

`SwitchEmulator` owns one `SwitchModel` (the same behaviour model the simulated lab lights NICs with), the
users it accepts, its client sessions over TCP (127.0.0.1 and an ephemeral port by default), one
`FaultPlan`, and the order in which commands from every session take effect. Changes are checked and
applied to the model one at a time; only the mirrors' movement overlaps, as on a real switch. Replies go
out when the model's mirrors have settled (the modeled switching time) plus any injected delay, with the
faults the plan asks for (drop the connection, drop it mid-reply, garbage bytes, lost state, refusals).
"""

from __future__ import annotations

import asyncio
import hmac
import random
from collections.abc import Mapping as MappingType
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from labctl.core.errors import InputError
from labctl.core.yamlio import load_yaml, pydantic_error_line
from labctl.inventory.mapping import MappingDiff
from labctl.models.switch import SwitchModel

MAX_INPUT = 64 * 1024  # bytes of unterminated input a session may buffer before it is hung up


class FaultPlan(BaseModel):
    """Fault injection. Command counts are server-wide (every session), counted from when the faults were
    set; the count-triggered faults fire once."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)

    drop_after_commands: int | None = Field(
        default=None,
        ge=1,
        le=2**31,
        description="close the connection on receiving the Nth command, without a reply",
    )
    drop_mid_reply_after_commands: int | None = Field(
        default=None, ge=1, le=2**31, description="send half of the reply to the Nth command, then close"
    )
    delay_ms: float = Field(default=0.0, ge=0, le=60_000, description="extra delay before every reply")
    deny_probability: float = Field(default=0.0, ge=0, le=1, description="refuse a command at random")
    deny_verbs: list[str] | None = Field(
        default=None, description="commands that may be refused (default: the protocol's patch changes)"
    )
    garbage_every: int | None = Field(
        default=None, ge=1, le=2**31, description="garbage bytes with every Nth reply"
    )
    garbage_position: Literal["between", "inside"] = Field(
        default="inside", description="before the reply (between messages) or inside its status line"
    )
    lose_state_after_commands: int | None = Field(
        default=None,
        ge=1,
        le=2**31,
        description="lose every patch (as after a reboot) on receiving the Nth command",
    )
    seed: int = Field(default=0, ge=0, le=2**63 - 1)


def load_faults(path: Path | str) -> FaultPlan:
    src = load_yaml(Path(path), "fault file")
    try:
        return FaultPlan.model_validate(src.data or {})
    except ValidationError as e:
        raise InputError(pydantic_error_line(src, e)) from None


@dataclass(eq=False)
class Session:
    """One client connection: who logged in, the replies still being delivered."""

    writer: asyncio.StreamWriter
    user: str | None = None
    replies: set[asyncio.Task[None]] = field(default_factory=set)
    closed: bool = False

    def write(self, data: bytes) -> None:
        if not self.closed and not self.writer.is_closing():
            self.writer.write(data)

    def abort(self) -> None:
        self.closed = True
        self.writer.transport.abort()


@dataclass(frozen=True)
class CommandFaults:
    """What the fault plan does to one command (decided when it arrives, in arrival order)."""

    drop: bool = False
    drop_mid_reply: bool = False
    garbage: bool = False


class SwitchEmulator:
    """The shared core; a front end implements `next_command` (framing) and `handle` (one command)."""

    change_verbs: frozenset[str] = frozenset()
    """Commands that change patches: the ones a fault plan refuses unless it names others."""
    max_input: int = MAX_INPUT
    """Bytes of one unfinished command a session may buffer before it is hung up."""

    def __init__(
        self,
        model: SwitchModel,
        *,
        users: MappingType[str, str],
        host: str = "127.0.0.1",
        port: int = 0,
        faults: FaultPlan | None = None,
        session_timeout_s: float | None = None,
    ) -> None:
        self.model = model
        self.host = host
        self.port = port
        self.session_timeout_s = session_timeout_s
        self._users = dict(users)
        self._server: asyncio.Server | None = None
        self._sessions: dict[Session, asyncio.Task[None]] = {}
        self.commands = 0
        self.sessions_opened = 0
        self._order = asyncio.Lock()
        self.set_faults(faults or FaultPlan())

    # -- lifecycle -------------------------------------------------------------------------------------------
    async def start(self) -> None:
        self._server = await asyncio.start_server(self._serve, self.host, self.port)
        self.port = self._server.sockets[0].getsockname()[1]

    @property
    def address(self) -> tuple[str, int]:
        return self.host, self.port

    async def close(self) -> None:
        server, self._server = self._server, None
        if server is not None:
            server.close()
        tasks = list(self._sessions.values())
        for session in list(self._sessions):
            session.abort()  # each session's read then ends and its handler finishes by itself
        if tasks:
            _, stuck = await asyncio.wait(tasks, timeout=1.0)
            for task in stuck:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
        if server is not None:
            await server.wait_closed()

    # -- users, faults, state (also the test API) ------------------------------------------------------------
    def add_user(self, user: str, password: str) -> None:
        self._users[user] = password

    def authenticate(self, user: str, password: str) -> bool | None:
        """True: accepted; False: wrong password; None: no such user. Constant-time on the password."""
        expected = self._users.get(user)
        if expected is None:
            return None
        return hmac.compare_digest(expected.encode(), password.encode())

    def set_faults(self, faults: FaultPlan) -> None:
        self.faults = faults
        self._fault_count = 0
        self.rng = random.Random(faults.seed)

    def lose_state(self) -> None:
        """As after a reboot: every patch gone, outputs dark."""
        self.model.cancel_pending()
        self.model.lose_state()

    @property
    def sessions(self) -> int:
        return len(self._sessions)

    @property
    def logged_in(self) -> list[Session]:
        return [s for s in self._sessions if s.user is not None]

    # -- what a front end implements -------------------------------------------------------------------------
    def next_command(self, buf: bytearray) -> str | None:
        """Take one complete command off the front of `buf` (None: not complete yet)."""
        raise NotImplementedError

    async def handle(self, session: Session, text: str) -> None:
        """Act on one command, inside `ordered()`; reply through `deliver()`."""
        raise NotImplementedError

    def frame(self, session: Session, buf: bytearray) -> str | None:
        """`next_command` for one session: a protocol whose framing changes within a session (NETCONF,
        after the hello) overrides this; the session loop calls it."""
        return self.next_command(buf)

    # -- what a front end calls ------------------------------------------------------------------------------
    def arrived(self) -> CommandFaults:
        """Count a command and decide what the fault plan does to it. Loses the state now if it says so."""
        self.commands += 1
        self._fault_count += 1
        n, plan = self._fault_count, self.faults
        if plan.lose_state_after_commands == n:
            self.lose_state()
        return CommandFaults(
            drop=plan.drop_after_commands == n,
            drop_mid_reply=plan.drop_mid_reply_after_commands == n,
            garbage=plan.garbage_every is not None and n % plan.garbage_every == 0,
        )

    def refuse(self, verb: str) -> bool:
        """The fault plan refuses this command (at its probability, if the verb is one it may refuse)."""
        plan = self.faults
        verbs = self.change_verbs if plan.deny_verbs is None else {v.upper() for v in plan.deny_verbs}
        return bool(plan.deny_probability) and verb in verbs and self.rng.random() < plan.deny_probability

    async def move(self, diff: MappingDiff) -> asyncio.Task[tuple[int, int]]:
        """Start the model's mirror move and return once it has taken the new patches, so the next command
        (from any session) is checked against them; the move itself completes in the background. Raises
        the model's ChangeRefused if it refused the change (nothing moved)."""
        started = asyncio.Event()

        async def run() -> tuple[int, int]:
            started.set()  # same step as execute()'s synchronous state change
            return await self.model.execute(diff)

        task = asyncio.create_task(run())
        await started.wait()
        if task.done():  # the model refused the change before anything moved (ChangeRefused)
            task.result()
        return task

    def expected_reply_s(self, moving: bool) -> float:
        """How long until a reply goes out: the injected delay, plus the slowest mirror if one moves."""
        return self.faults.delay_ms / 1000 + (self.model.profile.switching_ms[1] / 1000 if moving else 0)

    def deliver(
        self,
        session: Session,
        data: bytes,
        moving: asyncio.Task[tuple[int, int]] | None,
        faults: CommandFaults,
        *,
        garbage_at: int,
        forbidden: bytes,
    ) -> asyncio.Task[None]:
        """Send `data` once the mirrors have settled and the injected delay has passed, with the plan's
        faults: garbage bytes (none of `forbidden`, so noise cannot forge a message) at `garbage_at` or
        before the reply, or half the reply and a hang-up. Replies of one session may overlap; the job
        returned lets a front end whose protocol orders replies make the next one wait for it."""
        job = asyncio.create_task(self._deliver(session, data, moving, faults, garbage_at, forbidden))
        session.replies.add(job)
        job.add_done_callback(session.replies.discard)
        return job

    async def _deliver(
        self,
        session: Session,
        data: bytes,
        moving: asyncio.Task[tuple[int, int]] | None,
        faults: CommandFaults,
        garbage_at: int,
        forbidden: bytes,
    ) -> None:
        try:
            if moving is not None:
                await moving
        finally:
            if moving is not None and not moving.done():
                moving.cancel()
        if self.faults.delay_ms:
            await asyncio.sleep(self.faults.delay_ms / 1000)
        if faults.garbage:
            alphabet = bytes(b for b in range(256) if b not in forbidden)
            noise = bytes(self.rng.choice(alphabet) for _ in range(self.rng.randint(4, 24)))
            if self.faults.garbage_position == "between":
                data = noise + b"\r\n" + data
            else:
                data = data[:garbage_at] + noise + data[garbage_at:]
        if faults.drop_mid_reply:
            session.write(data[: len(data) // 2])
            session.abort()
            return
        session.write(data)

    # -- one connection --------------------------------------------------------------------------------------
    async def _serve(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, session: Session | None = None
    ) -> None:
        """One session over a reader/writer pair: a TCP connection, or any other stream a front end
        wraps (a pty), with its own `Session` subclass where a drop means something else than a hang-up."""
        session = session or Session(writer)
        task = asyncio.current_task()
        assert task is not None
        self._sessions[session] = task
        self.sessions_opened += 1
        buf = bytearray()
        try:
            while not session.closed:
                try:
                    async with asyncio.timeout(self.session_timeout_s):
                        data = await reader.read(4096)
                except TimeoutError:
                    break  # idle longer than the session timeout: logged out and hung up
                if not data:
                    break
                buf += data
                while not session.closed:
                    text = self.frame(session, buf)
                    if text is None:
                        break
                    # One command at a time, from every session, is checked and applied to the model;
                    # only the mirrors move and the replies overlap. Without this, two sessions could
                    # both be granted one port.
                    async with self._order:
                        await self.handle(session, text)
                if len(buf) > self.max_input:
                    break
        except (ConnectionError, OSError):
            pass
        finally:
            session.closed = True
            for reply in list(session.replies):
                reply.cancel()
            await asyncio.gather(*session.replies, return_exceptions=True)
            writer.close()
            self._sessions.pop(session, None)
