"""Issue 27's "done when" for the shared queue: 20 jobs over two labs whose resources overlap, run by two
`labctl serve` processes on one PostgreSQL queue; one serve is SIGKILLed while it runs a job. Each job runs
to completion exactly once, no two runs ever hold one resource at a time, the killed serve's job is retried
once by the other serve after its lease expires, and the other serve keeps going to the end. The same on
SQLite with one serve at a time (the killed one's successor recovers the job at its start).

No timing is asserted: every wait has a generous deadline, and the intervals compared are the workers' own
start and end stamps (run.json), which are ordered by the leases whatever the machine's load."""

from __future__ import annotations

import json
import signal
import subprocess
import time
from collections import defaultdict
from itertools import pairwise
from pathlib import Path

import pytest

from labctl.core.events import read_events
from labctl.scheduler.backends import open_store
from labctl.scheduler.plan import declare
from labctl.scheduler.store import RunRow, Store
from labctl.scheduler.store_sql import resource_keys
from tests.helpers import postgres as pg
from tests.helpers import serve_processes
from tests.helpers.scheduler import SPLIT_INVENTORY, experiment
from tests.helpers.serve_processes import labctl_argv, pid_gone, wait_for

postgres_server, pg_url = pg.postgres_server, pg.pg_url  # fixtures
procs = serve_processes.procs  # a fixture

# Lab B shares switch ocs1's rail-0 fibers and hosts h1, h2 with lab A (SPLIT_INVENTORY); its rail 1 is its own.
LAB_B = """
lab: split-test-b
switches:
  ocs1: {driver: sim, size: 16x16}
profile: fast
hosts:
  h1: {nics: [{ifname: p0, rail: 0, switch: ocs1, tx: 1, rx: 17}, {ifname: p1, rail: 0, switch: ocs1, tx: 2, rx: 18}]}
  h2: {nics: [{ifname: p0, rail: 0, switch: ocs1, tx: 3, rx: 19}, {ifname: p1, rail: 0, switch: ocs1, tx: 4, rx: 20}]}
  h5: {nics: [{ifname: p0, rail: 1, switch: ocs1, tx: 9, rx: 25}, {ifname: p1, rail: 1, switch: ocs1, tx: 10, rx: 26}]}
  h6: {nics: [{ifname: p0, rail: 1, switch: ocs1, tx: 11, rx: 27}, {ifname: p1, rail: 1, switch: ocs1, tx: 12, rx: 28}]}
"""
# Two serves and up to 22 worker processes at once: the heaviest load the suite makes. Under pytest-xdist it
# runs on the agents tests' worker, one after another with them, so the agents' timing comparisons (marks
# through MQTT against one process, within the clocks' stated uncertainty) never run beside it.
pytestmark = pytest.mark.xdist_group("agents")

LEASE_S = "3"
DEADLINE_S = 240.0


def _rows(db: str) -> list[RunRow]:
    store: Store = open_store(db)
    try:
        return store.runs()
    finally:
        store.close()


@pytest.fixture
def jobs(tmp_path: Path) -> list[tuple[Path, Path]]:
    """20 jobs: (experiment, inventory). Per lab, 5 on each rail; the first job of each lab's rail 1 is long
    (the one a serve is killed in)."""
    inv_a, inv_b = tmp_path / "lab-a.yaml", tmp_path / "lab-b.yaml"
    inv_a.write_text(SPLIT_INVENTORY)
    inv_b.write_text(LAB_B)
    out: list[tuple[Path, Path]] = []
    for lab, inv, rail1 in (("a", inv_a, ("h3", "h4")), ("b", inv_b, ("h5", "h6"))):
        for i in range(5):
            for rail, hosts in ((0, ("h1", "h2")), (1, rail1)):
                long = rail == 1 and i == 0
                name = f"{'long' if long else 'quick'}-{lab}{rail}-{i}"
                path = tmp_path / f"{name}.yaml"
                path.write_text(
                    experiment(rail, hosts, name=name, repeat=8 if long else 1, hold_s=0.3 if long else 0.0)
                )
                out.append((path, inv))
    return out


