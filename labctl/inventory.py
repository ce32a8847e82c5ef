"""The lab inventory (inventory.yaml): switches, hosts, GPUs, NIC ports and their fibers, delay profiles.

Validated in full before anything touches hardware. A bad file gets one line naming the file, line and
field. Secrets appear only as `${ENV_VAR}` references; they are resolved from the environment when a
driver connects and are never written back out. Each switch entry is validated by its driver's own
config model (labctl.switches); `kind` names a registered lab kind, whose own checks run when a lab is
chosen for the inventory (labctl.labs.load).
"""

from __future__ import annotations

import ipaddress
from collections import defaultdict
from dataclasses import dataclass
from dataclasses import field as dataclass_field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel, Field, ValidationError, field_validator, model_validator

from labctl.config import ConfigModel, SecretRef, SwitchConfig
from labctl.errors import InputError
from labctl.profiles import DEFAULT_PROFILE, Profile, resolve_profile
from labctl.registry import DEFAULT_LAB_KIND, LAB_KINDS
from labctl.switches import config_union as switch_drivers_config_union
from labctl.yamlio import Loc, SourcedYaml, format_loc, load_yaml, pydantic_error_line


class GpuSpec(ConfigModel):
    index: int = Field(ge=0, le=1023)
    model: str = ""


class RdmaPortSpec(ConfigModel):
    """Where a NIC port's RDMA side is (for the pyverbs probe): `rdma link show` / `ibv_devices` name the
    device and port; `show_gids` the GID index (RoCE v2 over the port's IPv4 address, usually)."""

    device: str = Field(min_length=1, max_length=64, description="RDMA device, e.g. mlx5_0")
    port: int = Field(default=1, ge=1, le=255, description="the device's port number")
    gid_index: int = Field(default=3, ge=0, le=1023, description="GID table index (RoCE v2 IPv4: often 3)")


class NicPortSpec(ConfigModel):
    ifname: str = Field(min_length=1, max_length=15)
    rail: int = Field(ge=0, le=1023)
    gpu: int | None = Field(default=None, ge=0, le=1023, description="GPU index this NIC serves")
    switch: str
    tx: int = Field(
        ge=1, le=8192, description="OCS ingress port that this NIC port's transmit fiber lands on"
    )
    rx: int = Field(ge=1, le=8192, description="OCS egress port that feeds this NIC port's receive fiber")
    gbps: int = Field(default=100, gt=0, le=6400)
    address: str | None = Field(default=None, description="IPv4 address/prefix (emulated fabric)")
    rdma: RdmaPortSpec | None = Field(default=None, description="the port's RDMA device (pyverbs probe)")


class HostSpec(ConfigModel):
    address: str | None = None
    gpus: list[GpuSpec] = Field(default_factory=list)
    nics: list[NicPortSpec] = Field(min_length=1)


# One switch entry: the config model of the driver its `driver` field names (a discriminated union over
# the switch-driver registry). A type checker sees the common base.
if TYPE_CHECKING:
    SwitchSpec = SwitchConfig
else:
    SwitchSpec = switch_drivers_config_union()


class BrokerTlsSpec(ConfigModel):
    """TLS to the MQTT broker: file paths only (keys stay on disk, never in the inventory)."""

    ca_file: str | None = None
    cert_file: str | None = None
    key_file: str | None = None


class BrokerSpec(ConfigModel):
    """The MQTT broker between the controller and `labctl agent`s; without it everything is one process."""

    url: str = Field(default="mqtt://127.0.0.1:1883", description="mqtt://HOST:PORT or mqtts://HOST:PORT")
    username: SecretRef | None = None
    password: SecretRef | None = None
    auth_key: SecretRef | None = Field(
        default=None, description="HMAC-SHA256 key: every labctl message is signed and checked with it"
    )
    tls: BrokerTlsSpec | None = None
    clock_sync_interval_s: float = Field(
        default=10.0, ge=0.1, le=3600, description="re-measure agent clock offsets"
    )
    clock_samples: int = Field(default=16, ge=4, le=1000, description="ping/pong samples per measurement")
    agent_grace_s: float = Field(
        default=5.0,
        gt=0,
        le=600,
        description="an agent offline this long mid-run is lost (a shorter gap: a broker restart)",
    )

    @field_validator("url")
    @classmethod
    def _url_parses(cls, value: str) -> str:
        from urllib.parse import urlsplit

        parts = urlsplit(value)
        if parts.scheme not in ("mqtt", "mqtts") or not parts.hostname:
            raise ValueError("broker url must look like mqtt://HOST:PORT or mqtts://HOST:PORT")
        try:
            parts.port  # noqa: B018 - raises on a bad port
        except ValueError as e:
            raise ValueError(f"broker url: {e}") from None
        return value


