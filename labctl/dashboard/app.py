"""The dashboard's Starlette application: the queue, the live run, the history, and the few POSTs behind the
token. Pages are rendered here from Jinja2 templates (labctl/dashboard/templates); the live page's plain
JavaScript (labctl/dashboard/static) reads a Server-Sent Events stream. Every query runs in a worker thread
(the store and the catalogue block), so the event loop (in `serve --http`, the scheduler's) never waits on
one.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import sys
import tempfile
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from jinja2 import Environment, FileSystemLoader, select_autoescape
from starlette.applications import Starlette
from starlette.background import BackgroundTask
from starlette.concurrency import run_in_threadpool
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import (
    FileResponse,
    HTMLResponse,
    JSONResponse,
    PlainTextResponse,
    RedirectResponse,
    Response,
    StreamingResponse,
)
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles

from labctl.core.errors import LabctlError
from labctl.dashboard import queries
from labctl.dashboard.fanout import CLOSED, DEFAULT_MAXSIZE
from labctl.dashboard.live import LiveRuns
from labctl.dashboard.security import TOKEN_HEADER, run_dir_of, run_file_of, token_matches

HERE = Path(__file__).resolve().parent
KEEPALIVE_S = 15.0
REPORT_TIMEOUT_S = 120.0
EXPORTS = {"perfetto": "trace.perfetto.json", "vcd": "timeline.vcd"}


@dataclass
class Settings:
    """What one server shows: a runs directory, and the queue when it is `serve`'s (or named)."""

    runs_dir: Path
    db: str | Path | None = None
    from_env: bool = False
    token: str | None = None
    client_queue: int = DEFAULT_MAXSIZE
    workdir: Path = field(default_factory=Path.cwd)
    """Where a POSTed submit's experiment and inventory paths are taken from (and must stay inside)."""


def _fmt_ns(ns: Any) -> str:
    from labctl.core.units import fmt_ns

    return "—" if ns is None else fmt_ns(int(ns))


def _templates() -> Environment:
    env = Environment(loader=FileSystemLoader(HERE / "templates"), autoescape=select_autoescape(("html",)))
    env.filters["ns"] = _fmt_ns
    return env


