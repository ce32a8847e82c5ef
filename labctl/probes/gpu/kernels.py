"""CUDA C++ sources of the GPU microbenchmarks, compiled at run time with NVRTC (see nvrtc.py).

Every kernel is `extern "C"` (no name mangling, so the driver finds it by name) and uses inline PTX for
the operations whose exact form matters: the flag loads/stores (volatile vs. system-scope acquire/release),
the cache operator of pointer-chasing loads (.ca = cache in L1, .cg = L2 only) and the timers. No CUDA
headers are included, so NVRTC from the `nvidia-cuda-nvrtc-cu12` wheel compiles it with no toolkit, GPU or
driver installed (probes.md §4.2).

Timers: %globaltimer is a nanosecond clock shared by all SMs of a GPU, used for anything that crosses SMs;
%clock64 counts cycles of the SM that reads it and is only differenced on that SM (the ping side of a round
trip, the pointer-chasing thread). Spin loops check a deadline every 1024 polls, so a peer that never
answers (not co-resident, peer access broken) ends the kernel with status 1 instead of hanging the GPU.
"""

from __future__ import annotations

from dataclasses import dataclass

SOURCE = r"""
typedef unsigned long long u64;
typedef unsigned int u32;

__device__ __forceinline__ u64 lc_globaltimer() {
    u64 t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    return t;
}

__device__ __forceinline__ u64 lc_clock64() {
    u64 c;
    asm volatile("mov.u64 %0, %%clock64;" : "=l"(c));
    return c;
}

__device__ __forceinline__ u32 lc_smid() {
    u32 s;
    asm volatile("mov.u32 %0, %%smid;" : "=r"(s));
    return s;
}

// Flag operations of the "direct" variant: volatile accesses, no ordering beyond program order.
struct VolatileFlag {
    static __device__ __forceinline__ u64 load(const u64* p) {
        u64 v;
        asm volatile("ld.volatile.global.u64 %0, [%1];" : "=l"(v) : "l"(p) : "memory");
        return v;
    }
    static __device__ __forceinline__ void store(u64* p, u64 v) {
        asm volatile("st.volatile.global.u64 [%0], %1;" :: "l"(p), "l"(v) : "memory");
    }
};

// Flag operations of the "atomic" variant: system-scope acquire loads and release stores, the ordering a
// real producer/consumer needs when the flag guards a payload (valid across GPUs and the host).
struct SystemAcqRelFlag {
    static __device__ __forceinline__ u64 load(const u64* p) {
        u64 v;
        asm volatile("ld.acquire.sys.global.u64 %0, [%1];" : "=l"(v) : "l"(p) : "memory");
        return v;
    }
    static __device__ __forceinline__ void store(u64* p, u64 v) {
        asm volatile("st.release.sys.global.u64 [%0], %1;" :: "l"(p), "l"(v) : "memory");
    }
};

// Ping-pong with sequence numbers. Round i: ping stores 2i+1 into `to_pong` and waits until `to_ping`
// holds at least 2i+2; pong waits until `to_pong` holds at least 2i+1 and stores 2i+2 into `to_ping`.
// Flag flipping passes the same word as both flags; direct-remote-write-local-read passes a word in each
// poller's own memory, so only the store crosses to the peer. Values only grow: no ABA, no 0/1 toggle.
// role >= 0: this launch is that role (one block per GPU). role < 0: block 0 pings, block `pong_block`
// pongs, other blocks exit (one launch, two SMs of one GPU).
// ts_ns/ts_cycles get iters+1 stamps taken by ping after each timed round trip (index 0 = start).
// info[4*role + 0..3] = SM id, status (0 ok, 1 deadline passed), polls, rounds completed.
template <class Flag>
__device__ __forceinline__ void pingpong_body(u64* to_pong, u64* to_ping, int role_arg, int pong_block,
                                              int warmup, int iters, u64 timeout_ns, u64* ts_ns,
                                              u64* ts_cycles, u64* info) {
    if (threadIdx.x != 0) return;
    const int role = role_arg >= 0 ? role_arg
                                   : (blockIdx.x == 0 ? 0 : ((int)blockIdx.x == pong_block ? 1 : -1));
    if (role < 0) return;
    u64* mine = info + 4 * role;
    mine[0] = lc_smid();
    const u64 deadline = lc_globaltimer() + timeout_ns;
    const int total = warmup + iters;
    u64 polls = 0;
    u64 status = 0;
    int done = 0;
    if (role == 0) {
        for (int i = 0; i < total; ++i) {
            if (i == warmup) {
                ts_ns[0] = lc_globaltimer();
                ts_cycles[0] = lc_clock64();
            }
            const u64 ball = 2ull * (u64)i + 1ull;
            Flag::store(to_pong, ball);
            while (Flag::load(to_ping) < ball + 1ull) {
                if ((++polls & 0x3ffull) == 0 && lc_globaltimer() > deadline) { status = 1; break; }
            }
            if (status) break;
            if (i >= warmup) {
                ts_ns[i - warmup + 1] = lc_globaltimer();
                ts_cycles[i - warmup + 1] = lc_clock64();
            }
            done = i + 1;
        }
    } else {
        for (int i = 0; i < total; ++i) {
            const u64 ball = 2ull * (u64)i + 1ull;
            while (Flag::load(to_pong) < ball) {
                if ((++polls & 0x3ffull) == 0 && lc_globaltimer() > deadline) { status = 1; break; }
            }
            if (status) break;
            Flag::store(to_ping, ball + 1ull);
            done = i + 1;
        }
    }
    mine[1] = status;
    mine[2] = polls;
    mine[3] = (u64)done;
}

extern "C" __global__ void pingpong_volatile(u64* to_pong, u64* to_ping, int role, int pong_block,
                                             int warmup, int iters, u64 timeout_ns, u64* ts_ns,
                                             u64* ts_cycles, u64* info) {
    pingpong_body<VolatileFlag>(to_pong, to_ping, role, pong_block, warmup, iters, timeout_ns, ts_ns,
                                ts_cycles, info);
}

extern "C" __global__ void pingpong_acqrel(u64* to_pong, u64* to_ping, int role, int pong_block,
                                           int warmup, int iters, u64 timeout_ns, u64* ts_ns,
                                           u64* ts_cycles, u64* info) {
    pingpong_body<SystemAcqRelFlag>(to_pong, to_ping, role, pong_block, warmup, iters, timeout_ns, ts_ns,
                                    ts_cycles, info);
}

// The globaltimer's own update granularity: spin until its value changes, n times. step_ns[k] is the size
// of the k-th change (k = 0 starts mid-interval), step_cycles[k] the SM cycles it took, reads[k] how many
// reads. The deadline is in cycles: a timer that never moves must not hang the kernel.
// info = SM id, status, changes seen.
extern "C" __global__ void timer_steps(u64* step_ns, u64* step_cycles, u64* reads, int n,
                                       u64 timeout_cycles, u64* info) {
    if (threadIdx.x != 0 || blockIdx.x != 0) return;
    info[0] = lc_smid();
    u64 t_prev = lc_globaltimer();
    u64 c_prev = lc_clock64();
    const u64 deadline = c_prev + timeout_cycles;
    u64 status = 0;
    int k = 0;
    for (; k < n; ++k) {
        u64 t, c;
        u64 r = 0;
        do {
            t = lc_globaltimer();
            c = lc_clock64();
            ++r;
        } while (t == t_prev && c < deadline);
        if (t == t_prev) { status = 1; break; }
        step_ns[k] = t - t_prev;
        step_cycles[k] = c - c_prev;
        reads[k] = r;
        t_prev = t;
        c_prev = c;
    }
    info[1] = status;
    info[2] = (u64)k;
}

// Writes a pointer chain into buf: slot i (at i*stride_words) holds the address of slot next[i].
extern "C" __global__ void chase_build(u64* buf, const u32* next, u32 n, u32 stride_words) {
    for (u32 i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x) {
        buf[(u64)i * stride_words] = (u64)(buf + (u64)next[i] * stride_words);
    }
}

// Dependent loads p = *p; the loaded value is the next address, so nothing but the load is timed.
// MODE 0: ld.global.ca (cached in L1), MODE 1: ld.global.cg (L2 and below, bypasses L1).
template <int MODE>
__device__ __forceinline__ u64 chase_step(u64 p) {
    if (MODE == 0) {
        asm volatile("ld.global.ca.u64 %0, [%0];" : "+l"(p) :: "memory");
    } else {
        asm volatile("ld.global.cg.u64 %0, [%0];" : "+l"(p) :: "memory");
    }
    return p;
}

// One thread: warm_hops untimed hops (fill the level), then `trials` timed runs of `hops` hops each.
// out_cycles/out_ns[t] = clock64 / globaltimer span of trial t. info = final pointer, SM id.
template <int MODE>
__device__ __forceinline__ void chase_global_body(const u64* start, int warm_hops, int hops, int trials,
                                                  u64* out_cycles, u64* out_ns, u64* info) {
    if (threadIdx.x != 0 || blockIdx.x != 0) return;
    u64 p = (u64)start;
    for (int h = 0; h < warm_hops; ++h) p = chase_step<MODE>(p);
    for (int t = 0; t < trials; ++t) {
        const u64 g0 = lc_globaltimer();
        const u64 c0 = lc_clock64();
        for (int h = 0; h < hops; ++h) p = chase_step<MODE>(p);
        const u64 c1 = lc_clock64();
        const u64 g1 = lc_globaltimer();
        out_cycles[t] = c1 - c0;
        out_ns[t] = g1 - g0;
    }
    info[0] = p;  // keeps the chain live
    info[1] = lc_smid();
}

extern "C" __global__ void chase_global_ca(const u64* start, int warm_hops, int hops, int trials,
                                           u64* out_cycles, u64* out_ns, u64* info) {
    chase_global_body<0>(start, warm_hops, hops, trials, out_cycles, out_ns, info);
}

extern "C" __global__ void chase_global_cg(const u64* start, int warm_hops, int hops, int trials,
                                           u64* out_cycles, u64* out_ns, u64* info) {
    chase_global_body<1>(start, warm_hops, hops, trials, out_cycles, out_ns, info);
}

// Shared memory: the chain lives in dynamic shared memory as 32-bit shared-window addresses, so the
// chase is ld.shared.u32 r, [r] with no index arithmetic. The chain order comes from next[] in global.
extern "C" __global__ void chase_shared(const u32* next, u32 n, u32 stride_words, int warm_hops, int hops,
                                        int trials, u64* out_cycles, u64* out_ns, u64* info) {
    extern __shared__ u32 chase_smem[];
    if (threadIdx.x != 0 || blockIdx.x != 0) return;
    const u32 base = (u32)__cvta_generic_to_shared(chase_smem);
    for (u32 i = 0; i < n; ++i) {
        chase_smem[i * stride_words] = base + next[i] * stride_words * 4u;
    }
    u32 a = base;
    for (int h = 0; h < warm_hops; ++h) asm volatile("ld.shared.u32 %0, [%0];" : "+r"(a) :: "memory");
    for (int t = 0; t < trials; ++t) {
        const u64 g0 = lc_globaltimer();
        const u64 c0 = lc_clock64();
        for (int h = 0; h < hops; ++h) asm volatile("ld.shared.u32 %0, [%0];" : "+r"(a) :: "memory");
        const u64 c1 = lc_clock64();
        const u64 g1 = lc_globaltimer();
        out_cycles[t] = c1 - c0;
        out_ns[t] = g1 - g0;
    }
    info[0] = a;
    info[1] = lc_smid();
}
"""


