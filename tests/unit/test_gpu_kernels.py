"""Every GPU kernel really compiles with NVRTC for sm_90, to PTX and to a cubin, with no GPU or driver.

CI installs cuda-bindings + nvidia-cuda-nvrtc-cu12 through the [test] extra, so there these tests must
run (tests.conftest.require fails in CI instead of skipping)."""

from __future__ import annotations

import importlib.util
import re
from types import ModuleType

import pytest

from labctl.probes.gpu.errors import CompileError
from labctl.probes.gpu.kernels import KERNELS, SOURCE
from tests.conftest import require


@pytest.fixture(scope="module")
def nvrtc_mod() -> ModuleType:
    require(
        importlib.util.find_spec("cuda") is not None
        and importlib.util.find_spec("cuda.bindings") is not None,
        "cuda-bindings is not installed (pip install -e '.[test]')",
    )
    from labctl.probes.gpu import nvrtc

    try:
        nvrtc.nvrtc_version()
    except Exception as e:  # the NVRTC shared library itself is missing
        require(False, f"NVRTC is not loadable: {e}")
    return nvrtc


def _entry_body(ptx: str, name: str) -> str:
    m = re.search(r"\.entry " + re.escape(name) + r"\((.*?)\n}\n", ptx, re.S)
    assert m is not None, f"no .entry {name} in the PTX"
    return m.group(1)


def test_ptx_for_compute_90_has_every_kernel_and_the_expected_instructions(nvrtc_mod: ModuleType) -> None:
    compiled = nvrtc_mod.compile_source(SOURCE, "compute_90")
    assert compiled.cubin is None and compiled.ptx
    assert nvrtc_mod.ptx_target(compiled.ptx) == "sm_90"
    assert set(nvrtc_mod.ptx_entries(compiled.ptx)) == set(KERNELS)
    for kernel in KERNELS.values():
        body = _entry_body(compiled.ptx, kernel.name)
        for fragment in kernel.ptx_must_contain:
            assert fragment in body, f"{kernel.name}: {fragment!r} missing from its PTX"


def test_globaltimer_is_in_every_timing_kernel_and_flag_ops_are_not_mixed(nvrtc_mod: ModuleType) -> None:
    ptx = nvrtc_mod.compile_kernels("compute_90").ptx
    for name in (
        "pingpong_volatile",
        "pingpong_acqrel",
        "timer_steps",
        "chase_shared",
        "chase_global_ca",
        "chase_global_cg",
    ):
        assert "%globaltimer" in _entry_body(ptx, name), name
    assert "%globaltimer" not in _entry_body(ptx, "chase_build")
    volatile, acqrel = _entry_body(ptx, "pingpong_volatile"), _entry_body(ptx, "pingpong_acqrel")
    assert "acquire" not in volatile and "release" not in volatile
    assert "ld.volatile" not in acqrel and "st.volatile" not in acqrel
    assert "ld.global.cg" not in _entry_body(ptx, "chase_global_ca")
    assert "ld.global.ca" not in _entry_body(ptx, "chase_global_cg")


def test_cubin_for_sm_90_is_a_cuda_elf_for_sm_90(nvrtc_mod: ModuleType) -> None:
    compiled = nvrtc_mod.compile_source(SOURCE, "sm_90")
    assert compiled.ptx is None and compiled.cubin is not None
    assert nvrtc_mod.cubin_sm(compiled.cubin) == 90
    for name in KERNELS:
        assert name.encode() in compiled.cubin  # symbol table names every kernel
    assert compiled.image is compiled.cubin


def test_a_broken_kernel_is_one_line_compile_error(nvrtc_mod: ModuleType) -> None:
    with pytest.raises(CompileError) as info:
        nvrtc_mod.compile_source(
            'extern "C" __global__ void k() { undefined_thing(); }', "compute_90", name="bad.cu"
        )
    text = str(info.value)
    assert "\n" not in text and text.startswith("bad.cu: NVRTC could not compile for compute_90")
    assert "undefined_thing" in text


def test_arch_choice_for_devices(nvrtc_mod: ModuleType) -> None:
    archs = [70, 80, 90, 100, 103, 120]
    assert nvrtc_mod.arch_for((9, 0), archs) == "sm_90"
    assert nvrtc_mod.arch_for((10, 3), archs) == "sm_103"
    assert nvrtc_mod.arch_for((8, 9), archs) == "compute_80"  # unknown to NVRTC: PTX, JIT by the driver
    with pytest.raises(CompileError):
        nvrtc_mod.arch_for((6, 0), archs)
    assert 90 in nvrtc_mod.supported_archs()


def test_cubin_sm_rejects_non_cubins() -> None:
    from labctl.probes.gpu.nvrtc import cubin_sm

    with pytest.raises(CompileError):
        cubin_sm(b"not an elf at all" + bytes(64))
    fake = bytearray(64)
    fake[:4] = b"\x7fELF"
    fake[0x12] = 62  # x86-64
    with pytest.raises(CompileError, match="e_machine 62"):
        cubin_sm(bytes(fake))


@pytest.mark.parametrize(
    ("abi_version", "e_flags", "sm"),
    [
        (7, 0x005A055A, 90),  # NVRTC 12.9 sm_90, read here
        (8, 0x0A005A04, 90),  # NVRTC 13.0 sm_90, read on an H200
        (8, 0x0A006404, 100),
    ],
)
def test_cubin_sm_reads_both_elf_abi_layouts(abi_version: int, e_flags: int, sm: int) -> None:
    import struct

    from labctl.probes.gpu.nvrtc import cubin_sm

    header = bytearray(64)
    header[:4] = b"\x7fELF"
    header[7] = 0x33 if abi_version == 7 else 0x41  # e_ident[OSABI] as each NVRTC writes it
    header[8] = abi_version
    struct.pack_into("<H", header, 0x12, 190)
    struct.pack_into("<I", header, 0x30, e_flags)
    assert cubin_sm(bytes(header)) == sm