def create_app(settings: Settings) -> Starlette:
    env = _templates()
    live = LiveRuns(settings.client_queue)

    def page(request: Request, template: str, status: int = 200, **context: Any) -> HTMLResponse:
        html = env.get_template(template).render(
            request=request, queue=settings.db is not None, read_only=settings.token is None, **context
        )
        return HTMLResponse(html, status_code=status)

    def problem(request: Request, status: int, line: str) -> HTMLResponse:
        return page(request, "error.html", status=status, title=f"{status}", line=line)

    def run_dir(request: Request) -> Path:
        found = run_dir_of(settings.runs_dir, request.path_params["run_id"])
        if found is None:
            raise HTTPException(404, f"no run {request.path_params['run_id']!r} in {settings.runs_dir}")
        return found

    def need_queue() -> str | Path:
        if settings.db is None:
            raise HTTPException(404, "this dashboard has no queue: `labctl serve --http` shows one")
        return settings.db

    def need_token(request: Request) -> None:
        if settings.token is None:
            raise HTTPException(403, "read-only: start the server with --token-file to allow changes")
        if not token_matches(settings.token, request.headers.get(TOKEN_HEADER)):
            raise HTTPException(403, f"wrong or missing token: send it in the {TOKEN_HEADER} header")

    # -- pages -----------------------------------------------------------------------------------------
    async def home(request: Request) -> Response:
        return RedirectResponse("/queue" if settings.db is not None else "/runs", status_code=303)

    async def queue_page(request: Request) -> Response:
        db = need_queue()
        view = await run_in_threadpool(queries.queue_view, db, from_env=settings.from_env)
        return page(request, "queue.html", title="queue", view=view)

    async def queue_json(request: Request) -> Response:
        db = need_queue()
        return JSONResponse(await run_in_threadpool(queries.queue_view, db, from_env=settings.from_env))

    async def live_current(request: Request) -> Response:
        name: str | None = None
        if settings.db is not None:
            name = await run_in_threadpool(queries.running_run, settings.db, from_env=settings.from_env)
        else:
            rows = await run_in_threadpool(queries.catalogue, settings.runs_dir, {"status": "running"})
            name = rows[0]["dir"] if rows else None
        if name is not None:
            return RedirectResponse(f"/live/{name}", status_code=303)
        return page(
            request,
            "waiting.html",
            title="live",
            line="No run is going now; this page looks again every 2 s.",
        )

    async def live_job(request: Request) -> Response:
        db = need_queue()
        try:
            job = int(request.path_params["job"])
        except ValueError:
            raise HTTPException(404, "a job id is a number") from None
        state, name = await run_in_threadpool(queries.job_run, db, job, from_env=settings.from_env)
        if name is not None:
            return RedirectResponse(f"/live/{name}", status_code=303)
        return page(
            request,
            "waiting.html",
            title="live",
            line=f"Job {job} is {state}; this page looks again every 2 s.",
        )

    async def live_page(request: Request) -> Response:
        path = run_dir(request)
        return page(request, "live.html", title=f"live {path.name}", run=path.name)

    async def live_stream(request: Request) -> Response:
        path = run_dir(request)
        watched, client = live.watch(path)

        async def events() -> AsyncIterator[bytes]:
            try:
                yield b"retry: 1000\n\n"  # a dropped page reconnects after 1 s and gets a fresh snapshot
                while True:
                    try:
                        async with asyncio.timeout(KEEPALIVE_S):
                            batch = await client.next_batch()
                    except TimeoutError:
                        yield b": keep-alive\n\n"
                        continue
                    ended = batch[-1] == CLOSED
                    if ended:
                        batch.pop()
                    if batch:
                        yield b"".join(batch)
                    if ended:
                        return
            finally:
                live.unwatch(watched, client)

        headers = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}
        return StreamingResponse(events(), media_type="text/event-stream", headers=headers)

    async def runs_page(request: Request) -> Response:
        params = dict(request.query_params)
        rows = await run_in_threadpool(queries.catalogue, settings.runs_dir, params)
        trend = await run_in_threadpool(queries.trend, settings.runs_dir)
        return page(
            request,
            "runs.html",
            title="history",
            rows=rows,
            filters=queries.filters_of(params),
            trend=_trend_svg(trend),
        )

    async def runs_json(request: Request) -> Response:
        return JSONResponse(
            await run_in_threadpool(queries.catalogue, settings.runs_dir, dict(request.query_params))
        )

    async def run_page(request: Request) -> Response:
        path = run_dir(request)
        view = await run_in_threadpool(queries.run_view, path)
        return page(request, "run.html", title=path.name, view=view)

    async def run_file(request: Request) -> Response:
        found = run_file_of(run_dir(request), request.path_params["name"])
        if found is None:
            raise HTTPException(404, f"no file {request.path_params['name']!r} in this run")
        return FileResponse(found)

    async def run_export(request: Request) -> Response:
        path = run_dir(request)
        fmt = request.path_params["fmt"]
        if fmt not in EXPORTS:
            raise HTTPException(404, f"no export {fmt!r}: perfetto or vcd")
        target = await run_in_threadpool(_export, fmt, path)
        return FileResponse(
            target,
            filename=f"{path.name}-{EXPORTS[fmt]}",
            background=BackgroundTask(target.unlink, missing_ok=True),
        )

    async def run_report(request: Request) -> Response:
        path = run_dir(request)
        text = await _report_text(path)
        return PlainTextResponse(text)

    # -- changes, behind the token ----------------------------------------------------------------------
    async def job_cancel(request: Request) -> Response:
        db = need_queue()
        need_token(request)
        ident = request.path_params["ident"]
        if not (ident.isascii() and (ident.isdigit() or (ident.startswith("c") and ident[1:].isdigit()))):
            raise HTTPException(400, "cancel takes a job id (12) or a schedule id (c3)")
        done = await run_in_threadpool(queries.cancel, db, ident, from_env=settings.from_env)
        if not done:
            raise HTTPException(404, f"no job or schedule {ident} in the queue")
        return JSONResponse({"done": done})

    async def job_resubmit(request: Request) -> Response:
        db = need_queue()
        need_token(request)
        try:
            job = int(request.path_params["job"])
        except ValueError:
            raise HTTPException(400, "resubmit takes a job id (a number)") from None
        new = await run_in_threadpool(queries.resubmit, db, job, from_env=settings.from_env)
        return JSONResponse({"id": new})

    async def submit(request: Request) -> Response:
        db = need_queue()
        need_token(request)
        try:
            body = json.loads(await request.body() or b"{}")
        except ValueError:
            raise HTTPException(
                400, "the body must be JSON: {experiment, inventory, priority?, profile?}"
            ) from None
        if not isinstance(body, dict):
            raise HTTPException(400, "the body must be a JSON object")
        experiment = _inside(settings.workdir, body.get("experiment"), "experiment")
        inventory = _inside(settings.workdir, body.get("inventory", "inventory.yaml"), "inventory")
        priority = body.get("priority", 0)
        profile = body.get("profile")
        if not isinstance(priority, int) or not (profile is None or isinstance(profile, str)):
            raise HTTPException(400, "priority is an integer, profile a name")
        new = await run_in_threadpool(
            _submit, db, settings.from_env, experiment, inventory, priority, profile
        )
        return JSONResponse({"id": new})

    # -- errors: one line, with what to do --------------------------------------------------------------
    async def http_error(request: Request, exc: Exception) -> Response:
        assert isinstance(exc, HTTPException)
        if request.url.path.startswith("/api/") or request.method != "GET":
            return JSONResponse({"error": exc.detail}, status_code=exc.status_code)
        return problem(request, exc.status_code, str(exc.detail))

    async def input_error(request: Request, exc: Exception) -> Response:
        line = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        if request.url.path.startswith("/api/") or request.method != "GET":
            return JSONResponse({"error": line}, status_code=400)
        return problem(request, 400, line)

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        yield
        await live.close()

    routes = [
        Route("/", home),
        Route("/queue", queue_page),
        Route("/api/queue", queue_json),
        Route("/api/jobs/{ident}/cancel", job_cancel, methods=["POST"]),
        Route("/api/jobs/{job}/resubmit", job_resubmit, methods=["POST"]),
        Route("/api/submit", submit, methods=["POST"]),
        Route("/live", live_current),
        Route("/live/job/{job}", live_job),
        Route("/live/{run_id}", live_page),
        Route("/live/{run_id}/stream", live_stream),
        Route("/runs", runs_page),
        Route("/api/runs", runs_json),
        Route("/runs/{run_id}", run_page),
        Route("/runs/{run_id}/files/{name}", run_file),
        Route("/runs/{run_id}/export/{fmt}", run_export),
        Route("/runs/{run_id}/report.txt", run_report),
        Mount("/static", StaticFiles(directory=HERE / "static"), name="static"),
    ]
    app = Starlette(
        routes=routes,
        exception_handlers={HTTPException: http_error, LabctlError: input_error},
        lifespan=lifespan,
    )
    app.state.live = live
    return app


