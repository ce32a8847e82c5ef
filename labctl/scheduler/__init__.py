"""`labctl serve`: a queue of experiment runs, started by priority, due date and cron schedule.

- The queue is a SQLite file in WAL mode (the default; one `serve` per file) or a PostgreSQL database that
  several `serve`s share (decision 0061): runs claimed with row locks, their resources leased with an expiry
  the holding serve renews, a dead serve's runs taken over and retried once after its leases expire. Inside
  `serve`, one writer task makes every state change in a short transaction; the CLI clients (`submit`,
  `cancel`) make short ones too, so no transaction ever waits on a run (the QCoDeS lock complaints came
  from long-lived writers).
- Each run declares what it touches: the OCS ports of its rails (every fiber of the rail, as
  `topology.rail_scope`) and the hosts of its plan. Runs on disjoint resources run at the same time.
- Order: priority (high first), then due time, then submission order. A run that waits for resources
  reserves them against every lower-priority run (conservative backfill, decision 0015), so a lower
  priority run never delays it; priority never preempts a running run.
- Every run executes in its own worker process through `labctl.run.lifecycle.run_experiment`, the same path
  as `labctl run`. A crashed worker, or a `serve` killed while runs were going, leaves rows in `running`;
  the next `serve` (or the monitor of a crashed worker) re-applies the run's baseline through the
  inventory's switch drivers, records that in `recovery.jsonl`, marks the row `interrupted` and queues one
  retry (decision 0016).

The modules, each importing only those above it:

- `timing`: the injectable wall clock, `--at` parsing, cron expressions (croniter, imported on first use).
- `plan`: what a run touches (`Resources`), `declare` (validate an experiment, derive its resources and
  baseline) and `pick`, the conservative-backfill choice of which due runs start now.
- `location`: where the queue is: the default SQLite file, or a PostgreSQL URL (checked, its password masked).
- `store`: the queue's interface (`Store`, a Protocol), the run state machine, `RunRow`/`ScheduleRow`.
- `store_sql`: the SQL both backends share (`SqlStore`): submissions, reads, state changes, claims.
- `store_sqlite`: the SQLite backend (`QueueStore`).
- `store_pg`: the PostgreSQL backend (psycopg, the `[postgres]` extra, imported only for a URL): claims,
  leases, takeover.
- `backends`: `open_store`, the backend a `--db` path or URL names.
- `results`: a finished run's headline numbers from its summary.json (`history`, `serve`'s log line).
- `worker`: executing one run: the `Executor` protocol and `SubprocessExecutor`, and the worker process
  itself (`python -m labctl.scheduler worker ARGS`, through `__main__`).
- `crash_recovery`: recovery of runs left `running` (baseline and link settings restored, one retry).
- `service`: the `serve` engine (`Scheduler`), `serve_main`.

Nothing is imported here: `labctl.scheduler.timing` and the stores stay light for the CLI clients, and the
worker process loads only what it runs.
"""
