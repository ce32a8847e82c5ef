"""What the clock daemons themselves say about this host's clock error: chronyd (chronyc) and ptp4l (pmc).

The kernel's adjtimex view (timesync.py) holds whatever error the daemon last wrote there, often a coarse
one (linuxptp writes maxerror 0 and the kernel then adds 500 µs every second). The daemons know better:
chronyd's tracking report bounds the error against the stratum-1 reference, ptp4l's current data set
gives the offset from its master and the path delay that bounds how wrong that offset can be. Each
reader returns a `Reading`: a discipline dict (integer ns) or None with the reason, never an exception,
whatever a tool prints. The parsers are plain functions over text, tested against output captured from
the real tools (tests/fixtures/timesync/).

phc2sys answers no queries: its offset between the system clock and the PHC is only in its log lines, so
a live phc2sys is read from its log file (or a journal export) that the caller names, never found alone.
"""

from __future__ import annotations

import math
import re
import subprocess
from pathlib import Path
from typing import Any, NamedTuple

TOOL_TIMEOUT_S = 0.5  # chronyc over its Unix socket and pmc (100 ms wait) answer well within this
CHRONY_LOCAL_REFID = "7F7F0101"  # 127.127.1.1: chronyd serving its own clock (`local`), not synchronised
PMC_QUERIES = ("GET TIME_STATUS_NP", "GET CURRENT_DATA_SET", "GET PORT_DATA_SET", "GET PORT_PROPERTIES_NP")
PTP_P2P = "2"  # PORT_DATA_SET delayMechanism: 1 E2E, 2 P2P


class Reading(NamedTuple):
    """A daemon's view of the clock: `discipline` (a dict, integer ns), or None and `why` it is missing."""

    discipline: dict[str, Any] | None
    why: str = ""


def _run(argv: list[str], timeout_s: float) -> tuple[str | None, str]:
    """The tool's stdout, or None and why not: a missing binary, a hang or a crash is a reason."""
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=timeout_s, check=False)
    except FileNotFoundError:
        return None, f"{argv[0]} not installed"
    except subprocess.TimeoutExpired:
        return None, f"{argv[0]} did not answer within {timeout_s} s"
    except (OSError, ValueError) as e:
        return None, f"{argv[0]}: {e}"
    if done.returncode != 0:
        said = (done.stdout.strip() or done.stderr.strip()).splitlines()
        return None, f"{argv[0]} exit {done.returncode}: {said[-1] if said else 'no output'}"
    return done.stdout, ""


def _ns(seconds: float) -> int:
    return round(seconds * 1e9)


def _finite(*values: float) -> bool:
    return all(math.isfinite(v) for v in values)


# --- chrony --------------------------------------------------------------------------------------------

# `chronyc -n tracking` labels, in order; `chronyc -c tracking` prints the same 14 values as CSV.
_CHRONY_LABELS = (
    "Reference ID",
    "Stratum",
    "Ref time (UTC)",
    "System time",
    "Last offset",
    "RMS offset",
    "Frequency",
    "Residual freq",
    "Skew",
    "Root delay",
    "Root dispersion",
    "Update interval",
    "Leap status",
)
_NUM = r"([-+]?\d+(?:\.\d+)?)"


def _chrony_plain(text: str) -> dict[str, Any] | str:
    labels = {}
    for line in text.splitlines():
        label, sep, value = line.partition(" : ")
        if sep:
            labels[label.strip()] = value.strip()
    missing = [name for name in _CHRONY_LABELS if name not in labels]
    if missing:
        return f"chronyc tracking output lacks {', '.join(missing)}"
    ref = re.fullmatch(r"([0-9A-Fa-f]{8}) \((.*)\)", labels["Reference ID"])
    system = re.fullmatch(_NUM + r" seconds (fast|slow) of NTP time", labels["System time"])
    freq = re.fullmatch(_NUM + r" ppm (fast|slow)", labels["Frequency"])
    units = {k: "seconds" for k in _CHRONY_LABELS[4:6] + _CHRONY_LABELS[9:12]} | {
        "Residual freq": "ppm",
        "Skew": "ppm",
    }
    nums = {k: float(m[1]) for k, unit in units.items() if (m := re.fullmatch(_NUM + " " + unit, labels[k]))}
    if not (ref and system and freq and labels["Stratum"].isdigit() and len(nums) == len(units)):
        return "chronyc tracking output not in the expected form"
    # Plain form prints magnitudes with a word; CSV prints chronyd's signed values, which are negative
    # for a fast system clock and for a slow frequency (client.c %O). Normalise to the CSV signs.
    return {
        "refid": ref[1].upper(),
        "name": ref[2],
        "stratum": int(labels["Stratum"]),
        "ref_time": labels["Ref time (UTC)"],
        "system_s": float(system[1]) * (-1 if system[2] == "fast" else 1),
        "last_offset_s": nums["Last offset"],
        "rms_offset_s": nums["RMS offset"],
        "frequency_ppm": float(freq[1]) * (-1 if freq[2] == "slow" else 1),
        "residual_freq_ppm": nums["Residual freq"],
        "skew_ppm": nums["Skew"],
        "root_delay_s": nums["Root delay"],
        "root_dispersion_s": nums["Root dispersion"],
        "update_interval_s": nums["Update interval"],
        "leap_status": labels["Leap status"],
    }