def _inside(workdir: Path, value: Any, what: str) -> Path:
    """A POSTed path: relative, inside the server's working directory, an existing YAML file."""
    if not isinstance(value, str) or not value:
        raise HTTPException(400, f"{what}: a path relative to the server's working directory")
    path = Path(value)
    root = workdir.resolve()
    resolved = (root / path).resolve()
    if path.is_absolute() or ".." in path.parts or not resolved.is_relative_to(root):
        raise HTTPException(400, f"{what}: {value!r} leaves the server's working directory")
    if resolved.suffix not in (".yaml", ".yml") or not resolved.is_file():
        raise HTTPException(400, f"{what}: no YAML file {value!r} in the server's working directory")
    return resolved


def _submit(
    db: str | Path, from_env: bool, experiment: Path, inventory: Path, priority: int, profile: str | None
) -> int:
    from labctl.scheduler.backends import open_store
    from labctl.scheduler.plan import declare
    from labctl.scheduler.timing import SystemClock

    decl = declare(experiment, inventory)
    if profile is not None:
        from labctl.labs import load

        load(inventory).profile(profile)
    now = SystemClock().wall_ns()
    store = open_store(db, from_env=from_env)
    try:
        return store.submit(
            experiment, inventory, decl, now_ns=now, priority=priority, due_ns=now, profile=profile
        )
    finally:
        store.close()


def _export(fmt: str, run_dir: Path) -> Path:
    """`labctl export RUN --format FMT` into a temporary file (removed once sent)."""
    writer: Callable[[Path, Path], int]
    if fmt == "vcd":
        from labctl.analysis.vcd import write_vcd as writer
    else:
        from labctl.analysis.perfetto import write_perfetto as writer
    fd, name = tempfile.mkstemp(suffix="-" + EXPORTS[fmt])
    os.close(fd)
    target = Path(name)
    try:
        writer(run_dir, target)
    except BaseException:
        target.unlink(missing_ok=True)
        raise
    return target


async def _report_text(run_dir: Path) -> str:
    """`labctl report RUN`'s text, from the command itself (one query layer: its own process, its own
    tables), 120 columns, no colour."""
    env = {**os.environ, "COLUMNS": "120", "NO_COLOR": "1", "TERM": "dumb"}
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "labctl.cli", "report", str(run_dir),
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT, env=env,
    )  # fmt: skip
    try:
        async with asyncio.timeout(REPORT_TIMEOUT_S):
            out, _ = await proc.communicate()
    except TimeoutError:
        proc.kill()
        await proc.wait()
        raise HTTPException(
            504, f"labctl report {run_dir.name} took over {REPORT_TIMEOUT_S:g} s: run it in a shell"
        ) from None
    except asyncio.CancelledError:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
        raise
    return out.decode(errors="replace")


def _trend_svg(series: dict[str, list[tuple[int, int]]]) -> dict[str, Any] | None:
    """The median total link-up of each experiment's runs over time, as polylines in a 600x200 box."""
    points = [p for values in series.values() for p in values]
    if not points:
        return None
    t0, t1 = min(t for t, _ in points), max(t for t, _ in points)
    v1 = max(v for _, v in points) * 1.1 or 1
    width, height = 600, 200

    def xy(t: int, v: int) -> tuple[float, float]:
        x = 40 + (width - 50) * ((t - t0) / (t1 - t0) if t1 > t0 else 0.5)
        return round(x, 1), round(height - 20 - (height - 30) * v / v1, 1)

    lines = [
        {"experiment": name, "points": " ".join(f"{x},{y}" for x, y in (xy(t, v) for t, v in values)),
         "dots": [xy(t, v) for t, v in values], "last_ns": values[-1][1], "n": len(values)}
        for name, values in sorted(series.items())
    ]  # fmt: skip
    return {"width": width, "height": height, "lines": lines, "max_ns": v1}