class InventoryModel(ConfigModel):
    lab: str = Field(min_length=1)
    switches: dict[str, SwitchSpec] = Field(min_length=1)
    hosts: dict[str, HostSpec] = Field(
        default_factory=dict,
        description="hosts and their NIC ports (a switch-only inventory, for `labctl ocs`, has none)",
    )
    profile: str = DEFAULT_PROFILE
    profiles: dict[str, dict[str, Any]] = Field(default_factory=dict)
    kind: str = Field(
        default=DEFAULT_LAB_KIND,
        description="the kind of lab (labctl.registry.LAB_KINDS): simulated (in-process models), kernel "
        "(namespaces + veth + tc, root), agents (probes on `labctl agent`s over MQTT)",
    )
    broker: BrokerSpec | None = Field(
        default=None, description="MQTT broker between the controller and `labctl agent`s"
    )

    @field_validator("kind")
    @classmethod
    def _known_kind(cls, value: str) -> str:
        if value not in LAB_KINDS:
            raise ValueError(f"unknown lab kind {value!r} (known: {', '.join(sorted(LAB_KINDS))})")
        return value

    @model_validator(mode="before")
    @classmethod
    def _renamed_fields(cls, data: Any) -> Any:
        # `fabric: emulated` chose the kernel fabric before lab kinds were registry entries.
        if isinstance(data, dict) and "fabric" in data:
            raise ValueError(
                "`fabric:` is now `kind:` (fabric: emulated → kind: kernel; fabric: simulated → "
                "kind: simulated)"
            )
        return data


@dataclass(frozen=True, slots=True)
class NicPort:
    """One NIC port with its two fibers on the OCS, flattened from the inventory."""

    host: str
    ifname: str
    rail: int
    gpu: int | None
    switch: str
    tx: int
    rx: int
    gbps: int
    address: str | None
    rdma: RdmaPortSpec | None = dataclass_field(default=None, compare=False, repr=False)
    """The port's RDMA device, port and GID index, where the inventory names them."""
    source: str = dataclass_field(init=False, compare=False, repr=False)
    """The event `source` of every signal observed on this port: nic:<host>/<ifname>."""

    def __post_init__(self) -> None:
        # Computed once: hundreds of ports are looked up by source at every reconfiguration.
        object.__setattr__(self, "source", f"nic:{self.host}/{self.ifname}")

    def __hash__(self) -> int:
        return hash((self.host, self.ifname))  # a host has one port per ifname; equal ports hash alike

    @property
    def label(self) -> str:
        return f"{self.host}/{self.ifname}"


class Inventory:
    """A validated inventory with lookups the controller needs."""

    def __init__(
        self, model: InventoryModel, path: Path | None = None, src: SourcedYaml | None = None
    ) -> None:
        self.model = model
        self.path = path
        self.src = src
        self.ports: list[NicPort] = [
            NicPort(host, n.ifname, n.rail, n.gpu, n.switch, n.tx, n.rx, n.gbps, n.address, n.rdma)
            for host, spec in model.hosts.items()
            for n in spec.nics
        ]
        self._by_source = {p.source: p for p in self.ports}

    @property
    def lab(self) -> str:
        return self.model.lab

    @property
    def kind(self) -> str:
        return self.model.kind

    @property
    def switches(self) -> dict[str, SwitchConfig]:
        return self.model.switches

    @property
    def hosts(self) -> list[str]:
        return list(self.model.hosts)

    @property
    def rails(self) -> list[int]:
        return sorted({p.rail for p in self.ports})

    def rail_switch(self, rail: int) -> str:
        return next(p.switch for p in self.ports if p.rail == rail)

    def rail_ports(self, rail: int) -> dict[str, list[NicPort]]:
        """Host → that host's ports on `rail`, in inventory order (port 0 first)."""
        out: dict[str, list[NicPort]] = defaultdict(list)
        for p in self.ports:
            if p.rail == rail:
                out[p.host].append(p)
        return dict(out)

    def port_by_source(self, source: str) -> NicPort:
        return self._by_source[source]

    def profile(self, name: str | None = None) -> Profile:
        return resolve_profile(name or self.model.profile, self.model.profiles)

    def secret_refs(self) -> list[tuple[Loc, SecretRef]]:
        """Every `${ENV}` reference in the inventory, with where it is written."""
        found: list[tuple[Loc, SecretRef]] = []

        def walk(value: object, loc: Loc) -> None:
            if isinstance(value, SecretRef):
                found.append((loc, value))
            elif isinstance(value, BaseModel):
                for name in type(value).model_fields:
                    walk(getattr(value, name), (*loc, name))
            elif isinstance(value, dict):
                for key, item in value.items():
                    walk(item, (*loc, key))
            elif isinstance(value, list):
                for i, item in enumerate(value):
                    walk(item, (*loc, i))

        walk(self.model, ())
        return found

    def port_loc(self, port: NicPort) -> Loc:
        """Where a NIC port is written in the inventory: `hosts.<host>.nics[<i>]`."""
        nics = self.model.hosts[port.host].nics
        return ("hosts", port.host, "nics", next(i for i, n in enumerate(nics) if n.ifname == port.ifname))

    def port_addresses(self, needed_by: str) -> dict[NicPort, ipaddress.IPv4Interface]:
        """Every NIC port's IPv4 address/prefix, or InputError at the first port without a valid, unique one
        (`needed_by` says what needs them, e.g. "the kernel fabric")."""
        out: dict[NicPort, ipaddress.IPv4Interface] = {}
        seen: dict[ipaddress.IPv4Address, str] = {}
        for port in self.ports:
            loc = (*self.port_loc(port), "address")
            if port.address is None:
                raise self.fail(loc, f"{needed_by} needs an IPv4 address/prefix on every NIC port")
            try:
                interface = ipaddress.IPv4Interface(port.address)
            except ValueError:
                raise self.fail(
                    loc, f"{port.address!r} is not an IPv4 address/prefix like 10.0.0.1/24"
                ) from None
            if interface.ip in seen:
                raise self.fail(loc, f"{interface.ip} is also used by {seen[interface.ip]}")
            seen[interface.ip] = port.label
            out[port] = interface
        return out

    def fail(self, loc: Loc, message: str) -> InputError:
        """The one-line error for a problem at field path `loc`: `file:line: field.path: message`."""
        where = self.src.where(loc) if self.src is not None else str(self.path or "inventory")
        return InputError(f"{where}: {format_loc(loc)}: {message}")

    def snapshot(self) -> dict[str, Any]:
        """The inventory as JSON-able data, secrets left as their `${ENV}` references."""
        return self.model.model_dump(mode="json")