def _chrony_csv(line: str) -> dict[str, Any] | str:
    f = line.strip().split(",")
    if len(f) != 14:
        return f"chronyc -c tracking: {len(f)} fields, expected 14"
    try:
        values = [float(x) for x in f[3:13]]
        stratum = int(f[2])
    except ValueError:
        return "chronyc -c tracking: a numeric field is not a number"
    if not re.fullmatch(r"[0-9A-Fa-f]{8}", f[0]):
        return f"chronyc -c tracking: bad reference ID {f[0]!r}"
    ref_time, system, last, rms, freq, resid, skew, delay, disp, interval = values
    return {
        "refid": f[0].upper(),
        "name": f[1],
        "stratum": stratum,
        "ref_time": ref_time,
        "system_s": system,
        "last_offset_s": last,
        "rms_offset_s": rms,
        "frequency_ppm": freq,
        "residual_freq_ppm": resid,
        "skew_ppm": skew,
        "root_delay_s": delay,
        "root_dispersion_s": disp,
        "update_interval_s": interval,
        "leap_status": f[13],
    }


def parse_chrony_tracking(text: str) -> Reading:
    """A discipline from `chronyc -n [-c] tracking` output (CSV or plain form, told apart by content)."""
    lines = [line for line in text.splitlines() if line.strip()]
    if not lines:
        return Reading(None, "chronyc printed nothing")
    if lines[0].startswith("506 ") or "Cannot talk to daemon" in text:
        return Reading(None, "chronyd not answering (506 Cannot talk to daemon)")
    parsed = _chrony_plain(text) if " : " in lines[0] else _chrony_csv(lines[-1])
    if isinstance(parsed, str):
        return Reading(None, parsed)
    p = parsed
    if not _finite(p["system_s"], p["root_delay_s"], p["root_dispersion_s"]):
        return Reading(None, "chronyc tracking: non-finite offset, delay or dispersion")
    if p["leap_status"] == "Not synchronised" or p["refid"] == "00000000":
        return Reading(None, "chronyd is not synchronised")
    if p["refid"] == CHRONY_LOCAL_REFID:
        # `local` mode: chronyd serves its own free-running clock; root delay/dispersion 0 say nothing.
        return Reading(None, "chronyd follows its local clock (reference 127.127.1.1), no real source")
    # chronyc(1), tracking, "Root dispersion": "An absolute bound on the computer's clock accuracy (assuming
    # the stratum-1 computer is correct) is given by:
    #     clock_error <= |system_time_offset| + root_dispersion + (0.5 * root_delay)"
    # chronyd adds the dispersion accrued since the last update when it answers, so the bound holds now.
    system_ns = _ns(p["system_s"])
    bound = abs(system_ns) + math.ceil(p["root_dispersion_s"] * 1e9 + p["root_delay_s"] * 1e9 / 2)
    return Reading(
        {
            "source": "chrony",
            "clock": "CLOCK_REALTIME",  # chronyd disciplines the system clock
            "offset_ns": -system_ns,  # this clock minus the reference (CSV System time < 0 when fast)
            "bound_ns": bound,
            "reference": p["name"] or p["refid"],
            "refid": p["refid"],
            "stratum": p["stratum"],
            "ref_time": p["ref_time"],
            "last_offset_ns": _ns(p["last_offset_s"]),
            "rms_offset_ns": _ns(p["rms_offset_s"]),
            "frequency_ppm": p["frequency_ppm"],
            "residual_freq_ppm": p["residual_freq_ppm"],
            "skew_ppm": p["skew_ppm"],
            "root_delay_ns": _ns(p["root_delay_s"]),
            "root_dispersion_ns": _ns(p["root_dispersion_s"]),
            "update_interval_s": p["update_interval_s"],
            "leap_status": p["leap_status"],
        }
    )


