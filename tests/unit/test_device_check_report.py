"""bench/device_check.py's report writer and its GPU part: the template filled in from what a run found
(every part present, every part empty), the H200 reference read back from docs/measured, and the GPU
part on the simulated GPU."""

from __future__ import annotations

import datetime as dt
import importlib.util
import sys
from pathlib import Path
from types import ModuleType

from labctl.linux.ethtool_text import (
    compare_link,
    compare_module,
    decoded_fields,
    ethtool_link,
    module_fields,
)
from labctl.linux.transceiver import FlatImage, parse_hex, read_dom
from labctl.probes.gpu.sim import SimulatedGpu
from labctl.probes.gpu.suite import SuiteConfig
from labctl.rdma.devinfo import check_ack_timeout, parse_ibv_devinfo
from labctl.rdma.rc import QpAttrs

REPO = Path(__file__).resolve().parents[2]
FIXTURES = REPO / "tests" / "fixtures" / "device"
QUICK = SuiteConfig(iterations=500, warmup=10, chase_trials=8, timer_changes=200)


def script() -> ModuleType:
    spec = importlib.util.spec_from_file_location("device_check", REPO / "bench" / "device_check.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up while the class is made
    spec.loader.exec_module(module)
    return module


def full_results(dc: ModuleType) -> object:
    devices = parse_ibv_devinfo((FIXTURES / "ibv_devinfo-v.txt").read_text())
    rdma = dc.RdmaResult(
        devices=devices,
        device="mlx5_0",
        port=1,
        gid_index=3,
        probe={"median_us": 2.41, "p99_us": 3.05, "n": 9998},
        send_lat={"median_us": 1.03, "p99_us": 1.31},
        timer=check_ack_timeout(QpAttrs(), 16),
    )
    modules = []
    for name in ("sfp_sff8472", "qsfp28_sff8636"):
        reading = read_dom(FlatImage(parse_hex((FIXTURES / f"{name}.eeprom.hex").read_text())))
        text = (FIXTURES / f"{name}.ethtool-m.txt").read_text()
        if name == "qsfp28_sff8636":
            text = text.replace("42.25 degrees C", "42.50 degrees C")
        rows = compare_module(decoded_fields(reading), module_fields(text))
        modules.append(dc.Compared(f"eth{len(modules)}", reading.identifier_name, rows))
    theirs = ethtool_link((FIXTURES / "ethtool.txt").read_text(), None)
    links = [dc.Compared("eth0", "link", compare_link(theirs, theirs))]
    ports = dc.PortsResult(modules=modules, links=links, without_module=["eno1"])
    gpu = dc.GpuResult(
        devices=["NVIDIA H100 80GB HBM3 (sm_90, 132 SMs)"],
        chase=[("shared", 23.1, 23.0), ("HBM", 640.0, 607.0)],
        pingpong=[("intra-gpu flip-atomic", 1664.0, 1600.0), ("inter-gpu flip-atomic", 3000.0, None)],
    )
    return dc.Results(dt.date(2027, 1, 15), "gpu-host", "Python 3.12.3 on Linux", rdma, ports, gpu)


def test_the_report_holds_every_figure() -> None:
    dc = script()
    text = dc.render(full_results(dc))
    assert text.startswith("# bench/device_check.py on gpu-host (2027-01-15)\n")
    assert "- mlx5_0: ConnectX-7 (part 4129, fw 28.39.1002, board MT_0000000838)" in text
    assert "two QPs on mlx5_0 port 1, GID index 3 (loopback; timeout 14, retry_cnt 7" in text
    assert "one-way median 2.41 us, p99 3.05 us over 9998 round trips" in text
    assert "- ib_send_lat on the same device: median 1.03 us, p99 1.31 us" in text
    assert "timeout 14: period 67.109 ms, retry budget 536.9 ms; local_ca_ack_delay 16" in text
    # 15 SFF-8472 fields + 30 SFF-8636 fields, one of them changed
    assert (
        "2 module(s) decoded; 44 of 45 fields agree with `ethtool -m` (44 equal, 0 within rounding), 1 different"
        in text
    )
    assert "| eth1 | QSFP28 | 30 | 29 | 0 | 1 | 0 |" in text
    assert "- eth1 temperature_c: labctl 42.25, ethtool 42.50" in text
    assert "Without a module EEPROM: eno1." in text
    assert "| eth0 | 7 | 7 | 0 | 0 |" in text
    assert "| shared | 23.1 | 23.0 | 1.00 |" in text and "| HBM | 640.0 | 607.0 | 1.05 |" in text
    assert "| inter-gpu flip-atomic | 3000 | - | - |" in text
    assert "Failed parts" not in text


def test_parts_that_found_nothing_say_so() -> None:
    dc = script()
    results = dc.Results(
        dt.date(2027, 1, 15),
        "vm",
        "Python 3.11",
        dc.RdmaResult(none_line="RDMA: none present (no RDMA device on this host)"),
        dc.PortsResult(without_module=["eth0"]),
        dc.GpuResult(none_line="GPU: none present (no CUDA GPU available: libcuda.so not found)"),
        failures=["GPU: RuntimeError: boom"],
    )
    text = dc.render(results)
    assert "- none present (no RDMA device on this host)" in text
    assert "No module: no interface here has a module EEPROM to read." in text
    assert "No interface answered both labctl's link reads and ethtool." in text
    assert "None present (no CUDA GPU available: libcuda.so not found)." in text
    assert "## Failed parts\n\n- GPU: RuntimeError: boom" in text


def test_a_part_left_out_is_named() -> None:
    dc = script()
    text = dc.render(dc.Results(dt.date(2027, 1, 15), "vm", "Python 3.11"))
    assert text.count("Not run (--parts).") == 3


def test_the_h200_reference_is_read_from_docs_measured() -> None:
    dc = script()
    chase, pingpong = dc.reference_tables(dc.GPU_REFERENCE.read_text())
    assert chase == {"shared": 23.0, "L1": 32.0, "L2": 280.6, "HBM": 607.0}
    assert pingpong == {
        "flip-volatile": 608.0,
        "flip-atomic": 1600.0,
        "rwlr-volatile": 608.0,
        "rwlr-atomic": 1600.0,
    }


def test_the_gpu_part_runs_the_suite_and_sets_it_beside_the_reference(tmp_path: Path) -> None:
    dc = script()
    gpu = SimulatedGpu(2)
    result = dc.gpu_part(tmp_path, QUICK, gpu)
    assert gpu.closed and result.none_line is None
    assert [level for level, _, _ in result.chase] == ["shared", "L1", "L2", "HBM"]
    assert all(ref is not None for _, _, ref in result.chase)
    refs = {name: ref for name, _, ref in result.pingpong}
    assert refs["intra-gpu flip-atomic"] == 1600.0 and refs["inter-gpu flip-atomic"] is None
    assert len(list(tmp_path.iterdir())) == 1  # the GPU run directory
