"""What rdma-core's `ibv_devices` and `ibv_devinfo [-v]` print, parsed; and the RC retry timer labctl models
(labctl.rdma.rc.QpAttrs: a local ACK timeout of 4.096 µs × 2^timeout) set beside what a device reports.

`ibv_devices`: a two-line header (`device  node GUID`, dashes), then one `name guid` line per device.
`ibv_devinfo -v`: per device an `hca_id:\\tNAME` line, `key:\\tvalue` lines (flag lists continue on
lines without a colon), then per port a `port:\\tN` line and its own `key:\\tvalue` lines, among them
`state: PORT_ACTIVE (4)`, `link_layer`, and (verbose) `GID[  3]:\\t::ffff:10.0.0.1, RoCE v2`.

The device's `local_ca_ack_delay` is an exponent on the same 4.096 µs unit: how long the HCA itself may
take to send an ACK. The kernel's connection manager never gives a QP a timeout below it
(drivers/infiniband/core/cm.c, `cm_ack_timeout`: at least the delay, plus the packet lifetime); labctl
sets `timeout` directly with modify_qp, as perftest does, so the model's period holds only if the HCA
honours a timeout below its own ACK delay. `check_ack_timeout` says which case a device is in.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field

from labctl.rdma.rc import ACK_TIMEOUT_UNIT_NS, QpAttrs

# PCI device IDs of Mellanox/NVIDIA adapters as ibv_devinfo's vendor_part_id prints them (decimal), from
# the PCI ID repository (pci.ids, vendor 15b3).
PART_NAMES: Mapping[int, str] = {
    4115: "ConnectX-4",
    4117: "ConnectX-4 Lx",
    4119: "ConnectX-5",
    4121: "ConnectX-5 Ex",
    4123: "ConnectX-6",
    4125: "ConnectX-6 Dx",
    4127: "ConnectX-6 Lx",
    4129: "ConnectX-7",
    4131: "ConnectX-8",
}


@dataclass(frozen=True)
class Gid:
    index: int
    gid: str
    kind: str | None  # "RoCE v2", "RoCE v1", "IB"; None where ibv_devinfo printed no type


@dataclass(frozen=True)
class RdmaPort:
    number: int
    fields: Mapping[str, str]
    gids: tuple[Gid, ...] = ()

    @property
    def state(self) -> str:
        """PORT_ACTIVE, PORT_DOWN, ... (the name before ibv_devinfo's number)."""
        return self.fields.get("state", "").split(" ")[0]

    @property
    def active(self) -> bool:
        return self.state == "PORT_ACTIVE"

    @property
    def link_layer(self) -> str | None:
        return self.fields.get("link_layer")

    def roce_v2_ipv4_gid(self) -> Gid | None:
        """The RoCE v2 GID of an IPv4 address (::ffff:a.b.c.d, or written out in full), if any."""
        for g in self.gids:
            full = g.gid.replace(":", "").lower()
            mapped = g.gid.lower().startswith("::ffff:") or full.startswith("0" * 20 + "ffff")
            if g.kind == "RoCE v2" and mapped:
                return g
        return None


@dataclass(frozen=True)
class RdmaDevice:
    name: str
    fields: Mapping[str, str]
    ports: tuple[RdmaPort, ...] = field(default_factory=tuple)

    def _int(self, key: str) -> int | None:
        value = self.fields.get(key)
        try:
            return int(value, 0) if value is not None else None
        except ValueError:
            return None

    @property
    def local_ca_ack_delay(self) -> int | None:
        """ibv_devinfo -v only (the short form does not print it)."""
        return self._int("local_ca_ack_delay")

    @property
    def vendor_part_id(self) -> int | None:
        return self._int("vendor_part_id")

    @property
    def model(self) -> str:
        """`ConnectX-7 (part 4129, fw 28.39.1002, board MT_0000000838)`, as much of it as was printed."""
        part = self.vendor_part_id
        name = PART_NAMES.get(part, f"vendor {self.fields.get('vendor_id', '?')}") if part else "unknown"
        details = [f"part {part}" if part is not None else None]
        details += [f"fw {self.fields['fw_ver']}" if "fw_ver" in self.fields else None]
        details += [f"board {self.fields['board_id']}" if "board_id" in self.fields else None]
        shown = ", ".join(d for d in details if d)
        return f"{name} ({shown})" if shown else name

    def first_active_port(self) -> RdmaPort | None:
        return next((p for p in self.ports if p.active), None)


def parse_ibv_devices(text: str) -> list[tuple[str, str]]:
    """`ibv_devices` → [(device, node GUID)] (the header's and the dashes' lines do not match)."""
    out = []
    for line in text.splitlines():
        words = line.split()
        if len(words) == 2 and re.fullmatch(r"[0-9a-fA-F]{16}", words[1]):
            out.append((words[0], words[1]))
    return out


_GID = re.compile(r"^GID\[\s*(\d+)\]$")


def parse_ibv_devinfo(text: str) -> list[RdmaDevice]:
    """`ibv_devinfo` or `ibv_devinfo -v` → one RdmaDevice per `hca_id`."""
    devices: list[RdmaDevice] = []
    name: str | None = None
    dev_fields: dict[str, str] = {}
    ports: list[RdmaPort] = []
    port: tuple[int, dict[str, str], list[Gid]] | None = None

    def close_port() -> None:
        nonlocal port
        if port is not None:
            ports.append(RdmaPort(port[0], dict(port[1]), tuple(port[2])))
            port = None

    def close_device() -> None:
        nonlocal name, dev_fields, ports
        close_port()
        if name is not None:
            devices.append(RdmaDevice(name, dict(dev_fields), tuple(ports)))
        name, dev_fields, ports = None, {}, []

    last: dict[str, str] | None = None
    last_key = ""
    for line in text.splitlines():
        if not line.strip():
            continue
        key, sep, value = line.strip().partition(":")
        value = value.strip()
        if not sep:  # a flag list continued
            if last is not None and last_key:
                last[last_key] = f"{last[last_key]} {line.strip()}".strip()
            continue
        if key == "hca_id":
            close_device()
            name = value
            last, last_key = dev_fields, ""
        elif key == "port" and name is not None:
            close_port()
            port = (int(value), {}, [])
            last, last_key = port[1], ""
        elif (gid := _GID.match(key)) and port is not None:
            address, _, kind = value.partition(",")
            port[2].append(Gid(int(gid.group(1)), address.strip(), kind.strip() or None))
        elif name is not None:
            target = port[1] if port is not None else dev_fields
            target[key] = value
            last, last_key = target, key
    close_device()
    return devices


@dataclass(frozen=True)
class AckTimeoutCheck:
    """The model's retry period beside the device's own ACK delay."""

    timeout: int
    period_ns: int | None  # the model's: 4.096 µs × 2^timeout (None: timeout 0, no timer)
    retry_budget_ns: int | None
    ca_ack_delay: int | None  # the device's exponent (None: not reported)
    ca_ack_delay_ns: int | None
    verdict: str

    def line(self) -> str:
        period = f"{self.period_ns / 1e6:.3f} ms" if self.period_ns else "no timer"
        budget = f"{self.retry_budget_ns / 1e6:.1f} ms" if self.retry_budget_ns else "none"
        delay = (
            f"local_ca_ack_delay {self.ca_ack_delay} ({self.ca_ack_delay_ns / 1e3:.1f} us)"
            if self.ca_ack_delay is not None and self.ca_ack_delay_ns is not None
            else "local_ca_ack_delay not reported"
        )
        return f"timeout {self.timeout}: period {period}, retry budget {budget}; {delay}: {self.verdict}"


def check_ack_timeout(attrs: QpAttrs, ca_ack_delay: int | None) -> AckTimeoutCheck:
    """Does the model's period sit at or above the device's ACK delay (timeout ≥ local_ca_ack_delay)?"""
    period = attrs.ack_timeout_ns
    delay_ns = ACK_TIMEOUT_UNIT_NS << ca_ack_delay if ca_ack_delay is not None else None
    if ca_ack_delay is None:
        verdict = "not checked (the device did not report its ACK delay)"
    elif period is None:
        verdict = "timeout 0 waits forever: no period to check"
    elif attrs.timeout >= ca_ack_delay:
        verdict = "consistent (the model's period is at least the device's ACK delay)"
    else:
        verdict = (
            f"BELOW THE DEVICE'S ACK DELAY: timeout {attrs.timeout} < local_ca_ack_delay {ca_ack_delay}; the "
            "connection manager would not set it, so the model's period holds only if the HCA honours it "
            "(time a dark gap on the wire to know)"
        )
    return AckTimeoutCheck(attrs.timeout, period, attrs.retry_budget_ns, ca_ack_delay, delay_ns, verdict)
