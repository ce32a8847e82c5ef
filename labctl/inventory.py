"""The lab inventory (inventory.yaml): switches, hosts, GPUs, NIC ports and their fibers, delay profiles.

Validated in full before anything touches hardware. A bad file gets one line naming the file, line and
field. Secrets appear only as `${ENV_VAR}` references; they are resolved from the environment when a
driver connects and are never written back out.
"""

from __future__ import annotations

import os
import re
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, GetCoreSchemaHandler, ValidationError, field_validator
from pydantic_core import CoreSchema, core_schema

from labctl.errors import InputError
from labctl.mapping import PortSpace
from labctl.profiles import DEFAULT_PROFILE, Profile, resolve_profile
from labctl.yamlio import Loc, SourcedYaml, format_loc, load_yaml, pydantic_error_line

DEFAULT_INVENTORY = Path("inventory.yaml")
_ENV_REF = re.compile(r"^\$\{([A-Za-z_][A-Za-z0-9_]*)\}$")


class Secret:
    """A resolved secret. Its str/repr never show the value; call `reveal()` at the last moment."""

    __slots__ = ("_value", "name")

    def __init__(self, name: str, value: str) -> None:
        self.name = name
        self._value = value

    def reveal(self) -> str:
        return self._value

    def __repr__(self) -> str:
        return f"Secret(${{{self.name}}})"

    __str__ = __repr__


class SecretRef(str):
    """A `${ENV_VAR}` reference as written in the inventory; it is what gets snapshotted, never the value."""

    @property
    def env_name(self) -> str:
        m = _ENV_REF.match(self)
        assert m is not None
        return m[1]

    @classmethod
    def __get_pydantic_core_schema__(cls, source: Any, handler: GetCoreSchemaHandler) -> CoreSchema:
        return core_schema.no_info_plain_validator_function(
            _secret_ref,
            json_schema_input_schema=core_schema.str_schema(),
            serialization=core_schema.to_string_ser_schema(),
        )

    def resolve(self, where: str = "") -> Secret:
        value = os.environ.get(self.env_name)
        if value is None:
            at = f" (needed by {where})" if where else ""
            raise InputError(f"environment variable {self.env_name} is not set{at}")
        return Secret(self.env_name, value)


def _secret_ref(value: Any) -> SecretRef:
    if not isinstance(value, str) or not _ENV_REF.match(value):
        raise ValueError("secrets must be written as an environment reference like ${POLATIS_PASSWORD}")
    return SecretRef(value)


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid")


class GpuSpec(_Model):
    index: int = Field(ge=0)
    model: str = ""


class NicPortSpec(_Model):
    ifname: str = Field(min_length=1, max_length=15)
    rail: int = Field(ge=0)
    gpu: int | None = Field(default=None, ge=0, description="GPU index this NIC serves")
    switch: str
    tx: int = Field(description="OCS ingress port that this NIC port's transmit fiber lands on")
    rx: int = Field(description="OCS egress port that feeds this NIC port's receive fiber")
    gbps: int = Field(default=100, gt=0)
    address: str | None = Field(default=None, description="IPv4 address/prefix (emulated fabric)")


class HostSpec(_Model):
    address: str | None = None
    gpus: list[GpuSpec] = []
    nics: list[NicPortSpec] = Field(min_length=1)


SwitchDriver = Literal["sim", "polatis-tl1", "polatis-netconf", "scpi", "serial"]


