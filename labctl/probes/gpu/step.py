"""The GPU microbenchmarks as a step of a reconfiguration experiment (the experiment's `gpu:` section).

The controller runs the step before the baseline set-up and after the last reconfiguration, so GPU and
fabric figures land in one run directory. Without a usable GPU the step records a `gpu.skip` event and
says so; a benchmark that fails records `gpu.error`. Neither stops the reconfiguration run.
"""

from __future__ import annotations

import asyncio
import socket
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from labctl.core.clock import now_ns
from labctl.core.errors import LabctlError
from labctl.core.events import EventLog, Kind

from .backend import GpuBackend
from .errors import NoGpuError
from .plot import plot_reports
from .record import emit_report, write_tables
from .runner import open_backend
from .suite import SuiteConfig, SuiteReport, run_suite


class GpuStep:
    def __init__(
        self,
        config: SuiteConfig,
        stages: Sequence[str],
        events: EventLog,
        message: Callable[[str], None],
        *,
        backend_factory: Callable[[], GpuBackend] | None = None,
        plots: bool = True,
    ) -> None:
        self.config = config
        self.stages = tuple(stages)
        self.events = events
        self.message = message
        self.run_dir: Path | None = events.path.parent if events.path is not None else None
        self.host = socket.gethostname()
        self.plots = plots
        self.reports: list[tuple[str | None, SuiteReport]] = []
        # looked up at call time so tests can substitute the module-level factory
        self._factory = backend_factory

    @classmethod
    def from_settings(cls, settings: Any, events: EventLog, message: Callable[[str], None]) -> GpuStep:
        """From labctl.run.experiment.GpuSettings (the experiment's validated `gpu:` section)."""
        config = SuiteConfig(
            device=settings.device,
            peer_device=settings.peer_device,
            inter_gpu=settings.inter_gpu,
            iterations=settings.iterations,
            warmup=settings.warmup,
            variants=tuple(settings.variants),
            pointer_chase=settings.pointer_chase,
        )
        return cls(config, settings.stages, events, message)

    @property
    def source(self) -> str:
        return f"gpu:{self.host}/{self.config.device}"

    def _blocking(self) -> SuiteReport:
        backend = (self._factory or open_backend)()
        try:
            return run_suite(backend, self.config)
        finally:
            backend.close()

    async def run(self, stage: str) -> SuiteReport | None:
        if stage not in self.stages:
            return None
        started = now_ns()
        self.message(f"GPU microbenchmarks ({stage})")
        try:
            report = await asyncio.to_thread(self._blocking)
        except NoGpuError as e:
            self.events.emit(
                now_ns(), Kind.GPU_SKIP, self.source, str(e), host=self.host, meta={"stage": stage}
            )
            self.message(f"GPU step '{stage}' skipped: {e}")
            return None
        except (LabctlError, ValueError) as e:
            text = f"{type(e).__name__}: {e}"
            self.events.emit(
                now_ns(),
                Kind.GPU_ERROR,
                self.source,
                text,
                host=self.host,
                meta={"stage": stage, "started_ns": started},
            )
            self.message(f"GPU step '{stage}' failed, run continues: {e}")
            return None
        emit_report(self.events.emit, report, host=self.host, stage=stage)
        for note in report.notes:
            self.message(f"GPU step '{stage}': {note}")
        self.reports.append((stage, report))
        if self.run_dir is not None:
            write_tables(self.run_dir, self.reports)
            if self.plots:
                plot_reports(self.run_dir, self.reports)
        self.events.flush(durable=True)
        return report
