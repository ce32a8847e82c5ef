"""The scheduler: priority order, due dates, cron under an injected clock, resource overlap, crash recovery."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sqlite3
import subprocess
import sys
import time
from datetime import UTC
from pathlib import Path

import pytest

from labctl.core.events import read_events
from labctl.scheduler.plan import declare
from labctl.scheduler.service import Scheduler
from labctl.scheduler.store import RunRow
from labctl.scheduler.store_sqlite import QueueStore
from tests.conftest import REPO
from tests.helpers import scheduler as helpers
from tests.helpers import serve_processes
from tests.helpers.scheduler import MIN, T0, FakeClock, RecordingExecutor
from tests.helpers.serve_processes import labctl_argv, pid_gone, wait_for

lab, store, procs = helpers.lab, helpers.store, serve_processes.procs  # fixtures


# -- due dates and cron under an injected clock ------------------------------------------------------------------
async def test_due_date_holds_a_run_back_until_its_time(lab: dict[str, Path], tmp_path: Path) -> None:
    clock, ex = FakeClock(T0), RecordingExecutor()
    sched = Scheduler(tmp_path / "q.sqlite", executor=ex, clock=clock, tz=UTC, out_dir=tmp_path)
    inv = lab["inventory"]
    later = sched.store.submit(
        lab["rail0"], inv, declare(lab["rail0"], inv), now_ns=T0, due_ns=T0 + 5 * MIN, priority=9
    )
    now = sched.store.submit(lab["rail0b"], inv, declare(lab["rail0b"], inv), now_ns=T0, priority=0)
    writer = asyncio.create_task(sched._writer())
    try:
        assert await sched.step() == [now]  # the priority-9 run is not due yet and reserves nothing
        ex.finish(now)
        await asyncio.sleep(0.05)
        clock.now = T0 + 5 * MIN - 1
        assert await sched.step() == []
        clock.now = T0 + 5 * MIN
        assert await sched.step() == [later]
        ex.finish(later)
        await asyncio.gather(*sched._monitors.values())
        assert sched.store.run(later).state == "completed"
        assert sched.store.run(later).started_ns == T0 + 5 * MIN
    finally:
        writer.cancel()
        await asyncio.gather(writer, return_exceptions=True)
        sched.store.close()


# -- real runs through worker processes ---------------------------------------------------------------------
def _run_interval(row: RunRow) -> tuple[int, int]:
    """The run's own start and end (wall ns) from its run.json, as written by the worker process."""
    assert row.run_dir is not None, row
    meta = json.loads((Path(row.run_dir) / "run.json").read_text())
    return int(meta["started_wall_ns"]), int(meta["finished_wall_ns"])


@pytest.mark.slow
async def test_disjoint_runs_overlap_and_overlapping_runs_wait(lab: dict[str, Path], tmp_path: Path) -> None:
    sched = Scheduler(tmp_path / "q.sqlite", out_dir=tmp_path / "runs", poll_s=0.05, plots=False)
    inv = lab["inventory"]
    a = sched.store.submit(lab["rail0"], inv, declare(lab["rail0"], inv), now_ns=time.time_ns())
    b = sched.store.submit(lab["rail1"], inv, declare(lab["rail1"], inv), now_ns=time.time_ns())
    c = sched.store.submit(lab["rail0b"], inv, declare(lab["rail0b"], inv), now_ns=time.time_ns())
    await asyncio.wait_for(sched.serve(exit_when_idle=True), 90)
    store = QueueStore(tmp_path / "q.sqlite")
    try:
        rows = {r.id: r for r in store.runs()}
    finally:
        store.close()
    assert {r.state for r in rows.values()} == {"completed"}, rows
    (a0, a1), (b0, b1), (c0, _c1) = (_run_interval(rows[i]) for i in (a, b, c))
    assert a0 < b1 and b0 < a1, "runs on disjoint rails and hosts must run at the same time"
    assert c0 >= a1, "a run on the same rail must wait for the one holding it"


@pytest.mark.slow
async def test_priority_order_of_real_runs(lab: dict[str, Path], tmp_path: Path) -> None:
    sched = Scheduler(tmp_path / "q.sqlite", out_dir=tmp_path / "runs", poll_s=0.05, plots=False)
    inv = lab["inventory"]
    ids = {
        prio: sched.store.submit(
            lab["quick"], inv, declare(lab["quick"], inv), now_ns=time.time_ns() + i, priority=prio
        )
        for i, prio in enumerate((1, 7, 3))
    }
    await asyncio.wait_for(sched.serve(exit_when_idle=True), 90)
    store = QueueStore(tmp_path / "q.sqlite")
    try:
        rows = {r.id: r for r in store.runs()}
    finally:
        store.close()
    starts = sorted(ids, key=lambda prio: _run_interval(rows[ids[prio]])[0])
    assert starts == [7, 3, 1]


