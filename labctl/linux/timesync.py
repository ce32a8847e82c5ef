"""How well this host's clock is disciplined: the kernel's own view (adjtimex) and which daemon drives it.

The kernel keeps, whatever the daemon (chrony, ntpd, ptp4l + phc2sys, systemd-timesyncd), a
synchronized flag (STA_UNSYNC clear), an estimated error and a maximum error in µs, set by the daemon
through adjtimex(2). Read with modes = 0, nothing changes. The daemon is found by process name. run.json
records this per host beside the measured agent clock offsets, so a reader can tell a host that was
free-running from one that was disciplined to a few µs.

The kernel's maxerror is often far looser than what the daemon knows (linuxptp writes 0 and the kernel
adds 500 µs each second), so where chronyd or ptp4l runs its own estimate is read too (clockd.py) and
the tighter bound becomes the host's `uncertainty_ns`, with `uncertainty_source` saying whose it is.
"""

from __future__ import annotations

import ctypes
import os
from pathlib import Path
from typing import Any

from labctl.linux.clockd import Reading, read_chrony, read_phc2sys_log, read_ptp4l, with_phc2sys

KERNEL = "adjtimex"
"""`uncertainty_source` where the kernel's own maximum error (adjtimex, set by the daemon) is the bound."""
STA_UNSYNC = 0x0040
TIME_ERROR = 5
DAEMONS = ("chronyd", "ptp4l", "phc2sys", "ntpd", "systemd-timesyn", "timemaster")
# Where a host's daemons are not at their default places (chronyd's /run/chrony/chronyd.sock, ptp4l's
# /var/run/ptp4l), or where phc2sys logs (it answers no queries), the agent's environment says so.
ENV_CHRONY_SOCKET = "LABCTL_CHRONY_SOCKET"
ENV_PTP4L_UDS = "LABCTL_PTP4L_UDS"
ENV_PHC2SYS_LOG = "LABCTL_PHC2SYS_LOG"


class _Timeval(ctypes.Structure):
    _fields_ = [("tv_sec", ctypes.c_long), ("tv_usec", ctypes.c_long)]


class _Timex(ctypes.Structure):
    # struct timex (uapi linux/timex.h): the fields read here, then the rest as padding.
    _fields_ = [
        ("modes", ctypes.c_uint),
        ("offset", ctypes.c_long),
        ("freq", ctypes.c_long),
        ("maxerror", ctypes.c_long),
        ("esterror", ctypes.c_long),
        ("status", ctypes.c_int),
        ("constant", ctypes.c_long),
        ("precision", ctypes.c_long),
        ("tolerance", ctypes.c_long),
        ("time", _Timeval),
        ("tick", ctypes.c_long),
        ("ppsfreq", ctypes.c_long),
        ("jitter", ctypes.c_long),
        ("shift", ctypes.c_int),
        ("stabil", ctypes.c_long),
        ("jitcnt", ctypes.c_long),
        ("calcnt", ctypes.c_long),
        ("errcnt", ctypes.c_long),
        ("stbcnt", ctypes.c_long),
        ("tai", ctypes.c_int),
        ("_padding", ctypes.c_int * 11),
    ]


def _daemons() -> list[str]:
    found = set()
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                comm = (entry / "comm").read_text().strip()
            except OSError:
                continue
            if comm in DAEMONS:
                found.add(comm)
    return sorted(found)


