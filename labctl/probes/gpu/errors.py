"""Error types of the GPU microbenchmarks: each carries one user-facing line."""

from __future__ import annotations

from labctl.core.errors import HardwareError, LabctlError


class NoGpuError(LabctlError):
    """No CUDA GPU can be used here; the message is `no CUDA GPU available: <reason>`."""

    def __init__(self, reason: str) -> None:
        self.reason = reason
        super().__init__(f"no CUDA GPU available: {reason}")


class CompileError(LabctlError):
    """NVRTC rejected a kernel source (the first lines of its log are in the message)."""


class GpuBenchError(HardwareError):
    """A benchmark ran but did not finish correctly (CUDA error, or a peer that never answered)."""
