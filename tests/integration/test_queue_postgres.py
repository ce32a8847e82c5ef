"""The shared queue (issue 27, decision 0061): the store on PostgreSQL (claims with row locks, resource leases
that expire unless renewed, takeover of a dead serve's runs), `--db` URLs on the command line (malformed: exit
2, unreachable: exit 1, a password never shown), and the headline results `history` and `serve` show.
The two-serve scenario itself, on PostgreSQL and on SQLite, is tests/integration/test_queue_shared.py."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from labctl.scheduler.location import mask_url
from labctl.scheduler.plan import declare
from labctl.scheduler.store_sql import resource_keys
from labctl.scheduler.store_sqlite import QueueStore
from tests.helpers import postgres as pg
from tests.helpers import scheduler as helpers
from tests.helpers.scheduler import T0

lab = helpers.lab
postgres_server, pg_url = pg.postgres_server, pg.pg_url  # fixtures


def _store(url: str):  # type: ignore[no-untyped-def]
    from labctl.scheduler.store_pg import PostgresStore

    return PostgresStore(url)


def _labctl(
    *args: str, env: dict[str, str] | None = None, timeout: float = 120
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "labctl.cli", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**os.environ, **(env or {})},
        check=False,
    )


# -- the store --------------------------------------------------------------------------------------------
def test_a_claim_leases_the_resources_and_a_second_serve_gets_only_what_is_free(
    lab: dict[str, Path], pg_url: str
) -> None:
    a, b = _store(pg_url), _store(pg_url)
    try:
        inv = lab["inventory"]
        r0 = a.submit(lab["rail0"], inv, declare(lab["rail0"], inv), now_ns=T0)
        r0b = a.submit(lab["rail0b"], inv, declare(lab["rail0b"], inv), now_ns=T0 + 1)
        r1 = a.submit(lab["rail1"], inv, declare(lab["rail1"], inv), now_ns=T0 + 2)
        assert [r.id for r in a.claim(T0 + 10, "hostA:1:x", 30)] == [r0, r1]
        # Everything free is taken; the rail-0 run behind r0 waits for it, on any serve.
        assert b.claim(T0 + 10, "hostB:2:y", 30) == []
        leases = {lease["resource"]: lease for lease in b.leases()}
        row0 = a.run(r0)
        assert set(leases) == {*resource_keys(row0.resources), f"run:{r0}"} | {
            *resource_keys(a.run(r1).resources),
            f"run:{r1}",
        }
        assert {lease["owner"] for lease in leases.values()} == {"hostA:1:x"}
        assert "port:ocs1/17" in leases and "host:h1" in leases
        assert (row0.state, row0.owner) == ("running", "hostA:1:x")
        # Only the holder ends a run; ending it frees its resources for the next claim, by any serve.
        assert not b.finish(r0, "hostB:2:y", "completed", finished_ns=T0 + 20)
        assert a.finish(r0, "hostA:1:x", "completed", finished_ns=T0 + 20)
        assert [r.id for r in b.claim(T0 + 30, "hostB:2:y", 30)] == [r0b]
        assert a.renew("hostA:1:x", 30) == {r1}
        assert b.renew("hostB:2:y", 30) == {r0b}
    finally:
        a.close()
        b.close()


def test_an_expired_lease_is_taken_over_and_the_run_retried_once(lab: dict[str, Path], pg_url: str) -> None:
    dead, alive = _store(pg_url), _store(pg_url)
    try:
        inv = lab["inventory"]
        rid = dead.submit(lab["rail0"], inv, declare(lab["rail0"], inv), now_ns=T0)
        [claimed] = dead.claim(T0, "hostA:1:dead", 0.5)
        assert claimed.id == rid
        assert alive.take_over_lost("hostB:2:alive", 30) == []  # the lease still lives
        time.sleep(1.0)  # the dead serve never renews: its lease expires at the database's clock
        [lost] = alive.take_over_lost("hostB:2:alive", 30)
        assert (lost.id, lost.owner) == (rid, "hostA:1:dead")  # the row as it was: who lost it
        assert alive.take_over_lost("hostC:3:late", 30) == []  # taken once
        assert {lease["owner"] for lease in alive.leases()} == {"hostB:2:alive"}
        assert dead.renew("hostA:1:dead", 30) == set()  # a serve that wakes up learns it lost the run
        assert dead.claim(T0 + 1, "hostA:1:dead", 30) == []  # the resources stay held during recovery
        retry = alive.interrupt(
            lost, "hostB:2:alive", now_ns=T0 + 5, reason="lost", recovery="{}", retry=True
        )
        assert retry is not None
        row, again = alive.run(rid), alive.run(retry)
        assert (row.state, row.error) == ("interrupted", "lost")
        assert (again.state, again.attempt, again.retry_of) == ("queued", 2, rid)
        assert alive.leases() == []
        assert [r.id for r in dead.claim(T0 + 6, "hostA:1:new", 30)] == [retry]
    finally:
        dead.close()
        alive.close()


def test_cancel_schedules_and_transitions_behave_as_on_sqlite(lab: dict[str, Path], pg_url: str) -> None:
    from datetime import UTC

    s = _store(pg_url)
    try:
        inv = lab["inventory"]
        rid = s.submit(lab["quick"], inv, declare(lab["quick"], inv), now_ns=T0)
        with pytest.raises(Exception, match="cannot go from queued to completed"):
            s.transition(rid, "completed")
        assert s.cancel(str(rid)) == [f"run {rid} cancelled"]
        assert s.cancel(str(rid)) == [f"run {rid} already cancelled"]
        sid = s.add_schedule(lab["quick"], inv, "every10", "*/10 * * * *", now_ns=T0, tz=UTC)
        [fired] = s.fire_schedules(T0 + 35 * 60 * 10**9, UTC)
        assert s.run(fired).missed_fires == 2
        assert s.fire_schedules(T0 + 35 * 60 * 10**9, UTC) == []  # once per fire time, whoever fires it
        assert s.cancel(f"c{sid}") == [f"schedule c{sid} disabled"]
        assert s.due(T0 + 36 * 60 * 10**9)[0].id == fired
    finally:
        s.close()


# -- the command line -----------------------------------------------------------------------------------------
def test_a_url_with_a_password_is_never_shown(lab: dict[str, Path], pg_url: str, tmp_path: Path) -> None:
    secret = "s3cr3t-Pw"
    url = pg_url.replace("labctl@", f"labctl:{secret}@")
    refused = _labctl("queue", "--db", url)
    assert refused.returncode == 2 and refused.stderr.count("\n") == 1, refused.stderr
    assert "PGPASSWORD" in refused.stderr and secret not in refused.stderr + refused.stdout
    # From the environment it is accepted (the server trusts 127.0.0.1 anyway), and never printed or logged.
    env = {"LABCTL_QUEUE_DB": url}
    sub = _labctl("submit", str(lab["quick"]), "-i", str(lab["inventory"]), env=env)
    assert sub.returncode == 0, sub.stderr
    runs = tmp_path / "runs"
    serve = _labctl(
        "serve", "--out", str(runs), "--no-plots", "--poll", "0.05", "--exit-when-idle", "--log-format", "json",
        env=env,
    )  # fmt: skip
    assert serve.returncode == 0, serve.stderr
    hist = _labctl("history", "--json", env=env)
    assert hist.returncode == 0, hist.stderr
    [row] = json.loads(hist.stdout)
    assert row["state"] == "completed"
    assert mask_url(url) in serve.stderr
    written = "".join(p.read_text(errors="replace") for p in runs.rglob("*") if p.is_file())
    assert secret not in serve.stderr + serve.stdout + hist.stdout + written


@pytest.mark.parametrize(
    ("url", "code", "message"),
    [
        ("postgresql://labctl@127.0.0.1:99999/q", 2, "out of range"),
        ("postgresql://labctl@127.0.0.1:5432/", 2, "no database name"),
        ("mysql://labctl@127.0.0.1/q", 2, "unknown scheme"),
        ("postgresql://labctl@127.0.0.1:{closed}/q", 1, "cannot connect to the queue database"),
    ],
)
def test_a_bad_or_unreachable_queue_url_is_one_line(url: str, code: int, message: str) -> None:
    import socket

    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        closed = s.getsockname()[1]
    for command in (["queue"], ["history"], ["serve", "--exit-when-idle"]):
        proc = _labctl(*command, "--db", url.format(closed=closed), timeout=60)
        assert proc.returncode == code, (command, proc.stderr)
        assert proc.stderr.count("\n") == 1 and "Traceback" not in proc.stderr, proc.stderr
        assert message in proc.stderr


# -- headline results ------------------------------------------------------------------------------------------
def test_history_and_serve_show_each_runs_headline_results(tmp_path: Path, repo: Path) -> None:
    """On the built-in lab (fast profile) a run measures link-ups: `serve` logs its reconfigurations and each
    phase's median with unit and n when it finishes, and `history` shows the same from summary.json."""
    inv = tmp_path / "inventory.yaml"
    inv.write_text((repo / "inventory.yaml").read_text().replace("profile: opus-testbed", "profile: fast"))
    exp = tmp_path / "exp.yaml"
    exp.write_text(
        "name: headline\nrails: [0]\nphases:\n  dp: {pairs: [[h1, h2], [h3, h4]]}\n"
        "  pp: {pairs: [[h1, h3], [h2, h4]]}\nbaseline: dp\ncycle: [pp, dp]\nrepeat: 1\nhold_s: 0.1\n"
        "recovery_timeout_s: 10\n"
    )
    db = tmp_path / "q.sqlite"
    assert _labctl("submit", str(exp), "-i", str(inv), "--db", str(db)).returncode == 0
    serve = _labctl(
        "serve", "--db", str(db), "--out", str(tmp_path / "runs"), "--no-plots", "--poll", "0.05",
        "--exit-when-idle", "--log-format", "json",
    )  # fmt: skip
    assert serve.returncode == 0, serve.stderr
    lines = [json.loads(line) for line in serve.stderr.splitlines() if line.startswith("{")]
    [finished] = [line for line in lines if " finished" in line["msg"]]
    results = finished["results"]
    assert results["reconfigurations"] == 2
    assert set(results["phases"]) >= {"switch", "optical", "carrier", "total"}
    total = results["phases"]["total"]
    assert total["unit"] and total["n"] > 0 and total["median_ns"] > 0
    assert "2 reconfigurations" in finished["msg"] and f"(n={total['n']} {total['unit']})" in finished["msg"]
    hist = _labctl("history", "--db", str(db), "--json")
    [row] = json.loads(hist.stdout)
    assert row["results"] == results
    table = _labctl("history", "--db", str(db), env={"COLUMNS": "400"})
    assert "2 reconfigurations" in table.stdout and "total" in table.stdout, table.stdout


