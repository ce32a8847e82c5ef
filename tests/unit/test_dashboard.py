"""The dashboard's pure parts: the bind address and token rules, run ids and file names checked, the log
tail, the live view's fold, and the bounded fan-out that drops a slow page instead of waiting for it."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest

from labctl.core.errors import InputError
from labctl.dashboard.fanout import CLOSED, Fanout
from labctl.dashboard.security import Bind, load_token, parse_bind, run_dir_of, run_file_of, token_matches
from labctl.dashboard.tail import LiveView, Tail, planned_reconfigurations


# -- where it listens, and the token -----------------------------------------------------------------------
@pytest.mark.parametrize(
    ("text", "host", "port", "loopback"),
    [
        ("8080", "127.0.0.1", 8080, True),
        ("127.0.0.1:0", "127.0.0.1", 0, True),
        ("localhost:80", "localhost", 80, True),
        ("[::1]:9000", "::1", 9000, True),
        ("0.0.0.0:8080", "0.0.0.0", 8080, False),
        ("192.0.2.7:1", "192.0.2.7", 1, False),
    ],
)
def test_bind_addresses(text: str, host: str, port: int, loopback: bool) -> None:
    bind = parse_bind(text)
    assert (bind.host, bind.port, bind.loopback) == (host, port, loopback)


@pytest.mark.parametrize(
    "text", ["", "http", "70000", "host.example:80", "::1:80", "1.2.3.4:-1", "1.2.3.4:٣"]
)
def test_bad_bind_addresses_are_one_line(text: str) -> None:
    with pytest.raises(InputError) as e:
        parse_bind(text)
    assert "\n" not in str(e.value)


def test_a_non_loopback_address_needs_a_token_file(tmp_path: Path) -> None:
    with pytest.raises(InputError, match="token is required"):
        load_token(None, Bind("0.0.0.0", 80))
    assert load_token(None, Bind("127.0.0.1", 80)) == (None, False)  # loopback: read-only, no token


def test_a_missing_token_file_gets_a_new_owner_only_token_once(tmp_path: Path) -> None:
    path = tmp_path / "token"
    token, generated = load_token(path, Bind("0.0.0.0", 80))
    assert generated and token is not None and len(token) >= 40
    assert path.stat().st_mode & 0o777 == 0o600
    assert load_token(path, Bind("0.0.0.0", 80)) == (token, False)  # the same token, not shown again
    path.write_text("short\n")
    with pytest.raises(InputError, match="at least 16"):
        load_token(path, Bind("0.0.0.0", 80))


def test_tokens_match_only_exactly() -> None:
    assert token_matches("s3cret-s3cret-s3cret", "s3cret-s3cret-s3cret")
    for given in (None, "", "s3cret-s3cret-s3cre", "s3cret-s3cret-s3cretx", "S3cret-s3cret-s3cret", "ß"):
        assert not token_matches("s3cret-s3cret-s3cret", given)
    assert not token_matches(None, "anything")  # a server without a token accepts none


# -- run ids and file names ----------------------------------------------------------------------------------
def test_run_ids_and_file_names_stay_inside_the_runs_directory(tmp_path: Path) -> None:
    runs = tmp_path / "runs"
    run = runs / "20261206-run-1"
    run.mkdir(parents=True)
    (run / "run.json").write_text("{}")
    (run / "timeline.png").write_bytes(b"png")
    (tmp_path / "secret.json").write_text("{}")
    (runs / "out").symlink_to(tmp_path)
    assert run_dir_of(runs, "20261206-run-1") == run.resolve()
    for bad in (
        "..",
        "../runs/20261206-run-1",
        "20261206-run-1/",
        ".hidden",
        "out",
        "no-such",
        "a/b",
        "%2e%2e",
    ):
        assert run_dir_of(runs, bad) is None, bad
    assert run_file_of(run, "timeline.png") == (run / "timeline.png").resolve()
    (run / "link.json").symlink_to(tmp_path / "secret.json")
    for bad in ("../../secret.json", "run.json/..", ".run.json", "link.json", "x.sh", "missing.png", ""):
        assert run_file_of(run, bad) is None, bad


# -- the log tail -------------------------------------------------------------------------------------------
def test_the_tail_returns_whole_lines_only_as_they_are_appended(tmp_path: Path) -> None:
    path = tmp_path / "events.jsonl"
    tail = Tail(path)
    assert tail.read() == []  # not written yet
    path.write_bytes(b'{"a": 1}\n{"b"')
    assert tail.read() == [b'{"a": 1}']
    assert tail.read() == []
    with path.open("ab") as f:
        f.write(b': 2}\n\n{"c": 3}\n')
    assert tail.read() == [b'{"b": 2}', b'{"c": 3}']
    with path.open("ab") as f:
        f.write(b'{"d": 4}\n' * 10)
    assert len(tail.read(limit=25)) == 2 and len(tail.read()) == 8  # bounded reads lose nothing


# -- the live view ------------------------------------------------------------------------------------------
def _event(
    seq: int,
    kind: str,
    t: int,
    *,
    source: str = "controller",
    value: object = None,
    reconfig: int | None = 0,
    **meta: object,
) -> bytes:
    return json.dumps(
        {"seq": seq, "t_ns": t, "wall_ns": 10**18 + t, "host": "", "source": source, "kind": kind,
         "value": value, "reconfig": reconfig, "meta": meta}
    ).encode()  # fmt: skip


def test_the_live_view_marks_each_moved_port_t0_to_t5_and_the_run_end() -> None:
    a, b = "nic:h1/p0", "nic:h2/p0"
    ports = [
        {"source": a, "host": "h1", "port": "p0", "peer": b},
        {"source": b, "host": "h2", "port": "p0", "peer": a},
    ]
    lines = [
        _event(0, "run.start", 0, value="x", reconfig=None, rx_power_threshold_dbm=-10.0),
        _event(1, "phase", 100, value="dp", ports=ports),
        _event(2, "ocs.command", 200),
        _event(3, "rx_power", 150, source=a, value=-3.0),  # before t0: not a mark
        _event(4, "ocs.complete", 1_200),
        _event(5, "rx_power", 1_300, source=a, value=None),  # dark, then light
        _event(6, "rx_power", 1_500, source=a, value=-4.0),
        _event(7, "link.firmware", 2_000, source=a, value=1),
        _event(8, "carrier", 2_100, source=a, value=1),
        _event(9, "traffic.ok", 2_150, source=a, value=5, peer="nic:h9/p0"),  # an old peer: not t5
        _event(10, "traffic.ok", 2_200, source=a, value=5, peer=b),
        _event(11, "loop.lag", 2_300, value=30_000_000),
        b"not json",
        _event(12, "run.end", 3_000, value="completed", error=None),
    ]
    view = LiveView("r", planned_reconfigurations({"baseline": "dp", "cycle": ["pp", "dp"], "repeat": 2}))
    assert view.fold_lines(lines) == 1
    state = view.state()
    assert (state["status"], state["reconfig"], state["total"], state["seq"]) == ("completed", 0, 5, 12)
    marks = {p["source"]: p["marks"] for p in state["ports"]}
    assert marks[a] == {"t0": 0, "t1": 1_000, "t2": 1_300, "t3": 1_800, "t4": 1_900, "t5": 2_000}
    assert marks[b] == {"t0": 0, "t1": 1_000}
    assert state["rx_dbm"][a] == -4.0 and state["lag_max_ns"] == 30_000_000
    assert any("late" in w for w in state["warnings"])
    assert view.rows == [{"reconfig": 0, "phase": "dp", "port": a, "marks": marks[a]}]
    # the next reconfiguration starts every port anew
    view.fold_lines([_event(13, "phase", 4_000, value="pp", reconfig=1, ports=ports)])
    assert all(p["marks"] == {} for p in view.state()["ports"])


def test_the_live_view_shows_each_agents_clock_as_last_measured() -> None:
    clock = {"uncertainty_ns": 40_000, "rtt_min_ns": 80_000, "samples": 16}
    view = LiveView("r")
    view.fold_lines(
        [
            _event(0, "agent.clock", 10, source="agent:h1", value=2_500_000_000, via="udp", **clock),
            _event(
                1, "agent.clock", 20, source="agent:h2", value=0, via="broker", shared_clock=True, **clock
            ),
            _event(2, "agent.clock", 30, source="agent:h1", value=2_500_100_000, via="udp", **clock),
        ]
    )
    assert view.state()["clocks"] == {
        "h1": {"offset_ns": 2_500_100_000, "uncertainty_ns": 40_000, "rtt_min_ns": 80_000, "via": "udp",
               "shared": False},
        "h2": {"offset_ns": 0, "uncertainty_ns": 40_000, "rtt_min_ns": 80_000, "via": "broker", "shared": True},
    }  # fmt: skip


def test_the_live_view_shows_skipped_ticks_as_they_grow() -> None:
    view = LiveView("r")
    assert view.state()["skipped"] == {}
    view.fold_lines(
        [
            _event(
                0, "sampler.skip", 10, source="probe:rx-power", value=3, stalls=1, stall_longest_ns=4_200_000
            ),
            _event(1, "sampler.skip", 20, source="probe:agent:h2/rx-power", value=7, stalls=2),
            _event(
                2, "sampler.skip", 30, source="probe:rx-power", value=9, stalls=2, stall_longest_ns=6_000_000
            ),
        ]
    )
    state = view.state()
    assert state["skipped"] == {"rx-power": 9, "agent:h2/rx-power": 7}
    assert state["warnings"][-1] == (
        "probe:rx-power: 9 ticks skipped so far after stalls of its loop (longest 6.0 ms)"
    )
    assert state["warnings"][1] == "probe:agent:h2/rx-power: 7 ticks skipped so far after stalls of its loop"


def test_a_replay_or_tune_has_no_planned_count() -> None:
    assert planned_reconfigurations({"kind": "replay"}) is None


# -- the fan-out ---------------------------------------------------------------------------------------------
async def test_a_slow_client_is_dropped_and_never_waited_for() -> None:
    fan = Fanout(maxsize=4)
    fast, slow = fan.subscribe([b"snapshot"]), fan.subscribe([b"snapshot"])
    for n in range(10):
        fan.publish(f"m{n}".encode())  # never blocks, whatever the clients do
        while not fast.queue.empty():
            await fast.next()
    assert slow.dropped and slow not in fan.clients and fan.dropped == 1
    assert await slow.next() == CLOSED  # its stream ends; the browser reconnects for a fresh snapshot
    assert fast in fan.clients and not fast.dropped and fast.sent == 11
    fan.unsubscribe(fast)
    assert fan.clients == set()


async def test_a_page_gets_what_queued_up_in_one_batch_and_the_end_last() -> None:
    fan = Fanout(maxsize=8)
    client = fan.subscribe([b"a"])
    fan.publish(b"b")
    fan.publish(b"c")
    assert await client.next_batch() == [b"a", b"b", b"c"] and client.sent == 3
    fan.publish(b"d")
    fan.close()
    assert await client.next_batch() == [CLOSED]  # closing makes room for the end: what was queued is lost
    assert client.sent == 4


async def test_closing_ends_every_stream_and_a_snapshot_is_cut_to_fit() -> None:
    fan = Fanout(maxsize=3)
    client = fan.subscribe([b"1", b"2", b"3", b"4", b"5"])
    assert [await client.next() for _ in range(2)] == [b"4", b"5"]
    fan.close()
    assert await client.next() == CLOSED and fan.clients == set()
    await asyncio.sleep(0)