# -- a killed serve ------------------------------------------------------------------------------------------


@pytest.mark.slow
def test_killed_serve_leaves_consistent_queue_and_restart_restores_baseline(
    lab: dict[str, Path], tmp_path: Path, procs: list[subprocess.Popen[bytes]]
) -> None:
    db, runs = tmp_path / "q.sqlite", tmp_path / "runs"
    inv = lab["inventory"]
    for exp in ("long", "quick"):
        subprocess.run(labctl_argv("submit", str(lab[exp]), "-i", str(inv), "--db", str(db)), check=True)
    serve_args = ("serve", "--db", str(db), "--out", str(runs), "--no-plots", "--poll", "0.05")
    serve = subprocess.Popen(labctl_argv(*serve_args), stderr=subprocess.DEVNULL)
    procs.append(serve)

    def long_row() -> RunRow:
        s = QueueStore(db)
        try:
            return s.run(1)
        finally:
            s.close()

    def reconfigured_twice() -> bool:
        row = long_row()
        if row.run_dir is None or not (Path(row.run_dir) / "events.jsonl").exists():
            return False
        return sum(e.kind == "phase" for e in read_events(Path(row.run_dir) / "events.jsonl")) >= 2

    wait_for(reconfigured_twice, 60, "the long run to be mid-way")
    worker = long_row().pid
    assert worker is not None
    serve.send_signal(signal.SIGKILL)
    serve.wait(timeout=10)
    wait_for(lambda: pid_gone(worker), 30, "the orphaned worker to stop")

    # The queue as the dead serve left it: readable, intact, every row in a known state.
    with sqlite3.connect(db) as conn:
        assert conn.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
    s = QueueStore(db)
    try:
        states = {r.id: r.state for r in s.runs()}
    finally:
        s.close()
    assert states == {1: "running", 2: "queued"}

    restart = subprocess.Popen(labctl_argv(*serve_args, "--exit-when-idle"), stderr=subprocess.DEVNULL)
    procs.append(restart)
    assert restart.wait(timeout=120) == 0

    s = QueueStore(db)
    try:
        rows = {r.id: r for r in s.runs()}
    finally:
        s.close()
    interrupted = rows[1]
    assert interrupted.state == "interrupted"
    recovery = json.loads(interrupted.recovery or "{}")
    assert recovery["ok"] is True
    # A simulated lab's switch died with the run: the record says the restore had nothing physical to do.
    assert "no physical switch needed restoring" in recovery["note"]
    baseline = sorted(map(tuple, interrupted.baseline["ocs1"]["mapping"]))
    assert sorted(map(tuple, recovery["held"]["ocs1"])) == baseline
    # The recovery went through the switch driver: its events show the baseline applied and read back.
    events = list(read_events(Path(recovery["events"])))
    assert any(e.kind == "ocs.command" and e.meta.get("recovery") == 1 for e in events)
    reads = [e for e in events if e.kind == "ocs.read"]
    assert reads and sorted(map(tuple, reads[-1].meta["patches"])) == baseline
    meta = json.loads((Path(interrupted.run_dir or "") / "run.json").read_text())
    assert meta["status"] == "aborted" and meta["recovery"]["ok"] is True
    # The queue resumed: the waiting run ran, and the interrupted one was retried once.
    assert rows[2].state == "completed"
    [retry] = [r for r in rows.values() if r.retry_of == 1]
    assert (retry.state, retry.attempt) == ("completed", 2)


