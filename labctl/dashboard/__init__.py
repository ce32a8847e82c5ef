"""The live lab dashboard: `labctl serve --http` (beside the scheduler) and `labctl dashboard RUNS_DIR`.

Server-rendered pages over the same query layer as the command line (the queue store of
labctl.scheduler, the run catalogue of labctl.analysis.catalog), a live page fed by Server-Sent Events
from the running run's events.jsonl as it is written, and the token rules for anything that changes state
(docs/dashboard.md; decision 0066).

The modules, each importing only those above it:
- `security`: pure: the bind address, the token (constant-time), run ids and file names checked.
- `tail`: pure: a growing events.jsonl read line by line, and the live view those events fold into.
- `fanout`: bounded per-client queues; a client that falls behind is dropped, never waited for.
- `queries`: the pages' data, through the store and catalogue functions the CLI uses.
- `live`: one reader task per watched run, publishing to its clients.
- `app`: the Starlette application (routes, pages, SSE).
- `server`: uvicorn beside the scheduler's loop (`serve --http`) or alone (`labctl dashboard`).

Starlette, uvicorn and Jinja2 (the `dashboard` extra) are imported by `app` and `server` only: nothing
here is loaded unless a command serves HTTP.
"""
