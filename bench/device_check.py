"""The one read-only hardware check for a lent GPU server: RDMA, transceiver modules, link settings, GPU.

    python bench/device_check.py                # everything; writes docs/measured/device-YYYY-MM-DD.md
    python bench/device_check.py --dry-run      # the same checks, the report printed instead of written

What it does, in order (each part that finds nothing says so in one line, and the script goes on):
1. RDMA: lists the devices (`ibv_devices`, else pyverbs) and their ports (`ibv_devinfo -v`); on the first
   active port, labctl's verbs-rc probe runs an RC SEND/RECV ping-pong between two QPs on that one device
   (loopback through the NIC: no link is touched) with the README's RC settings (timeout 14, retry_cnt 7,
   rnr_retry 7, min_rnr_timer 12), one-way latency median and p99 the way perftest reports it, beside
   `ib_send_lat` where perftest is installed; and the retry-timer model's period (4.096 us x 2^timeout,
   labctl.rdma.rc) beside the device's local_ca_ack_delay (ibv_devinfo -v, else pyverbs query_device).
2. Modules and links: every network interface's module EEPROM through labctl's ethtool netlink path
   (labctl.linux.ethtool: reads only), decoded (labctl.linux.transceiver) and compared field by field
   with `ethtool -m`'s own decoding (equal, within rounding, different); link modes, FEC and link state
   through labctl (LINKMODES_GET, FEC_GET, LINKSTATE_GET) against `ethtool IF` and `ethtool --show-fec IF`.
3. GPU: bench/gpu_device_check.py's suite (compile, %globaltimer, ping-pong, pointer chase), its figures
   set beside docs/measured/gpu-h200-2026-12-04.md.
4. Read-only, always: the first thing it does is labctl.linux.readonly.forbid_writes(), so every labctl
   SET path (ethtool LINKMODES_SET / FEC_SET / PRIVFLAGS_SET, link up/down and every other rtnetlink
   change, sysctl writes) raises before a byte is sent. It loads no kernel module and changes no setting;
   the tools it runs (ibv_devices, ibv_devinfo, ethtool without options, -m, --show-fec, ib_send_lat)
   only read. One side effect to know: reading a whole SFF-8636/CMIS EEPROM (`ethtool -m` does) clears
   the module's latched alarm flags.

Results: docs/measured/device-YYYY-MM-DD.md (the run's date; --report elsewhere), and the GPU run directory
under --gpu-out. Well under 10 minutes (about a minute of RDMA, seconds per module, a minute of GPU).
Exit codes: 0 = every part ran (finding nothing is not a failure; differences are reported, not failed);
3 = a part failed (the line says which). Needs the repository and its environment; pyverbs, rdma-core's
tools, perftest, ethtool and the [gpu] extra where present.
"""

from __future__ import annotations

import argparse
import asyncio
import datetime as dt
import importlib.util
import os
import platform
import re
import shutil
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import Any

from labctl.linux.ethtool_text import (
    AGREE,
    DIFFERENT,
    EQUAL,
    ROUNDING,
    FieldComparison,
    compare_link,
    compare_module,
    decoded_fields,
    ethtool_link,
    labctl_link,
    module_fields,
)
from labctl.linux.readonly import forbid_writes
from labctl.rdma.devinfo import (
    AckTimeoutCheck,
    RdmaDevice,
    check_ack_timeout,
    parse_ibv_devices,
    parse_ibv_devinfo,
)
from labctl.rdma.rc import QpAttrs

REPO = Path(__file__).resolve().parents[1]
GPU_REFERENCE = REPO / "docs" / "measured" / "gpu-h200-2026-12-04.md"
TOOL_TIMEOUT_S = 20.0


