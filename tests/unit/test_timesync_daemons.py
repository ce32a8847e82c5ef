"""Reading chronyd's and ptp4l's own clock error (labctl/linux/clockd.py) and its use in clock_sync_state.

The fixtures are the real tools' output, captured on Debian 12 by tests/fixtures/timesync/capture.sh
(see its README). The live daemons are tests/integration/test_timesync_daemons.py."""

from __future__ import annotations

from pathlib import Path

import pytest

from labctl.linux import clockd, timesync
from labctl.linux.clockd import (
    parse_chrony_tracking,
    parse_phc2sys_line,
    parse_pmc,
    ptp4l_discipline,
    read_phc2sys_log,
)
from labctl.linux.timesync import clock_sync_state, read_disciplines
from tests.conftest import REPO

FIX = REPO / "tests" / "fixtures" / "timesync"


def fixture(name: str) -> str:
    return (FIX / name).read_text()


# -- chrony ------------------------------------------------------------------------------------------------
def test_chrony_csv_fixture_gives_the_documented_bound() -> None:
    d = parse_chrony_tracking(fixture("chrony-tracking-csv.txt")).discipline
    assert d is not None
    # 7F000001,127.0.0.1,9,1796178613.497581500,-0.000001304,-0.000000035,0.000000019,0.001,-0.003,0.078,
    # 0.000006424,0.000000718,0.1,Normal
    assert d["source"] == "chrony" and d["clock"] == "CLOCK_REALTIME"
    assert (d["reference"], d["refid"], d["stratum"], d["leap_status"]) == (
        "127.0.0.1",
        "7F000001",
        9,
        "Normal",
    )
    assert d["offset_ns"] == 1304  # System time -1.304 µs in CSV = the system clock is 1.304 µs fast
    assert (d["last_offset_ns"], d["rms_offset_ns"]) == (-35, 19)
    assert (d["root_delay_ns"], d["root_dispersion_ns"]) == (6424, 718)
    assert (d["frequency_ppm"], d["residual_freq_ppm"], d["skew_ppm"]) == (0.001, -0.003, 0.078)
    assert d["update_interval_s"] == 0.1
    # chronyc(1): clock_error <= |system_time_offset| + root_dispersion + 0.5 * root_delay
    assert d["bound_ns"] == 1304 + 718 + 6424 // 2


def test_chrony_plain_fixture_agrees_with_csv() -> None:
    plain = parse_chrony_tracking(fixture("chrony-tracking.txt")).discipline
    csv = parse_chrony_tracking(fixture("chrony-tracking-csv.txt")).discipline
    assert plain is not None and csv is not None
    assert plain["ref_time"] == "Wed Dec 02 02:30:13 2026"
    assert plain["bound_ns"] == 1304 + 716 + 6424 // 2  # dispersion grew 2 ns between the two chronyc calls
    same = ("offset_ns", "reference", "stratum", "root_delay_ns", "frequency_ppm", "skew_ppm", "leap_status")
    assert {k: plain[k] for k in same} == {k: csv[k] for k in same}


@pytest.mark.parametrize(
    ("name", "why"),
    [
        ("chrony-tracking-local.txt", "local clock"),
        ("chrony-tracking-local-csv.txt", "local clock"),
        ("chrony-tracking-unsync.txt", "not synchronised"),
        ("chrony-tracking-unsync-csv.txt", "not synchronised"),
        ("chrony-not-running.txt", "506 Cannot talk to daemon"),
        ("chrony-sources.txt", "expected 14"),
    ],
)
def test_chrony_states_without_a_usable_bound(name: str, why: str) -> None:
    r = parse_chrony_tracking(fixture(name))
    assert r.discipline is None and why in r.why


