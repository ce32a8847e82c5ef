"""`labctl dashboard RUNS_DIR --http [ADDR:]PORT`: the lab dashboard over a runs directory, without a
scheduler; and what `labctl serve --http` adds to `serve` (labctl.dashboard; docs/dashboard.md).

Bad input (an address that is not one, a non-loopback address without a token, a port in use) is one line
and exit code 2, before anything starts.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from labctl.cli.common import RUNS, HttpOpt, TokenFileOpt, start_logging

if TYPE_CHECKING:
    from labctl.dashboard.app import Settings
    from labctl.dashboard.security import Bind


def _settings(
    http: str, token_file: Path | None, runs_dir: Path, db: str | Path | None, from_env: bool
) -> tuple[Settings, Bind, bool]:
    """The address, the token (InputError, exit 2, where one is needed and missing) and the app's settings;
    the dashboard's packages checked first (the `dashboard` extra)."""
    from labctl.core.extras import require

    for module in ("starlette", "uvicorn", "jinja2"):
        require(module, "dashboard", "the dashboard (--http)")
    from labctl.dashboard.app import Settings
    from labctl.dashboard.security import load_token, parse_bind

    bind = parse_bind(http)
    token, generated = load_token(token_file, bind)
    return Settings(runs_dir=runs_dir, db=db, from_env=from_env, token=token), bind, generated


def serve_with_dashboard(
    http: str,
    token_file: Path | None,
    where: str | Path,
    out_dir: Path,
    *,
    from_env: bool,
    options: dict[str, Any],
) -> None:
    """`labctl serve --http`: the scheduler as always, with the dashboard beside it on its loop."""
    import asyncio

    settings, bind, generated = _settings(http, token_file, out_dir, where, from_env)
    from labctl.dashboard.server import serve_with_http

    asyncio.run(serve_with_http(settings, bind, token_file, generated, {**options, "from_env": from_env}))


def dashboard(
    runs_dir: Annotated[Path, typer.Argument(metavar="RUNS_DIR", help="The runs directory.")] = RUNS,
    http: HttpOpt = "8080",
    token_file: TokenFileOpt = None,
    db: Annotated[
        str | None,
        typer.Option(
            "--db",
            envvar="LABCTL_QUEUE_DB",
            show_default=False,
            help="Also show this queue (read through the store, as `labctl queue` does).",
        ),
    ] = None,
) -> None:
    """Serve the lab dashboard for a runs directory: its history (the run catalogue, as `labctl runs`), each
    run's summary, figures and exports, and the live page of a run being written.

    Binds 127.0.0.1:8080 by default. `labctl serve --http` serves the same pages beside the scheduler,
    with its queue. Stops on Ctrl-C/SIGTERM."""
    import asyncio
    import os

    start_logging("warning", None)
    from_env = db is not None and os.environ.get("LABCTL_QUEUE_DB") == db
    settings, bind, generated = _settings(http or "8080", token_file, runs_dir, db, from_env)
    from labctl.dashboard.server import dashboard_main

    asyncio.run(dashboard_main(settings, bind, token_file, generated))


def register(app: typer.Typer) -> None:
    app.command("dashboard")(dashboard)