def _bench_module(name: str) -> ModuleType:
    """A sibling bench script loaded by path (bench/ is not a package; this file is also imported by tests)."""
    spec = importlib.util.spec_from_file_location(
        f"bench_{name}", Path(__file__).resolve().with_name(f"{name}.py")
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses in it look their module up while the class is made
    spec.loader.exec_module(module)
    return module


def run_tool(*args: str) -> str | None:
    """A read-only tool's stdout; None when it is not installed, failed or timed out."""
    if shutil.which(args[0]) is None:
        return None
    try:
        proc = subprocess.run(args, capture_output=True, text=True, timeout=TOOL_TIMEOUT_S, check=False)
    except subprocess.TimeoutExpired:
        return None
    return proc.stdout if proc.returncode == 0 else None


# -- results -------------------------------------------------------------------------------------------


@dataclass
class RdmaResult:
    devices: list[RdmaDevice] = field(default_factory=list)
    none_line: str | None = None  # why there is nothing to measure
    device: str | None = None
    port: int | None = None
    gid_index: int | None = None
    probe: dict[str, float] | None = None  # one-way us: median, p99, n
    probe_line: str | None = None
    send_lat: dict[str, float] | None = None
    send_lat_line: str | None = None
    timer: AckTimeoutCheck | None = None


@dataclass
class Compared:
    interface: str
    what: str  # the module's name, or "link"
    rows: list[FieldComparison]

    def count(self, *verdicts: str) -> int:
        return sum(1 for r in self.rows if r.verdict in verdicts)


@dataclass
class PortsResult:
    modules: list[Compared] = field(default_factory=list)
    links: list[Compared] = field(default_factory=list)
    without_module: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)


@dataclass
class GpuResult:
    none_line: str | None = None
    devices: list[str] = field(default_factory=list)
    chase: list[tuple[str, float, float | None]] = field(default_factory=list)  # level, cycles, reference
    pingpong: list[tuple[str, float, float | None]] = field(default_factory=list)  # variant, median ns, ref
    run_dir: str | None = None


@dataclass
class Results:
    date: dt.date
    host: str
    platform: str
    rdma: RdmaResult | None = None
    ports: PortsResult | None = None
    gpu: GpuResult | None = None
    failures: list[str] = field(default_factory=list)


# -- 1. RDMA ---------------------------------------------------------------------------------------------


def rdma_part(iterations: int, settings: Any) -> RdmaResult:
    from labctl.rdma import compat

    result = RdmaResult()
    listed = run_tool("ibv_devices")
    names = [name for name, _ in parse_ibv_devices(listed)] if listed else []
    verbs = None
    if not names:
        try:
            verbs = compat.load()
            names = compat.devices(verbs)
        except (compat.PyverbsMissing, compat.RdmaUnavailable) as e:
            result.none_line = f"RDMA: none present ({e})"
            return result
    for name in names:
        text = run_tool("ibv_devinfo", "-v", "-d", name)
        found = parse_ibv_devinfo(text) if text else []
        result.devices += found or [RdmaDevice(name, {})]
    active = next(((d, p) for d in result.devices if (p := d.first_active_port())), None)
    delay = next((d.local_ca_ack_delay for d in result.devices if d.local_ca_ack_delay is not None), None)
    attrs = QpAttrs(settings.timeout, settings.retry_cnt, settings.rnr_retry, settings.min_rnr_timer)
    if active is None:
        result.timer = check_ack_timeout(attrs, delay)
        result.none_line = f"RDMA: {len(names)} device(s), none with an active port: no ping-pong"
        return result
    device, port = active
    if delay is None:
        delay = _pyverbs_ack_delay(device.name)
    result.timer = check_ack_timeout(attrs, delay)
    gid = port.roce_v2_ipv4_gid()
    result.device, result.port = device.name, port.number
    result.gid_index = gid.index if gid is not None else 0  # InfiniBand: GID 0
    from labctl.rdma.perftest import latency_report, run_latency_tool

    try:
        rdma_bench = _bench_module("rdma")
        trips = asyncio.run(rdma_bench.probe_latency(device.name, result.gid_index, iterations))
        report = latency_report(trips)
        result.probe = {"median_us": report.t_typical / 1e3, "p99_us": report.p99 / 1e3, "n": report.n}
    except Exception as e:  # one line, and the script goes on: the figures are what is missing
        result.probe_line = f"verbs-rc ping-pong failed: {type(e).__name__}: {e}"
    lat = run_latency_tool("ib_send_lat", device.name, result.gid_index, iterations)
    if isinstance(lat, str):
        result.send_lat_line = lat
    else:
        result.send_lat = lat
    return result


