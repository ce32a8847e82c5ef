"""A TL1 server that behaves like a Polatis switch, over the same `SwitchModel` as the simulated lab.

Several sessions share one switch. Login is required; commands are case-insensitive and may end with LF
or CRLF (or nothing: TL1 input ends at `;`). Patches change in the order commands arrive; each reply is
sent when the model's mirrors have settled (the modeled switching time), so commands that arrive together
move their mirrors in parallel, as `SwitchModel` does. Changes are announced to the other logged-in
sessions as `REPT DBCHG` autonomous messages. Faults (drop, drop mid-reply, delay, DENY with a
probability, garbage bytes, state loss) come from a YAML file or the test API.

This parser and formatter are written independently of the driver's codec (drivers/polatis_tl1.py) on
purpose, so that a framing mistake in one is not mirrored by the other. Response shapes follow the shared
reference §1.4-1.5; what no source shows (DENY codes, REPT text, shutter tokens, the no-light reading) is
an emulator choice, listed in docs/decisions/0008.
"""

from __future__ import annotations

import asyncio
import hmac
import random
import re
import time
from collections.abc import Callable
from collections.abc import Mapping as MappingType
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from labctl.errors import InputError
from labctl.mapping import MappingDiff
from labctl.models.switch import SwitchModel
from labctl.yamlio import load_yaml, pydantic_error_line

NIL_SID = "( nil )"  # what a Polatis without a configured name prints as its SID (reference §1.2)
NO_LIGHT_DBM = -99.99  # printed for a dark port (tcdona3's fallback value; the real one is unverified)
MAX_INPUT = 64 * 1024


class Tl1Faults(BaseModel):
    """Fault injection. Command counts are server-wide (every session), counted from when the faults were
    set; the count-triggered faults fire once."""

    model_config = ConfigDict(extra="forbid")

    drop_after_commands: int | None = Field(
        default=None, ge=1, description="close the connection on receiving the Nth command, without a reply"
    )
    drop_mid_reply_after_commands: int | None = Field(
        default=None, ge=1, description="send half of the reply to the Nth command, then close"
    )
    delay_ms: float = Field(default=0.0, ge=0, description="extra delay before every reply")
    deny_probability: float = Field(default=0.0, ge=0, le=1, description="DENY (SROF) a command at random")
    deny_verbs: list[str] = Field(default_factory=lambda: ["ENT-PATCH", "DLT-PATCH"])
    garbage_every: int | None = Field(default=None, ge=1, description="garbage bytes with every Nth reply")
    garbage_position: Literal["between", "inside"] = Field(
        default="inside", description="before the reply (between messages) or inside its status line"
    )
    lose_state_after_commands: int | None = Field(
        default=None, ge=1, description="lose every patch (as after a reboot) on receiving the Nth command"
    )
    seed: int = 0


def load_faults(path: Path | str) -> Tl1Faults:
    src = load_yaml(Path(path), "fault file")
    try:
        return Tl1Faults.model_validate(src.data or {})
    except ValidationError as e:
        raise InputError(pydantic_error_line(src, e)) from None


@dataclass
class _Command:
    verb: str
    tid: str
    aid: str
    ctag: str
    blocks: list[str]


class _Deny(Exception):
    def __init__(self, code: str, comment: str) -> None:
        super().__init__(code)
        self.code = code
        self.comment = comment


@dataclass
class _Reply:
    status: str = "COMPLD"
    lines: list[str] = field(default_factory=list)
    code: str | None = None
    comment: str | None = None


_Result = tuple[_Reply, MappingDiff | None]


@dataclass(eq=False)
class _Session:
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


def _split_fields(text: str, sep: str) -> list[str]:
    """Split on `sep` outside double quotes."""
    out: list[str] = []
    cur: list[str] = []
    quoted = False
    for ch in text:
        if ch == '"':
            quoted = not quoted
        if ch == sep and not quoted:
            out.append("".join(cur))
            cur = []
        else:
            cur.append(ch)
    out.append("".join(cur))
    return out


_CTAG = re.compile(r"^[A-Za-z0-9]{1,6}$")
_VERB = re.compile(r"^[A-Z][A-Z0-9]*(-[A-Z0-9]+){0,2}$")
_PORTS = re.compile(r"^\d+(&&\d+)?(&\d+(&&\d+)?)*$")
_PAIR = re.compile(r"(\d+)(?:&&(\d+))?")


def parse_command(text: str) -> _Command:
    """One input message without its `;`. Raises _Deny (with the ctag, where one was readable)."""
    parts = _split_fields(text.strip(), ":")
    verb = parts[0].strip().upper()
    ctag = parts[3].strip() if len(parts) > 3 else ""
    if len(parts) < 4 or not _VERB.match(verb):
        raise _Deny("IISP", "expected VERB:TID:AID:CTAG[:...];")
    if not _CTAG.match(ctag):
        raise _Deny("IICT", "the ctag must be 1-6 letters or digits")
    return _Command(verb, parts[1].strip().strip('"'), parts[2].strip(), ctag, [b.strip() for b in parts[4:]])


