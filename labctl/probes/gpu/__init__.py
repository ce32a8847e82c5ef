"""GPU ping-pong and pointer-chasing microbenchmarks (the `[gpu]` extra), logged as `gpu.*` events.

Kernels (kernels.py) are CUDA C++ compiled at run time with NVRTC (nvrtc.py) and launched through
cuda.bindings.driver (runner.py). Nothing here imports cuda-bindings at import time: without it, or
without a GPU, `open_backend()` raises NoGpuError ("no CUDA GPU available: <reason>").
Layers: backend.py (Protocol + raw records) → pingpong.py / pointer_chase.py / timer.py (statistics) →
suite.py (run everything) → record.py / plot.py (events, tables, plot) → bench.py (stand-alone run) and
step.py (a step inside a reconfiguration experiment). sim.py is a behavioural model for CPU-only tests.
"""

from __future__ import annotations

from .errors import CompileError, GpuBenchError, NoGpuError

__all__ = ["CompileError", "GpuBenchError", "NoGpuError"]
