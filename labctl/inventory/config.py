"""Configuration building blocks shared by the inventory and every driver's config model.

A strict base model (unknown fields are errors), secrets as `${ENV_VAR}` references resolved only at
the last moment, and `SwitchConfig`: what every switch entry of an inventory has. Each switch driver
extends `SwitchConfig` with its own fields and narrows `driver` to its registry name; the inventory picks
the model by that field (a discriminated union built from the registry, labctl.ocs.switches).
"""

from __future__ import annotations

import os
import re
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, GetCoreSchemaHandler, field_validator, model_validator
from pydantic_core import CoreSchema, core_schema

from labctl.core.errors import InputError
from labctl.inventory.mapping import PortSpace
from labctl.ocs.protocol import TimeoutPolicy

__all__ = [  # the public surface (docs/architecture.md, "Public surface"); the rest is internal
    "ConfigModel",
    "NetworkSwitchConfig",
    "Secret",
    "SecretRef",
    "SwitchConfig",
]

_ENV_REF = re.compile(r"^\$\{([A-Za-z_][A-Za-z0-9_]*)\}$")


class ConfigModel(BaseModel):
    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)


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


class SwitchConfig(ConfigModel):
    """Every switch: which driver, its port space, and the one deadline for an operation on it."""

    driver: str = Field(description="the switch driver (`labctl plugins` lists them)")
    size: str = Field(
        default="32x32",
        description="the port space, INxOUT: 32x32 is ingress ports 1-32 and egress ports 33-64",
    )
    timeout_s: float = Field(default=10.0, gt=0, le=3600, description="deadline for one switch operation")
    owned_ports: list[int | str] | None = Field(
        default=None,
        description="on a switch shared with other labs: the ports this lab owns, as numbers and ranges "
        "('1-16'); nothing outside them is ever patched or unpatched (default: every port)",
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

    @property
    def owned(self) -> frozenset[int] | None:
        """The owned ports as a set (None: the whole switch)."""
        if self.owned_ports is None:
            return None
        ports: set[int] = set()
        for item in self.owned_ports:
            if isinstance(item, int):
                ports.add(item)
            else:
                low, _, high = item.partition("-")
                ports.update(range(int(low), int(high or low) + 1))
        return frozenset(ports)

    @model_validator(mode="after")
    def _owned_ports_exist(self) -> SwitchConfig:
        if self.owned_ports is None:
            return self
        for item in self.owned_ports:
            if isinstance(item, str):
                m = re.fullmatch(r"(\d{1,6})(?:-(\d{1,6}))?", item.strip())
                if m is None or (m[2] is not None and int(m[2]) < int(m[1])):
                    raise ValueError(f"owned_ports: {item!r} is not a port or a range like 1-16")
        owned = self.owned or frozenset()
        outside = sorted(p for p in owned if p not in self.space.all_ports)
        if outside:
            raise ValueError(f"owned_ports: {outside[:5]} are not ports of a {self.size} switch")
        return self

    @property
    def over_model(self) -> bool:
        """True when the switch is the lab's behaviour model (driven in-process or through its emulator),
        False when it is hardware at an address."""
        return False

    def timeouts(self) -> TimeoutPolicy:
        return TimeoutPolicy(connect_s=self.timeout_s, operation_s=self.timeout_s)


class NetworkSwitchConfig(SwitchConfig):
    """A switch reached over the network. With `emulate: true` the lab runs this driver's protocol
    emulator around its own switch model (127.0.0.1, ephemeral port, a one-time password unless one is
    given) and the driver talks to that over real TCP; otherwise `address` and `user` are required."""

    address: str | None = Field(default=None, description="the switch's host name or IP address")
    port: int | None = Field(
        default=None, ge=1, le=65535, description="its TCP port (default: the protocol's usual one)"
    )
    user: str | None = Field(default=None, description="the user to log in as")
    password: SecretRef | None = Field(
        default=None,
        description="the password, as a reference to the environment (`${POLATIS_PASSWORD}`): never the "
        "password itself in the file",
    )
    emulate: bool = Field(
        default=False,
        description="drive this driver's protocol emulator around the lab's switch model instead of an "
        "address",
    )

    @model_validator(mode="after")
    def _reachable(self) -> NetworkSwitchConfig:
        if not self.emulate:
            missing = [f for f in ("address", "user") if getattr(self, f) is None]
            if missing:
                raise ValueError(
                    f"a {self.driver} switch needs {' and '.join(missing)} (or `emulate: true` to drive its "
                    "emulator)"
                )
        return self

    @property
    def over_model(self) -> bool:
        return self.emulate