@pytest.mark.slow
async def test_crashed_worker_is_recovered_and_retried(lab: dict[str, Path], tmp_path: Path) -> None:
    sched = Scheduler(tmp_path / "q.sqlite", out_dir=tmp_path / "runs", poll_s=0.05, plots=False)
    inv = lab["inventory"]
    rid = sched.store.submit(lab["long"], inv, declare(lab["long"], inv), now_ns=time.time_ns())
    serving = asyncio.create_task(sched.serve(exit_when_idle=False))
    try:
        for _ in range(600):
            row = sched.store.run(rid)
            if row.run_dir and (Path(row.run_dir) / "events.jsonl").exists():
                break
            await asyncio.sleep(0.05)
        assert row.pid is not None and row.run_dir is not None
        os.kill(row.pid, signal.SIGKILL)  # the run dies hard: no chance to restore anything itself
        for _ in range(600):
            if sched.store.run(rid).state == "interrupted":
                break
            await asyncio.sleep(0.05)
        row = sched.store.run(rid)
        assert row.state == "interrupted"
        assert json.loads(row.recovery or "{}")["ok"] is True
        assert (Path(row.run_dir or "") / "recovery.jsonl").exists()
        [retry] = sched.store.runs("retry_of=?", (rid,))
        assert retry.attempt == 2
        assert sched.store.cancel(str(retry.id))
    finally:
        serving.cancel()
        await asyncio.gather(serving, return_exceptions=True)


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--cron", "0 0 31 2 *"], "never fires"),
        (["--cron", "* * * * * *"], "five fields"),
        (["--at", "+99999999999999d"], "must be between now and"),
        (["--at", "9999-12-31T23:59"], "must be between now and"),
        (["--priority", "99999999999999999999"], "priority"),
    ],
)
def test_submit_bad_schedules_are_one_line_exit_2(
    lab: dict[str, Path], tmp_path: Path, args: list[str], message: str
) -> None:
    proc = subprocess.run(
        labctl_argv(
            "submit", str(lab["rail0"]), "-i", str(lab["inventory"]), "--db", str(tmp_path / "q.db"), *args
        ),
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert proc.returncode == 2, proc.stderr
    assert "Traceback" not in proc.stderr
    assert message in proc.stderr


def test_cancel_with_a_non_ascii_digit_is_not_a_crash(tmp_path: Path) -> None:
    QueueStore(tmp_path / "q.db").close()
    proc = subprocess.run(
        labctl_argv("cancel", "²", "--db", str(tmp_path / "q.db")),
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert "Traceback" not in proc.stderr
    assert proc.returncode in (1, 2)


def test_reading_a_queue_that_does_not_exist_creates_nothing(tmp_path: Path) -> None:
    db = tmp_path / "typo.db"
    queue = subprocess.run(
        labctl_argv("queue", "--db", str(db), "--json"), capture_output=True, text=True, timeout=60
    )
    assert queue.returncode == 0 and json.loads(queue.stdout) == {"runs": [], "schedules": []}
    history = subprocess.run(
        labctl_argv("history", "--db", str(db)), capture_output=True, text=True, timeout=60
    )
    assert history.returncode == 0 and "no queue at" in history.stdout
    cancel = subprocess.run(
        labctl_argv("cancel", "1", "--db", str(db)), capture_output=True, text=True, timeout=60
    )
    assert cancel.returncode == 2 and cancel.stderr.count("\n") == 1 and "no queue database" in cancel.stderr
    assert not db.exists()


async def test_recovery_restores_an_emulated_switch_through_its_own_emulator(
    repo: Path, tmp_path: Path, store: QueueStore
) -> None:
    """An `emulate: true` switch serves its emulator while it is connected, so the recovery reaches it
    over TCP without starting the rest of the lab (no fabric, no broker)."""
    from labctl.scheduler.crash_recovery import restore_baseline

    inv = repo / "experiments" / "inventories" / "tl1-emulated.yaml"
    exp = repo / "experiments" / "reconfig-timeline.yaml"
    rid = store.submit(exp, inv, declare(exp, inv), now_ns=time.time_ns(), profile="fast")
    row = store.run(rid)
    held = await restore_baseline(row, tmp_path / "recovery.jsonl")
    assert held == {sw: entry["mapping"] for sw, entry in row.baseline.items()}
    commands = [
        e.meta.get("command", "") for e in read_events(tmp_path / "recovery.jsonl") if e.kind == "ocs.io"
    ]
    assert any(c.startswith("ACT-USER") for c in commands) and any(
        c.startswith("ENT-PATCH") for c in commands
    )


def test_a_worker_whose_serve_is_gone_finishes_without_a_traceback(tmp_path: Path) -> None:
    """`serve` killed mid-run: the worker's report has no reader. It must end quietly (the run directory
    holds the record), not write a BrokenPipeError traceback into its log."""
    args = {
        "experiment": str(tmp_path / "missing.yaml"),
        "inventory": "inventory.yaml",
        "out_dir": str(tmp_path),
    }
    read_fd, write_fd = os.pipe()
    os.close(read_fd)  # nobody will ever read the worker's reports
    try:
        proc = subprocess.run(
            [sys.executable, "-m", "labctl.scheduler", "worker", json.dumps(args)],
            stdout=write_fd,
            stderr=subprocess.PIPE,
            text=True,
            timeout=60,
        )
    finally:
        os.close(write_fd)
    assert "Traceback" not in proc.stderr and "BrokenPipe" not in proc.stderr, proc.stderr
    assert proc.returncode == 1  # the experiment file does not exist: failed, said nowhere, no crash


def test_the_queue_database_defaults_to_the_users_data_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from labctl.scheduler.location import default_queue_db
    from labctl.scheduler.store_sqlite import QueueStore

    monkeypatch.delenv("LABCTL_QUEUE_DB", raising=False)
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "data"))
    monkeypatch.chdir(tmp_path)
    assert default_queue_db() == tmp_path / "data" / "labctl" / "queue.sqlite"
    QueueStore().close()
    assert (tmp_path / "data" / "labctl" / "queue.sqlite").is_file()
    assert not (tmp_path / "labctl-queue.sqlite").exists()  # nothing lands in the working directory
    monkeypatch.setenv("LABCTL_QUEUE_DB", str(tmp_path / "elsewhere.sqlite"))
    assert default_queue_db() == tmp_path / "elsewhere.sqlite"
    help_text = subprocess.run(
        labctl_argv("queue", "--help"), capture_output=True, text=True, timeout=60
    ).stdout
    assert "XDG_DATA_HOME" in help_text and "LABCTL_QUEUE_DB" in help_text


