"""Live clock daemons: chronyd (-x: it never touches the system clock) and ptp4l in network namespaces, and
their tools when the daemons are dead or missing. Parsing the tools' captured output is
tests/unit/test_timesync_daemons.py."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from labctl.linux.clockd import (
    read_chrony,
    read_ptp4l,
)
from labctl.linux.timesync import clock_sync_state
from tests.conftest import require


def test_missing_binaries_and_dead_sockets_are_reasons(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    sleep = shutil.which("sleep")
    monkeypatch.setenv("PATH", str(tmp_path))  # neither chronyc nor pmc
    assert read_chrony().why == "chronyc not installed"
    assert read_ptp4l().why == "pmc not installed"
    hang = tmp_path / "chronyc"
    hang.write_text(f"#!/bin/sh\nexec {sleep} 5\n")
    hang.chmod(0o755)
    t0 = time.monotonic()
    r = read_chrony(timeout_s=0.2)
    assert r.discipline is None and "did not answer" in r.why and time.monotonic() - t0 < 2


def test_dead_daemons_answer_with_reasons(tmp_path: Path) -> None:
    require(shutil.which("chronyc") is not None, "chronyc not installed (apt-get install chrony)")
    require(shutil.which("pmc") is not None, "pmc not installed (apt-get install linuxptp)")
    r = read_chrony(str(tmp_path / "no-chronyd.sock"))
    assert r.discipline is None and r.why == "chronyd not answering (Could not open connection to daemon)"
    r = read_ptp4l(str(tmp_path / "no-ptp4l.sock"))
    assert r.discipline is None and r.why == "ptp4l did not answer pmc"


# -- live daemons ------------------------------------------------------------------------------------------
def _free_udp_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _stop(procs: list[subprocess.Popen[bytes]]) -> None:
    for p in procs:
        if p.poll() is None:
            p.terminate()
    for p in procs:
        try:
            p.wait(timeout=5)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()


@pytest.fixture
def chronyd_pair() -> Iterator[str]:
    """A chronyd serving its local clock on a free loopback port and a chronyd (-x) synchronised to it;
    yields the client's command socket. Neither touches the system clock; both stop afterwards."""
    require(os.geteuid() == 0, "chronyd runs as root here")
    require(shutil.which("chronyd") is not None, "chronyd not installed (apt-get install chrony)")
    require(shutil.which("chronyc") is not None, "chronyc not installed (apt-get install chrony)")
    work = Path(tempfile.mkdtemp(prefix="lc-chrony-"))  # short: socket paths are limited to 108 bytes
    work.chmod(0o700)  # chronyd refuses a socket directory others can read
    port = _free_udp_port()
    confs = {
        "s": f"port {port}\nbindaddress 127.0.0.1\nallow 127.0.0.1\nlocal stratum 8\n",
        "c": f"port 0\nserver 127.0.0.1 port {port} iburst minpoll -4 maxpoll -4\n",
    }
    procs: list[subprocess.Popen[bytes]] = []
    try:
        for name, conf in confs.items():
            (work / name).mkdir(mode=0o700)
            (work / name / "chrony.conf").write_text(
                f"bindcmdaddress {work / name / 'chronyd.sock'}\ncmdport 0\n"
                f"pidfile {work / name / 'chronyd.pid'}\n{conf}"
            )
            cmd = ["chronyd", "-x", "-d", "-u", "root", "-f", str(work / name / "chrony.conf")]
            procs.append(subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
        yield str(work / "c" / "chronyd.sock")
    finally:
        _stop(procs)
        shutil.rmtree(work, ignore_errors=True)


def test_live_chronyd(chronyd_pair: str) -> None:
    deadline = time.monotonic() + 10
    r = read_chrony(chronyd_pair)
    while r.discipline is None and time.monotonic() < deadline:
        time.sleep(0.2)
        r = read_chrony(chronyd_pair)
    d = r.discipline
    assert d is not None, r.why
    assert (d["source"], d["clock"], d["reference"], d["leap_status"]) == (
        "chrony",
        "CLOCK_REALTIME",
        "127.0.0.1",
        "Normal",
    )
    assert d["stratum"] == 9
    # Same clock at both ends, over loopback: the bound is micro-, not milliseconds.
    assert abs(d["offset_ns"]) <= d["bound_ns"] < 1_000_000
    s = clock_sync_state(chrony_socket=chronyd_pair)
    assert "chronyd" in s["daemons"]
    assert s["discipline"]["source"] == "chrony"
    assert (
        s["uncertainty_source"] in ("chrony", "adjtimex")
        and s["uncertainty_ns"] <= s["discipline"]["bound_ns"]
    )


@pytest.fixture
def ptp4l_pair() -> Iterator[str]:
    """A ptp4l grandmaster and a slave-only ptp4l on the two ends of a veth pair, each in its own network
    namespace, software timestamping, free_running (neither steers the system clock). Yields the slave's
    management socket; the processes, the namespaces (and with them the veths) go afterwards."""
    require(os.geteuid() == 0, "needs root for network namespaces")
    for tool in ("ip", "ptp4l", "pmc"):
        require(shutil.which(tool) is not None, f"{tool} not installed (apt-get install iproute2 linuxptp)")
    tag = f"lc{os.getpid() % 100000}"
    work = Path(tempfile.mkdtemp(prefix="lc-ptp-"))
    namespaces: list[str] = []
    procs: list[subprocess.Popen[bytes]] = []

    def ip(*args: str) -> None:
        subprocess.run(["ip", *args], check=True, capture_output=True, timeout=10)

    try:
        for end in ("m", "s"):
            ip("netns", "add", f"{tag}-{end}")
            namespaces.append(f"{tag}-{end}")
        ip("link", "add", f"{tag}m", "type", "veth", "peer", "name", f"{tag}s")
        for n, end in enumerate(("m", "s"), start=1):
            ns, dev = f"{tag}-{end}", f"{tag}{end}"
            ip("link", "set", dev, "netns", ns)
            ip("-n", ns, "link", "set", "lo", "up")
            ip("-n", ns, "link", "set", dev, "up")
            ip("-n", ns, "addr", "add", f"10.213.0.{n}/30", "dev", dev)
            role = "priority1 10" if end == "m" else "slaveOnly 1"
            (work / f"{end}.cfg").write_text(
                f"[global]\n{role}\nfree_running 1\nlogSyncInterval -3\nlogAnnounceInterval -2\n"
                f"logMinDelayReqInterval -3\nuds_address {work / end}.sock\n"
            )
            cmd = ["ip", "netns", "exec", ns, "ptp4l", "-f", str(work / f"{end}.cfg"), "-i", dev, "-S", "-q"]
            procs.append(subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
        yield str(work / "s.sock")
    finally:
        _stop(procs)
        for ns in namespaces:
            subprocess.run(["ip", "netns", "del", ns], check=False, capture_output=True)
        shutil.rmtree(work, ignore_errors=True)


@pytest.mark.emulated
def test_live_ptp4l_in_netns(ptp4l_pair: str) -> None:
    uds = ptp4l_pair
    deadline = time.monotonic() + 10
    r = read_ptp4l(uds)
    while r.discipline is None and time.monotonic() < deadline:
        if "UNCALIBRATED" in r.why:
            # free_running leaves the servo unlocked; telling ptp4l its clock is in sync (as an external
            # servo would) lets the port go to SLAVE. Harmless to repeat.
            subprocess.run(
                ["pmc", "-u", "-b", "0", "-s", uds, "SET SYNCHRONIZATION_UNCERTAIN_NP 0"],
                capture_output=True,
                timeout=5,
                check=False,
            )
        time.sleep(0.25)
        r = read_ptp4l(uds)
    d = r.discipline
    assert d is not None, r.why
    assert (d["source"], d["clock"], d["port_state"], d["timestamping"]) == (
        "ptp4l",
        "CLOCK_REALTIME",
        "SLAVE",
        "SOFTWARE",
    )
    assert d["reference"].startswith("PTP grandmaster ") and d["steps_removed"] == 1
    assert d["mean_path_delay_ns"] > 0
    # One clock at both ends: the true offset is 0, and the bound must cover it.
    assert d["bound_ns"] >= abs(d["offset_ns"])
    s = clock_sync_state(ptp4l_uds=uds)
    assert s["discipline"] is not None and s["discipline"]["source"] == "ptp4l"
