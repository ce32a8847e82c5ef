"""The scheduler in-process under an injected clock and a recording executor: resource declarations, priority
order and backfill, state transitions, cron, cancellation, one serve per queue, the queue database's owner.
Worker processes, real runs and the CLI are tests/integration/test_scheduler.py."""

from __future__ import annotations

import asyncio
import os
from datetime import UTC, datetime
from pathlib import Path

import pytest

from labctl.core.errors import InputError
from labctl.scheduler.plan import declare, pick
from labctl.scheduler.service import Scheduler
from labctl.scheduler.store import TRANSITIONS, RunRow
from labctl.scheduler.store_sqlite import QueueStore
from labctl.scheduler.timing import parse_at
from tests.helpers import scheduler as helpers
from tests.helpers.scheduler import MIN, T0, FakeClock, RecordingExecutor, experiment

lab, store = helpers.lab, helpers.store  # fixtures


# -- declarations and pure ordering ---------------------------------------------------------------------------
def test_declaration_holds_rail_ports_and_plan_hosts(lab: dict[str, Path]) -> None:
    d0 = declare(lab["rail0"], lab["inventory"])
    d1 = declare(lab["rail1"], lab["inventory"])
    assert d0.resources.ports == {("ocs1", p) for p in (1, 2, 3, 4, 17, 18, 19, 20)}
    assert d0.resources.hosts == {"h1", "h2"}
    assert not d0.resources.overlaps(d1.resources)
    assert d0.resources.overlaps(declare(lab["rail0b"], lab["inventory"]).resources)
    assert sorted(map(tuple, d0.baseline["ocs1"]["mapping"])) == [(1, 19), (2, 20), (3, 17), (4, 18)]


