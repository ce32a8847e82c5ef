"""Issue 45: due runs go to whichever serve is free, and a queue database outage is two log lines.

- A serve claims only while it has a free slot (`--max-runs`), and on a shared (PostgreSQL) queue it leaves
  a due run to a freer live serve: one running fewer runs, or as many and waiting longer since its last
  claim (decision 0074). Checked step by step with two in-process serves whose runs end when the test says
  (so nothing depends on timing), then with two `labctl serve` processes running real runs.
- While the queue's database is out of reach a serve logs one line when that starts and one when it ends,
  however many passes and lease renewals fail in between, and keeps retrying (bounded backoff).

No timing is asserted: the serves' order is forced by the runs they hold, and every wait has a deadline."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import signal
import subprocess
import time
from collections import defaultdict
from collections.abc import AsyncIterator
from itertools import pairwise
from pathlib import Path
from typing import Any

import pytest

from labctl.scheduler.plan import declare
from labctl.scheduler.service import OUTAGE_RETRY_MAX_S, Outage, Scheduler
from labctl.scheduler.store import RunRow, StoreUnavailable
from labctl.scheduler.store_sql import resource_keys
from tests.helpers import postgres as pg
from tests.helpers import scheduler as helpers
from tests.helpers import serve_processes
from tests.helpers.scheduler import SPLIT_INVENTORY, T0, RecordingExecutor, experiment
from tests.helpers.serve_processes import labctl_argv, wait_for

lab, procs = helpers.lab, serve_processes.procs  # fixtures
postgres_server, pg_url = pg.postgres_server, pg.pg_url  # fixtures

DEADLINE_S = 120.0


def _pg_store(url: str) -> Any:
    from labctl.scheduler.store_pg import PostgresStore

    return PostgresStore(url)


@contextlib.asynccontextmanager
async def _writers(*scheds: Scheduler) -> AsyncIterator[None]:
    """The serves' writer tasks (what `serve` starts) for a test that drives `step` itself."""
    tasks = [asyncio.ensure_future(s._writer()) for s in scheds]
    try:
        yield
    finally:
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


async def _stop(*scheds: Scheduler) -> None:
    for s in scheds:
        await asyncio.gather(*s._monitors.values(), return_exceptions=True)
        s.store.close()


# -- claims, step by step ------------------------------------------------------------------------------------
async def test_a_due_run_goes_to_the_freer_of_two_serves(
    lab: dict[str, Path], pg_url: str, tmp_path: Path
) -> None:
    """Two serves with unlimited slots on one PostgreSQL queue: a serve that runs more runs than the other, or
    as many and claimed more recently, leaves the next due run to the other, even a run it could start."""
    ex_a, ex_b = RecordingExecutor(), RecordingExecutor()
    a = Scheduler(_pg_store(pg_url), executor=ex_a, out_dir=tmp_path / "runs", lease_s=30)
    b = Scheduler(_pg_store(pg_url), executor=ex_b, out_dir=tmp_path / "runs", lease_s=30)
    inv = lab["inventory"]

    def submit(key: str, i: int) -> int:
        return int(a.store.submit(lab[key], inv, declare(lab[key], inv), now_ns=T0 + i))

    r0, r1, r0b = submit("rail0", 0), submit("rail1", 1), submit("rail0b", 2)
    a.store.register_serve(a.owner, None, 30)
    b.store.register_serve(b.owner, None, 30)
    try:
        async with _writers(a, b):
            # Both rails are free, but after its first claim A runs one run and B none: B gets the second.
            assert await a.step() == [r0]
            assert await a.step() == []
            assert await b.step() == [r1]  # r0b waits for r0's rail whoever claims
            ex_a.finish(r0)
            await asyncio.gather(*a._monitors.values())
            # B runs one run, A none: r0b (its rail free now) is A's, not B's.
            assert await b.step() == []
            assert await a.step() == [r0b]
            ex_a.finish(r0b)
            ex_b.finish(r1)
            await asyncio.gather(*a._monitors.values(), *b._monitors.values())
            # Both idle: the one that waited longer since its last claim (B) gets the next run.
            quick = submit("quick", 3)
            assert await a.step() == []
            assert await b.step() == [quick]
            ex_b.finish(quick)
            await asyncio.gather(*b._monitors.values())
            # A serve that stopped (unregistered) or died (its registration expired) holds nothing back.
            b.store.unregister_serve(b.owner)
            b.store.register_serve("ghost:1:dead", None, 0.3)
            await asyncio.sleep(
                0.6
            )  # the ghost never renews: its registration expires on the database's clock
            last = submit("quick", 4)
            assert await a.step() == [last]
            ex_a.finish(last)
            await asyncio.gather(*a._monitors.values())
            rows = a.store.runs()
            assert {r.state for r in rows} == {"completed"}
            assert sorted(ex_a.started + ex_b.started) == sorted(r.id for r in rows)  # each once
    finally:
        await _stop(a, b)


