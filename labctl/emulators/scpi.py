"""The SCPI front end of the switch emulator: a raw-socket SCPI server that behaves like a Polatis switch
(the `OXC:SWITch:CONNect` subsystem, `:PMON:POWer?`, the IEEE 488.2 common commands, an error queue).

Sessions, the fault plan and the order in which changes take effect are the shared core's
(labctl.emulators.core). SCPI on this port has no login, so every session is accepted (users are
ignored). A program message is one line (LF, optionally CR LF) of one or more units separated by `;`;
mnemonics are case-insensitive in their short or long form (`OXC:SWIT:CONN:ADD` =
`oxc:switch:connect:add`); after a `;` a header without a leading `:` continues the previous command's
path (`OXC:SWIT:CONN:ADD (@1),(@9);STAT?`), and common commands (`*IDN?`) leave the path alone. The
replies of one line go out as one line, joined by `;`, in order. A change starts the model's mirrors and
returns at once (SCPI commands overlap); `*OPC?` answers `1` once this session's changes have settled.
Errors go to the session's error queue (`SYST:ERR?`): `-221,"Settings conflict;…"` for a port in use, a
refused change (the model's ChangeRefused, or the plan's refusal) is `-200,"Execution error;…"`.

Written independently of the driver's codec (labctl/ocs/drivers/polatis_scpi/codec.py), so a mistake in one
is not mirrored by the other. Facts: shared reference §3.1; emulator choices (error codes per case, the
no-light reading, `*RST` leaving the connections alone, the empty STAT? reply) are listed in
docs/decisions/0032.
"""

from __future__ import annotations

import asyncio
import re
import weakref
from collections.abc import Callable, Iterable
from collections.abc import Mapping as MappingType
from dataclasses import dataclass

from labctl.emulators.core import CommandFaults, FaultPlan, Session, SwitchEmulator, load_faults
from labctl.inventory.mapping import MappingDiff
from labctl.models.switch import ChangeRefused, SwitchModel

__all__ = ["ScpiEmulator", "load_faults"]

NO_LIGHT_DBM = -99.99  # printed for a dark port (the same floor the TL1 emulator prints; unverified)
ERROR_QUEUE_LENGTH = 16
FIRMWARE = "labctl-emulator-1.0"

MESSAGES = {
    0: "No error",
    -102: "Syntax error",
    -104: "Data type error",
    -108: "Parameter not allowed",
    -109: "Missing parameter",
    -113: "Undefined header",
    -200: "Execution error",
    -221: "Settings conflict",
    -222: "Data out of range",
    -224: "Illegal parameter value",
    -350: "Queue overflow",
}


class _Fail(Exception):
    """An SCPI error to queue: its code and the device-dependent detail."""

    def __init__(self, code: int, detail: str = "") -> None:
        super().__init__(code, detail)
        self.code = code
        self.detail = detail


# -- the command tree ----------------------------------------------------------------------------------------
# Each mnemonic as SCPI manuals write it: the upper-case part is the short form, the whole word the long
# one; either is accepted, in any case, and nothing in between. The key a handler is filed under (and that
# a fault plan's deny_verbs names) is the short form, e.g. OXC:SWIT:CONN:ADD or SYST:ERR?.
_COMMANDS = (
    "OXC:SWITch:CONNect:ADD",
    "OXC:SWITch:CONNect:SUB",
    "OXC:SWITch:CONNect:ONLY",
    "OXC:SWITch:CONNect:STATe?",
    "OXC:SWITch:CONNect:PORT?",
    "OXC:SWITch:DISConnect:ALL",
    "PMON:POWer?",
    "SYSTem:ERRor?",
    "SYSTem:ERRor:NEXT?",
    "SYSTem:ERRor:COUNt?",
)
_COMMON = ("*IDN?", "*OPC?", "*OPC", "*RST", "*CLS")


@dataclass
class _Node:
    short: str
    long: str
    children: list[_Node]
    key: str | None = None  # the short path of a command that ends here (without `?`)
    query_key: str | None = None