def test_submit_rejects_bad_experiment_with_one_line(lab: dict[str, Path], tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text(experiment(0, ("h1", "h9"), name="bad"))
    with pytest.raises(InputError, match="unknown host 'h9'"):
        declare(bad, lab["inventory"])
    with pytest.raises(InputError, match="--at"):
        parse_at("next tuesday", T0)
    assert parse_at("+10m", T0) == T0 + 10 * MIN
    assert parse_at("2026-12-01T00:05:30+00:00", T0) == T0 + 5 * MIN


def test_priority_order_and_conservative_backfill(lab: dict[str, Path], store: QueueStore) -> None:
    inv = lab["inventory"]
    low = store.submit(lab["rail0"], inv, declare(lab["rail0"], inv), now_ns=T0, priority=0)
    high = store.submit(lab["rail0b"], inv, declare(lab["rail0b"], inv), now_ns=T0 + 1, priority=5)
    mid = store.submit(lab["quick"], inv, declare(lab["quick"], inv), now_ns=T0 + 2, priority=2)
    other = store.submit(lab["rail1"], inv, declare(lab["rail1"], inv), now_ns=T0 + 3, priority=-1)
    due = store.due(T0 + 10)
    assert [r.id for r in due] == [high, mid, low, other]
    # Rail 0 goes to the highest priority; the rail-1 run backfills since nobody above wants rail 1.
    assert [r.id for r in pick(due, [])] == [high, other]
    # While a rail-1 run holds rail 1, a waiting high-priority rail-0 run still reserves rail 0.
    running_other = [r for r in due if r.id == other]
    assert [r.id for r in pick([r for r in due if r.id != other], running_other)] == [high]


def test_transitions_are_enforced(lab: dict[str, Path], store: QueueStore) -> None:
    rid = store.submit(lab["quick"], lab["inventory"], declare(lab["quick"], lab["inventory"]), now_ns=T0)
    assert "completed" not in TRANSITIONS["queued"]
    with pytest.raises(Exception, match="cannot go from queued to completed"):
        store.transition(rid, "completed")
    store.transition(rid, "running", started_ns=T0)
    store.transition(rid, "completed", finished_ns=T0 + 1)
    assert store.run(rid).state == "completed"


async def test_cron_fires_on_schedule_and_merges_missed_fires(lab: dict[str, Path], tmp_path: Path) -> None:
    clock, ex = FakeClock(T0), RecordingExecutor()
    sched = Scheduler(tmp_path / "q.sqlite", executor=ex, clock=clock, tz=UTC, out_dir=tmp_path)
    sid = sched.store.add_schedule(
        lab["quick"], lab["inventory"], "every10", "*/10 * * * *", now_ns=T0, tz=UTC, priority=1
    )
    writer = asyncio.create_task(sched._writer())
    try:
        clock.now = T0 + 9 * MIN  # 00:09:30
        assert await sched.step() == []
        clock.now = T0 + 10 * MIN  # 00:10:30: the 00:10 fire
        [first] = await sched.step()
        row = sched.store.run(first)
        assert (row.schedule_id, row.name, row.priority, row.missed_fires) == (sid, "every10", 1, 0)
        assert row.due_ns == int(datetime(2026, 12, 1, 0, 10, tzinfo=UTC).timestamp() * 1e9)
        ex.finish(first)
        await asyncio.gather(*sched._monitors.values())
        assert await sched.step() == []  # fires once per cron time, not once per step
        clock.now = T0 + 35 * MIN  # 00:35:30: serve "was down" over 00:20 and 00:30
        [merged] = await sched.step()
        row = sched.store.run(merged)
        assert row.missed_fires == 1
        assert row.due_ns == int(datetime(2026, 12, 1, 0, 30, tzinfo=UTC).timestamp() * 1e9)
        [schedule] = sched.store.schedules()
        assert schedule.next_fire_ns == int(datetime(2026, 12, 1, 0, 40, tzinfo=UTC).timestamp() * 1e9)
        ex.finish(merged)
        await asyncio.gather(*sched._monitors.values())
        assert sched.store.cancel(f"c{sid}") == [f"schedule c{sid} disabled"]
        assert sched.store.cancel(f"c{sid}") == [f"schedule c{sid} already disabled"]  # like a cancelled run
        assert sched.store.cancel("c999") == []  # no such schedule: the CLI says so, exit 2
        clock.now = T0 + 60 * MIN
        assert await sched.step() == []
    finally:
        writer.cancel()
        await asyncio.gather(writer, return_exceptions=True)
        sched.store.close()


# -- review findings -----------------------------------------------------------------------------------------
async def test_a_run_cancelled_between_read_and_launch_is_skipped(
    lab: dict[str, Path], tmp_path: Path
) -> None:
    """A client may cancel a run after a scheduling pass read the queue and before it launched the run:
    the pass skips that run instead of dying, and still starts the others."""
    clock, ex = FakeClock(T0), RecordingExecutor()
    sched = Scheduler(tmp_path / "q.sqlite", executor=ex, clock=clock, tz=UTC, out_dir=tmp_path)
    inv = lab["inventory"]
    first = sched.store.submit(lab["rail0"], inv, declare(lab["rail0"], inv), now_ns=T0, priority=5)
    second = sched.store.submit(lab["rail1"], inv, declare(lab["rail1"], inv), now_ns=T0, priority=1)
    due = sched.store.due

    def due_then_cancel(now_ns: int) -> list[RunRow]:
        rows = due(now_ns)
        sched.store.cancel(str(first))  # lands between the read and the launch
        return rows

    sched.store.due = due_then_cancel  # type: ignore[method-assign]
    writer = asyncio.create_task(sched._writer())
    try:
        assert await sched.step() == [second]
        assert sched.store.run(first).state == "cancelled"
        ex.finish(second)
        await asyncio.gather(*sched._monitors.values())
    finally:
        writer.cancel()
        await asyncio.gather(writer, return_exceptions=True)
        sched.store.close()


def test_a_second_serve_on_the_same_queue_is_refused(tmp_path: Path) -> None:
    from labctl.scheduler.service import exclusive_serve

    db = tmp_path / "q.sqlite"
    with exclusive_serve(db):
        with pytest.raises(InputError, match="another `labctl serve` is already running this queue"):
            with exclusive_serve(db):
                pass
    with exclusive_serve(db):  # released when the first one ended
        pass


def test_a_queue_database_of_another_user_is_named_as_such(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import labctl.scheduler.store_sqlite as store
    from labctl.core.errors import InputError

    db = tmp_path / "q.sqlite"
    store.QueueStore(db).close()
    real_access = os.access
    monkeypatch.setattr(store.os, "access", lambda p, mode: False if Path(p) == db else real_access(p, mode))
    with pytest.raises(InputError, match=r"no write permission on the queue database \(it belongs to uid"):
        store.QueueStore(db)


# -- the shared queue (decision 0061) ---------------------------------------------------------------------------
def test_queue_urls_are_checked_and_their_passwords_masked() -> None:
    from labctl.scheduler.location import check_url, is_url, mask_url

    assert is_url("postgresql://u@h:5432/q") and not is_url("/var/lib/q.sqlite") and not is_url("q.sqlite")
    assert mask_url("postgresql://u:pw@h:5432/q") == "postgresql://u:***@h:5432/q"
    assert mask_url("postgresql://u@h/q") == "postgresql://u@h/q"
    assert check_url("postgresql://u@h:5432/q", from_env=False)
    assert check_url("postgresql://u:pw@h/q", from_env=True)  # from $LABCTL_QUEUE_DB: accepted
    for bad, message in (
        ("postgresql://u:pw@h/q", "PGPASSWORD"),
        ("postgresql://u@h:0/q", "out of range"),
        ("postgresql://u@h", "no database name"),
        ("postgresql:///q", "no host"),
        ("http://h/q", "unknown scheme"),
    ):
        with pytest.raises(InputError, match=message) as caught:
            check_url(bad, from_env=False)
        assert "pw" not in str(caught.value).replace("PGPASSWORD", "")


def test_headline_results_read_from_summary_json(tmp_path: Path) -> None:
    import json

    from labctl.scheduler.results import headline, headline_text

    assert headline(None) is None and headline(tmp_path) is None and headline_text(None) == ""
    (tmp_path / "summary.json").write_text(
        json.dumps(
            {
                "reconfigurations": 4,
                "phases": {
                    "switch": {"unit": "switch command", "n": 4, "median": 25_000_000},
                    "firmware": {"unit": "port", "n": 0, "median": None},
                    "total": {"unit": "port", "n": 16, "median": 6_102_000_000},
                },
            }
        )
    )
    h = headline(tmp_path)
    assert h == {
        "reconfigurations": 4,
        "phases": {
            "switch": {"median_ns": 25_000_000, "unit": "switch command", "n": 4},
            "total": {"median_ns": 6_102_000_000, "unit": "port", "n": 16},
        },
    }
    assert (
        headline_text(h)
        == "4 reconfigurations; switch 25.0 ms (n=4 switch command), total 6.102 s (n=16 port)"
    )
