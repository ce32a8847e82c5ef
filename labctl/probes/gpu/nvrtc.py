"""Run-time compilation of the kernels with NVRTC (cuda-bindings), to PTX or to a cubin.

Works with no GPU and no driver, which is what lets CPU-only CI compile-check every kernel for sm_90.
cuda-bindings is imported lazily: the core never needs it (it comes with the `[gpu]` extra).
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

from labctl.core.extras import MissingExtra, require

from .errors import CompileError, NoGpuError
from .kernels import SOURCE

CUBIN_MAGIC = b"\x7fELF"
EM_CUDA = 190
ABI_SM_IN_SECOND_BYTE = 8  # e_ident[EI_ABIVERSION] from which e_flags carries the SM in bits 8-15


def _nvrtc() -> Any:
    try:
        return require("cuda.bindings.nvrtc", "gpu", "the GPU microbenchmarks")
    except MissingExtra as e:
        raise NoGpuError(str(e)) from None


def _check(result: Any, what: str) -> None:
    nvrtc = _nvrtc()
    if result != nvrtc.nvrtcResult.NVRTC_SUCCESS:
        _err, text = nvrtc.nvrtcGetErrorString(result)
        raise CompileError(f"NVRTC {what} failed: {text.decode(errors='replace')}")


def nvrtc_version() -> tuple[int, int]:
    nvrtc = _nvrtc()
    err, major, minor = nvrtc.nvrtcVersion()
    _check(err, "version query")
    return int(major), int(minor)


def supported_archs() -> list[int]:
    nvrtc = _nvrtc()
    err, archs = nvrtc.nvrtcGetSupportedArchs()
    _check(err, "arch query")
    return [int(a) for a in archs]


@dataclass(frozen=True)
class Compiled:
    """One compilation of SOURCE: `image` is what cuModuleLoadData takes (cubin bytes, or PTX + NUL)."""

    arch: str
    ptx: str | None
    cubin: bytes | None
    log: str

    @property
    def image(self) -> bytes:
        if self.cubin is not None:
            return self.cubin
        assert self.ptx is not None
        return self.ptx.encode() + b"\0"


def compile_source(source: str, arch: str, *, name: str = "labctl_gpu.cu") -> Compiled:
    """Compile `source` for `arch`: `compute_NN` gives PTX, `sm_NN` gives a cubin (its PTX is not kept)."""
    nvrtc = _nvrtc()
    err, prog = nvrtc.nvrtcCreateProgram(source.encode(), name.encode(), 0, [], [])
    _check(err, "program creation")
    try:
        opts = [f"--gpu-architecture={arch}".encode(), b"--std=c++17", b"-lineinfo"]
        (result,) = nvrtc.nvrtcCompileProgram(prog, len(opts), opts)
        err, size = nvrtc.nvrtcGetProgramLogSize(prog)
        _check(err, "log size query")
        # NVRTC writes into the buffer: it must be a fresh mutable one. (`b" " * 1` is CPython's shared
        # one-byte object; writing into it corrupts every b" " in the process.)
        log_buf = bytearray(size)
        (err,) = nvrtc.nvrtcGetProgramLog(prog, log_buf)
        log = bytes(log_buf).rstrip(b"\0 ").decode(errors="replace")
        if result != nvrtc.nvrtcResult.NVRTC_SUCCESS:
            first = "; ".join(line for line in log.splitlines() if line.strip())[:400]
            raise CompileError(f"{name}: NVRTC could not compile for {arch}: {first or result}")
        ptx: str | None = None
        cubin: bytes | None = None
        if arch.startswith("sm_"):
            err, size = nvrtc.nvrtcGetCUBINSize(prog)
            _check(err, "cubin size query")
            buf = bytearray(size)
            (err,) = nvrtc.nvrtcGetCUBIN(prog, buf)
            _check(err, "cubin fetch")
            cubin = bytes(buf)
        else:
            err, size = nvrtc.nvrtcGetPTXSize(prog)
            _check(err, "PTX size query")
            buf = bytearray(size)
            (err,) = nvrtc.nvrtcGetPTX(prog, buf)
            _check(err, "PTX fetch")
            ptx = bytes(buf).rstrip(b"\0").decode()
        return Compiled(arch=arch, ptx=ptx, cubin=cubin, log=log)
    finally:
        nvrtc.nvrtcDestroyProgram(prog)


@lru_cache(maxsize=8)
def compile_kernels(arch: str) -> Compiled:
    """The benchmark kernels for one architecture (cached per process)."""
    return compile_source(SOURCE, arch)


def arch_for(capability: tuple[int, int], archs: list[int] | None = None) -> str:
    """The NVRTC target for a device: its own sm_XY cubin when NVRTC knows it, else PTX for the newest
    older compute_XY, which the driver JIT-compiles for the device at load."""
    cc = capability[0] * 10 + capability[1]
    archs = supported_archs() if archs is None else archs
    if cc in archs:
        return f"sm_{cc}"
    older = [a for a in archs if a < cc]
    if not older:
        raise CompileError(f"NVRTC supports none of the architectures up to sm_{cc} (has {archs})")
    return f"compute_{max(older)}"


def cubin_sm(cubin: bytes) -> int:
    """The SM version a cubin was built for, from its ELF header (e_machine EM_CUDA, then e_flags).

    Where the SM sits in e_flags depends on the ELF ABI version (e_ident[8]): up to CUDA 12 (ABI 7) it is
    the low byte (sm_90: 0x005a055a); CUDA 13's NVRTC writes ABI 8 with the SM in the second byte (sm_90:
    0x0a005a04), which the low-byte reading took for "sm_4" on the first GPU run.
    """
    if cubin[:4] != CUBIN_MAGIC:
        raise CompileError("not a cubin: no ELF magic")
    (machine,) = struct.unpack_from("<H", cubin, 0x12)
    if machine != EM_CUDA:
        raise CompileError(f"not a CUDA ELF: e_machine {machine}")
    (flags,) = struct.unpack_from("<I", cubin, 0x30)
    abi_version = cubin[8]
    return int((flags >> 8) & 0xFF) if abi_version >= ABI_SM_IN_SECOND_BYTE else int(flags & 0xFF)


def ptx_target(ptx: str) -> str | None:
    """The `.target` line's first architecture of a PTX module."""
    for line in ptx.splitlines():
        line = line.strip()
        if line.startswith(".target"):
            return line.split()[1].rstrip(",")
    return None


def ptx_entries(ptx: str) -> list[str]:
    """Names of the `.entry` kernels in a PTX module."""
    out = []
    for line in ptx.splitlines():
        parts = line.split()
        if ".entry" in parts:
            out.append(parts[parts.index(".entry") + 1].split("(")[0])
    return out