def _tree() -> _Node:
    root = _Node("", "", [])
    for spec in _COMMANDS:
        query = spec.endswith("?")
        node = root
        shorts = []
        for word in spec.rstrip("?").split(":"):
            short = "".join(c for c in word if c.isupper() or c.isdigit())
            child = next((c for c in node.children if c.long == word.upper()), None)
            if child is None:
                child = _Node(short, word.upper(), [])
                node.children.append(child)
            node = child
            shorts.append(short)
        key = ":".join(shorts)
        if query:
            node.query_key = key + "?"
        else:
            node.key = key
    return root


_ROOT = _tree()
_UNIT = re.compile(
    r"^(:?)(\*[A-Za-z]+|[A-Za-z][A-Za-z0-9]*(?::[A-Za-z][A-Za-z0-9]*)*)(\?)?(?:\s+(.*?))?\s*$", re.S
)
_CHANNELS = re.compile(r"^\(@\s*(.*?)\s*\)$", re.S)
_RANGE = re.compile(r"^(\d{1,6})(?::(\d{1,6}))?$")


def _split(text: str, sep: str) -> list[str]:
    """Split on `sep` outside double quotes and parentheses."""
    parts: list[str] = []
    depth, quoted, start = 0, False, 0
    for i, ch in enumerate(text):
        if ch == '"':
            quoted = not quoted
        elif not quoted and ch == "(":
            depth += 1
        elif not quoted and ch == ")":
            depth = max(depth - 1, 0)
        elif not quoted and depth == 0 and ch == sep:
            parts.append(text[start:i])
            start = i + 1
    parts.append(text[start:])
    return parts


def _channels(text: str) -> list[int]:
    m = _CHANNELS.match(text.strip())
    if m is None:
        raise _Fail(-104, f"expected a channel list like (@1,2), got {text.strip()[:40]!r}")
    ports: list[int] = []
    if not m[1]:
        return ports
    for item in m[1].split(","):
        r = _RANGE.match(item.strip())
        if r is None:
            raise _Fail(-104, f"bad channel {item.strip()[:20]!r}")
        low, high = int(r[1]), int(r[2] or r[1])
        if high < low:
            raise _Fail(-222, f"bad range {low}:{high}")
        if high - low > 4096:  # checked before expanding: a huge range must not stall every session
            raise _Fail(-222, f"range {low}:{high} is longer than the switch")
        ports.extend(range(low, high + 1))
    return ports


@dataclass
class _Result:
    reply: str | None = None
    diff: MappingDiff | None = None
    settle: bool = False  # the reply waits until this session's changes have settled (*OPC?)