async def test_a_serve_without_a_free_slot_claims_nothing(lab: dict[str, Path], tmp_path: Path) -> None:
    """SQLite, one serve, `max_runs=1`: two runs on disjoint rails could run together, but the serve starts
    the second only once the first has ended."""
    ex = RecordingExecutor()
    sched = Scheduler(tmp_path / "q.sqlite", executor=ex, out_dir=tmp_path / "runs", max_runs=1)
    inv = lab["inventory"]
    r0 = sched.store.submit(lab["rail0"], inv, declare(lab["rail0"], inv), now_ns=T0)
    r1 = sched.store.submit(lab["rail1"], inv, declare(lab["rail1"], inv), now_ns=T0 + 1)
    try:
        async with _writers(sched):
            assert await sched.step() == [r0]
            assert await sched.step() == []
            assert sched.store.run(r1).state == "queued"
            ex.finish(r0)
            await asyncio.gather(*sched._monitors.values())
            assert await sched.step() == [r1]
            ex.finish(r1)
            await asyncio.gather(*sched._monitors.values())
    finally:
        await _stop(sched)
    with pytest.raises(Exception, match="at least 1"):
        Scheduler(tmp_path / "q2.sqlite", executor=ex, out_dir=tmp_path / "runs", max_runs=0)


def test_an_outage_is_one_line_when_it_starts_and_one_when_it_ends(caplog: pytest.LogCaptureFixture) -> None:
    outage = Outage("postgresql://labctl@db:5432/q")
    waits = []
    with caplog.at_level(logging.INFO, logger="labctl.scheduler"):
        for i in range(20):
            outage.failed(
                StoreUnavailable("postgresql://labctl@db:5432/q: connection refused"), float(i), 0.5
            )
            waits.append(outage.retry_in(0.5))
        outage.ended(30.0)
        outage.ended(31.0)  # nothing was out any more
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 2, lines
    assert "out of reach" in lines[0] and "connection refused" in lines[0] and "keeps retrying" in lines[0]
    assert "reachable again" in lines[1] and "30.0 s" in lines[1]
    assert waits == sorted(waits) and waits[0] == 0.5 and waits[-1] == OUTAGE_RETRY_MAX_S
    assert outage.retry_in(0.5) == 0.5


# -- real serves ------------------------------------------------------------------------------------------------
def _live_serves(url: str) -> int:
    import psycopg

    with contextlib.closing(psycopg.connect(url, autocommit=True, connect_timeout=10)) as conn:
        row = conn.execute("SELECT count(*) FROM serves WHERE expires_at > clock_timestamp()").fetchone()
    return int(row[0]) if row else 0


def _rows(url: str) -> list[RunRow]:
    store = _pg_store(url)
    try:
        return list(store.runs())
    finally:
        store.close()


def _serve(url: str, out: Path, log: Path, *extra: str) -> subprocess.Popen[bytes]:
    _pg_store(url).close()  # the schema, before anyone looks for the serves in it
    with open(log, "wb") as f:
        return subprocess.Popen(
            labctl_argv(
                "serve", "--db", url, "--out", str(out), "--no-plots", "--poll", "0.1", "--log-format", "json",
                *extra,
            ),
            stderr=f,
        )  # fmt: skip


def _log(path: Path) -> list[dict[str, Any]]:
    return [
        json.loads(line) for line in path.read_text(errors="replace").splitlines() if line.startswith("{")
    ]


def _stop_serves(serves: list[subprocess.Popen[bytes]]) -> None:
    for p in serves:
        p.send_signal(signal.SIGTERM)
    for p in serves:
        assert p.wait(timeout=DEADLINE_S) == 0