@dataclass(frozen=True)
class KernelInfo:
    """A kernel in SOURCE and the PTX fragments its compiled form must contain (checked in CI)."""

    name: str
    purpose: str
    ptx_must_contain: tuple[str, ...]


KERNELS: dict[str, KernelInfo] = {
    k.name: k
    for k in (
        KernelInfo(
            "pingpong_volatile",
            "flag ping-pong with volatile loads/stores (flip or remote-write-local-read by flag placement)",
            ("%globaltimer", "%clock64", "%smid", "ld.volatile.global.u64", "st.volatile.global.u64"),
        ),
        KernelInfo(
            "pingpong_acqrel",
            "flag ping-pong with system-scope acquire loads and release stores",
            ("%globaltimer", "%clock64", "%smid", "ld.acquire.sys.global.u64", "st.release.sys.global.u64"),
        ),
        KernelInfo(
            "timer_steps",
            "update granularity of %globaltimer, in ns and SM cycles",
            ("%globaltimer", "%clock64", "%smid"),
        ),
        KernelInfo("chase_build", "writes a pointer chain into a global buffer", ()),
        KernelInfo(
            "chase_global_ca",
            "pointer chase with L1-cached loads (L1 hits)",
            ("%globaltimer", "%clock64", "ld.global.ca.u64"),
        ),
        KernelInfo(
            "chase_global_cg",
            "pointer chase with L2-only loads (L2 hits, or HBM with a footprint beyond L2)",
            ("%globaltimer", "%clock64", "ld.global.cg.u64"),
        ),
        KernelInfo(
            "chase_shared",
            "pointer chase in shared memory",
            ("%globaltimer", "%clock64", "ld.shared.u32"),
        ),
    )
}
