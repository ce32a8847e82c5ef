"""uvicorn for the dashboard: beside the scheduler's loop (`labctl serve --http`) or alone (`labctl
dashboard RUNS_DIR --http`). The socket is bound here first, so a port in use is one line (exit 2) and port
0's pick is known before anything is announced; uvicorn's own signal handling is off (serve_main, or
`dashboard_main`, owns SIGINT/SIGTERM and stops the HTTP server after its own work).
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
import socket
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import uvicorn

from labctl.core.errors import InputError
from labctl.dashboard.app import Settings, create_app
from labctl.dashboard.security import Bind

SHUTDOWN_GRACE_S = 2
"""Seconds uvicorn gives open requests at shutdown (live streams are ended first, so this is rarely used)."""


class _Server(uvicorn.Server):
    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:  # the caller's loop owns the signals
        yield


def listen(bind: Bind) -> socket.socket:
    family = socket.AF_INET6 if ":" in bind.host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((bind.host, bind.port))
    except OSError as e:
        sock.close()
        raise InputError(f"--http {bind.host}:{bind.port}: cannot listen there: {e.strerror}") from None
    sock.set_inheritable(False)  # the scheduler's worker processes must not hold the port
    return sock


class Http:
    """A running dashboard server: `start`, then `stop`."""

    def __init__(self, settings: Settings, bind: Bind) -> None:
        self.settings = settings
        self.bind = bind
        self.app = create_app(settings)
        self.sock = listen(bind)
        self.port: int = self.sock.getsockname()[1]
        config = uvicorn.Config(
            self.app,
            lifespan="on",
            http="h11",
            ws="none",
            log_level="warning",
            access_log=False,
            timeout_graceful_shutdown=SHUTDOWN_GRACE_S,
        )
        self.server = _Server(config)
        self.task: asyncio.Task[None] | None = None

    @property
    def url(self) -> str:
        return self.bind.url(self.port)

    async def start(self) -> None:
        self.task = asyncio.create_task(self.server.serve(sockets=[self.sock]), name="dashboard-http")
        while not self.server.started:
            if self.task.done():
                await self.task  # its error, if any
                raise InputError(f"--http {self.bind.host}:{self.port}: the dashboard did not start")
            await asyncio.sleep(0.01)

    async def stop(self) -> None:
        await self.app.state.live.close()  # end the live streams first: uvicorn then has nothing to wait for
        self.server.should_exit = True
        if self.task is not None:
            with contextlib.suppress(asyncio.CancelledError):
                await self.task
        self.sock.close()


def announce(http: Http, token: str | None, generated: bool, token_file: Path | None) -> None:
    """The address (tests and scripts read this line), and a new token once: it is in the file from now on."""
    print(f"dashboard: {http.url}", flush=True)
    if generated and token is not None:
        print(f"dashboard token (shown once; kept in {token_file}): {token}", flush=True)
    elif token is None:
        print("dashboard: read-only (no --token-file: cancel, resubmit and submit are off)", flush=True)


async def serve_with_http(
    settings: Settings, bind: Bind, token_file: Path | None, generated: bool, serve_kwargs: dict[str, Any]
) -> None:
    """`labctl serve --http`: the scheduler (labctl.scheduler.service.serve_main, unchanged) with the
    dashboard served beside it on the same loop; when the scheduler stops (SIGINT/SIGTERM,
    --exit-when-idle), so does the dashboard."""
    from labctl.scheduler.service import serve_main

    assert settings.db is not None
    http = Http(settings, bind)
    await http.start()
    try:
        announce(http, settings.token, generated, token_file)
        await serve_main(settings.db, settings.runs_dir, **serve_kwargs)
    finally:
        await http.stop()


async def dashboard_main(settings: Settings, bind: Bind, token_file: Path | None, generated: bool) -> None:
    """`labctl dashboard RUNS_DIR --http …`: the pages alone, until SIGINT/SIGTERM."""
    http = Http(settings, bind)
    await http.start()
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    try:
        announce(http, settings.token, generated, token_file)
        await stop.wait()
    finally:
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.remove_signal_handler(sig)
        await http.stop()
    sys.stdout.flush()