class ScpiEmulator(SwitchEmulator):
    """The SCPI front end. `start()` binds (127.0.0.1, ephemeral port by default); `close()` ends every
    session. Test API (from the core): `set_faults(FaultPlan(...))`, `lose_state()`, `commands`,
    `sessions`; `errors(session)` is a session's error queue."""

    change_verbs = frozenset(
        {"OXC:SWIT:CONN:ADD", "OXC:SWIT:CONN:SUB", "OXC:SWIT:CONN:ONLY", "OXC:SWIT:DISC:ALL"}
    )

    def __init__(
        self,
        model: SwitchModel,
        *,
        users: MappingType[str, str] | None = None,
        host: str = "127.0.0.1",
        port: int = 0,
        faults: FaultPlan | None = None,
        session_timeout_s: float | None = None,
        product: str | None = None,
    ) -> None:
        # No login on the SCPI socket: `users` is taken (every front end is served alike) and unused.
        super().__init__(
            model, users=users or {}, host=host, port=port, faults=faults, session_timeout_s=session_timeout_s
        )
        space = model.space
        self.product = product or f"N-OST-{space.n_ingress}x{space.n_egress}-LA1-DMHNS"
        serial = re.sub(r"[^A-Za-z0-9]", "", model.name)[:16] or "0"
        self.identity = f"Polatis,{self.product},{serial},{FIRMWARE}"
        self._errors: weakref.WeakKeyDictionary[Session, list[tuple[int, str]]] = weakref.WeakKeyDictionary()
        self._moving: weakref.WeakKeyDictionary[Session, set[asyncio.Task[tuple[int, int]]]] = (
            weakref.WeakKeyDictionary()
        )
        self._last_reply: weakref.WeakKeyDictionary[Session, asyncio.Task[None]] = weakref.WeakKeyDictionary()

    # -- error queue -----------------------------------------------------------------------------------------
    def errors(self, session: Session) -> list[tuple[int, str]]:
        return self._errors.setdefault(session, [])

    def _queue(self, session: Session, code: int, detail: str) -> None:
        queue = self.errors(session)
        text = MESSAGES.get(code, "Error") + (f";{detail}" if detail else "")
        if len(queue) >= ERROR_QUEUE_LENGTH:  # SCPI: the newest entry becomes the overflow note
            queue[-1] = (-350, MESSAGES[-350])
            return
        queue.append((code, text))

    # -- framing ---------------------------------------------------------------------------------------------
    def next_command(self, buf: bytearray) -> str | None:
        """One program message: a line up to LF (a CR before it is dropped); empty lines are skipped."""
        while (end := buf.find(b"\n")) >= 0:
            line = buf[:end].decode("latin-1").removesuffix("\r")
            del buf[: end + 1]
            if line.strip():
                return line
        return None

    async def handle(self, session: Session, text: str) -> None:
        replies: list[str] = []
        settle = False
        faults = CommandFaults()
        path: list[_Node] = []
        for unit in _split(text, ";"):
            if not unit.strip():
                continue
            arrived = self.arrived()
            if arrived.drop:
                session.abort()
                return
            result = _Result()
            try:
                handler, path, params = self._resolve(unit, path)
                result = handler(session, params)
                if result.diff is not None and not result.diff.empty:
                    self._hold(session, await self.move(result.diff))
            except _Fail as e:  # a query that failed answers nothing (SCPI); the error is queued
                self._queue(session, e.code, e.detail)
                result = _Result()
            except ChangeRefused as e:  # the switch itself said no; nothing moved
                self._queue(session, -200, str(e).replace('"', "'"))
                result = _Result()
            if result.reply is None:
                if arrived.drop_mid_reply:  # no reply to cut: hang up once the command has taken effect
                    session.abort()
                    return
                continue
            replies.append(result.reply)
            settle = settle or result.settle
            faults = CommandFaults(
                garbage=faults.garbage or arrived.garbage,
                drop_mid_reply=faults.drop_mid_reply or arrived.drop_mid_reply,
            )
        if not replies:
            return
        data = (";".join(replies) + "\n").encode("ascii", errors="replace")
        waits: list[asyncio.Task[object]] = []
        if settle:
            waits.extend(self._moving.get(session, ()))
        prior = self._last_reply.get(session)
        if prior is not None:
            waits.append(prior)  # SCPI replies go out in order
        self._last_reply[session] = self.deliver(
            session,
            data,
            self._after(session, waits),
            faults,
            garbage_at=len(data) // 2,
            forbidden=_NOT_GARBAGE,
        )

    def _hold(self, session: Session, move: asyncio.Task[tuple[int, int]]) -> None:
        """Keep a change's mirror move as this session's pending operation (for *OPC?); it ends with the
        session, as a reply being delivered does."""
        pending = self._moving.setdefault(session, set())
        pending.add(move)
        move.add_done_callback(pending.discard)
        session.replies.add(move)  # type: ignore[arg-type]  # cancelled with the session's replies
        move.add_done_callback(session.replies.discard)

    def _after(
        self, session: Session, waits: Iterable[asyncio.Task[object]]
    ) -> asyncio.Task[tuple[int, int]] | None:
        pending = [t for t in waits if not t.done()]
        if not pending:
            return None

        async def settled() -> tuple[int, int]:
            await asyncio.wait(pending)  # waits without cancelling them if this is cancelled
            return 0, 0

        waiter = asyncio.create_task(settled())
        session.replies.add(waiter)  # type: ignore[arg-type]  # cancelled with the session's replies
        waiter.add_done_callback(session.replies.discard)
        return waiter

    # -- headers ---------------------------------------------------------------------------------------------
    def _resolve(
        self, unit: str, path: list[_Node]
    ) -> tuple[Callable[[Session, list[str]], _Result], list[_Node], list[str]]:
        """The handler of one unit, the path the next unit continues from, and the parameters."""
        m = _UNIT.match(unit.strip())
        if m is None:
            raise _Fail(-102, f"cannot read {unit.strip()[:40]!r}")
        absolute, header, query, rest = m[1], m[2], m[3] or "", m[4]
        params = [p.strip() for p in _split(rest, ",")] if rest else []
        if header.startswith("*"):
            key = header.upper() + query
            if key not in _COMMON:
                raise _Fail(-113, f"{header}{query}")
            return self._common[key], path, params
        node = _ROOT if absolute or not path else path[-1]
        walked: list[_Node] = [] if absolute or not path else list(path)
        for word in header.upper().split(":"):
            child = next((c for c in node.children if word in (c.short, c.long)), None)
            if child is None:
                raise _Fail(-113, f"{header}{query}")
            walked.append(child)
            node = child
        key = node.query_key if query else node.key
        if key is None:
            raise _Fail(-113, f"{header}{query}")
        if self.refuse(key):
            raise _Fail(-200, "injected fault")
        return self._handlers[key], walked[:-1], params

    # -- handlers --------------------------------------------------------------------------------------------
    @property
    def _common(self) -> dict[str, Callable[[Session, list[str]], _Result]]:
        return {
            "*IDN?": self._idn,
            "*OPC?": self._opc_query,
            "*OPC": self._no_op,
            "*RST": self._reset,
            "*CLS": self._reset,
        }

    @property
    def _handlers(self) -> dict[str, Callable[[Session, list[str]], _Result]]:
        return {
            "OXC:SWIT:CONN:ADD": self._add,
            "OXC:SWIT:CONN:SUB": self._sub,
            "OXC:SWIT:CONN:ONLY": self._only,
            "OXC:SWIT:CONN:STAT?": self._state,
            "OXC:SWIT:CONN:PORT?": self._port,
            "OXC:SWIT:DISC:ALL": self._disconnect_all,
            "PMON:POW?": self._power,
            "SYST:ERR?": self._next_error,
            "SYST:ERR:NEXT?": self._next_error,
            "SYST:ERR:COUN?": self._error_count,
        }

    @staticmethod
    def _none(params: list[str]) -> None:
        if params:
            raise _Fail(-108, params[0][:40])

    def _idn(self, session: Session, params: list[str]) -> _Result:
        self._none(params)
        return _Result(self.identity)

    def _opc_query(self, session: Session, params: list[str]) -> _Result:
        self._none(params)
        return _Result("1", settle=True)

    def _no_op(self, session: Session, params: list[str]) -> _Result:
        self._none(params)
        return _Result()

    def _reset(self, session: Session, params: list[str]) -> _Result:
        """*CLS and *RST clear the error queue. *RST leaves the connections as they are: a reset that cut
        every light path would be a poor default for a switch carrying traffic (an emulator choice)."""
        self._none(params)
        self.errors(session).clear()
        return _Result()

    def _next_error(self, session: Session, params: list[str]) -> _Result:
        self._none(params)
        queue = self.errors(session)
        code, text = queue.pop(0) if queue else (0, MESSAGES[0])
        return _Result(f'{code},"{text}"')

    def _error_count(self, session: Session, params: list[str]) -> _Result:
        self._none(params)
        return _Result(str(len(self.errors(session))))

    def _pairs(self, params: list[str]) -> list[tuple[int, int]]:
        """Two channel lists of equal length (ingress, egress): the pairs, checked against the port space."""
        if len(params) < 2:
            raise _Fail(-109, "expected (@ingress...),(@egress...)")
        if len(params) > 2:
            raise _Fail(-108, params[2][:40])
        ins, outs = _channels(params[0]), _channels(params[1])
        if len(ins) != len(outs):
            raise _Fail(-224, f"{len(ins)} ingress but {len(outs)} egress ports")
        space = self.model.space
        last = space.n_ingress + space.n_egress
        seen: set[int] = set()
        for ingress, egress in zip(ins, outs, strict=True):
            for port in (ingress, egress):
                if not 1 <= port <= last:
                    raise _Fail(-222, f"port {port} is not 1..{last}")
                if port in seen:
                    raise _Fail(-224, f"port {port} named twice")
                seen.add(port)
            if not space.is_ingress(ingress) or not space.is_egress(egress):
                raise _Fail(
                    -224, f"{ingress},{egress}: light goes from ingress 1..{space.n_ingress} to egress"
                )
        return list(zip(ins, outs, strict=True))

    def _add(self, session: Session, params: list[str]) -> _Result:
        patches = self.model.patches
        used = {p for pair in patches for p in pair}
        add = set()
        for pair in self._pairs(params):
            if pair in patches:
                continue  # already connected this way: nothing to do
            for port in pair:
                if port in used:
                    raise _Fail(-221, f"port {port} is already connected")
            add.add(pair)
        return _Result(diff=MappingDiff(remove=frozenset(), add=frozenset(add)))

    def _sub(self, session: Session, params: list[str]) -> _Result:
        patches = self.model.patches
        remove = set()
        for pair in self._pairs(params):
            if pair not in patches:
                raise _Fail(-221, f"{pair[0]},{pair[1]} is not connected")
            remove.add(pair)
        return _Result(diff=MappingDiff(remove=frozenset(remove), add=frozenset()))

    def _only(self, session: Session, params: list[str]) -> _Result:
        wanted = frozenset(self._pairs(params))
        patches = self.model.patches
        return _Result(diff=MappingDiff(remove=patches - wanted, add=wanted - patches))

    def _disconnect_all(self, session: Session, params: list[str]) -> _Result:
        self._none(params)
        return _Result(diff=MappingDiff(remove=self.model.patches, add=frozenset()))

    def _state(self, session: Session, params: list[str]) -> _Result:
        self._none(params)
        pairs = sorted(self.model.patches)
        ins = ",".join(str(i) for i, _ in pairs)
        outs = ",".join(str(e) for _, e in pairs)
        return _Result(f"(@{ins}),(@{outs})")

    def _port(self, session: Session, params: list[str]) -> _Result:
        if len(params) != 1:
            raise _Fail(-109 if not params else -108, "expected one port")
        text = params[0]
        if text.startswith("("):
            ports = _channels(text)
        elif re.fullmatch(r"\d{1,6}", text):
            ports = [int(text)]
        else:
            ports = []
        if len(ports) != 1:
            raise _Fail(-104, f"expected one port, got {text[:40]!r}")
        peers = {a: b for pair in self.model.patches for a, b in (pair, pair[::-1])}
        peer = peers.get(ports[0])
        return _Result("" if peer is None else str(peer))

    def _power(self, session: Session, params: list[str]) -> _Result:
        space = self.model.space
        last = space.n_ingress + space.n_egress
        if len(params) > 1:
            raise _Fail(-108, params[1][:40])
        ports = _channels(params[0]) if params else list(range(1, last + 1))
        for port in ports:
            if not 1 <= port <= last:
                raise _Fail(-222, f"port {port} is not 1..{last}")
        values = []
        for port in ports:
            dbm = self.model.monitor_dbm(port)
            values.append(f"{NO_LIGHT_DBM if dbm is None else dbm:.2f}")
        return _Result("(" + ",".join(values) + ")")


# Garbage never holds what SCPI replies are made of (line ends, separators, digits, signs, channel-list
# punctuation), so noise can neither forge a reply nor be read as part of one.
_NOT_GARBAGE = b'\r\n;,"()@+-.0123456789'
