"""The real backend: loads the NVRTC-compiled kernels and launches them through cuda.bindings.driver.

Without a usable GPU, `open_backend()` raises NoGpuError with one line saying why (no cuda-bindings, no
driver library, no device). cuda-bindings is imported only here and in nvrtc.py, lazily.
"""

from __future__ import annotations

import contextlib
import ctypes
import time
from collections.abc import Iterator
from typing import Any

import numpy as np

from labctl.core.extras import MissingExtra, require

from .backend import (
    ChaseConfig,
    ChaseRaw,
    DeviceInfo,
    PingPongConfig,
    PingPongRaw,
    TimerRaw,
)
from .errors import GpuBenchError, NoGpuError
from .nvrtc import arch_for, compile_kernels, nvrtc_version

# A timer that has not moved after this many SM cycles (about 2 s at 2 GHz) is reported, not waited on.
TIMER_TIMEOUT_CYCLES = 4_000_000_000
FLAG_BYTES = 256  # each flag word gets its own 128-byte lines, away from any other data


def _driver() -> Any:
    try:
        return require("cuda.bindings.driver", "gpu", "the GPU microbenchmarks")
    except MissingExtra as e:
        raise NoGpuError(str(e)) from None


def _first_line(e: BaseException) -> str:
    text = str(e).strip().splitlines()
    return text[0] if text else type(e).__name__


