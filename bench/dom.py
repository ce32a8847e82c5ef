"""Rx power sampling rate per port: emulated module vs raw netlink vs an `ethtool -m` subprocess loop.

    sudo python bench/dom.py [--rounds 5] [--seconds 0.4]

Rows (samples/s per port, median over rounds; per-sample p50/p99 from all rounds):
- emulated module, read + decode: one EmulatedQsfp28, lower page 0 bytes 34–41 read through the module
  read interface, decoded to 4 lanes of mW and dBm (the fast poller's work per sample).
- emulated, 16 ports on one core: the same over 16 modules round-robin, reported per port.
- emulated, set + read + decode: what the simulated lab's probe does per port per tick.
- raw netlink read on a veth: ETHTOOL_MSG_MODULE_EEPROM_GET for the same 8 bytes. A veth has no module,
  so this can only fail (EOPNOTSUPP); it times the kernel round trip, not a module's I2C.
- `ethtool -m` loop on the same veth: one `ethtool -m vb offset 34 length 8 hex on` process per sample
  (the 100 ms ethtool polling the Opus testbed used, run as fast as it goes); also fails on a veth.
Needs root for the namespace (and `ip`, `ethtool` on PATH: a row whose tool is missing says so in its note);
the emulated rows run without them.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import shutil
import signal
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

from labctl.linux import netns
from labctl.linux.ethtool import NetlinkModuleEeprom
from labctl.linux.netlink import NetlinkError
from labctl.linux.transceiver import module_info, mw_to_dbm
from labctl.models.module_eeprom import EmulatedQsfp28

sys.path.insert(0, str(Path(__file__).resolve().parent))  # bench/ is not a package
from _table import record

PORTS = 16


def measure(
    step: Callable[[], None], rounds: int, seconds: float, per_call: int = 1
) -> tuple[float, list[int]]:
    """Median samples/s over rounds, and every call's duration in ns (one call = per_call samples)."""
    rates: list[float] = []
    durations: list[int] = []
    clock = time.perf_counter_ns
    for _ in range(rounds):
        n = 0
        start = clock()
        deadline = start + int(seconds * 1e9)
        t = start
        while t < deadline:
            step()
            t2 = clock()
            durations.append(t2 - t)
            t = t2
            n += 1
        rates.append(n * per_call / ((t - start) / 1e9))
    return statistics.median(rates), durations


def pct(durations: list[int], q: float) -> float:
    s = sorted(durations)
    return s[min(len(s) - 1, int(q * len(s)))] / 1e3


def emulated_steps() -> tuple[Callable[[], None], Callable[[], None], Callable[[], None]]:
    modules = [EmulatedQsfp28(rx_power_mw=0.5 + i / 100) for i in range(PORTS)]
    info = module_info(modules[0])
    (r,) = info.rx_power_reads
    args = (r.i2c_address, r.page, r.bank, r.offset, r.length)
    decode = info.decode_rx_power_mw
    one = modules[0]

    def single() -> None:
        for mw in decode([one.read(*args)]):
            mw_to_dbm(mw)

    def sixteen() -> None:
        for m in modules:
            for mw in decode([m.read(*args)]):
                mw_to_dbm(mw)

    def set_read_decode() -> None:
        one.set_rx_power_dbm(-2.5)
        mw_to_dbm(decode([one.read(*args)])[0])

    return single, sixteen, set_read_decode


class Netns:
    """A namespace with veth va/vb; the bench's own (single) thread enters it, then leaves and deletes it."""

    def __init__(self) -> None:
        self.name = f"lt{os.getpid()}-bench"
        self._inside = contextlib.ExitStack()

    def __enter__(self) -> Netns:
        subprocess.run(["ip", "netns", "add", self.name], check=True)
        try:
            subprocess.run(
                ["ip", "-n", self.name, "link", "add", "va", "type", "veth", "peer", "name", "vb"], check=True
            )
            subprocess.run(["ip", "-n", self.name, "link", "set", "vb", "up"], check=True)
            self._inside.enter_context(netns.entered(self.name))
        except BaseException:
            subprocess.run(["ip", "netns", "del", self.name], check=False)
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self._inside.close()
        subprocess.run(["ip", "netns", "del", self.name], check=False)


