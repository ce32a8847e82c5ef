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
from labctl.models.switch import ChangeRefused, OpmConfig, SwitchModel, VoaSetting

__all__ = ["Tl1Emulator", "load_faults", "parse_command"]

NIL_SID = "( nil )"  # what a Polatis without a configured name prints as its SID (reference §1.2)
NO_LIGHT_DBM = -99.99  # printed for a dark port (tcdona3's fallback value; the real one is unverified)
SOFTWARE_VERSION = "labctl-emulator-1.0"
# SET-PORT-ATTEN modes (polatis_tl1.sh: NONE|ABSOLUTE|RELATIVE|CONVERGED; a public Polatis TL1 library also
# sends FIX, MAX and the short forms) → the optical-switch YANG's atten-mode, which the model holds
_ATTEN_MODES = {
    "NONE": "VOA_MODE_NONE",
    "ABSOLUTE": "VOA_MODE_ABSOLUTE",
    "ABS": "VOA_MODE_ABSOLUTE",
    "RELATIVE": "VOA_MODE_RELATIVE",
    "REL": "VOA_MODE_RELATIVE",
    "CONVERGED": "VOA_MODE_CONVERGED",
    "CONV": "VOA_MODE_CONVERGED",
    "MAXIMUM": "VOA_MODE_MAXIMUM",
    "MAX": "VOA_MODE_MAXIMUM",
    "FIXED": "VOA_MODE_FIXED",
    "FIX": "VOA_MODE_FIXED",
}
_ATTEN_NAMES = {
    "VOA_MODE_NONE": "NONE",
    "VOA_MODE_ABSOLUTE": "ABSOLUTE",
    "VOA_MODE_RELATIVE": "RELATIVE",
    "VOA_MODE_CONVERGED": "CONVERGED",
    "VOA_MODE_MAXIMUM": "MAXIMUM",
    "VOA_MODE_FIXED": "FIXED",
}
_NUMBER = re.compile(r"^\(?\s*([+-]?\d{1,6}(?:\.\d+)?)\s*\)?$")  # LEVEL=5, LEVEL=(5.0)


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
        """`"vendor,model,type,version"` (reference §1.3), no whitespace inside any field: legacy scripts
        split the response on whitespace. The model is a product code as a Polatis prints one (its size in
        `-<in>x<out>-`, as NETCONF's model-name and SCPI's *IDN?); type OCS, as Polatis names its
        equipment (`RTRV-INV::OCS`)."""
        space = self.model.space
        model = f"N-VST-{space.n_ingress}x{space.n_egress}-LABCTL-EMU"
        return _Reply(lines=[f"POLATIS,{model},OCS,{SOFTWARE_VERSION}"]), None

    def _params(self, cmd: _Command) -> dict[str, str]:
        """`KEY=VALUE,...` of the last block (TL1's parameter block), keys upper-cased."""
        out: dict[str, str] = {}
        text = ",".join(b for b in cmd.blocks if "=" in b)
        for item in _split_fields(text, ","):
            if not item.strip():
                continue
            key, eq, value = item.partition("=")
            if not eq:
                raise _Deny("IPNV", f"parameter {item.strip()!r} is not KEY=VALUE")
            out[key.strip().upper()] = value.strip()
        return out

    def _number(self, text: str, what: str) -> float:
        m = _NUMBER.match(text)
        if not m:
            raise _Deny("IPNV", f"{what} {text!r} is not a number")
        return float(m[1])

    def _set_port_atten(self, session: Session, cmd: _Command) -> _Result:
        """SET-PORT-ATTEN::<egress ports>:<ctag>:::MODE=<mode>[,LEVEL=<l>][,REFS=<ports>] (polatis_tl1.sh)."""
        space = self.model.space
        ports = self._ports(cmd.aid, allow_all=False)
        params = self._params(cmd)
        mode = _ATTEN_MODES.get(params.get("MODE", "").upper())
        if mode is None:
            raise _Deny("IPNV", f"MODE={params.get('MODE', '')}: one of NONE, ABSOLUTE, RELATIVE, CONVERGED")
        level = 0.0
        if mode in ("VOA_MODE_ABSOLUTE", "VOA_MODE_RELATIVE", "VOA_MODE_CONVERGED"):
            if "LEVEL" not in params:
                raise _Deny("IPMS", f"MODE={params['MODE']} needs LEVEL=")
            level = self._number(params["LEVEL"], "LEVEL")
        refs = [0] * len(ports)
        if mode == "VOA_MODE_RELATIVE" and params.get("REFS"):
            refs = self._ports(params["REFS"], allow_all=False)
            if len(refs) != len(ports) or not all(space.is_ingress(r) for r in refs):
                raise _Deny("IPNV", "REFS= names one ingress port per attenuated port")
        for port in ports:
            if not space.is_egress(port):
                raise _Deny("IIAC", f"port {port} is not an output port: attenuators sit on outputs")
        for port, ref in zip(ports, refs, strict=True):
            self.model.set_voa(port, VoaSetting(mode, round(level, 2), ref))
        return _Reply(), None

    def _rtrv_port_atten(self, session: Session, cmd: _Command) -> _Result:
        """`"<port>:<mode>,<level>,<ref>"` per output port (level and ref empty where the mode has none;
        the line shape a public Polatis TL1 library parses)."""
        lines = []
        for port in self._ports(cmd.aid):
            if not self.model.space.is_egress(port):
                continue
            setting = self.model.voa_setting(port)
            has_level = setting.mode in ("VOA_MODE_ABSOLUTE", "VOA_MODE_RELATIVE", "VOA_MODE_CONVERGED")
            level = f"{setting.level:.2f}" if has_level else ""
            ref = str(setting.reference) if setting.mode == "VOA_MODE_RELATIVE" else ""
            lines.append(f"{port}:{_ATTEN_NAMES[setting.mode]},{level},{ref}")
        return _Reply(lines=lines), None

    def _set_port_pmon(self, session: Session, cmd: _Command) -> _Result:
        """SET-PORT-PMON::<ports>:<ctag>:::WAVE=<nm>[,OFFSET=<dB>][,ATIME=<1..8>] (tcdona3's form)."""
        ports = self._ports(cmd.aid, allow_all=False)
        params = self._params(cmd)
        unknown = sorted(set(params) - {"WAVE", "OFFSET", "ATIME"})
        if unknown or not params:
            raise _Deny("IPNV", "parameters: WAVE=, OFFSET=, ATIME=")
        for port in ports:
            current = self.model.opm_config(port)
            wave = self._number(params["WAVE"], "WAVE") if "WAVE" in params else current.wavelength_nm
            offset = self._number(params["OFFSET"], "OFFSET") if "OFFSET" in params else current.offset_db
            atime = params.get("ATIME", str(current.averaging_time))
            if not atime.isdigit():
                raise _Deny("IPNV", f"ATIME={atime} is not 1..8")
            try:
                self.model.set_opm(port, OpmConfig(round(wave, 2), round(offset, 2), int(atime)))
            except ValueError as e:
                raise _Deny("IPNV", str(e)) from None
        return _Reply(), None

    def _rtrv_port_pmon(self, session: Session, cmd: _Command) -> _Result:
        """`"<port>:<wavelength>,<offset>,<atime>"` (the order tcdona3 parses, reference §1.4)."""
        lines = []
        for port in self._ports(cmd.aid):
            c = self.model.opm_config(port)
            lines.append(f"{port}:{c.wavelength_nm:.2f},{c.offset_db:.2f},{c.averaging_time}")
        return _Reply(lines=lines), None

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
            dbm = self.model.monitor_dbm(port)
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
            "SET-PORT-ATTEN": self._set_port_atten,
            "RTRV-PORT-ATTEN": self._rtrv_port_atten,
            "SET-PORT-PMON": self._set_port_pmon,
            "RTRV-PORT-PMON": self._rtrv_port_pmon,
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