class CudaBackend:
    """GpuBackend over the CUDA driver API. One primary context per device used, released on close()."""

    def __init__(self) -> None:
        cu = self._cu = _driver()
        try:
            (err,) = cu.cuInit(0)
        except Exception as e:  # cuda-pathfinder raises when libcuda.so cannot be found
            if "driver library" in str(e) or "not found" in str(e).lower():
                raise NoGpuError("the NVIDIA driver library (libcuda.so) was not found") from None
            raise NoGpuError(f"cuInit failed: {_first_line(e)}") from None
        if err != cu.CUresult.CUDA_SUCCESS:
            raise NoGpuError(f"cuInit returned {self._err_name(err)}")
        count = self._call(cu.cuDeviceGetCount(), "cuDeviceGetCount")
        if count < 1:
            raise NoGpuError("the CUDA driver reports no devices")
        self._handles = [self._call(cu.cuDeviceGet(i), "cuDeviceGet") for i in range(count)]
        self._devices = [self._info(i) for i in range(count)]
        self._contexts: dict[int, Any] = {}
        self._modules: dict[int, tuple[Any, str, dict[str, Any]]] = {}
        self._peers: set[tuple[int, int]] = set()

    # -- driver plumbing ------------------------------------------------------------------------------------
    def _err_name(self, err: Any) -> str:
        try:
            _e, name = self._cu.cuGetErrorName(err)
            return str(name.decode() if isinstance(name, bytes) else name)
        except Exception:
            return str(err)

    def _call(self, result: Any, what: str) -> Any:
        """Unpack a cuda-bindings (err, value...) tuple, raising on anything but CUDA_SUCCESS."""
        if isinstance(result, tuple):
            err, rest = result[0], result[1:]
        else:
            err, rest = result, ()
        if err != self._cu.CUresult.CUDA_SUCCESS:
            raise GpuBenchError(f"{what} failed: {self._err_name(err)}")
        if not rest:
            return None
        return rest[0] if len(rest) == 1 else rest

    def _attr(self, index: int, name: str) -> int:
        attr = getattr(self._cu.CUdevice_attribute, f"CU_DEVICE_ATTRIBUTE_{name}")
        return int(self._call(self._cu.cuDeviceGetAttribute(attr, self._handles[index]), name))

    def _info(self, index: int) -> DeviceInfo:
        cu = self._cu
        dev = self._handles[index]
        raw_name = self._call(cu.cuDeviceGetName(128, dev), "cuDeviceGetName")
        name = raw_name.split(b"\0", 1)[0].decode(errors="replace")
        try:
            clock_khz = self._attr(index, "CLOCK_RATE")
        except (AttributeError, GpuBenchError):
            clock_khz = 0
        try:
            bus = self._call(cu.cuDeviceGetPCIBusId(32, dev), "cuDeviceGetPCIBusId")
            bus_id = bus.split(b"\0", 1)[0].decode() if isinstance(bus, bytes) else str(bus)
        except GpuBenchError:
            bus_id = ""
        return DeviceInfo(
            index=index,
            name=name,
            capability=(
                self._attr(index, "COMPUTE_CAPABILITY_MAJOR"),
                self._attr(index, "COMPUTE_CAPABILITY_MINOR"),
            ),
            sm_count=self._attr(index, "MULTIPROCESSOR_COUNT"),
            sm_clock_khz=clock_khz,
            l2_bytes=self._attr(index, "L2_CACHE_SIZE"),
            memory_bytes=int(self._call(cu.cuDeviceTotalMem(dev), "cuDeviceTotalMem")),
            pci_bus_id=bus_id,
        )

    def _device_index(self, device: int) -> int:
        if not 0 <= device < len(self._devices):
            raise NoGpuError(f"device {device} does not exist (this machine has {len(self._devices)})")
        return device

    def _use(self, device: int) -> None:
        """Make the device's primary context current (retained once, released in close())."""
        self._device_index(device)
        ctx = self._contexts.get(device)
        if ctx is None:
            ctx = self._call(
                self._cu.cuDevicePrimaryCtxRetain(self._handles[device]), "cuDevicePrimaryCtxRetain"
            )
            self._contexts[device] = ctx
        self._call(self._cu.cuCtxSetCurrent(ctx), "cuCtxSetCurrent")

    def _function(self, device: int, name: str) -> Any:
        self._use(device)
        entry = self._modules.get(device)
        if entry is None:
            arch = arch_for(self._devices[device].capability)
            compiled = compile_kernels(arch)
            module = self._call(self._cu.cuModuleLoadData(compiled.image), f"cuModuleLoadData ({arch})")
            entry = self._modules[device] = (module, arch, {})
        module, _arch, functions = entry
        if name not in functions:
            functions[name] = self._call(self._cu.cuModuleGetFunction(module, name.encode()), name)
        return functions[name]

    @contextlib.contextmanager
    def _buffers(self) -> Iterator[list[tuple[int, int]]]:
        """Collects (device, pointer) allocations and frees them however the benchmark ends."""
        allocations: list[tuple[int, int]] = []
        try:
            yield allocations
        finally:
            for device, ptr in reversed(allocations):
                with contextlib.suppress(Exception):
                    self._use(device)
                    self._cu.cuMemFree(self._cu.CUdeviceptr(ptr))

    def _alloc(self, allocations: list[tuple[int, int]], device: int, nbytes: int, zero: bool = True) -> int:
        self._use(device)
        ptr = int(self._call(self._cu.cuMemAlloc(nbytes), f"cuMemAlloc({nbytes})"))
        allocations.append((device, ptr))
        if zero:
            self._call(self._cu.cuMemsetD8(self._cu.CUdeviceptr(ptr), 0, nbytes), "cuMemsetD8")
        return ptr

    def _upload(self, device: int, ptr: int, array: np.ndarray) -> None:
        self._use(device)
        a = np.ascontiguousarray(array)
        self._call(self._cu.cuMemcpyHtoD(self._cu.CUdeviceptr(ptr), a.ctypes.data, a.nbytes), "cuMemcpyHtoD")

    def _download(self, device: int, ptr: int, count: int, dtype: type = np.uint64) -> np.ndarray:
        self._use(device)
        out: np.ndarray = np.zeros(count, dtype=dtype)
        self._call(
            self._cu.cuMemcpyDtoH(out.ctypes.data, self._cu.CUdeviceptr(ptr), out.nbytes), "cuMemcpyDtoH"
        )
        return out

    def _launch(self, device: int, name: str, grid: int, block: int, shared: int, args: list[Any]) -> None:
        """Launch asynchronously; args are ctypes values in the kernel's parameter order."""
        func = self._function(device, name)
        pointers = (ctypes.c_void_p * len(args))(*[ctypes.addressof(a) for a in args])
        self._call(
            self._cu.cuLaunchKernel(func, grid, 1, 1, block, 1, 1, shared, 0, ctypes.addressof(pointers), 0),
            f"launch {name}",
        )

    def _sync(self, device: int, what: str) -> None:
        self._use(device)
        self._call(self._cu.cuCtxSynchronize(), what)

    # -- GpuBackend ---------------------------------------------------------------------------------------
    def devices(self) -> list[DeviceInfo]:
        return list(self._devices)

    def can_access_peer(self, device: int, peer: int) -> bool:
        self._device_index(device)
        self._device_index(peer)
        if device == peer:
            return False
        ok = self._call(
            self._cu.cuDeviceCanAccessPeer(self._handles[device], self._handles[peer]),
            "cuDeviceCanAccessPeer",
        )
        return bool(ok)

    def _enable_peer(self, device: int, peer: int) -> None:
        if (device, peer) in self._peers:
            return
        if not self.can_access_peer(device, peer):
            raise GpuBenchError(f"GPU {device} cannot access GPU {peer}'s memory (no peer access)")
        self._use(peer)
        peer_ctx = self._contexts[peer]
        self._use(device)
        (err,) = self._cu.cuCtxEnablePeerAccess(peer_ctx, 0)
        if err not in (
            self._cu.CUresult.CUDA_SUCCESS,
            self._cu.CUresult.CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED,
        ):
            raise GpuBenchError(f"cuCtxEnablePeerAccess({device}->{peer}) failed: {self._err_name(err)}")
        self._peers.add((device, peer))

    def describe(self) -> dict[str, str]:
        version = self._call(self._cu.cuDriverGetVersion(), "cuDriverGetVersion")
        major, minor = nvrtc_version()
        out = {
            "cuda_driver": f"{int(version) // 1000}.{int(version) % 1000 // 10}",
            "nvrtc": f"{major}.{minor}",
        }
        for d in self._devices:
            out[f"gpu{d.index}"] = f"{d.name} ({d.sm_arch}, kernels built for {arch_for(d.capability)})"
        return out

    def timer(self, device: int, changes: int) -> TimerRaw:
        u64 = ctypes.c_uint64
        with self._buffers() as bufs:
            step_ns = self._alloc(bufs, device, changes * 8)
            step_cyc = self._alloc(bufs, device, changes * 8)
            reads = self._alloc(bufs, device, changes * 8)
            info = self._alloc(bufs, device, 64)
            t0 = time.monotonic_ns()
            self._launch(
                device,
                "timer_steps",
                1,
                1,
                0,
                [
                    u64(step_ns),
                    u64(step_cyc),
                    u64(reads),
                    ctypes.c_int(changes),
                    u64(TIMER_TIMEOUT_CYCLES),
                    u64(info),
                ],
            )
            self._sync(device, "timer_steps")
            t1 = time.monotonic_ns()
            meta = self._download(device, info, 8)
            seen = int(meta[2])
            if int(meta[1]) != 0 or seen < 2:
                raise GpuBenchError(f"GPU {device}: %globaltimer did not advance (saw {seen} changes)")
            return TimerRaw(
                device=device,
                step_ns=self._download(device, step_ns, seen),
                step_cycles=self._download(device, step_cyc, seen),
                reads=self._download(device, reads, seen),
                sm=int(meta[0]),
                host_start_ns=t0,
                host_end_ns=t1,
            )

    def pingpong(self, config: PingPongConfig) -> PingPongRaw:
        u64, c_int = ctypes.c_uint64, ctypes.c_int
        ping_dev = config.device
        pong_dev = config.peer_device if config.peer_device is not None else config.device
        inter = config.peer_device is not None
        if inter:
            self._enable_peer(ping_dev, pong_dev)
            self._enable_peer(pong_dev, ping_dev)
        kernel = f"pingpong_{config.ops}"
        n = config.iterations + 1
        with self._buffers() as bufs:
            ping_flag = self._alloc(bufs, ping_dev, FLAG_BYTES)
            pong_flag = self._alloc(bufs, pong_dev, FLAG_BYTES)
            if config.placement == "flip":
                to_pong = to_ping = ping_flag  # one word, in the ping GPU's memory
            else:
                to_pong, to_ping = pong_flag, ping_flag  # each side polls its own memory
            ts_ns = self._alloc(bufs, ping_dev, n * 8)
            ts_cyc = self._alloc(bufs, ping_dev, n * 8)
            info_ping = self._alloc(bufs, ping_dev, 64)
            info_pong = self._alloc(bufs, pong_dev, 64) if inter else info_ping

            def args(role: int, info: int) -> list[Any]:
                return [
                    u64(to_pong),
                    u64(to_ping),
                    c_int(role),
                    c_int(config.pong_block),
                    c_int(config.warmup),
                    c_int(config.iterations),
                    u64(config.timeout_ns),
                    u64(ts_ns),
                    u64(ts_cyc),
                    u64(info),
                ]

            t0 = time.monotonic_ns()
            if inter:
                # pong first: it waits for the first ball; both kernels must be resident at once
                self._launch(pong_dev, kernel, 1, 1, 0, args(1, info_pong))
                self._launch(ping_dev, kernel, 1, 1, 0, args(0, info_ping))
                self._sync(ping_dev, kernel)
                self._sync(pong_dev, kernel)
            else:
                self._launch(ping_dev, kernel, config.pong_block + 1, 1, 0, args(-1, info_ping))
                self._sync(ping_dev, kernel)
            t1 = time.monotonic_ns()
            ping_info = self._download(ping_dev, info_ping, 8)
            pong_info = self._download(pong_dev, info_pong, 8)
            ping_done, pong_done = int(ping_info[3]), int(pong_info[7])
            total = config.warmup + config.iterations
            if int(ping_info[1]) or int(pong_info[5]) or ping_done != total or pong_done != total:
                raise GpuBenchError(
                    f"{kernel} ({config.placement}) GPU {ping_dev}->{pong_dev}: peer stopped answering "
                    f"(ping {ping_done}/{total}, pong {pong_done}/{total} round trips within "
                    f"{config.timeout_ns / 1e9:g} s)"
                )
            return PingPongRaw(
                config=config,
                ts_ns=self._download(ping_dev, ts_ns, n),
                ts_cycles=self._download(ping_dev, ts_cyc, n),
                sm_ping=int(ping_info[0]),
                sm_pong=int(pong_info[4]),
                polls_ping=int(ping_info[2]),
                polls_pong=int(pong_info[6]),
                host_start_ns=t0,
                host_end_ns=t1,
            )

    def chase(self, config: ChaseConfig) -> ChaseRaw:
        u64, c_int, u32 = ctypes.c_uint64, ctypes.c_int, ctypes.c_uint32
        dev = config.device
        n = len(config.next_slot)
        nxt = np.ascontiguousarray(config.next_slot, dtype=np.uint32)
        with self._buffers() as bufs:
            next_ptr = self._alloc(bufs, dev, nxt.nbytes, zero=False)
            self._upload(dev, next_ptr, nxt)
            out_cyc = self._alloc(bufs, dev, config.trials * 8)
            out_ns = self._alloc(bufs, dev, config.trials * 8)
            info = self._alloc(bufs, dev, 64)
            timed = [
                c_int(config.warm_hops),
                c_int(config.hops),
                c_int(config.trials),
                u64(out_cyc),
                u64(out_ns),
                u64(info),
            ]
            t0 = time.monotonic_ns()
            if config.kernel == "chase_shared":
                args = [u64(next_ptr), u32(n), u32(config.stride_bytes // 4), *timed]
                self._launch(dev, "chase_shared", 1, 1, config.footprint_bytes, args)
            else:
                buf = self._alloc(bufs, dev, config.footprint_bytes, zero=False)
                stride_words = config.stride_bytes // 8
                grid = min((n + 255) // 256, 4096)
                self._launch(
                    dev, "chase_build", grid, 256, 0, [u64(buf), u64(next_ptr), u32(n), u32(stride_words)]
                )
                self._sync(dev, "chase_build")
                t0 = time.monotonic_ns()
                self._launch(dev, config.kernel, 1, 1, 0, [u64(buf), *timed])
            self._sync(dev, config.kernel)
            t1 = time.monotonic_ns()
            meta = self._download(dev, info, 8)
            return ChaseRaw(
                config=config,
                cycles=self._download(dev, out_cyc, config.trials),
                ns=self._download(dev, out_ns, config.trials),
                sm=int(meta[1]),
                host_start_ns=t0,
                host_end_ns=t1,
            )

    def close(self) -> None:
        for device, (module, _arch, _f) in list(self._modules.items()):
            with contextlib.suppress(Exception):
                self._use(device)
                self._cu.cuModuleUnload(module)
        self._modules.clear()
        for device in list(self._contexts):
            with contextlib.suppress(Exception):
                self._cu.cuDevicePrimaryCtxRelease(self._handles[device])
        self._contexts.clear()


def open_backend() -> CudaBackend:
    """The real backend, or NoGpuError saying in one line why there is no usable GPU here."""
    return CudaBackend()
