"""The lab inventory (inventory.yaml): switches, hosts, GPUs, NIC ports and their fibers, delay profiles.

Validated in full before anything touches hardware. A bad file gets one line naming the file, line and
field. Secrets appear only as `${ENV_VAR}` references; they are resolved from the environment when a
driver connects and are never written back out. Each switch entry is validated by its driver's own
config model (labctl.ocs.switches); `kind` names a registered lab kind, whose own checks run when a lab is
chosen for the inventory (labctl.labs.load).
"""

from __future__ import annotations

import ipaddress
from collections import defaultdict
from dataclasses import dataclass
from dataclasses import field as dataclass_field
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, Literal

from pydantic import BaseModel, Field, ValidationError, field_validator, model_validator

from labctl.core.errors import InputError
from labctl.core.registry import DEFAULT_LAB_KIND
from labctl.core.registry import names as registered_names
from labctl.core.yamlio import Loc, SourcedYaml, format_loc, load_yaml, pydantic_error_line
from labctl.inventory.config import ConfigModel, SecretRef, SwitchConfig
from labctl.inventory.profiles import DEFAULT_PROFILE, Profile, resolve_profile
from labctl.ocs.switches import config_union as switch_drivers_config_union

__all__ = [  # the public surface (docs/architecture.md, "Public surface"); the rest is internal
    "Inventory",
    "InventoryModel",
    "MeterChannel",
    "NicPort",
    "PowerMeterSpec",
    "RdmaPortSpec",
    "load_inventory",
]


class GpuSpec(ConfigModel):
    index: int = Field(ge=0, le=1023, description="the GPU's index on its host; NIC ports name it in `gpu:`")
    model: str = Field(default="", description="the GPU's model, e.g. L40 (informational)")


class RdmaPortSpec(ConfigModel):
    """Where a NIC port's RDMA side is (for the pyverbs probe): `rdma link show` / `ibv_devices` name the
    device and port; `show_gids` the GID index (RoCE v2 over the port's IPv4 address, usually)."""

    device: str = Field(min_length=1, max_length=64, description="RDMA device, e.g. mlx5_0")
    port: int = Field(default=1, ge=1, le=255, description="the device's port number")
    gid_index: int = Field(default=3, ge=0, le=1023, description="GID table index (RoCE v2 IPv4: often 3)")


class NicPortSpec(ConfigModel):
    ifname: str = Field(
        min_length=1, max_length=15, description="the port's Linux interface name, unique on its host"
    )
    rail: int = Field(
        ge=0, le=1023, description="the rail this port is on; every port of one rail is on one switch"
    )
    gpu: int | None = Field(default=None, ge=0, le=1023, description="GPU index this NIC serves")
    switch: str = Field(description="the switch (a key of `switches:`) both of this port's fibers land on")
    tx: int = Field(
        ge=1, le=8192, description="OCS ingress port that this NIC port's transmit fiber lands on"
    )
    rx: int = Field(ge=1, le=8192, description="OCS egress port that feeds this NIC port's receive fiber")
    gbps: int = Field(
        default=100,
        gt=0,
        le=6400,
        description="the port's line rate in Gb/s; recorded with the run's inventory, read by no probe",
    )
    address: str | None = Field(default=None, description="IPv4 address/prefix (emulated fabric)")
    rdma: RdmaPortSpec | None = Field(default=None, description="the port's RDMA device (pyverbs probe)")
    module: bool = Field(
        default=True,
        description="the port carries a pluggable transceiver whose DOM (Rx power) labctl reads: true for a "
        "real NIC port with an optical module; false for a port without one (a DAC, a veth, a module "
        "without diagnostics): the Rx-power probe leaves it alone, `labctl lab check` does not look for a "
        "module there, and t2 comes only from a power-meter channel tapping its receive fiber",
    )