def _pyverbs_ack_delay(device: str) -> int | None:
    """local_ca_ack_delay through pyverbs query_device, where ibv_devinfo -v did not say."""
    try:
        from labctl.rdma import compat

        ctx = compat.load().module("device").Context(name=device)
        try:
            return int(ctx.query_device().local_ca_ack_delay)
        finally:
            ctx.close()
    except Exception:  # pyverbs missing or the query refused: not reported
        return None


# -- 2. modules and links ---------------------------------------------------------------------------------


def interfaces() -> list[str]:
    return sorted(n for n in os.listdir("/sys/class/net") if n != "lo")


def ports_part(names: list[str]) -> PortsResult:
    from labctl.core.errors import LabctlError
    from labctl.linux.ethtool import NoModuleEepromError, open_module_eeprom
    from labctl.linux.transceiver import read_dom

    result = PortsResult()
    have_ethtool = shutil.which("ethtool") is not None
    if not have_ethtool:
        result.notes.append("ethtool not installed: labctl's reads are not compared (apt install ethtool)")
    for name in names:
        try:
            mem = open_module_eeprom(name)
            try:
                reading = read_dom(mem)
            finally:
                mem.close()
        except NoModuleEepromError:
            result.without_module.append(name)
        except (LabctlError, OSError) as e:
            result.notes.append(f"{name}: module EEPROM not read: {e}")
        else:
            text = run_tool("ethtool", "-m", name) if have_ethtool else None
            theirs = module_fields(text) if text else {}
            what = f"{reading.identifier_name}" + (
                f" {reading.identity.vendor_name} {reading.identity.part_number}" if reading.identity else ""
            )
            result.modules.append(Compared(name, what, compare_module(decoded_fields(reading), theirs)))
        if have_ethtool:
            link = _link_compare(name, result.notes)
            if link is not None:
                result.links.append(link)
    return result


def _link_compare(name: str, notes: list[str]) -> Compared | None:
    import errno

    from labctl.linux.ethtool_link import EthtoolLink
    from labctl.linux.linkstate import LinkStateReader
    from labctl.linux.netlink import NetlinkError

    def optional(get: Any) -> Any:
        try:
            return get()
        except NetlinkError as e:
            if e.errno in (errno.EOPNOTSUPP, errno.ENODATA):
                return None
            raise

    try:
        with EthtoolLink() as link:
            modes = optional(lambda: link.linkmodes(name))
            names = link.link_mode_names(name) if modes is not None else {}
            fec = optional(lambda: link.fec(name))
        reader = LinkStateReader(name)
        try:
            state = optional(reader.read)
        finally:
            reader.close()
    except (NetlinkError, OSError) as e:
        notes.append(f"{name}: link settings not read: {e}")
        return None
    ours = labctl_link(modes, names, fec, state.link if state is not None else None)
    theirs = ethtool_link(run_tool("ethtool", name), run_tool("ethtool", "--show-fec", name))
    rows = compare_link(ours, theirs)
    return Compared(name, "link", rows) if rows else None


# -- 3. GPU -----------------------------------------------------------------------------------------------


def reference_tables(text: str) -> tuple[dict[str, float], dict[str, float]]:
    """docs/measured/gpu-h200-2026-12-04.md's pointer-chase cycles per level and ping-pong round-trip
    medians (ns) per variant."""
    chase: dict[str, float] = {}
    pingpong: dict[str, float] = {}
    for line in text.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) >= 3 and re.fullmatch(r"(shared|L1|L2|HBM)\b.*", cells[0]):
            chase[cells[0].split()[0]] = float(cells[1])
        elif len(cells) >= 7 and re.fullmatch(r"(flip|rwlr)-(volatile|atomic)\*?", cells[0]):
            pingpong[cells[0].rstrip("*")] = float(cells[2])
    return chase, pingpong