class SwitchSpec(_Model):
    driver: SwitchDriver
    size: str = "32x32"
    address: str | None = None
    port: int | None = Field(default=None, ge=1, le=65535)
    user: str | None = None
    password: SecretRef | None = None
    timeout_s: float = Field(default=10.0, gt=0, description="deadline for one switch operation")
    emulate: bool = Field(
        default=False,
        description="start an in-process protocol emulator of this switch on 127.0.0.1 (ephemeral port) "
        "and drive it over real TCP (polatis-tl1)",
    )

    @field_validator("size", mode="before")
    @classmethod
    def _size_is_text(cls, value: object) -> object:
        # YAML reads `0x10` as the hex number 16: say what was meant instead of "should be a valid string".
        if isinstance(value, int | float) and not isinstance(value, bool):
            raise ValueError(f"{value!r} is a number here; write the port space as INxOUT, e.g. 16x16")
        return value

    @field_validator("size")
    @classmethod
    def _size_parses(cls, value: str) -> str:
        try:
            PortSpace.parse(value)
        except InputError as e:
            raise ValueError(str(e)) from None
        return value

    @property
    def space(self) -> PortSpace:
        return PortSpace.parse(self.size)


class BrokerTlsSpec(_Model):
    """TLS to the MQTT broker: file paths only (keys stay on disk, never in the inventory)."""

    ca_file: str | None = None
    cert_file: str | None = None
    key_file: str | None = None


class BrokerSpec(_Model):
    """The MQTT broker between the controller and `labctl agent`s; without it everything is one process."""

    url: str = Field(default="mqtt://127.0.0.1:1883", description="mqtt://HOST:PORT or mqtts://HOST:PORT")
    username: SecretRef | None = None
    password: SecretRef | None = None
    auth_key: SecretRef | None = Field(
        default=None, description="HMAC-SHA256 key: every labctl message is signed and checked with it"
    )
    tls: BrokerTlsSpec | None = None
    clock_sync_interval_s: float = Field(default=10.0, gt=0, description="re-measure agent clock offsets")
    clock_samples: int = Field(default=16, ge=4, le=1000, description="ping/pong samples per measurement")

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


class InventoryModel(_Model):
    lab: str = Field(min_length=1)
    switches: dict[str, SwitchSpec] = Field(min_length=1)
    hosts: dict[str, HostSpec] = Field(min_length=1)
    profile: str = DEFAULT_PROFILE
    profiles: dict[str, dict[str, Any]] = {}
    fabric: Literal["simulated", "emulated"] = Field(
        default="simulated",
        description="simulated: in-process NIC models; emulated: kernel namespaces + veth + tc (root, Linux)",
    )
    broker: BrokerSpec | None = Field(
        default=None, description="MQTT broker for multi-host agents (`labctl agent`); absent: one process"
    )


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

    @property
    def source(self) -> str:
        """The event `source` of every signal observed on this port."""
        return f"nic:{self.host}/{self.ifname}"

    @property
    def label(self) -> str:
        return f"{self.host}/{self.ifname}"


class Inventory:
    """A validated inventory with lookups the controller needs."""

    def __init__(self, model: InventoryModel, path: Path | None = None) -> None:
        self.model = model
        self.path = path
        self.ports: list[NicPort] = [
            NicPort(host, n.ifname, n.rail, n.gpu, n.switch, n.tx, n.rx, n.gbps, n.address)
            for host, spec in model.hosts.items()
            for n in spec.nics
        ]
        self._by_source = {p.source: p for p in self.ports}

    @property
    def lab(self) -> str:
        return self.model.lab

    @property
    def switches(self) -> dict[str, SwitchSpec]:
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

    def snapshot(self) -> dict[str, Any]:
        """The inventory as JSON-able data, secrets left as their `${ENV}` references."""
        return self.model.model_dump(mode="json")


def load_inventory(path: Path | str = DEFAULT_INVENTORY) -> Inventory:
    """Load and fully validate an inventory file; raise InputError with `file:line: field: problem`."""
    path = Path(path)
    src = load_yaml(path, "inventory")
    try:
        model = InventoryModel.model_validate(src.data)
    except ValidationError as e:
        raise InputError(pydantic_error_line(src, e)) from None
    _check_references(model, src)
    inventory = Inventory(model, path)
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
            space = switch.space
            for field, want_ingress in (("tx", True), ("rx", False)):
                port = getattr(nic, field)
                loc = (*base, field)
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