class Tl1Emulator:
    """The server. `start()` binds (127.0.0.1, ephemeral port by default); `close()` ends every session.

    Test API: `set_faults(Tl1Faults(...))`, `lose_state()`, `commands`, `sessions`.
    """

    def __init__(
        self,
        model: SwitchModel,
        *,
        users: MappingType[str, str],
        host: str = "127.0.0.1",
        port: int = 0,
        sid: str | None = None,
        faults: Tl1Faults | None = None,
        session_timeout_s: float | None = None,
        ack_after_s: float = 2.0,
    ) -> None:
        self.model = model
        self.host = host
        self.port = port
        self.sid = sid or NIL_SID
        self.session_timeout_s = session_timeout_s
        self.ack_after_s = ack_after_s
        self._users = dict(users)
        self._server: asyncio.Server | None = None
        self._sessions: dict[_Session, asyncio.Task[None]] = {}
        self.shutters: dict[int, bool] = {}  # port → closed
        self.commands = 0
        self.sessions_opened = 0
        self._atag = 0
        self._order = asyncio.Lock()
        self.set_faults(faults or Tl1Faults())

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

    # -- test API -------------------------------------------------------------------------------------------
    def add_user(self, user: str, password: str) -> None:
        self._users[user] = password

    def set_faults(self, faults: Tl1Faults) -> None:
        self.faults = faults
        self._fault_count = 0
        self._rng = random.Random(faults.seed)

    def lose_state(self) -> None:
        """As after a reboot: every patch gone, outputs dark, shutters open."""
        self.model.cancel_pending()
        self.model.lose_state()
        self.shutters.clear()

    @property
    def sessions(self) -> int:
        return len(self._sessions)

    # -- one connection --------------------------------------------------------------------------------------
    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        session = _Session(writer)
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
                    text = self._next_command(buf)
                    if text is None:
                        break
                    await self._dispatch(session, text)
                if len(buf) > MAX_INPUT:
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

    @staticmethod
    def _next_command(buf: bytearray) -> str | None:
        quoted = False
        for i, byte in enumerate(buf):
            if byte == 0x22:
                quoted = not quoted
            elif byte == 0x3B and not quoted:
                text = buf[:i].decode("latin-1")
                del buf[: i + 1]
                return text
        return None

    async def _dispatch(self, session: _Session, text: str) -> None:
        # One command at a time, from every session, is checked and applied to the model; only the mirror
        # moves and the replies overlap. Without this, two sessions could both be granted one port.
        async with self._order:
            self.commands += 1
            self._fault_count += 1
            n, faults = self._fault_count, self.faults
            if faults.drop_after_commands == n:
                session.abort()
                return
            if faults.lose_state_after_commands == n:
                self.lose_state()
            mid_reply_drop = faults.drop_mid_reply_after_commands == n
            garbage = faults.garbage_every is not None and n % faults.garbage_every == 0
            ctag = "0"
            moving: asyncio.Task[tuple[int, int]] | None = None
            try:
                cmd = parse_command(text)
                ctag = cmd.ctag
                deniable = cmd.verb in {v.upper() for v in faults.deny_verbs}
                if deniable and faults.deny_probability and self._rng.random() < faults.deny_probability:
                    raise _Deny("SROF", "injected fault")
                reply, diff = self._execute(session, cmd)
                if diff is not None and not diff.empty:
                    moving = await self._move(diff)
                    self._announce(session, diff)
            except _Deny as e:
                reply = _Reply("DENY", code=e.code, comment=e.comment)
        expected_s = faults.delay_ms / 1000 + (self.model.profile.switching_ms[1] / 1000 if moving else 0)
        if expected_s >= self.ack_after_s:
            session.write(f"IP {ctag}\r\n<".encode())
        job = asyncio.create_task(self._reply(session, ctag, reply, moving, garbage, mid_reply_drop))
        session.replies.add(job)
        job.add_done_callback(session.replies.discard)

    async def _move(self, diff: MappingDiff) -> asyncio.Task[tuple[int, int]]:
        """Start the model's mirror move and return once it has taken the new patches, so the next
        command (from any session) is checked against them; the move itself completes in the background."""
        started = asyncio.Event()

        async def run() -> tuple[int, int]:
            started.set()  # same step as execute()'s synchronous state change
            return await self.model.execute(diff)

        task = asyncio.create_task(run())
        await started.wait()
        return task

    async def _reply(
        self,
        session: _Session,
        ctag: str,
        reply: _Reply,
        moving: asyncio.Task[tuple[int, int]] | None,
        garbage: bool,
        mid_reply_drop: bool,
    ) -> None:
        try:
            if moving is not None:
                await moving
        finally:
            if moving is not None and not moving.done():
                moving.cancel()
        if self.faults.delay_ms:
            await asyncio.sleep(self.faults.delay_ms / 1000)
        data = self._frame("M", ctag, reply.status, reply.lines, reply.code, reply.comment)
        if garbage:
            noise = bytes(self._rng.choice(_GARBAGE) for _ in range(self._rng.randint(4, 24)))
            if self.faults.garbage_position == "between":
                data = noise + b"\r\n" + data
            else:
                cut = data.index(reply.status.encode()) + len(reply.status)
                data = data[:cut] + noise + data[cut:]
        if mid_reply_drop:
            session.write(data[: len(data) // 2])
            session.abort()
            return
        session.write(data)

    def _frame(
        self,
        kind: str,
        tag: str,
        status: str,
        lines: list[str],
        code: str | None = None,
        comment: str | None = None,
    ) -> bytes:
        stamp = time.strftime("%y-%m-%d %H:%M:%S", time.gmtime())
        out = [f"\r\n\n   {self.sid} {stamp}\r\n{kind}  {tag} {status}\r\n"]
        if code:
            out.append(f"   {code}\r\n")
        if comment:
            out.append(f"   /* {comment} */\r\n")
        out.extend(f'   "{line.replace(chr(34), chr(92) + chr(34))}"\r\n' for line in lines)
        out.append(";")
        return "".join(out).encode("latin-1", errors="replace")

    def _announce(self, origin: _Session, diff: MappingDiff) -> None:
        """REPT DBCHG to every other logged-in session (the REPT text is an emulator choice)."""
        self._atag += 1
        lines = [f"DLT-PATCH:{i},{e}" for i, e in sorted(diff.remove)]
        lines += [f"ENT-PATCH:{i},{e}" for i, e in sorted(diff.add)]
        message = self._frame("A", str(self._atag), "REPT DBCHG", lines)
        for session in self._sessions:
            if session is not origin and session.user is not None:
                session.write(message)

    # -- commands -------------------------------------------------------------------------------------------
    def _ports(self, aid: str, *, allow_all: bool = True) -> list[int]:
        aid = aid.strip()
        n = self.model.space.n_ingress + self.model.space.n_egress
        if allow_all and aid.upper() in ("", "ALL"):
            return list(range(1, n + 1))
        if not _PORTS.match(aid):
            raise _Deny("IIAC", f"bad port list {aid!r}")
        ports: list[int] = []
        for a, b in _PAIR.findall(aid):
            lo, hi = int(a), int(b or a)
            if lo > hi:
                raise _Deny("IIAC", f"bad range {lo}&&{hi}")
            for end in (lo, hi):  # checked before expanding: a huge range must not stall every session
                if not 1 <= end <= n:
                    raise _Deny("IIAC", f"port {end} out of range 1..{n}")
            ports.extend(range(lo, hi + 1))
        return ports

    def _execute(self, session: _Session, cmd: _Command) -> _Result:
        verb = cmd.verb
        handler = self._handlers.get(verb)
        if handler is None:
            raise _Deny("IICM", f"unknown command {verb}")
        if cmd.tid and cmd.tid.upper() != self.sid.upper():
            raise _Deny("IITA", "unknown target identifier")
        if verb != "ACT-USER" and session.user is None:
            raise _Deny("PLNA", "log in with ACT-USER first")
        return handler(session, cmd)

    # -- one handler per verb (registered in `_handlers`) ----------------------------------------------
    def _act_user(self, session: _Session, cmd: _Command) -> _Result:
        return self._login(session, cmd), None

    def _canc_user(self, session: _Session, cmd: _Command) -> _Result:
        session.user = None
        return _Reply(), None

    def _rtrv_hdr(self, session: _Session, cmd: _Command) -> _Result:
        return _Reply(), None

    def _rtrv_netype(self, session: _Session, cmd: _Command) -> _Result:
        return _Reply(lines=["POLATIS,labctl TL1 emulator,OPTICAL SWITCH,1.0"]), None

    def _rtrv_eqpt(self, session: _Session, cmd: _Command) -> _Result:
        space = self.model.space
        params = ",".join(cmd.blocks).upper().replace(" ", "")
        if cmd.aid.upper() != "SYSTEM":
            raise _Deny("IIAC", f"unknown equipment {cmd.aid!r}")
        if "PARAMETER=SIZE" not in params:
            raise _Deny("IPNV", "supported: PARAMETER=SIZE")
        return _Reply(lines=[f"SYSTEM:SIZE={space.n_ingress}x{space.n_egress}"]), None

    def _rtrv_patch(self, session: _Session, cmd: _Command) -> _Result:
        patches = self.model.patches
        if cmd.aid.strip().upper() in ("", "ALL"):
            chosen = sorted(patches)
        else:
            wanted = set(self._ports(cmd.aid, allow_all=False))
            chosen = sorted(p for p in patches if p[0] in wanted or p[1] in wanted)
        return _Reply(lines=[f"{i},{e}" for i, e in chosen]), None

    def _rtrv_port_power(self, session: _Session, cmd: _Command) -> _Result:
        lines = []
        for port in self._ports(cmd.aid):
            dbm = self.model.power_dbm(port)
            lines.append(f"{port}:{NO_LIGHT_DBM if dbm is None else dbm:.2f}")
        return _Reply(lines=lines), None

    def _set_shutter(self, session: _Session, cmd: _Command) -> _Result:
        for port in self._ports(cmd.aid, allow_all=False):
            self.shutters[port] = cmd.verb.startswith("OPR")
        return _Reply(), None

    def _rtrv_port_shutter(self, session: _Session, cmd: _Command) -> _Result:
        return _Reply(
            lines=[f"{p}:{'CLOSED' if self.shutters.get(p) else 'OPEN'}" for p in self._ports(cmd.aid)]
        ), None

    def _dlt_patch(self, session: _Session, cmd: _Command) -> _Result:
        patches = self.model.patches
        if cmd.aid.strip().upper() == "ALL":
            return _Reply(), MappingDiff(remove=patches, add=frozenset())
        remove = set()
        for port in self._ports(cmd.aid, allow_all=False):
            hit = [p for p in patches if port in p]
            if not hit:
                raise _Deny("IENE", f"port {port} has no patch")
            remove.update(hit)
        return _Reply(), MappingDiff(remove=frozenset(remove), add=frozenset())

    def _ent_patch(self, session: _Session, cmd: _Command) -> _Result:
        """`<in>,<out>`; either side may be a list of equal length (bulk form; unverified on real ones)."""
        space = self.model.space
        patches = self.model.patches
        halves = cmd.aid.split(",")
        if len(halves) != 2:
            raise _Deny("IIAC", "expected <ingress>,<egress>")
        ins, outs = (self._ports(h, allow_all=False) for h in halves)
        if len(ins) != len(outs):
            raise _Deny("IIAC", "ingress and egress lists differ in length")
        used = {p for patch in patches for p in patch}
        add: set[tuple[int, int]] = set()
        seen: set[int] = set()
        for ingress, egress in zip(ins, outs, strict=True):
            if not space.is_ingress(ingress) or not space.is_egress(egress):
                raise _Deny("IDNV", f"{ingress},{egress}: light goes ingress 1..{space.n_ingress} to egress")
            if (ingress, egress) in patches:
                raise _Deny("IEAE", f"patch {ingress},{egress} already exists")
            for port in (ingress, egress):
                if port in used or port in seen:
                    raise _Deny("SAIS", f"port {port} is already in use")
                seen.add(port)
            add.add((ingress, egress))
        return _Reply(), MappingDiff(remove=frozenset(), add=frozenset(add))

    @property
    def _handlers(self) -> dict[str, Callable[[_Session, _Command], _Result]]:
        return {
            "ACT-USER": self._act_user,
            "CANC-USER": self._canc_user,
            "RTRV-HDR": self._rtrv_hdr,
            "RTRV-NETYPE": self._rtrv_netype,
            "RTRV-EQPT": self._rtrv_eqpt,
            "RTRV-PATCH": self._rtrv_patch,
            "RTRV-PORT-POWER": self._rtrv_port_power,
            "OPR-PORT-SHUTTER": self._set_shutter,
            "RLS-PORT-SHUTTER": self._set_shutter,
            "RTRV-PORT-SHUTTER": self._rtrv_port_shutter,
            "DLT-PATCH": self._dlt_patch,
            "ENT-PATCH": self._ent_patch,
        }

    def _login(self, session: _Session, cmd: _Command) -> _Reply:
        user = cmd.aid
        password = cmd.blocks[1] if len(cmd.blocks) > 1 else ""
        expected = self._users.get(user)
        if expected is None:
            raise _Deny("PIUI", "unknown user")
        if not hmac.compare_digest(expected.encode(), password.encode()):
            raise _Deny("PIUC", "password not accepted")
        session.user = user
        return _Reply()


# Line noise: anything but the bytes that delimit TL1 lines and messages, so that the garbage itself cannot
# forge a well-formed message (TCP does not corrupt bytes; a confused agent might emit these).
_GARBAGE = bytes(b for b in range(256) if b not in b'\r\n;"<>')