class HostSpec(ConfigModel):
    address: str | None = Field(
        default=None, description="the host's management address or name (informational)"
    )
    gpus: list[GpuSpec] = Field(
        default_factory=list,
        description="the host's GPUs (index, model); when listed, each NIC port's `gpu:` must name one",
    )
    nics: list[NicPortSpec] = Field(min_length=1, description="the host's NIC ports and their fibers")


# One switch entry: the config model of the driver its `driver` field names (a discriminated union over
# the switch-driver registry). A type checker sees the common base.
if TYPE_CHECKING:
    SwitchSpec = SwitchConfig
else:
    SwitchSpec = switch_drivers_config_union()


class BrokerTlsSpec(ConfigModel):
    """TLS to the MQTT broker: file paths only (keys stay on disk, never in the inventory)."""

    ca_file: str | None = Field(
        default=None, description="CA certificate file the broker's certificate is checked against"
    )
    cert_file: str | None = Field(
        default=None,
        description="client certificate file (mutual TLS); `{identity}` in the path becomes `controller` or "
        "the agent's host name, so each identity presents its own",
    )
    key_file: str | None = Field(
        default=None, description="the client certificate's private key file (`{identity}` as in cert_file)"
    )

    @model_validator(mode="after")
    def _cert_and_key(self) -> BrokerTlsSpec:
        if (self.cert_file is None) != (self.key_file is None):
            raise ValueError("a client certificate needs both cert_file and key_file")
        for name in ("ca_file", "cert_file", "key_file"):
            value = getattr(self, name)
            if value is not None and "{" in value.replace("{identity}", ""):
                raise ValueError(f"{name}: the only placeholder is {{identity}}")
        return self


_ENV_NAME = r"^[A-Za-z_][A-Za-z0-9_]*$"


class BrokerIdentitiesSpec(ConfigModel):
    """Per-host identities on the broker (decision 0067): the controller and each host's agent log in as
    their own user, `<user_prefix>-controller` and `<user_prefix>-agent-<host>`, and sign with their own
    key; each identity's secret comes from the environment variable `<secret_env>_<NAME>` (NAME: CONTROLLER
    or the host name in capitals, other characters as `_`). An agent holds only its own secret; the
    controller holds all of them. `labctl lab broker-config` writes the broker's password and ACL files."""

    secret_env: str = Field(
        default="LABCTL_MQTT_SECRET",
        pattern=_ENV_NAME,
        description="prefix of the environment variables holding each identity's secret "
        "(LABCTL_MQTT_SECRET_CONTROLLER, LABCTL_MQTT_SECRET_H1, ...)",
    )
    user_prefix: str = Field(
        default="labctl",
        pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]*$",
        description="broker user names: <prefix>-controller and <prefix>-agent-<host>",
    )