def ethtool_loop(rounds: int, seconds: float) -> tuple[str, float, list[int] | None, str]:
    """One `ethtool -m` process per sample on the namespace's veth: the peer the other rows are set against."""
    cmd = ["ethtool", "-m", "vb", "offset", "34", "length", "8", "hex", "on"]
    codes: set[int] = set()

    def ethtool_read() -> None:
        codes.add(subprocess.run(cmd, capture_output=True, check=False).returncode)

    rate, d = measure(ethtool_read, rounds, seconds)
    return ("ethtool -m subprocess loop on a veth", rate, d, f"can only fail on veth (exit {sorted(codes)})")


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--seconds", type=float, default=0.4, help="per round and method")
    args = parser.parse_args()
    # A timeout's SIGTERM unwinds like Ctrl-C, so the veth namespace is removed.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))

    rows: list[tuple[str, float, list[int] | None, str]] = []
    single, sixteen, set_read_decode = emulated_steps()
    rate, d = measure(single, args.rounds, args.seconds)
    rows.append(("emulated module, read + decode (1 port)", rate, d, ""))
    rate, d = measure(sixteen, args.rounds, args.seconds, per_call=PORTS)
    rows.append((f"emulated module, {PORTS} ports on one core", rate / PORTS, None, "per port"))
    rate, d = measure(set_read_decode, args.rounds, args.seconds)
    rows.append(("emulated module, set + read + decode (sim probe)", rate, d, ""))

    # What the veth rows need is said in their note, one line each (as bench/all.py does), never a traceback.
    missing = [tool for tool in ("ip", "ethtool") if shutil.which(tool) is None]
    if os.geteuid() != 0 or "ip" in missing:
        why = "skipped: needs root" if os.geteuid() != 0 else "skipped: needs ip (iproute2) on PATH"
        rows.append(("raw netlink read on a veth", float("nan"), None, why))
        rows.append(("ethtool -m subprocess loop on a veth", float("nan"), None, why))
    else:
        with Netns():
            nl = NetlinkModuleEeprom("vb")
            failures = 0

            def netlink_read() -> None:
                nonlocal failures
                try:
                    nl.read_raw(0x50, 0, 0, 34, 8)
                except NetlinkError:
                    failures += 1

            rate, d = measure(netlink_read, args.rounds, args.seconds)
            nl.close()
            note = "can only fail on veth" + (
                " (every read failed: EOPNOTSUPP)" if failures == len(d) else ""
            )
            rows.append(("raw netlink read on a veth", rate, d, note))
            if "ethtool" in missing:
                rows.append(
                    (
                        "ethtool -m subprocess loop on a veth",
                        float("nan"),
                        None,
                        "skipped: needs ethtool on PATH",
                    )
                )
            else:
                rows.append(ethtool_loop(args.rounds, max(args.seconds, 0.5)))

    print(f"{'path':<50} {'samples/s/port':>15} {'p50 µs':>9} {'p99 µs':>9}  note")
    for name, rate, d, note in rows:
        p50 = f"{pct(d, 0.5):9.1f}" if d else f"{'':>9}"
        p99 = f"{pct(d, 0.99):9.1f}" if d else f"{'':>9}"
        print(f"{name:<50} {rate:>15,.0f} {p50} {p99}  {note}")
    ethtool = rows[-1][1]
    measured = ethtool == ethtool and ethtool > 0  # not NaN
    if measured:
        print()
        print("ratio vs the ethtool -m loop, like for like (the 16-port row against ethtool's rate / 16,")
        print("one core looping ethtool over 16 ports)")
        for name, rate, _d, note in rows[:-1]:
            peer = ethtool / PORTS if note == "per port" else ethtool
            print(f"  {name:<48} {rate / peer:>10,.0f}x")
    print()
    print(f"goal >= 1,000 samples/s per port, {PORTS} emulated ports on one core: {rows[1][1]:,.0f}")
    record(
        "dom",
        f"emulated module, {PORTS} ports on one core",
        rows[1][1],
        "samples/s/port",
        peer=f"ethtool -m loop / {PORTS}" if measured else None,
        peer_value=ethtool / PORTS if measured else None,
        goal=">= 1,000 samples/s/port",
    )
    for name, rate, _d, _note in (rows[0], rows[3]) if measured else rows[:1]:
        record(
            "dom",
            name,
            rate,
            "samples/s/port",
            peer="ethtool -m loop" if measured else None,
            peer_value=ethtool if measured else None,
            goal=">= 20x ethtool -m",
        )
    if measured:
        print(
            f"goal >= 20x the ethtool -m loop, per port: emulated {rows[0][1] / ethtool:,.0f}x, "
            f"raw netlink {rows[3][1] / ethtool:,.0f}x"
        )


if __name__ == "__main__":
    main()