@pytest.mark.slow
async def test_a_replay_experiment_is_queued_with_its_rails_and_runs(tmp_path: Path) -> None:
    """`labctl submit` takes any experiment kind: a trace replay holds its rails' ports and hosts like a
    timeline does, and the worker runs it to the end (replay_steps.csv in its run directory)."""
    inv = tmp_path / "inventory.yaml"
    inv.write_text((REPO / "inventory.yaml").read_text().replace("profile: opus-testbed", "profile: fast"))
    replay = tmp_path / "replay.yaml"
    replay.write_text(
        "name: queued-replay\nkind: replay\ntrace: opus-testbed-mini\nmode: provisioning\nswitching_ms: 5\n"
        "steps: 1\nhold_s: 0\n"
    )
    decl = declare(replay, inv)
    assert decl.name == "queued-replay"
    assert {h for h in decl.resources.hosts} == {"h1", "h2", "h3", "h4"}
    assert len(decl.resources.ports) == 32  # both rails of the 32x32 switch: 16 NIC ports x tx and rx
    sched = Scheduler(tmp_path / "q.sqlite", out_dir=tmp_path / "runs", poll_s=0.05, plots=False)
    rid = sched.store.submit(replay, inv, decl, now_ns=time.time_ns())
    await asyncio.wait_for(sched.serve(exit_when_idle=True), 120)
    store = QueueStore(tmp_path / "q.sqlite")
    try:
        [row] = [r for r in store.runs() if r.id == rid]
    finally:
        store.close()
    assert row.state == "completed", row
    assert list((tmp_path / "runs").glob("*/replay_steps.csv"))


async def test_a_serve_that_cannot_renew_its_leases_stops_its_run_and_it_is_retried(
    lab: dict[str, Path], tmp_path: Path
) -> None:
    """Fencing: a serve whose lease renewals fail for two thirds of the lease stops its runs before another
    serve could take them over; the run is recorded interrupted and retried once."""
    from labctl.scheduler.store import StoreUnavailable

    class Flaky(QueueStore):
        shared = True  # a shared queue's serve: a heartbeat renews its leases
        down = False

        def renew(self, owner: str, lease_s: float) -> set[int]:
            if self.down:
                raise StoreUnavailable("q: connection lost")
            return super().renew(owner, lease_s)

    store = Flaky(tmp_path / "q.sqlite")
    ex = RecordingExecutor()
    sched = Scheduler(store, executor=ex, lease_s=0.3, poll_s=0.05, out_dir=tmp_path / "runs")
    inv = lab["inventory"]
    rid = store.submit(lab["quick"], inv, declare(lab["quick"], inv), now_ns=T0)
    serving = asyncio.create_task(sched.serve())
    try:
        for _ in range(400):
            if ex.started:
                break
            await asyncio.sleep(0.025)
        assert ex.started == [rid]
        store.down = True
        for _ in range(800):
            if store.run(rid).state == "interrupted":
                break
            await asyncio.sleep(0.025)
        row = store.run(rid)
        assert (row.state, row.error) == ("interrupted", "its serve lost the queue database")
        # Retried once (the retry itself meets the same outage: its fate is not this test's point).
        [retry] = store.runs("retry_of=?", (rid,))
        assert retry.attempt == 2
    finally:
        serving.cancel()
        await asyncio.gather(serving, return_exceptions=True)