def _submit(db: str, jobs: list[tuple[Path, Path]]) -> None:
    """The first job through `labctl submit`, the rest through the store as it does (20 CLI processes were
    ~10 s of CPU per backend, which the suite's other tests waited for; the CLI is what submits the first)."""
    priority = {True: 5, False: 0}
    (exp, inv), rest = jobs[0], jobs[1:]
    proc = subprocess.run(
        labctl_argv(
            "submit",
            str(exp),
            "-i",
            str(inv),
            "--db",
            db,
            "--priority",
            str(priority[exp.name.startswith("long")]),
        ),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 0, proc.stderr
    store = open_store(db)
    try:
        for exp, inv in rest:
            store.submit(
                exp,
                inv,
                declare(exp, inv),
                now_ns=time.time_ns(),
                priority=priority[exp.name.startswith("long")],
            )
    finally:
        store.close()
    submitted = _rows(db)
    assert len(submitted) == 20 and len({r.experiment for r in submitted}) == 20


def _mid_run_owner(store: Store) -> tuple[RunRow, int] | None:
    """A long run that is mid-way (two phases in its events), and the pid of the serve running it."""
    for row in store.runs("state='running'"):
        if not row.name.startswith("long") or not row.run_dir or not row.owner:
            continue
        events = Path(row.run_dir) / "events.jsonl"
        if events.exists() and sum(e.kind == "phase" for e in read_events(events)) >= 2:
            return row, int(row.owner.rsplit(":", 2)[1])
    return None


def _check(db: str, runs: Path, killed_serve: int, survivor: int) -> None:
    rows = {r.id: r for r in _rows(db)}
    originals = [r for r in rows.values() if r.retry_of is None]
    assert len(originals) == 20
    # Every job's chain of attempts ends in one completed run; every other attempt is one the killed serve
    # was running, recovered by another serve (or its successor), interrupted and retried exactly once.
    interrupted = [r for r in rows.values() if r.state == "interrupted"]
    assert interrupted, "the killed serve was running a job: it must have been recovered"
    for row in interrupted:
        assert row.owner is not None and f":{killed_serve}:" not in row.owner  # the recovering serve's now
        assert row.error and ("lost" in row.error or "interrupted" in row.error), row.error
        [retry] = [r for r in rows.values() if r.retry_of == row.id]
        assert (retry.state, retry.attempt) == ("completed", 2), retry
        assert retry.owner is not None and f":{survivor}:" in retry.owner
        if row.run_dir is not None:
            meta = json.loads((Path(row.run_dir) / "run.json").read_text())
            assert meta["status"] == "aborted" and meta["recovery"]["ok"] is True
    for job in originals:
        chain = [job]
        while chain[-1].state == "interrupted":
            [nxt] = [r for r in rows.values() if r.retry_of == chain[-1].id]
            chain.append(nxt)
        assert chain[-1].state == "completed" and len(chain) <= 2, chain
    # Exactly once, from the run directories themselves (each job has its own experiment file): one completed
    # run per job, whatever the queue recorded; any other directory of a job is an attempt that was stopped.
    metas = {p.parent: json.loads(p.read_text()) for p in runs.glob("*/run.json")}
    per_job: dict[str, list[str]] = defaultdict(list)
    for meta in metas.values():
        per_job[meta["experiment_path"]].append(meta["status"])
    assert len(per_job) == 20
    for experiment_path, statuses in per_job.items():
        assert sorted(statuses) == sorted(["completed"] + ["aborted"] * (len(statuses) - 1)), (
            experiment_path,
            statuses,
        )
    recorded = [r.run_dir for r in rows.values() if r.run_dir is not None]
    assert len(set(recorded)) == len(recorded)  # each attempt its own directory
    assert {str(d) for d in metas} >= set(recorded)
    # Never two runs on one resource at a time: the workers' own start and end, per resource (a job's
    # resources are its row's). An interrupted run held them until its recovery ended (its row's
    # finished_ns), after its worker was gone.
    job_rows = {r.experiment: r for r in originals}
    ended = {r.run_dir: r.finished_ns for r in interrupted if r.run_dir is not None}
    # Killed before its run directory was recorded: its directory (if the worker made one) is the one of
    # its job that the queue does not know.
    for row in interrupted:
        if row.run_dir is None:
            unknown = [
                d
                for d, m in metas.items()
                if m["experiment_path"] == row.experiment and str(d) not in recorded
            ]
            assert len(unknown) <= 1
            ended.update({str(d): row.finished_ns for d in unknown})
    by_key: dict[str, list[tuple[int, int, str]]] = defaultdict(list)
    for run_dir, meta in metas.items():
        start, end = int(meta["started_wall_ns"]), int(meta["finished_wall_ns"])
        end = max(end, ended.get(str(run_dir)) or end)
        for key in resource_keys(job_rows[meta["experiment_path"]].resources):
            by_key[key].append((start, end, run_dir.name))
    assert len(by_key["host:h1"]) >= 10  # both labs' rail-0 jobs (5 each) share h1
    for key, spans in by_key.items():
        spans.sort()
        for (_s0, e0, a), (s1, _e1, b) in pairwise(spans):
            assert s1 >= e0, f"{a} and {b} overlap on {key}"


@pytest.mark.slow
@pytest.mark.timeout(DEADLINE_S * 2)  # ~40 s alone; 22 worker processes on a busy 2-core machine take longer
@pytest.mark.parametrize("backend", ["postgres", "sqlite"])
def test_twenty_jobs_two_labs_a_killed_serve_and_each_job_once(
    backend: str,
    request: pytest.FixtureRequest,
    tmp_path: Path,
    jobs: list[tuple[Path, Path]],
    procs: list[subprocess.Popen[bytes]],
) -> None:
    db = request.getfixturevalue("pg_url") if backend == "postgres" else str(tmp_path / "q.sqlite")
    runs = tmp_path / "runs"
    _submit(db, jobs)
    serve = ("serve", "--db", db, "--out", str(runs), "--no-plots", "--poll", "0.1", "--lease", LEASE_S)
    logs = [open(tmp_path / f"serve-{i}.log", "wb") for i in range(3)]  # noqa: SIM115
    try:
        first = subprocess.Popen(labctl_argv(*serve, "--exit-when-idle"), stderr=logs[0])
        procs.append(first)
        if backend == "postgres":  # a second serve on the same queue, at the same time
            second = subprocess.Popen(labctl_argv(*serve, "--exit-when-idle"), stderr=logs[1])
            procs.append(second)
        found: list[tuple[RunRow, int]] = []
        watcher = open_store(db)

        def mid_run() -> bool:
            hit = _mid_run_owner(watcher)
            if hit is not None:
                found.append(hit)
            return hit is not None

        try:
            wait_for(mid_run, DEADLINE_S, "a long run to be mid-way")
        finally:
            watcher.close()
        row, victim_pid = found[-1]
        victim = next(p for p in procs if p.pid == victim_pid)
        worker = row.pid
        victim.send_signal(signal.SIGKILL)
        victim.wait(timeout=30)
        assert worker is not None
        # Its worker got SIGTERM from the kernel (PR_SET_PDEATHSIG) and stops: no second copy of the run.
        wait_for(lambda: pid_gone(worker), 60, "the killed serve's worker to stop")
        if backend == "postgres":
            survivor = next(p for p in procs if p is not victim)
        else:  # one serve per SQLite file: the next one recovers the killed serve's run at its start
            survivor = subprocess.Popen(labctl_argv(*serve, "--exit-when-idle"), stderr=logs[2])
            procs.append(survivor)
        assert survivor.wait(timeout=DEADLINE_S) == 0
    finally:
        for f in logs:
            f.close()
    log_text = "".join((tmp_path / f"serve-{i}.log").read_text(errors="replace") for i in range(3))
    assert "Traceback" not in log_text, log_text[-4000:]
    _check(db, runs, victim_pid, survivor.pid)
