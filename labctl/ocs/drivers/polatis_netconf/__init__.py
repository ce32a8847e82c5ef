"""Polatis NETCONF (the `polatis-netconf` driver): its inventory config and its registry entry.

This is all labctl needs to know the driver exists; the driver (switch.py over connection.py and codec.py,
on ncclient) and its emulator (labctl.emulators.netconf, on asyncssh) are imported only when a switch is
opened, emulated or served, and need the `[netconf]` extra. Decision: docs/decisions/0031.
"""

from __future__ import annotations

import re
import secrets
from pathlib import Path
from typing import TYPE_CHECKING, Literal

from pydantic import Field, field_validator, model_validator

from labctl.core.extras import require
from labctl.inventory.config import NetworkSwitchConfig, Secret, SecretRef
from labctl.ocs.switches import EmulatedSwitch, Emulator, EmulatorFrontEnd, EmulatorOptions, SwitchDriver

if TYPE_CHECKING:  # in annotations only: loading the config union loads no switch model (numpy)
    from labctl.models.switch import SwitchModel
    from labctl.ocs.protocol import EventSink, OpticalSwitch

DEFAULT_PORT = 830  # NETCONF over SSH (RFC 6242; "Polatis default: 830", reference §2.4)
PURPOSE = "the polatis-netconf driver"
_SHA256 = re.compile(r"^SHA256:[A-Za-z0-9+/]{43}=?$")


class PolatisNetconfConfig(NetworkSwitchConfig):
    """A Polatis switch over NETCONF/SSH: `address`, `port` (default 830), `user`, `password: ${ENV}`, and
    which SSH host key it may present: `host_key: known-hosts` (the default: an entry for the address in
    `known_hosts`, default ~/.ssh/known_hosts) or `host_key: pinned` with `host_key_sha256: SHA256:…` (as
    `ssh-keygen -lf` prints it). An unknown key is refused before the password is sent. With
    `emulate: true` the driver pins the key its emulator generated for the run and these fields are unused."""

    driver: Literal["polatis-netconf"] = Field(
        description="a Polatis switch over NETCONF (SSH, port 830 by default)"
    )
    host_key: Literal["known-hosts", "pinned"] = Field(
        default="known-hosts", description="how the switch's SSH host key is checked"
    )
    known_hosts: str | None = Field(
        default=None,
        description="OpenSSH known_hosts file (default: ~/.ssh/known_hosts); host_key: known-hosts",
    )
    host_key_sha256: str | None = Field(
        default=None, description="the switch's host key fingerprint, SHA256:…; host_key: pinned"
    )

    @field_validator("host_key_sha256")
    @classmethod
    def _fingerprint_form(cls, value: str | None) -> str | None:
        if value is not None and not _SHA256.match(value.strip()):
            raise ValueError(
                "write the fingerprint as ssh-keygen -l prints it: SHA256: and 43 base64 characters"
            )
        return None if value is None else value.strip()

    @model_validator(mode="after")
    def _policy_complete(self) -> PolatisNetconfConfig:
        if self.host_key == "pinned" and self.host_key_sha256 is None and not self.emulate:
            raise ValueError(
                "host_key: pinned needs host_key_sha256: SHA256:… (ssh-keygen -lf of the switch's key)"
            )
        if self.host_key == "known-hosts" and self.host_key_sha256 is not None:
            raise ValueError("host_key_sha256 is only read with host_key: pinned")
        if self.host_key == "pinned" and self.known_hosts is not None:
            raise ValueError("known_hosts is only read with host_key: known-hosts")
        return self


def _require_ncclient() -> None:
    """Import ncclient now (one line naming the extra if it is missing), not inside the first connect's
    deadline: importing it and paramiko takes a good part of a second on a slow machine."""
    for module in ("ncclient", "ncclient.transport", "ncclient.devices.default"):
        require(module, "netconf", PURPOSE)


def _open(name: str, config: PolatisNetconfConfig, emit: EventSink) -> OpticalSwitch:
    _require_ncclient()
    from .connection import Endpoint, HostKeyPolicy
    from .switch import PolatisNetconfSwitch

    assert config.address is not None and config.user is not None  # the config requires them
    if config.host_key == "pinned":
        policy = HostKeyPolicy(sha256=config.host_key_sha256)
    else:
        policy = HostKeyPolicy(known_hosts=Path(config.known_hosts or "~/.ssh/known_hosts").expanduser())
    return PolatisNetconfSwitch(
        name,
        config.space,
        endpoint=Endpoint(config.address, config.port or DEFAULT_PORT),
        user=config.user,
        password=config.password,
        host_keys=policy,
        emit=emit,
        timeouts=config.timeouts(),
        owned=config.owned,
    )


def _emulate(name: str, config: PolatisNetconfConfig, model: SwitchModel, emit: EventSink) -> EmulatedSwitch:
    """The real NETCONF driver over SSH to a NETCONF emulator of `model` (127.0.0.1, ephemeral port), which
    serves from before the switch connects until after it has closed. The driver pins the host key the
    emulator generated; without `user`/`password` a one-time password is generated for the run."""
    _require_ncclient()
    require("asyncssh", "netconf", "the NETCONF emulator")
    from labctl.emulators.netconf import NetconfEmulator

    from .connection import Endpoint, HostKeyPolicy
    from .switch import PolatisNetconfSwitch

    user = config.user or "admin"
    password: SecretRef | Secret = config.password or Secret(
        "LABCTL_EMULATOR_ONE_TIME_PASSWORD", secrets.token_urlsafe(18)
    )
    emulator = NetconfEmulator(model, users={})
    driver = PolatisNetconfSwitch(
        name,
        config.space,
        endpoint=Endpoint("127.0.0.1", 0),
        user=user,
        password=password,
        host_keys=HostKeyPolicy(sha256=emulator.host_key_sha256),
        emit=emit,
        timeouts=config.timeouts(),
        owned=config.owned,
    )

    async def start() -> None:
        secret = password.resolve(f"switch {name}") if isinstance(password, SecretRef) else password
        emulator.add_user(user, secret.reveal())
        await emulator.start()
        driver.endpoint = Endpoint(*emulator.address)

    return EmulatedSwitch(driver, start=start, close=emulator.close)


def _serve(model: SwitchModel, options: EmulatorOptions) -> Emulator:
    require("asyncssh", "netconf", "the NETCONF emulator")
    from labctl.emulators.netconf import NetconfEmulator

    emulator = NetconfEmulator(
        model,
        users=options.users,
        host=options.host,
        port=options.port,
        faults=options.faults,
        session_timeout_s=options.session_timeout_s,
    )
    return emulator


DRIVER = SwitchDriver(
    name="polatis-netconf",
    config=PolatisNetconfConfig,
    description="Polatis optical switch over NETCONF (SSH, port 830; needs the [netconf] extra)",
    open=_open,
    emulate=_emulate,
    emulator=EmulatorFrontEnd("NETCONF over SSH", DEFAULT_PORT, _serve, password_env="POLATIS_PASSWORD"),
)