def read_disciplines(
    daemons: list[str] | None = None,
    chrony_socket: str | None = None,
    ptp4l_uds: str | None = None,
    phc2sys_log: str | None = None,
) -> tuple[list[dict[str, Any]], list[str]]:
    """Every daemon's discipline reading, and why each missing one is missing. A daemon is asked only
    when its process runs or its socket was named, so a host without one costs no subprocess."""
    running = _daemons() if daemons is None else daemons
    chrony_socket = chrony_socket or os.environ.get(ENV_CHRONY_SOCKET) or None
    ptp4l_uds = ptp4l_uds or os.environ.get(ENV_PTP4L_UDS) or None
    phc2sys_log = phc2sys_log or os.environ.get(ENV_PHC2SYS_LOG) or None
    found: list[dict[str, Any]] = []
    why: list[str] = []

    def take(name: str, reading: Reading) -> None:
        if reading.discipline is not None:
            found.append(reading.discipline)
        else:
            why.append(f"{name}: {reading.why}")

    if "chronyd" in running or chrony_socket:
        take("chrony", read_chrony(chrony_socket))
    if "ptp4l" in running or ptp4l_uds:
        ptp = read_ptp4l(ptp4l_uds)
        if ptp.discipline is not None and ptp.discipline["clock"] == "PHC" and phc2sys_log:
            phc = read_phc2sys_log(phc2sys_log)
            if phc.discipline is not None and phc.discipline["clock"] == "CLOCK_REALTIME":
                ptp = Reading(with_phc2sys(ptp.discipline, phc.discipline))
            elif phc.discipline is not None:
                why.append(f"phc2sys: its log steers {phc.discipline['clock']}, not CLOCK_REALTIME")
            else:
                why.append(f"phc2sys: {phc.why}")
        elif ptp.discipline is not None and ptp.discipline["clock"] == "PHC":
            why.append(
                f"ptp4l steers the PHC of {ptp.discipline['interface']}; the system clock follows it through "
                f"phc2sys, whose offset is only in its log (${ENV_PHC2SYS_LOG} names it)"
            )
        elif ptp.discipline is not None and ptp.discipline["clock"] != "CLOCK_REALTIME":
            why.append("ptp4l: pmc did not say which clock it steers (no PORT_PROPERTIES_NP answer)")
        take("ptp4l", ptp)
    if not running and not found and not why:
        why.append("no clock daemon running")
    elif not found and not why:
        why.append(f"no reader for {', '.join(running)}")
    return found, why


def _tightest(disciplines: list[dict[str, Any]]) -> dict[str, Any] | None:
    """The reading with the smallest bound on the system clock; else (a PHC-only ptp4l) the first one."""
    system = [d for d in disciplines if d["clock"] == "CLOCK_REALTIME"]
    if system:
        return min(system, key=lambda d: int(d["bound_ns"]))
    return disciplines[0] if disciplines else None


def clock_discipline(
    chrony_socket: str | None = None, ptp4l_uds: str | None = None, phc2sys_log: str | None = None
) -> dict[str, Any] | None:
    """The daemon's own view of this host's clock (`source` chrony or ptp4l, `clock`, `offset_ns`,
    `bound_ns`, `reference` and the daemon's raw fields), the tightest if several; None if none answers."""
    found, _ = read_disciplines(chrony_socket=chrony_socket, ptp4l_uds=ptp4l_uds, phc2sys_log=phc2sys_log)
    return _tightest(found)


def clock_sync_state(
    chrony_socket: str | None = None, ptp4l_uds: str | None = None, phc2sys_log: str | None = None
) -> dict[str, Any]:
    """`synchronized`, `est_error_us`, `max_error_us` (the kernel's), `daemons` (running ones), `host`;
    `discipline` (clock_discipline's dict, or None and `discipline_why`); `uncertainty_ns`, the tighter
    of the kernel's maximum error and the daemon's bound, and `uncertainty_source` ("adjtimex", "chrony",
    "ptp4l", or None when neither holds). Never raises; each daemon asked costs at most 0.5 s."""
    timex = _Timex()
    libc = ctypes.CDLL(None, use_errno=True)
    state = libc.adjtimex(ctypes.byref(timex))
    out: dict[str, Any] = {"host": os.uname().nodename, "daemons": _daemons()}
    bounds: list[tuple[int, str]] = []
    if state < 0:
        out["error"] = os.strerror(ctypes.get_errno())
    else:
        out.update(
            synchronized=state != TIME_ERROR and not timex.status & STA_UNSYNC,
            est_error_us=int(timex.esterror),
            max_error_us=int(timex.maxerror),
        )
        if out["synchronized"]:
            bounds.append((int(timex.maxerror) * 1000, KERNEL))
    try:
        found, why = read_disciplines(out["daemons"], chrony_socket, ptp4l_uds, phc2sys_log)
    except Exception as e:  # a reader bug must not cost the run its time_sync record
        found, why = [], [f"reading the clock daemons failed: {e!r}"]
    out["discipline"] = best = _tightest(found)
    if best is not None and best["clock"] == "CLOCK_REALTIME":
        bounds.append((int(best["bound_ns"]), str(best["source"])))
    else:  # nothing read, or only a PHC's discipline, which bounds not this clock
        out["discipline_why"] = "; ".join(why)
    # On a tie the daemon wins: its number is the measured one, the kernel's is what the daemon wrote.
    tightest = min(bounds, key=lambda b: (b[0], b[1] == KERNEL), default=None)
    out["uncertainty_ns"] = tightest[0] if tightest else None
    out["uncertainty_source"] = tightest[1] if tightest else None
    return out