def read_chrony(socket: str | None = None, timeout_s: float = TOOL_TIMEOUT_S) -> Reading:
    """Ask the running chronyd (default socket /run/chrony/chronyd.sock, else UDP 127.0.0.1:323)."""
    argv = ["chronyc", "-n", "-c"] + (["-h", socket] if socket else []) + ["tracking"]
    out, why = _run(argv, timeout_s)
    if out is None:
        for said in ("506 Cannot talk to daemon", "Could not open connection to daemon"):
            if said in why:
                why = f"chronyd not answering ({said})"
        return Reading(None, why)
    return parse_chrony_tracking(out)


# --- linuxptp ------------------------------------------------------------------------------------------

_PMC_HEAD = re.compile(r"^\s*(\S+) seq \d+ RESPONSE MANAGEMENT (\S+)\s*$")


def parse_pmc(text: str) -> dict[str, list[dict[str, str]]]:
    """pmc's answers by management ID (one dict of fields per responding port); anything else is skipped."""
    out: dict[str, list[dict[str, str]]] = {}
    block: dict[str, str] | None = None
    for line in text.splitlines():
        head = _PMC_HEAD.match(line)
        if head:
            block = {"_from": head[1]}
            out.setdefault(head[2], []).append(block)
        elif line.startswith("\t\t") and block is not None:
            key, _, value = line.strip().partition(" ")
            block[key] = value.strip()
        else:  # "sending: ...", an error status, anything unknown ends the block
            block = None
    return out


def _num(fields: dict[str, str], key: str) -> float | None:
    try:
        v = float(fields[key])
    except (KeyError, ValueError):
        return None
    return v if math.isfinite(v) else None


def ptp4l_discipline(text: str) -> Reading:
    """A discipline from pmc's answers to PMC_QUERIES (TIME_STATUS_NP, CURRENT_DATA_SET, PORT_* sets)."""
    r = parse_pmc(text)
    if not r:
        return Reading(None, "ptp4l did not answer pmc")
    ports = r.get("PORT_PROPERTIES_NP") or r.get("PORT_DATA_SET") or []
    slave = next((p for p in ports if p.get("portState") == "SLAVE"), None)
    if slave is None:
        states = ", ".join(sorted({p.get("portState", "?") for p in ports})) or "none reported"
        return Reading(None, f"no ptp4l port is SLAVE (port states: {states})")
    status = (r.get("TIME_STATUS_NP") or [{}])[0]
    current = (r.get("CURRENT_DATA_SET") or [{}])[0]
    if status.get("gmPresent") != "true":
        return Reading(None, "ptp4l sees no grandmaster (gmPresent false)")
    offset, mean_delay = _num(current, "offsetFromMaster"), _num(current, "meanPathDelay")
    if offset is None or mean_delay is None:
        return Reading(None, "pmc CURRENT_DATA_SET lacks offsetFromMaster/meanPathDelay")
    port_ds = next(
        (p for p in r.get("PORT_DATA_SET", []) if p.get("portIdentity") == slave.get("portIdentity")), {}
    )
    peer_delay = _num(port_ds, "peerMeanPathDelay") or 0.0
    # The slave computes offset = ((t2 - t1) - (t4 - t3)) / 2, true only if both directions take equally
    # long. With one-way delays d_ms, d_sm >= 0 the error of that assumption is (d_ms - d_sm) / 2, whose size
    # is at most (d_ms + d_sm) / 2 = meanPathDelay. So |clock - master| <= |offsetFromMaster| + meanPathDelay,
    # timestamping latency included (it is part of the measured delays). With P2P delay the link delay is
    # in PORT_DATA_SET's peerMeanPathDelay, so the larger of the two is used. Not included: the master's
    # own error when it is a boundary clock (stepsRemoved > 1), and drift since the last Sync (a servo in
    # lock has a residual frequency error of ppb, i.e. ns per second).
    path = max(mean_delay, peer_delay if port_ds.get("delayMechanism") == PTP_P2P else 0.0, 0.0)
    offset_ns = round(offset)
    stamping = slave.get("timestamping")  # only PORT_PROPERTIES_NP says; SOFTWARE, HARDWARE, ONESTEP, ...
    discipline: dict[str, Any] = {
        "source": "ptp4l",
        # With software timestamping ptp4l steers CLOCK_REALTIME itself; with hardware timestamping it
        # steers the NIC's PHC, and the system clock follows only through phc2sys.
        "clock": "CLOCK_REALTIME" if stamping == "SOFTWARE" else "PHC" if stamping else "unknown",
        "offset_ns": offset_ns,
        "bound_ns": abs(offset_ns) + math.ceil(path),
        "reference": f"PTP grandmaster {status.get('gmIdentity', '?')}",
        "gm_identity": status.get("gmIdentity"),
        "port_state": slave.get("portState"),
        "port_identity": slave.get("portIdentity"),
        "interface": slave.get("interface"),
        "timestamping": slave.get("timestamping"),
        "steps_removed": int(_num(current, "stepsRemoved") or 0),
        "mean_path_delay_ns": round(mean_delay),
        "peer_mean_path_delay_ns": round(peer_delay),
    }
    master_offset = _num(status, "master_offset")
    if master_offset is not None:
        discipline["master_offset_ns"] = round(master_offset)
    return Reading(discipline)