@pytest.mark.slow
@pytest.mark.timeout(DEADLINE_S * 3)
def test_two_serves_with_one_slot_each_share_the_jobs_exactly_once(
    pg_url: str, tmp_path: Path, procs: list[subprocess.Popen[bytes]]
) -> None:
    """Two `labctl serve --max-runs 1` on one queue, four real jobs (two per rail), submitted once both serve:
    each serve runs jobs (the first claim fills a serve's slot, and when a run ends the serve that waited
    longer takes the next), each job runs once, never two on one resource at a time."""
    inv = tmp_path / "lab.yaml"
    inv.write_text(SPLIT_INVENTORY)
    jobs = []
    for i in range(2):
        for rail, hosts in ((0, ("h1", "h2")), (1, ("h3", "h4"))):
            path = tmp_path / f"job-{rail}-{i}.yaml"
            path.write_text(experiment(rail, hosts, name=f"job-{rail}-{i}", repeat=2, hold_s=0.2))
            jobs.append(path)
    runs = tmp_path / "runs"
    logs = [tmp_path / f"serve-{i}.log" for i in range(2)]
    serves = [_serve(pg_url, runs, log, "--max-runs", "1") for log in logs]
    procs.extend(serves)
    wait_for(lambda: _live_serves(pg_url) == 2, DEADLINE_S, "both serves to register")
    store = _pg_store(pg_url)
    try:
        for path in jobs:
            store.submit(path, inv, declare(path, inv), now_ns=time.time_ns())
    finally:
        store.close()
    wait_for(
        lambda: [r.state for r in _rows(pg_url)] == ["completed"] * len(jobs),
        DEADLINE_S,
        "every job to complete",
    )
    _stop_serves(serves)
    rows = _rows(pg_url)
    per_serve = {p.pid: [r.id for r in rows if r.owner and f":{p.pid}:" in r.owner] for p in serves}
    assert all(per_serve.values()), per_serve
    assert sum(len(ids) for ids in per_serve.values()) == len(jobs)
    assert all(r.attempt == 1 for r in rows)
    # Exactly once, from the run directories themselves: one completed run per job file.
    metas = [json.loads(p.read_text()) for p in runs.glob("*/run.json")]
    assert sorted(m["experiment_path"] for m in metas) == sorted(str(p.resolve()) for p in jobs)
    assert {m["status"] for m in metas} == {"completed"}
    # A serve never ran two at once (its one slot), nor did two runs ever hold one resource at a time.
    by_row = {r.experiment: r for r in rows}
    spans: dict[str, list[tuple[int, int, str]]] = defaultdict(list)
    for m in metas:
        row = by_row[m["experiment_path"]]
        assert row.owner is not None
        span = (int(m["started_wall_ns"]), int(m["finished_wall_ns"]), row.name)
        for key in [*resource_keys(row.resources), f"serve:{row.owner}"]:
            spans[key].append(span)
    for key, held in spans.items():
        held.sort()
        for (_s0, e0, x), (s1, _e1, y) in pairwise(held):
            assert s1 >= e0, f"{x} and {y} overlap on {key}"
    text = "".join(p.read_text(errors="replace") for p in logs)
    assert "Traceback" not in text, text[-4000:]


@pytest.mark.slow
@pytest.mark.timeout(DEADLINE_S * 3)
def test_a_database_outage_is_one_line_per_serve_when_it_starts_and_one_when_it_ends(
    lab: dict[str, Path],
    pg_url: str,
    postgres_server: pg.PostgresServer,
    tmp_path: Path,
    procs: list[subprocess.Popen[bytes]],
) -> None:
    """Two serves; the queue's database refuses connections and their sessions are ended, for many of their
    polls and lease renewals; then it is back. Each serve logs the outage once when it starts and once when it
    ends, nothing else above info, and goes on: a job submitted afterwards runs."""
    database = pg_url.rsplit("/", 1)[1]
    runs = tmp_path / "runs"
    logs = [tmp_path / f"serve-{i}.log" for i in range(2)]
    serves = [_serve(pg_url, runs, log, "--lease", "1.5") for log in logs]
    procs.extend(serves)
    wait_for(lambda: _live_serves(pg_url) == 2, DEADLINE_S, "both serves to register")

    def lines(log: Path, outage: str) -> list[dict[str, Any]]:
        return [e for e in _log(log) if e.get("outage") == outage]

    with contextlib.closing(postgres_server.admin()) as admin:
        admin.execute(f'ALTER DATABASE "{database}" ALLOW_CONNECTIONS false')
        try:
            admin.execute(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname=%s AND pid<>pg_backend_pid()",
                (database,),
            )
            wait_for(lambda: all(lines(log, "started") for log in logs), DEADLINE_S, "both serves to see it")
            # Many of their passes (backing off from 0.1 s) and lease renewals (every 0.5 s) fail meanwhile:
            # each failed call tries to reconnect, which the server refuses and logs.
            refused = f'database "{database}" is not currently accepting connections'
            server_log = postgres_server.root / "server.log"
            wait_for(
                lambda: server_log.read_text(errors="replace").count(refused) >= 12,
                DEADLINE_S,
                "a dozen refused reconnections",
            )
        finally:
            admin.execute(f'ALTER DATABASE "{database}" ALLOW_CONNECTIONS true')
    wait_for(lambda: all(lines(log, "ended") for log in logs), DEADLINE_S, "both serves to reach it again")
    store = _pg_store(pg_url)
    try:
        inv = lab["inventory"]
        rid = store.submit(lab["quick"], inv, declare(lab["quick"], inv), now_ns=time.time_ns())
    finally:
        store.close()
    wait_for(lambda: _rows(pg_url)[0].state == "completed", DEADLINE_S, "a job after the outage")
    _stop_serves(serves)
    assert [r.id for r in _rows(pg_url)] == [rid]
    failures: list[int] = []
    for log in logs:
        entries = _log(log)
        [started], [ended] = lines(log, "started"), lines(log, "ended")
        failures.append(ended["failures"])
        assert started["level"] == "warning" and "keeps retrying" in started["msg"], started
        assert database in started["msg"] and "out of reach" in started["msg"], started
        assert "reachable again" in ended["msg"] and ended["outage_s"] > 0, ended
        loud = [e for e in entries if e["level"] in ("warning", "error")]
        assert loud == [started, ended], loud
    # The dozen refused reconnections were failed passes and renewals: more of them than lines.
    assert sum(failures) > len(serves), failures
