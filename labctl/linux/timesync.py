"""How well this host's clock is disciplined: the kernel's own view (adjtimex) and which daemon drives it.

The kernel keeps, whatever the daemon (chrony, ntpd, ptp4l + phc2sys, systemd-timesyncd), a
synchronized flag (STA_UNSYNC clear), an estimated error and a maximum error in µs, set by the daemon
through adjtimex(2). Read with modes = 0, nothing changes. The daemon is found by process name. run.json
records this per host beside the measured agent clock offsets, so a reader can tell a host that was
free-running from one that was disciplined to a few µs.
"""

from __future__ import annotations

import ctypes
import os
from pathlib import Path
from typing import Any

STA_UNSYNC = 0x0040
TIME_ERROR = 5
DAEMONS = ("chronyd", "ptp4l", "phc2sys", "ntpd", "systemd-timesyn", "timemaster")


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


def clock_sync_state() -> dict[str, Any]:
    """`synchronized`, `est_error_us`, `max_error_us` (the kernel's), `daemons` (running ones), `host`."""
    timex = _Timex()
    libc = ctypes.CDLL(None, use_errno=True)
    state = libc.adjtimex(ctypes.byref(timex))
    out: dict[str, Any] = {"host": os.uname().nodename, "daemons": _daemons()}
    if state < 0:
        out["error"] = os.strerror(ctypes.get_errno())
        return out
    out.update(
        synchronized=state != TIME_ERROR and not timex.status & STA_UNSYNC,
        est_error_us=int(timex.esterror),
        max_error_us=int(timex.maxerror),
    )
    return out