def read_ptp4l(uds: str | None = None, timeout_s: float = TOOL_TIMEOUT_S) -> Reading:
    """Ask the running ptp4l on its management socket (default /var/run/ptp4l, else its `uds_address`)."""
    argv = ["pmc", "-u", "-b", "0"] + (["-s", uds] if uds else []) + list(PMC_QUERIES)
    out, why = _run(argv, timeout_s)
    if out is None:
        return Reading(None, why)
    return ptp4l_discipline(out)


# phc2sys (print.c, phc2sys.c update_clock): "<dev> <phc|sys|pps> offset %9d s%d freq %+7.0f[ delay %6d]",
# after "phc2sys[<monotonic s>]: " on stdout (-m) or "[<monotonic s>] " in syslog/journal lines.
_PHC2SYS = re.compile(
    r"(?P<clock>\S+) (?P<label>phc|sys|pps) offset\s+(?P<offset>-?\d+) s(?P<state>\d) "
    r"freq\s+(?P<freq>[-+]?\d+)(?: delay\s+(?P<delay>-?\d+))?\s*$"
)


def parse_phc2sys_line(text: str) -> Reading:
    """The last phc2sys offset line in `text`: how far the target clock was from its source (the PHC)."""
    for line in reversed(text.splitlines()):
        m = _PHC2SYS.search(line)
        if m is None or " master offset " in line:  # ptp4l's own lines are not phc2sys's
            continue
        offset, delay = int(m["offset"]), int(m["delay"] or 0)
        if m["state"] not in ("1", "2", "3"):  # s0 unlocked: not yet steering
            return Reading(None, f"phc2sys not locked (s{m['state']})")
        # The offset is read between two system-clock reads around a PHC read that `delay` ns apart; the
        # PHC time can be anywhere in between, so the reading itself may be off by up to delay / 2.
        return Reading(
            {
                "source": "phc2sys",
                "clock": m["clock"],
                "offset_ns": offset,
                "bound_ns": abs(offset) + math.ceil(max(delay, 0) / 2),
                "reference": m["label"],
                "servo_state": int(m["state"]),
                "freq_ppb": int(m["freq"]),
                "delay_ns": delay,
            }
        )
    return Reading(None, "no phc2sys offset line")


def read_phc2sys_log(path: str | Path, tail_bytes: int = 65536) -> Reading:
    """The last offset line of a phc2sys log file (only its tail is read)."""
    try:
        with open(path, "rb") as f:
            f.seek(0, 2)
            f.seek(max(0, f.tell() - tail_bytes))
            text = f.read().decode("utf-8", "replace")
    except OSError as e:
        return Reading(None, f"phc2sys log {path}: {e.strerror or e}")
    return parse_phc2sys_line(text)


def with_phc2sys(ptp: dict[str, Any], phc2sys: dict[str, Any]) -> dict[str, Any]:
    """ptp4l's PHC discipline carried to CLOCK_REALTIME through phc2sys: the two bounds add."""
    return {
        **ptp,
        "clock": "CLOCK_REALTIME",
        "offset_ns": ptp["offset_ns"] + phc2sys["offset_ns"],
        "bound_ns": ptp["bound_ns"] + phc2sys["bound_ns"],
        "phc2sys_offset_ns": phc2sys["offset_ns"],
        "phc2sys_delay_ns": phc2sys["delay_ns"],
        "phc2sys_servo_state": phc2sys["servo_state"],
    }