def load_inventory(path: Path | str) -> Inventory:
    """Load and fully validate an inventory file; raise InputError with `file:line: field: problem`."""
    path = Path(path)
    src = load_yaml(path, "inventory")
    try:
        model = InventoryModel.model_validate(src.data)
    except ValidationError as e:
        raise InputError(pydantic_error_line(src, e)) from None
    _check_references(model, src)
    inventory = Inventory(model, path, src)
    try:
        inventory.profile()
    except InputError as e:
        raise InputError(f"{src.where(('profile',))}: profile: {e}") from None
    return inventory


def _fail(src: SourcedYaml, loc: Loc, message: str) -> InputError:
    return InputError(f"{src.where(loc)}: {format_loc(loc)}: {message}")


def _check_references(model: InventoryModel, src: SourcedYaml) -> None:
    """Checks that span fields: switch names, port ranges and directions, ports used twice, rails."""
    used: dict[tuple[str, int], Loc] = {}
    rail_switch: dict[int, tuple[str, Loc]] = {}
    for host, spec in model.hosts.items():
        gpu_indices = {g.index for g in spec.gpus}
        ifnames: set[str] = set()
        for i, nic in enumerate(spec.nics):
            base: Loc = ("hosts", host, "nics", i)
            if nic.ifname in ifnames:
                raise _fail(src, (*base, "ifname"), f"interface {nic.ifname!r} is listed twice on {host}")
            ifnames.add(nic.ifname)
            if nic.gpu is not None and spec.gpus and nic.gpu not in gpu_indices:
                raise _fail(src, (*base, "gpu"), f"{host} has no GPU with index {nic.gpu}")
            switch = model.switches.get(nic.switch)
            if switch is None:
                known = ", ".join(model.switches)
                raise _fail(src, (*base, "switch"), f"unknown switch {nic.switch!r} (known: {known})")
            space, owned = switch.space, switch.owned
            for field, want_ingress in (("tx", True), ("rx", False)):
                port = getattr(nic, field)
                loc = (*base, field)
                if owned is not None and port in space.all_ports and port not in owned:
                    raise _fail(src, loc, f"port {port} of {nic.switch} is not among its owned_ports")
                if port not in space.all_ports:
                    raise _fail(
                        src,
                        loc,
                        f"port {port} is out of range 1..{space.all_ports.stop - 1} "
                        f"of {nic.switch} ({space})",
                    )
                if want_ingress and not space.is_ingress(port):
                    raise _fail(
                        src,
                        loc,
                        f"port {port} is an egress port of {nic.switch}; a transmit fiber must land on an "
                        f"ingress port (1..{space.n_ingress})",
                    )
                if not want_ingress and not space.is_egress(port):
                    raise _fail(
                        src,
                        loc,
                        f"port {port} is an ingress port of {nic.switch}; a receive fiber must come from an "
                        f"egress port ({space.egress.start}..{space.egress.stop - 1})",
                    )
                key = (nic.switch, port)
                if key in used:
                    raise _fail(
                        src, loc, f"{nic.switch} port {port} is used twice (also at {format_loc(used[key])})"
                    )
                used[key] = loc
            if nic.rail in rail_switch and rail_switch[nic.rail][0] != nic.switch:
                other, other_loc = rail_switch[nic.rail]
                raise _fail(
                    src,
                    (*base, "switch"),
                    f"rail {nic.rail} is on {other} (at {format_loc(other_loc)}); one rail is one switch",
                )
            rail_switch.setdefault(nic.rail, (nic.switch, (*base, "switch")))
