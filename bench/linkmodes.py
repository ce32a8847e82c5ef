"""Link-settings GETs: labctl's raw ethtool netlink (labctl.linux.ethtool_link) vs pyroute2's NlEthtool, on
the same veth, in the same run.

A namespace with veth pair va/vb; this process's thread enters it and both clients open their sockets
there. For LINKINFO_GET, LINKMODES_GET and STRSET_GET (ETH_SS_LINK_MODES: ~120 strings), each client sends
the request and decodes the reply N times per round; per-call durations (time.perf_counter_ns around one
request + decode). pyroute2 0.9.7 has no FEC or PRIVFLAGS message class, so those rows are ours alone (and a
veth answers them EOPNOTSUPP: the row then times the refusal). It prints the median and p99 per client, and
the ratio of medians (ours / pyroute2). pyroute2 is timed as its API is used: NlEthtool.get_* binds (resolves
the family) on every call; its get_stringset asks for every string set of the device, ours for one. Ours
parses ~120 strings in Python (~0.3 ms), which is why EthtoolLink fetches the link-mode set once per socket.
The machine may be shared: quote the load average printed with the numbers.
Run as root: python bench/linkmodes.py [--calls 2000] [--rounds 3]
"""

from __future__ import annotations

import argparse
import contextlib
import os
import signal
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

from labctl.linux import netns
from labctl.linux.ethtool_link import EthtoolLink
from labctl.linux.ethtool_msgs import ETH_SS_LINK_MODES
from labctl.linux.netlink import NetlinkError

sys.path.insert(0, str(Path(__file__).resolve().parent))  # bench/ is not a package
from _table import record


def timed(call: Callable[[], object], calls: int, rounds: int) -> list[int]:
    out: list[int] = []
    for _ in range(rounds):
        for _ in range(calls):
            t0 = time.perf_counter_ns()
            with contextlib.suppress(NetlinkError):  # a veth refuses FEC and PRIVFLAGS: time the refusal
                call()
            out.append(time.perf_counter_ns() - t0)
    return out


def stats(d: list[int]) -> tuple[float, float]:
    s = sorted(d)
    return statistics.median(s) / 1e3, s[min(len(s) - 1, int(0.99 * len(s)))] / 1e3


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--calls", type=int, default=2000, help="requests per round and client")
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    if os.geteuid() != 0:
        print("skipped: needs root (a veth in a namespace)")
        return
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    from pyroute2.netlink.generic.ethtool import NlEthtool

    name = f"lt{os.getpid()}-lmbench"
    subprocess.run(["ip", "netns", "add", name], check=True)
    try:
        subprocess.run(
            ["ip", "-n", name, "link", "add", "va", "type", "veth", "peer", "name", "vb"], check=True
        )
        with contextlib.ExitStack() as stack:
            stack.enter_context(netns.entered(name))
            ours = stack.enter_context(EthtoolLink())
            theirs = NlEthtool()
            stack.callback(theirs.close)
            rows: list[tuple[str, list[int], list[int] | None]] = [
                (
                    "LINKINFO_GET",
                    timed(lambda: ours.linkinfo("va"), args.calls, args.rounds),
                    timed(lambda: theirs.get_linkinfo("va"), args.calls, args.rounds),
                ),
                (
                    "LINKMODES_GET",
                    timed(lambda: ours.linkmodes("va"), args.calls, args.rounds),
                    timed(lambda: theirs.get_linkmode("va"), args.calls, args.rounds),
                ),
                (
                    "STRSET_GET link modes",
                    timed(lambda: ours.strings("va", ETH_SS_LINK_MODES), args.calls, args.rounds),
                    timed(lambda: theirs.get_stringset("va"), args.calls, args.rounds),
                ),
                ("FEC_GET (veth: EOPNOTSUPP)", timed(lambda: ours.fec("va"), args.calls, args.rounds), None),
                (
                    "PRIVFLAGS_GET (veth: EOPNOTSUPP)",
                    timed(lambda: ours.privflags("va"), args.calls, args.rounds),
                    None,
                ),
            ]
    finally:
        subprocess.run(["ip", "netns", "del", name], check=False)
    print(f"{'request':34} {'ours med µs':>12} {'p99':>8} {'pyroute2 med':>13} {'p99':>8} {'ratio':>6}")
    for label, mine, other in rows:
        med, p99 = stats(mine)
        if other is None:
            print(f"{label:34} {med:12.1f} {p99:8.1f} {'n/a':>13} {'':>8} {'':>6}")
            record("linkmodes", f"{label} median", med, "µs")
            continue
        omed, op99 = stats(other)
        print(f"{label:34} {med:12.1f} {p99:8.1f} {omed:13.1f} {op99:8.1f} {med / omed:6.2f}")
        record("linkmodes", f"{label} median", med, "µs", peer="pyroute2 ethtool", peer_value=omed)
    print(f"load average: {os.getloadavg()}")
    print("note: pyroute2's get_stringset asks for every string set of the device, ours for one")


if __name__ == "__main__":
    main()