class BrokerSpec(ConfigModel):
    """The MQTT broker between the controller and `labctl agent`s; without it everything is one process."""

    url: str = Field(default="mqtt://127.0.0.1:1883", description="mqtt://HOST:PORT or mqtts://HOST:PORT")
    username: SecretRef | None = Field(default=None, description="broker user name, as ${ENV_VAR}")
    password: SecretRef | None = Field(default=None, description="broker password, as ${ENV_VAR}")
    auth_key: SecretRef | None = Field(
        default=None, description="HMAC-SHA256 key: every labctl message is signed and checked with it"
    )
    identities: BrokerIdentitiesSpec | None = Field(
        default=None,
        description="per-host broker users and signing keys (instead of username/password/auth_key shared "
        "by every agent and the controller): each agent may publish only its own host's topics and read "
        "only its own commands (decision 0067)",
    )
    tls: BrokerTlsSpec | None = Field(default=None, description="TLS client settings (with mqtts://)")
    clock_sync_interval_s: float = Field(
        default=0.5,
        ge=0.05,
        le=3600,
        description="how often each agent's clock is exchanged with during a run (a burst of clock_samples "
        "pings; the clock model keeps the fastest of each burst and fits offset and drift over the run)",
    )
    clock_samples: int = Field(default=8, ge=4, le=1000, description="ping/pong samples per burst")
    clock_exchange: Literal["udp", "broker"] = Field(
        default="udp",
        description="how clock pings reach each agent: `udp`, straight to a responder the agent binds on the "
        "address it reaches the broker from (falls back to the broker where no pong comes back), or "
        "`broker`, through MQTT (a bound ~10x looser: two clients and the broker each way; decision 0048)",
    )
    clock_udp_port: int = Field(
        default=0,
        ge=0,
        le=65535,
        description="the UDP port of each agent's clock responder (0: any free port, announced in its pongs "
        "through the broker; set one where a firewall between controller and hosts needs it)",
    )
    feed_lead_ms: float = Field(
        default=50.0,
        ge=0.0,
        le=1000.0,
        description="agents lab: how far ahead of a switch command its light changes are sent to the "
        "agents' mirrors of the model (more than the broker's delivery time, so each is applied on time)",
    )
    mirror_lag_ms: float = Field(
        default=50.0,
        ge=0.0,
        le=1000.0,
        description="agents lab: how far each agent's mirror of the model runs behind it (its probes sample "
        "the model as it was this long ago, stamped then), so a world update that took up to this long "
        "through the broker is still applied at its model time (decision 0046)",
    )
    agent_grace_s: float = Field(
        default=5.0,
        gt=0,
        le=600,
        description="an agent offline this long mid-run is lost (a shorter gap: a broker restart)",
    )
    agent_return_s: float = Field(
        default=30.0,
        ge=0,
        le=3600,
        description="a run's restore waits this long for a lost agent to come back and put its ports' link "
        "settings back (a tune run); past it the run fails naming each port and what it holds, and "
        "`labctl lab restore RUN` puts them back later",
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

    @model_validator(mode="after")
    def _one_way_to_log_in(self) -> BrokerSpec:
        if self.identities is not None:
            shared = [
                name for name in ("username", "password", "auth_key") if getattr(self, name) is not None
            ]
            if shared:
                raise ValueError(
                    f"with `identities:` every host logs in and signs as itself: drop {', '.join(shared)}"
                )
        return self


class PowerMeterChannelSpec(ConfigModel):
    """What one power-meter channel (an N77xx port, `slot` in its SCPI) measures: the light leaving a switch
    egress port (`switch`, `port`), or the light arriving at a NIC port (`host`, `nic`: the fiber from its
    `rx` egress port, tapped)."""

    switch: str | None = Field(default=None, description="the switch whose egress port it taps (with `port`)")
    port: int | None = Field(default=None, ge=1, le=8192, description="the switch's egress port")
    host: str | None = Field(default=None, description="the host of the NIC port it taps (with `nic`)")
    nic: str | None = Field(default=None, min_length=1, max_length=15, description="the NIC port's ifname")

    @model_validator(mode="after")
    def _one_target(self) -> PowerMeterChannelSpec:
        on_switch = self.switch is not None or self.port is not None
        on_nic = self.host is not None or self.nic is not None
        if on_switch == on_nic:
            raise ValueError("a channel measures either {switch, port} or {host, nic}")
        if on_switch and (self.switch is None or self.port is None):
            raise ValueError("a switch channel needs both `switch` and `port`")
        if on_nic and (self.host is None or self.nic is None):
            raise ValueError("a NIC channel needs both `host` and `nic`")
        return self


class PowerMeterSpec(ConfigModel):
    """A bench optical power meter (Keysight N77xx over SCPI, TCP port 5025) whose channels tap the fibers
    of switch egress or NIC ports: a second Rx-power source (labctl.probes.power_meter)."""

    driver: Literal["keysight-n77xx"] = Field(
        default="keysight-n77xx", description="the meter's driver (Keysight N77xx over SCPI)"
    )
    address: str | None = Field(default=None, description="host name or IP of the meter (not with emulate)")
    port: int = Field(default=5025, ge=1, le=65535, description="the meter's SCPI TCP port")
    emulate: bool = Field(
        default=False, description="poll an N77xx emulator that reads the lab's switch models instead"
    )
    averaging_time_ms: float = Field(
        default=1.0, ge=0.001, le=10_000, description="SENS:POW:ATIM (1 us .. 10 s); the device's is recorded"
    )
    wavelength_nm: float = Field(
        default=1310.0,
        ge=1250,
        le=1625,
        description="SENS:POW:WAV: the wavelength the readings are calibrated for",
    )
    poll_hz: float | None = Field(
        default=None,
        gt=0,
        le=10_000,
        description="fetches a second (default: one per averaging time, <= 1 kHz)",
    )
    timeout_s: float = Field(default=2.0, gt=0, le=60, description="per SCPI query")
    channels: dict[Annotated[int, Field(ge=1, le=8)], PowerMeterChannelSpec] = Field(
        min_length=1, description="channel number (1-8) → the fiber it taps"
    )

    @model_validator(mode="after")
    def _reachable(self) -> PowerMeterSpec:
        if not self.emulate and self.address is None:
            raise ValueError("a power meter needs `address` (or `emulate: true` to poll its emulator)")
        return self


MAX_SWITCH_NAME = 64
"""The longest switch name an inventory may give (an identifier: `ocs1`, `polatis-row3`)."""


class InventoryModel(ConfigModel):
    lab: str = Field(min_length=1, description="the lab's name (recorded with every run)")
    switches: dict[str, SwitchSpec] = Field(
        min_length=1,
        description="the optical circuit switches by name; each entry is its driver's config (`driver:`)",
    )
    hosts: dict[str, HostSpec] = Field(
        default_factory=dict,
        description="hosts and their NIC ports (a switch-only inventory, for `labctl ocs`, has none)",
    )
    profile: str = Field(
        default=DEFAULT_PROFILE,
        description="the delay profile of a simulated or emulated lab: one of `profiles:` or a built-in "
        "(`labctl run --profile` overrides it)",
    )
    profiles: dict[str, dict[str, Any]] = Field(
        default_factory=dict,
        description="more delay profiles by name: each sets profile fields, and may `extends:` another "
        "profile (of these or a built-in) for the rest",
    )
    kind: str = Field(
        default=DEFAULT_LAB_KIND,
        description="the kind of lab (labctl.core.registry.LAB_KINDS): simulated (in-process models), kernel "
        "(namespaces + veth + tc, root), agents (probes on `labctl agent`s over MQTT)",
    )
    broker: BrokerSpec | None = Field(
        default=None, description="MQTT broker between the controller and `labctl agent`s"
    )
    power_meters: dict[str, PowerMeterSpec] = Field(
        default_factory=dict, description="bench power meters whose channels tap switch or NIC ports"
    )

    @field_validator("switches", mode="before")
    @classmethod
    def _switch_names(cls, value: Any) -> Any:
        """A switch's name is an identifier: it is in every event source (`ocs:NAME/PORT`), thread name and
        message that speaks of the switch. One longer than MAX_SWITCH_NAME is refused here, before any
        driver or emulator is built (issue 45: a 100,000-character name on the serial-emulated lab ran
        on for seconds instead), in a line that shows its start only."""
        if isinstance(value, dict):
            for name in value:
                if isinstance(name, str) and len(name) > MAX_SWITCH_NAME:
                    long = f"is {len(name)} characters long (at most {MAX_SWITCH_NAME})"
                    raise ValueError(f"switch name {name[:32]!r}... {long}")
        return value

    @field_validator("kind")
    @classmethod
    def _known_kind(cls, value: str) -> str:
        known = registered_names("labctl.lab_kinds")  # labctl's and every installed package's
        if value not in known:
            raise ValueError(f"unknown lab kind {value!r} (known: {', '.join(known)})")
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
    module: bool = dataclass_field(default=True, compare=False, repr=False)
    """Whether the inventory declares a transceiver with a readable DOM on this port (`module:`)."""
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


@dataclass(frozen=True, slots=True)
class MeterChannel:
    """One power-meter channel, resolved against the inventory: the switch egress port whose light it
    measures and the NIC port that light feeds (None: a switch port no NIC listens on)."""

    meter: str
    channel: int
    switch: str
    egress: int
    nic: NicPort | None
    label: str
    """What it is mapped to, as the inventory writes it: `<switch>/<port>` or `<host>/<ifname>`."""

    @property
    def source(self) -> str:
        """The event `source` of its readings: pm:<meter>/ch<channel>."""
        return f"pm:{self.meter}/ch{self.channel}"


class Inventory:
    """A validated inventory with lookups the controller needs."""

    def __init__(
        self, model: InventoryModel, path: Path | None = None, src: SourcedYaml | None = None
    ) -> None:
        self.model = model
        self.path = path
        self.src = src
        self.ports: list[NicPort] = [
            NicPort(host, n.ifname, n.rail, n.gpu, n.switch, n.tx, n.rx, n.gbps, n.address, n.rdma, n.module)
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

    def meter_channels(self, meter: str) -> list[MeterChannel]:
        """The channels of power meter `meter`, in channel order, each resolved to its switch egress port
        and the NIC port it feeds (the inventory's references were checked when it loaded)."""
        by_rx = {(p.switch, p.rx): p for p in self.ports}
        by_name = {(p.host, p.ifname): p for p in self.ports}
        out = []
        for number, ch in sorted(self.model.power_meters[meter].channels.items()):
            if ch.host is not None and ch.nic is not None:
                nic = by_name[(ch.host, ch.nic)]
                out.append(MeterChannel(meter, number, nic.switch, nic.rx, nic, nic.label))
            else:
                assert ch.switch is not None and ch.port is not None
                fed = by_rx.get((ch.switch, ch.port))
                out.append(MeterChannel(meter, number, ch.switch, ch.port, fed, f"{ch.switch}/{ch.port}"))
        return out

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
    _check_power_meters(model, src)
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


def _check_power_meters(model: InventoryModel, src: SourcedYaml) -> None:
    """Each power-meter channel names a switch egress port or a NIC port of this inventory, and no fiber is
    tapped twice."""
    nics = {(host, n.ifname): n for host, spec in model.hosts.items() for n in spec.nics}
    tapped: dict[tuple[str, int], Loc] = {}
    for name, meter in model.power_meters.items():
        for number, ch in meter.channels.items():
            base: Loc = ("power_meters", name, "channels", str(number))
            if ch.host is not None and ch.nic is not None:
                if ch.host not in model.hosts:
                    known = ", ".join(model.hosts) or "none"
                    raise _fail(src, (*base, "host"), f"unknown host {ch.host!r} (known: {known})")
                nic = nics.get((ch.host, ch.nic))
                if nic is None:
                    known = ", ".join(n.ifname for n in model.hosts[ch.host].nics)
                    raise _fail(src, (*base, "nic"), f"{ch.host} has no NIC port {ch.nic!r} (known: {known})")
                key, loc = (nic.switch, nic.rx), (*base, "nic")
            else:
                assert ch.switch is not None and ch.port is not None
                switch = model.switches.get(ch.switch)
                if switch is None:
                    known = ", ".join(model.switches)
                    raise _fail(src, (*base, "switch"), f"unknown switch {ch.switch!r} (known: {known})")
                space = switch.space
                if not space.is_egress(ch.port):
                    raise _fail(
                        src,
                        (*base, "port"),
                        f"port {ch.port} is not an egress port of {ch.switch} "
                        f"({space.egress.start}..{space.egress.stop - 1}): a meter measures the light a "
                        "switch sends out",
                    )
                key, loc = (ch.switch, ch.port), (*base, "port")
            if key in tapped:
                raise _fail(
                    src, loc, f"{key[0]} port {key[1]} is already measured (at {format_loc(tapped[key])})"
                )
            tapped[key] = loc