def gpu_part(out: Path, config: Any, backend: Any = None) -> GpuResult:
    """`config`: a labctl.probes.gpu.suite.SuiteConfig; `backend`: an opened GpuBackend (tests give the
    simulated one), else the CUDA one, compiled and opened as bench/gpu_device_check.py does."""
    from labctl.probes.gpu.errors import NoGpuError
    from labctl.probes.gpu.runner import open_backend

    result = GpuResult()
    gpu = _bench_module("gpu_device_check")
    if backend is None:
        try:
            gpu.compile_check()
            backend = open_backend()
        except NoGpuError as e:
            result.none_line = f"GPU: none present ({e})"
            return result
    code, report = gpu.check_report(backend, config, out)
    if report is None:
        raise RuntimeError(f"the GPU suite did not run (bench/gpu_device_check.py exit {code})")
    chase_ref, pingpong_ref = reference_tables(GPU_REFERENCE.read_text())
    result.devices = [f"{d.name} ({d.sm_arch}, {d.sm_count} SMs)" for d in report.devices]
    result.chase = [(c.level, c.cycles_per_hop.median, chase_ref.get(c.level)) for c in report.chase]
    result.pingpong = [
        (
            f"{r.scope} {r.variant}",
            r.round_trip_ns.median,
            pingpong_ref.get(r.variant) if r.scope == "intra-gpu" else None,
        )
        for r in report.pingpong
    ]
    return result


# -- the report ---------------------------------------------------------------------------------------


def _ratio(value: float, reference: float | None) -> str:
    return f"{value / reference:.2f}" if reference else "-"


