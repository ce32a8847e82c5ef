"""uvicorn for the dashboard, on a thread of its own at a lower CPU priority: beside the scheduler
(`labctl serve --http`) or alone (`labctl dashboard RUNS_DIR --http`). The socket is bound here first, so
a port in use is one line (exit 2) and port 0's pick is known before anything is announced; uvicorn's own
signal handling is off (serve_main, or `dashboard_main`, owns SIGINT/SIGTERM and stops the HTTP server
after its own work).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
import socket
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import uvicorn

from labctl.core.errors import InputError
from labctl.core.sched import idle_thread
from labctl.dashboard.app import Settings, create_app
from labctl.dashboard.security import Bind

log = logging.getLogger(__name__)

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
    """A running dashboard server: `start`, then `stop`. It runs on a thread of its own with its own event
    loop, below every ordinary thread (labctl.core.sched.idle_thread): it shares nothing with the
    scheduler's loop but the process (its pages read the queue's store and the runs directory), and the runs
    the scheduler starts inherit the scheduler's priority, not the dashboard's."""

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
        self.thread: threading.Thread | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._failure: BaseException | None = None

    @property
    def url(self) -> str:
        return self.bind.url(self.port)

    def _run(self) -> None:
        if not idle_thread():
            log.warning("dashboard: its thread's CPU priority could not be lowered; it runs beside the runs")
        try:
            asyncio.run(self._serve())
        except BaseException as e:  # reported by start() or stop() on the caller's loop
            self._failure = e

    async def _serve(self) -> None:
        self._loop = asyncio.get_running_loop()
        try:
            await self.server.serve(sockets=[self.sock])
        finally:
            await self.app.state.live.close()

    async def start(self) -> None:
        self.thread = threading.Thread(target=self._run, name="dashboard-http", daemon=True)
        self.thread.start()
        while not self.server.started:
            if not self.thread.is_alive():
                if self._failure is not None:
                    raise self._failure
                raise InputError(f"--http {self.bind.host}:{self.port}: the dashboard did not start")
            await asyncio.sleep(0.01)

    async def stop(self) -> None:
        loop, thread = self._loop, self.thread
        if loop is not None and thread is not None and thread.is_alive():
            # end the live streams first: uvicorn then has nothing to wait for
            with contextlib.suppress(RuntimeError):  # its loop ended meanwhile
                asyncio.run_coroutine_threadsafe(self._ask_to_stop(), loop)
        if thread is not None:
            await asyncio.to_thread(thread.join)
        self.sock.close()
        failure, self._failure = self._failure, None
        if failure is not None and not isinstance(failure, (KeyboardInterrupt, SystemExit)):
            raise failure

    async def _ask_to_stop(self) -> None:
        await self.app.state.live.close()
        self.server.should_exit = True


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
    dashboard served beside it (on its own thread); when the scheduler stops (SIGINT/SIGTERM,
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