def test_chrony_garbage_and_partial_output_give_reasons() -> None:
    full = fixture("chrony-tracking.txt")
    csv = fixture("chrony-tracking-csv.txt").strip()
    cases = [
        "",
        "\n\n",
        "\x00\xff garbage",
        full[: len(full) // 2],  # cut mid-report
        full.replace("seconds fast of NTP time", "parsecs fast"),
        full.replace("Stratum         : 9", "Stratum         : nine"),
        csv[: len(csv) // 2],
        csv.replace("0.000006424", "abc"),
        csv.replace("0.000006424", "nan"),
        csv.replace("7F000001", "ZZ"),
        csv + ",extra",
        "Reference ID : x (y)\n" * 20,
    ]
    for text in cases:
        r = parse_chrony_tracking(text)
        assert r.discipline is None and r.why, text


# -- linuxptp ----------------------------------------------------------------------------------------------
def test_pmc_answers_are_grouped_by_management_id() -> None:
    r = parse_pmc(fixture("pmc-slave.txt"))
    assert set(r) == {
        "TIME_STATUS_NP",
        "CURRENT_DATA_SET",
        "PORT_DATA_SET",
        "PORT_PROPERTIES_NP",
        "PARENT_DATA_SET",
    }
    assert r["TIME_STATUS_NP"][0]["master_offset"] == "-1414"
    assert r["TIME_STATUS_NP"][0]["gmIdentity"] == "6e2e2a.fffe.3ec42f"
    assert r["PORT_PROPERTIES_NP"][0] == {
        "_from": "9a4f43.fffe.15e04c-1",
        "portIdentity": "9a4f43.fffe.15e04c-1",
        "portState": "SLAVE",
        "timestamping": "SOFTWARE",
        "interface": "lcfix-vs",
    }
    assert r["PARENT_DATA_SET"][0]["gm.ClockClass"] == "248"


def test_ptp4l_slave_fixture_gives_offset_plus_path_delay() -> None:
    d = ptp4l_discipline(fixture("pmc-slave.txt")).discipline
    assert d is not None
    assert d["source"] == "ptp4l"
    assert d["clock"] == "CLOCK_REALTIME"  # software timestamping: ptp4l steers the system clock itself
    assert d["reference"] == "PTP grandmaster 6e2e2a.fffe.3ec42f"
    assert (d["offset_ns"], d["master_offset_ns"], d["mean_path_delay_ns"]) == (-1414, -1414, 2540)
    assert (d["port_state"], d["interface"], d["steps_removed"]) == ("SLAVE", "lcfix-vs", 1)
    # Both ends share one clock, so the true offset is 0: the -1414 ns are the veth's software-timestamp
    # asymmetry, and |offset| + meanPathDelay must (and does) cover it.
    assert d["bound_ns"] == 1414 + 2540 >= 0 + abs(0 - d["offset_ns"])


@pytest.mark.parametrize(
    ("name", "why"),
    [
        ("pmc-master.txt", "port states: MASTER"),
        ("pmc-uncalibrated.txt", "port states: UNCALIBRATED"),
        ("pmc-no-daemon.txt", "did not answer"),
    ],
)
def test_ptp4l_states_without_a_usable_bound(name: str, why: str) -> None:
    r = ptp4l_discipline(fixture(name))
    assert r.discipline is None and why in r.why


def test_ptp4l_hardware_timestamping_bounds_the_phc_not_the_system_clock() -> None:
    text = fixture("pmc-slave.txt").replace(
        "timestamping            SOFTWARE", "timestamping            HARDWARE"
    )
    d = ptp4l_discipline(text).discipline
    assert d is not None and d["clock"] == "PHC"


def test_ptp4l_p2p_uses_the_peer_delay_when_larger() -> None:
    text = (
        fixture("pmc-slave.txt")
        .replace("delayMechanism          1", "delayMechanism          2")
        .replace("peerMeanPathDelay       0", "peerMeanPathDelay       9000")
    )
    d = ptp4l_discipline(text).discipline
    assert d is not None and d["bound_ns"] == 1414 + 9000


def test_pmc_garbage_and_partial_output_give_reasons() -> None:
    full = fixture("pmc-slave.txt")
    cases = [
        "",
        "garbage\n\t\tportState SLAVE\n",
        full.replace("gmPresent                  true", "gmPresent                  false"),
        full.replace("offsetFromMaster -1414.0", "offsetFromMaster nan"),
        full.replace("meanPathDelay    2540.0", "meanPathDelay    ?"),
        full[: full.index("CURRENT_DATA_SET \n")],  # cut before the current data set
        full.replace("RESPONSE MANAGEMENT", "RESPONSE MANAGEMENT_ERROR_STATUS"),
    ]
    for text in cases:
        r = ptp4l_discipline(text)
        assert r.discipline is None and r.why, text


# -- phc2sys -----------------------------------------------------------------------------------------------
# phc2sys cannot run here (a veth has no PHC: see phc2sys-no-phc.txt), so these lines follow its source's
# format (linuxptp 3.1.1 phc2sys.c update_clock, print.c), as stdout with -m and as a journal line.
PHC2SYS_M = "phc2sys[2212.327]: CLOCK_REALTIME phc offset       -12 s2 freq  +34567 delay    563\n"


PHC2SYS_JOURNAL = "Dec 02 10:00:01 host phc2sys[812]: [2212.327] CLOCK_REALTIME phc offset        40 s2 freq   -1200 delay    700"


def test_phc2sys_lines() -> None:
    d = parse_phc2sys_line(PHC2SYS_M).discipline
    assert d == {
        "source": "phc2sys",
        "clock": "CLOCK_REALTIME",
        "offset_ns": -12,
        "bound_ns": 12 + 282,  # the PHC read lies somewhere within its 563 ns window
        "reference": "phc",
        "servo_state": 2,
        "freq_ppb": 34567,
        "delay_ns": 563,
    }
    j = parse_phc2sys_line(PHC2SYS_M + PHC2SYS_JOURNAL).discipline  # the last line counts
    assert j is not None and (j["offset_ns"], j["bound_ns"]) == (40, 40 + 350)
    unlocked = parse_phc2sys_line(PHC2SYS_M.replace(" s2 ", " s0 "))
    assert unlocked.discipline is None and "s0" in unlocked.why


def test_phc2sys_ignores_what_is_not_its_offset_line() -> None:
    for name in ("phc2sys-no-phc.txt", "ptp4l-slave.log.txt", "ptp4l-master.log.txt"):
        r = parse_phc2sys_line(fixture(name))
        assert r.discipline is None and r.why == "no phc2sys offset line"
    assert parse_phc2sys_line("").discipline is None
    assert parse_phc2sys_line(PHC2SYS_M[:40]).discipline is None


def test_phc2sys_log_tail_and_a_missing_log(tmp_path: Path) -> None:
    log = tmp_path / "phc2sys.log"
    log.write_text("noise\n" * 50000 + PHC2SYS_M)
    d = read_phc2sys_log(log, tail_bytes=4096).discipline
    assert d is not None and d["offset_ns"] == -12
    missing = read_phc2sys_log(tmp_path / "nope.log")
    assert missing.discipline is None and "nope.log" in missing.why


def test_ptp4l_with_phc2sys_adds_both_bounds(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    hw = fixture("pmc-slave.txt").replace("SOFTWARE", "HARDWARE")
    monkeypatch.setattr(clockd, "_run", lambda argv, timeout_s: (hw, ""))
    monkeypatch.setattr(timesync, "read_ptp4l", lambda uds: clockd.ptp4l_discipline(hw))
    found, why = read_disciplines(["ptp4l"])
    assert found[0]["clock"] == "PHC" and "LABCTL_PHC2SYS_LOG" in why[0]
    log = tmp_path / "phc2sys.log"
    log.write_text(PHC2SYS_M)
    found, why = read_disciplines(["ptp4l", "phc2sys"], phc2sys_log=str(log))
    assert why == []
    d = found[0]
    assert d["clock"] == "CLOCK_REALTIME" and d["source"] == "ptp4l"
    assert (d["offset_ns"], d["bound_ns"]) == (-1414 - 12, 1414 + 2540 + 12 + 282)
    assert (d["phc2sys_offset_ns"], d["phc2sys_delay_ns"]) == (-12, 563)


# -- clock_sync_state --------------------------------------------------------------------------------------
def test_clock_sync_state_keeps_its_keys_and_says_why_without_daemons(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    for var in (timesync.ENV_CHRONY_SOCKET, timesync.ENV_PTP4L_UDS, timesync.ENV_PHC2SYS_LOG):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setattr(timesync, "_daemons", lambda: [])
    s = clock_sync_state()
    assert {"host", "daemons", "synchronized", "est_error_us", "max_error_us"} <= set(s)
    assert s["discipline"] is None and s["discipline_why"] == "no clock daemon running"
    if s["synchronized"]:
        assert (s["uncertainty_ns"], s["uncertainty_source"]) == (s["max_error_us"] * 1000, "adjtimex")
    else:
        assert (s["uncertainty_ns"], s["uncertainty_source"]) == (None, None)


def test_clock_sync_state_takes_the_tighter_bound(monkeypatch: pytest.MonkeyPatch) -> None:
    chrony = parse_chrony_tracking(fixture("chrony-tracking-csv.txt"))
    ptp = ptp4l_discipline(fixture("pmc-slave.txt"))
    monkeypatch.setattr(timesync, "_daemons", lambda: ["chronyd", "ptp4l"])
    monkeypatch.setattr(timesync, "read_chrony", lambda socket: chrony)
    monkeypatch.setattr(timesync, "read_ptp4l", lambda uds: ptp)
    s = clock_sync_state()
    assert s["discipline"]["source"] == "ptp4l"  # 3954 ns against chrony's 5234 ns
    assert "discipline_why" not in s
    kernel = s["max_error_us"] * 1000 if s["synchronized"] else None
    if kernel is not None and kernel < 3954:
        assert (s["uncertainty_ns"], s["uncertainty_source"]) == (kernel, "adjtimex")
    else:
        assert (s["uncertainty_ns"], s["uncertainty_source"]) == (3954, "ptp4l")


def test_clock_sync_state_never_raises(monkeypatch: pytest.MonkeyPatch) -> None:
    def broken(socket: str | None) -> None:
        raise RuntimeError("reader bug")

    monkeypatch.setattr(timesync, "_daemons", lambda: ["chronyd"])
    monkeypatch.setattr(timesync, "read_chrony", broken)
    s = clock_sync_state()
    assert s["discipline"] is None and "reader bug" in s["discipline_why"]