def render(results: Results) -> str:
    """docs/measured/device-YYYY-MM-DD.md: the template, filled in with what the run found."""
    out = [
        f"# bench/device_check.py on {results.host} ({results.date.isoformat()})",
        "",
        f"Read-only run (labctl.linux.readonly.forbid_writes: every SET path refused), {results.platform}.",
        "",
        "## RDMA",
        "",
    ]
    r = results.rdma
    if r is None:
        out.append("Not run (--parts).")
    else:
        if r.devices:
            out += [f"- {d.name}: {d.model}" for d in r.devices]
        if r.none_line:
            out.append(f"- {r.none_line.removeprefix('RDMA: ')}")
        if r.device is not None:
            settings = "timeout 14, retry_cnt 7, rnr_retry 7, min_rnr_timer 12"
            where = f"{r.device} port {r.port}, GID index {r.gid_index}"
            out.append(f"- verbs-rc ping-pong, two QPs on {where} (loopback; {settings}):")
            if r.probe is not None:
                out.append(
                    f"  one-way median {r.probe['median_us']:.2f} us, p99 {r.probe['p99_us']:.2f} us "
                    f"over {r.probe['n']:.0f} round trips"
                )
            else:
                out.append(f"  {r.probe_line}")
            if r.send_lat is not None:
                out.append(
                    f"- ib_send_lat on the same device: median {r.send_lat['median_us']:.2f} us, "
                    f"p99 {r.send_lat['p99_us']:.2f} us"
                )
            else:
                out.append(f"- ib_send_lat: {r.send_lat_line}")
        if r.timer is not None:
            out.append(f"- Retry-timer model against the device: {r.timer.line()}")
    out += ["", "## Transceiver modules (labctl's decoding against `ethtool -m`)", ""]
    p = results.ports
    if p is None:
        out.append("Not run (--parts).")
    else:
        compared = sum(c.count(EQUAL, ROUNDING, DIFFERENT) for c in p.modules)
        agree = sum(c.count(*AGREE) for c in p.modules)
        if not p.modules:
            out.append("No module: no interface here has a module EEPROM to read.")
        else:
            out += [
                f"{len(p.modules)} module(s) decoded; {agree} of {compared} fields agree with `ethtool -m` "
                f"({sum(c.count(EQUAL) for c in p.modules)} equal, {sum(c.count(ROUNDING) for c in p.modules)} "
                f"within rounding), {sum(c.count(DIFFERENT) for c in p.modules)} different.",
                "",
                "| interface | module | compared | equal | within rounding | different | one side only |",
                "|---|---|---|---|---|---|---|",
            ]
            for c in p.modules:
                out.append(
                    f"| {c.interface} | {c.what} | {c.count(EQUAL, ROUNDING, DIFFERENT)} | {c.count(EQUAL)} | "
                    f"{c.count(ROUNDING)} | {c.count(DIFFERENT)} | {len(c.rows) - c.count(EQUAL, ROUNDING, DIFFERENT)} |"
                )
            out += _differences(p.modules)
        if p.without_module:
            out.append(f"\nWithout a module EEPROM: {', '.join(p.without_module)}.")
        out += [
            "",
            "## Link modes, FEC and link state (labctl's netlink reads against `ethtool`, `--show-fec`)",
            "",
        ]
        if not p.links:
            out.append("No interface answered both labctl's link reads and ethtool.")
        else:
            out += ["| interface | compared | agree | different | one side only |", "|---|---|---|---|---|"]
            for c in p.links:
                both = c.count(EQUAL, DIFFERENT)
                out.append(
                    f"| {c.interface} | {both} | {c.count(EQUAL)} | {c.count(DIFFERENT)} | {len(c.rows) - both} |"
                )
            out += _differences(p.links)
        out += [f"\nNote: {n}" for n in p.notes]
    out += [
        "",
        "## GPU (bench/gpu_device_check.py's suite, against docs/measured/gpu-h200-2026-12-04.md)",
        "",
    ]
    g = results.gpu
    if g is None:
        out.append("Not run (--parts).")
    elif g.none_line:
        line = g.none_line.removeprefix("GPU: ")
        out.append(line[:1].upper() + line[1:] + ".")
    else:
        out += [
            f"GPU(s): {', '.join(g.devices)}.",
            "",
            "| pointer chase | cycles/hop here | H200 2026-12-04 | ratio |",
        ]
        out.append("|---|---|---|---|")
        out += [
            f"| {lvl} | {v:.1f} | {ref if ref is not None else '-'} | {_ratio(v, ref)} |"
            for lvl, v, ref in g.chase
        ]
        out += [
            "",
            "| ping-pong | round trip median (ns) here | H200 2026-12-04 | ratio |",
            "|---|---|---|---|",
        ]
        out += [
            f"| {var} | {v:.0f} | {ref if ref is not None else '-'} | {_ratio(v, ref)} |"
            for var, v, ref in g.pingpong
        ]
    if results.failures:
        out += ["", "## Failed parts", ""] + [f"- {f}" for f in results.failures]
    return "\n".join(out) + "\n"


def _differences(compared: list[Compared]) -> list[str]:
    lines = [
        f"- {c.interface} {r.field}: labctl {r.labctl or '(none)'}, ethtool {r.ethtool or '(none)'}"
        for c in compared
        for r in c.rows
        if r.verdict == DIFFERENT
    ]
    return ["", "Different:", *lines] if lines else []


# -- the command ------------------------------------------------------------------------------------------

PARTS = ("rdma", "ports", "gpu")


