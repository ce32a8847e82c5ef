"""Whether a run recorded `running` still runs: its process, on this host, alive and the one that started
it; a run whose process is gone reads `crashed` (worked out when read, never stored)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any


def _boot_time_s() -> float | None:
    try:
        with open("/proc/stat") as f:
            for line in f:
                if line.startswith("btime "):
                    return float(line.split()[1])
    except OSError:
        pass
    return None


def process_alive(pid: int | None, started_ns: int | None) -> bool:
    """Whether the process `pid` still runs and is the one that started a run at `started_ns`: a pid
    since reused by a process started after the run counts as gone (Linux: /proc/<pid>/stat)."""
    if pid is None or pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass  # someone else's process: it exists
    except OSError:
        return False
    boot = _boot_time_s()
    if boot is None or started_ns is None:
        return True
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
        ticks = int(stat.rsplit(")", 1)[1].split()[19])  # field 22, starttime (after comm's parenthesis)
    except (OSError, ValueError, IndexError):
        return True
    process_started_s = boot + ticks / os.sysconf("SC_CLK_TCK")
    return process_started_s <= started_ns / 1e9 + 2.0  # btime is whole seconds: a little slack


_HOST: str | None = None


def effective_status(row: dict[str, Any]) -> str:
    """The row's status as of now: `crashed` for a run recorded running whose process (on this host) is
    gone; a run recorded running on another host stays `running` (its process cannot be seen from here)."""
    global _HOST
    status = str(row.get("recorded_status") or "unknown")
    if status != "running":
        return status
    if _HOST is None:
        _HOST = os.uname().nodename
    if row.get("host") not in (None, _HOST):
        return status
    return "running" if process_alive(row.get("pid"), row.get("started_ns")) else "crashed"
