"""What `labctl report` says of the clocks behind a run's marks (issue 45): where one clock stamps every mark
(a simulated or kernel lab, agents sharing the controller's kernel clock), the controller's synchronization
is no warning; where agents' own clocks stamp marks, each host's discipline is listed and an undisciplined
clock is said to be NOT synchronized."""

from __future__ import annotations

from labctl.analysis.summary import time_sync_lines

UNSYNCED = {"daemons": [], "synchronized": False, "est_error_us": 16_000_000}
CHRONY = {"daemons": ["chronyd"], "synchronized": True, "est_error_us": 120}


def test_one_clock_for_every_mark_is_said_once_without_a_warning() -> None:
    meta = {"time_sync": {"controller": UNSYNCED}, "clock_offsets": {}}
    (line,) = time_sync_lines(meta)
    assert line.startswith("time sync: one clock stamps every mark")
    assert "NOT" not in line and "16" not in line


def test_agents_that_share_the_controllers_clock_are_one_clock_too() -> None:
    meta = {
        "time_sync": {"controller": UNSYNCED, "h1": UNSYNCED, "h2": UNSYNCED},
        "clock_offsets": {"h1": {"source": "shared-clock"}, "h2": {"source": "shared-clock"}},
    }
    (line,) = time_sync_lines(meta)
    assert line.startswith("time sync: one clock stamps every mark")
    assert "h1, h2 share" in line


def test_hosts_with_their_own_clocks_keep_the_warning() -> None:
    meta = {
        "time_sync": {"controller": CHRONY, "h1": UNSYNCED, "h2": CHRONY, "h4": UNSYNCED},
        "clock_offsets": {
            "h1": {"source": "exchange"},
            "h2": {"source": "chrony"},
            "h4": {"source": "shared-clock"},
        },
    }
    lines = time_sync_lines(meta)
    assert lines[0] == "time sync controller: synchronized (chronyd; est. error 120 µs)"
    assert lines[1] == "time sync h1: NOT synchronized (no time daemon; est. error 16.000 s)"
    assert lines[2].startswith("time sync h2: synchronized")
    assert lines[3].startswith("time sync: h4 shares the controller's clock")
    assert not any(line.startswith("time sync h4") for line in lines)


def test_a_run_json_without_the_sections_still_gets_a_line() -> None:
    assert time_sync_lines({})[0].startswith("time sync: one clock")
    assert time_sync_lines({"time_sync": None, "clock_offsets": "x"})[0].startswith("time sync: one clock")