def main(argv: list[str] | None = None) -> int:
    forbid_writes()  # first thing: nothing below may change a setting on this machine
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--dry-run", action="store_true", help="run every check, print the report, write no file")
    ap.add_argument(
        "--report", type=Path, help="where the report goes (default docs/measured/device-DATE.md)"
    )
    ap.add_argument("--parts", default=",".join(PARTS), help="which parts, comma-separated: rdma,ports,gpu")
    ap.add_argument("--interfaces", help="comma-separated interfaces for part 2 (default: all but lo)")
    ap.add_argument("--iterations", type=int, default=10_000, help="RDMA round trips and GPU ping-pongs")
    ap.add_argument("--gpu-warmup", type=int, default=2_000, help="GPU ping-pong warm-up iterations")
    ap.add_argument("--gpu-out", type=Path, default=Path("runs"), help="where the GPU run directory goes")
    args = ap.parse_args(argv)
    parts = [p.strip() for p in args.parts.split(",") if p.strip()]
    unknown = [p for p in parts if p not in PARTS]
    if unknown:
        ap.error(f"unknown part(s) {', '.join(unknown)}: choose from {', '.join(PARTS)}")

    from labctl.probes.sampling import RdmaSettings

    t0 = time.monotonic()
    results = Results(
        dt.date.today(), socket.gethostname(), f"Python {platform.python_version()} on {platform.platform()}"
    )
    print(f"device check on {results.host}: {results.platform}; writes forbidden in this process")
    if "rdma" in parts:
        print("\n== 1. RDMA")
        try:
            results.rdma = rdma_part(args.iterations, RdmaSettings())
            _say_rdma(results.rdma)
        except Exception as e:
            results.failures.append(f"RDMA: {type(e).__name__}: {e}")
            print(f"RDMA part failed: {type(e).__name__}: {e}")
    if "ports" in parts:
        print("\n== 2. transceiver modules and link settings")
        try:
            names = args.interfaces.split(",") if args.interfaces else interfaces()
            results.ports = ports_part(names)
            _say_ports(results.ports)
        except Exception as e:
            results.failures.append(f"modules and links: {type(e).__name__}: {e}")
            print(f"modules and links part failed: {type(e).__name__}: {e}")
    if "gpu" in parts:
        print("\n== 3. GPU")
        try:
            from labctl.probes.gpu.suite import SuiteConfig

            config = SuiteConfig(iterations=args.iterations, warmup=args.gpu_warmup)
            results.gpu = gpu_part(args.gpu_out, config)
            if results.gpu.none_line:
                print(results.gpu.none_line)
        except Exception as e:
            results.failures.append(f"GPU: {type(e).__name__}: {e}")
            print(f"GPU part failed: {type(e).__name__}: {e}")
    text = render(results)
    if args.dry_run:
        print(f"\n== report (dry run: not written)\n{text}")
    else:
        path = args.report or REPO / "docs" / "measured" / f"device-{results.date.isoformat()}.md"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")
        print(f"\nreport: {path}")
    print(
        f"done in {time.monotonic() - t0:.1f} s"
        + (f"; failed: {'; '.join(results.failures)}" if results.failures else "")
    )
    return 3 if results.failures else 0


def _say_rdma(r: RdmaResult) -> None:
    for d in r.devices:
        print(f"{d.name}: {d.model}")
    if r.none_line:
        print(r.none_line)
    if r.probe is not None:
        print(
            f"verbs-rc ping-pong one-way: median {r.probe['median_us']:.2f} us, p99 {r.probe['p99_us']:.2f} us"
        )
    elif r.probe_line:
        print(r.probe_line)
    if r.send_lat is not None:
        print(f"ib_send_lat: median {r.send_lat['median_us']:.2f} us, p99 {r.send_lat['p99_us']:.2f} us")
    elif r.send_lat_line:
        print(f"ib_send_lat: {r.send_lat_line}")
    if r.timer is not None and r.device is not None:
        print(f"retry timer: {r.timer.line()}")


def _say_ports(p: PortsResult) -> None:
    if not p.modules:
        print(f"modules: none present (no module EEPROM on {', '.join(p.without_module) or 'any interface'})")
    for c in p.modules:
        print(
            f"{c.interface}: {c.what}: {c.count(*AGREE)} of {c.count(EQUAL, ROUNDING, DIFFERENT)} fields agree "
            f"with ethtool -m ({c.count(DIFFERENT)} different)"
        )
    for c in p.links:
        print(
            f"{c.interface}: link: {c.count(EQUAL)} of {c.count(EQUAL, DIFFERENT)} fields agree with ethtool"
        )
    for note in p.notes:
        print(note)


if __name__ == "__main__":
    sys.exit(main())
