"""The TL1 front end of the switch emulator: a TL1 server that behaves like a Polatis switch.

Sessions, users, the fault plan and the order in which changes take effect are the shared core's
(labctl.emulators.core); this module frames TL1 and implements its verbs. Several sessions share one
switch. Login is required; commands are case-insensitive and may end with LF
or CRLF (or nothing: TL1 input ends at `;`). Patches change in the order commands arrive; each reply is
sent when the model's mirrors have settled (the modeled switching time), so commands that arrive together
move their mirrors in parallel, as `SwitchModel` does. Changes are announced to the other logged-in
sessions as `REPT DBCHG` autonomous messages. Faults (drop, drop mid-reply, delay, DENY with a
probability, garbage bytes, state loss) come from a YAML file or the test API (FaultPlan).

This parser and formatter are written independently of the driver's codec
(labctl/ocs/drivers/polatis_tl1/codec.py) on purpose, so that a framing mistake in one is not mirrored by the
other. Response shapes follow the shared
reference §1.4-1.5; what no source shows (DENY codes, REPT text, shutter tokens, the no-light reading) is
an emulator choice, listed in docs/decisions/0008.
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable
from collections.abc import Mapping as MappingType
from dataclasses import dataclass, field

from labctl.emulators.core import FaultPlan, Session, SwitchEmulator, load_faults
from labctl.inventory.mapping import MappingDiff
from labctl.models.switch import ChangeRefused, SwitchModel

__all__ = ["Tl1Emulator", "load_faults", "parse_command"]

NIL_SID = "( nil )"  # what a Polatis without a configured name prints as its SID (reference §1.2)
NO_LIGHT_DBM = -99.99  # printed for a dark port (tcdona3's fallback value; the real one is unverified)


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


class Tl1Emulator(SwitchEmulator):
    """The TL1 front end. `start()` binds (127.0.0.1, ephemeral port by default); `close()` ends every
    session. Test API (from the core): `set_faults(FaultPlan(...))`, `lose_state()`, `commands`,
    `sessions`."""

    change_verbs = frozenset({"ENT-PATCH", "DLT-PATCH"})

    def __init__(
        self,
        model: SwitchModel,
        *,
        users: MappingType[str, str],
        host: str = "127.0.0.1",
        port: int = 0,
        sid: str | None = None,
        faults: FaultPlan | None = None,
        session_timeout_s: float | None = None,
        ack_after_s: float = 2.0,
    ) -> None:
        super().__init__(
            model, users=users, host=host, port=port, faults=faults, session_timeout_s=session_timeout_s
        )
        self.sid = sid or NIL_SID
        self.ack_after_s = ack_after_s
        self.shutters: dict[int, bool] = {}  # port → closed
        self._atag = 0

    def lose_state(self) -> None:
        """As after a reboot: every patch gone, outputs dark, shutters open."""
        super().lose_state()
        self.shutters.clear()

    # -- framing ---------------------------------------------------------------------------------------------
    def next_command(self, buf: bytearray) -> str | None:
        """TL1 input ends at `;` outside double quotes (LF/CRLF after it is whitespace of the next one)."""
        quoted = False
        for i, byte in enumerate(buf):
            if byte == 0x22:
                quoted = not quoted
            elif byte == 0x3B and not quoted:
                text = buf[:i].decode("latin-1")
                del buf[: i + 1]
                return text
        return None

    async def handle(self, session: Session, text: str) -> None:
        faults = self.arrived()
        if faults.drop:
            session.abort()
            return
        ctag = "0"
        moving = None
        try:
            cmd = parse_command(text)
            ctag = cmd.ctag
            if self.refuse(cmd.verb):
                raise _Deny("SROF", "injected fault")
            reply, diff = self._execute(session, cmd)
            if diff is not None and not diff.empty:
                moving = await self.move(diff)
                self._announce(session, diff)
        except _Deny as e:
            reply = _Reply("DENY", code=e.code, comment=e.comment)
        except ChangeRefused as e:  # the switch itself said no: "requested operation failed"
            reply = _Reply("DENY", code="SROF", comment=str(e))
        if self.expected_reply_s(moving is not None) >= self.ack_after_s:
            session.write(f"IP {ctag}\r\n<".encode())
        data = self._frame("M", ctag, reply.status, reply.lines, reply.code, reply.comment)
        cut = data.index(reply.status.encode()) + len(reply.status)  # "inside" garbage: in the status line
        self.deliver(session, data, moving, faults, garbage_at=cut, forbidden=_NOT_GARBAGE)

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

    def _announce(self, origin: Session, diff: MappingDiff) -> None:
        """REPT DBCHG to every other logged-in session (the REPT text is an emulator choice)."""
        self._atag += 1
        lines = [f"DLT-PATCH:{i},{e}" for i, e in sorted(diff.remove)]
        lines += [f"ENT-PATCH:{i},{e}" for i, e in sorted(diff.add)]
        message = self._frame("A", str(self._atag), "REPT DBCHG", lines)
        for session in self.logged_in:
            if session is not origin:
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

    def _execute(self, session: Session, cmd: _Command) -> _Result:
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
    def _act_user(self, session: Session, cmd: _Command) -> _Result:
        return self._login(session, cmd), None

    def _canc_user(self, session: Session, cmd: _Command) -> _Result:
        session.user = None
        return _Reply(), None

    def _rtrv_hdr(self, session: Session, cmd: _Command) -> _Result:
        return _Reply(), None

    def _rtrv_netype(self, session: Session, cmd: _Command) -> _Result:
        return _Reply(lines=["POLATIS,labctl TL1 emulator,OPTICAL SWITCH,1.0"]), None

    def _rtrv_eqpt(self, session: Session, cmd: _Command) -> _Result:
        space = self.model.space
        params = ",".join(cmd.blocks).upper().replace(" ", "")
        if cmd.aid.upper() != "SYSTEM":
            raise _Deny("IIAC", f"unknown equipment {cmd.aid!r}")
        if "PARAMETER=SIZE" not in params:
            raise _Deny("IPNV", "supported: PARAMETER=SIZE")
        return _Reply(lines=[f"SYSTEM:SIZE={space.n_ingress}x{space.n_egress}"]), None

    def _rtrv_patch(self, session: Session, cmd: _Command) -> _Result:
        patches = self.model.patches
        if cmd.aid.strip().upper() in ("", "ALL"):
            chosen = sorted(patches)
        else:
            wanted = set(self._ports(cmd.aid, allow_all=False))
            chosen = sorted(p for p in patches if p[0] in wanted or p[1] in wanted)
        return _Reply(lines=[f"{i},{e}" for i, e in chosen]), None

    def _rtrv_port_power(self, session: Session, cmd: _Command) -> _Result:
        lines = []
        for port in self._ports(cmd.aid):
            dbm = self.model.power_dbm(port)
            lines.append(f"{port}:{NO_LIGHT_DBM if dbm is None else dbm:.2f}")
        return _Reply(lines=lines), None

    def _set_shutter(self, session: Session, cmd: _Command) -> _Result:
        for port in self._ports(cmd.aid, allow_all=False):
            self.shutters[port] = cmd.verb.startswith("OPR")
        return _Reply(), None

    def _rtrv_port_shutter(self, session: Session, cmd: _Command) -> _Result:
        return _Reply(
            lines=[f"{p}:{'CLOSED' if self.shutters.get(p) else 'OPEN'}" for p in self._ports(cmd.aid)]
        ), None

    def _dlt_patch(self, session: Session, cmd: _Command) -> _Result:
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

    def _ent_patch(self, session: Session, cmd: _Command) -> _Result:
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
    def _handlers(self) -> dict[str, Callable[[Session, _Command], _Result]]:
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

    def _login(self, session: Session, cmd: _Command) -> _Reply:
        user = cmd.aid
        password = cmd.blocks[1] if len(cmd.blocks) > 1 else ""
        accepted = self.authenticate(user, password)
        if accepted is None:
            raise _Deny("PIUI", "unknown user")
        if not accepted:
            raise _Deny("PIUC", "password not accepted")
        session.user = user
        return _Reply()


# Garbage is anything but the bytes that delimit TL1 lines and messages, so that it cannot forge a
# well-formed message (TCP does not corrupt bytes; a confused agent might emit these).
_NOT_GARBAGE = b'\r\n;"<>'