def test_an_old_sqlite_queue_gains_the_owner_column(tmp_path: Path) -> None:
    import sqlite3

    from labctl.scheduler.store_sqlite import SCHEMA

    db = tmp_path / "old.sqlite"
    with sqlite3.connect(db) as conn:
        conn.executescript(SCHEMA.replace(",\n    owner TEXT", ""))
    QueueStore(db).close()
    with sqlite3.connect(db) as conn:
        assert "owner" in {r[1] for r in conn.execute("PRAGMA table_info(runs)")}


# -- two serves in one process: a takeover seen from both sides ------------------------------------------------
async def test_a_serve_that_stalled_past_its_lease_loses_the_run_and_records_nothing(
    lab: dict[str, Path], pg_url: str, tmp_path: Path
) -> None:
    import asyncio

    from labctl.scheduler.service import Scheduler
    from tests.helpers.scheduler import RecordingExecutor

    ex_a, ex_b = RecordingExecutor(), RecordingExecutor()
    a = Scheduler(_store(pg_url), executor=ex_a, lease_s=0.6, out_dir=tmp_path / "runs")
    b = Scheduler(_store(pg_url), executor=ex_b, lease_s=30, out_dir=tmp_path / "runs")
    inv = lab["inventory"]
    rid = a.store.submit(lab["quick"], inv, declare(lab["quick"], inv), now_ns=time.time_ns())
    tasks = [asyncio.create_task(a._writer()), asyncio.create_task(b._writer())]
    try:
        assert await a.step() == [rid]  # A's heartbeat is not running: A has stalled
        await asyncio.sleep(1.2)
        assert await b.step() == []  # B takes the run over (the rail is still leased to the recovery)
        await asyncio.gather(*b._recovering.values())
        row = b.store.run(rid)
        assert row.state == "interrupted" and row.error and a.owner in row.error
        assert json.loads(row.recovery or "{}")["ok"] is True
        [retry] = b.store.runs("retry_of=?", (rid,))
        # A wakes up: its renewal no longer holds the run, so it kills its worker and records nothing.
        tasks.append(asyncio.create_task(a._heartbeat()))
        await asyncio.wait_for(asyncio.gather(*a._monitors.values()), 30)
        assert b.store.run(rid).state == "interrupted"
        assert await b.step() == [retry.id]
        ex_b.finish(retry.id)
        await asyncio.gather(*b._monitors.values())
        assert b.store.run(retry.id).state == "completed" and b.store.leases() == []
    finally:
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        a.store.close()
        b.store.close()
