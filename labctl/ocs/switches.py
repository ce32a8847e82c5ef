"""What labctl knows about a kind of switch: its registry entry, `SwitchDriver`.

An entry holds the driver's inventory config model (a `labctl.inventory.config.SwitchConfig` subclass whose
`driver` field is a Literal of the entry's name: the inventory picks the model by it), and up to three
ways to build it:
- `open`: the driver for a switch at its address (real hardware, or an emulator someone started);
- `emulate`: the driver for the lab's own behaviour model of the switch, either directly (`sim`) or over
  real sockets to this driver's protocol emulator running around the model (`emulate: true`);
- `emulator`: the protocol emulator as a standalone server (`labctl emulate ocs DRIVER`).
Entries live in their driver's package and import the driver itself (and any optional dependency) only
when one of these is called. labctl.core.registry says where each entry is.
"""

from __future__ import annotations

import contextlib
from collections.abc import Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Annotated, Any, Generic, Literal, Protocol, TypeVar, Union, cast

from pydantic import Field, create_model, model_validator

from labctl.core.errors import InputError
from labctl.core.registry import Registry
from labctl.inventory.config import SwitchConfig
from labctl.inventory.mapping import Mapping as Patches
from labctl.ocs.protocol import ApplyResult, EventSink, OpticalSwitch, Timed

if TYPE_CHECKING:  # names in signatures only: loading an inventory loads no emulator or model
    from labctl.emulators.core import FaultPlan
    from labctl.models.switch import SwitchModel

__all__ = [  # the public surface (docs/architecture.md, "Public surface"); the rest is internal
    "EmulatedSwitch",
    "Emulator",
    "EmulatorFrontEnd",
    "EmulatorOptions",
    "ServedSwitch",
    "SwitchDriver",
    "config_union",
    "emulate_switch",
    "open_switch",
    "switch_drivers",
]

C = TypeVar("C", bound=SwitchConfig)


@dataclass(frozen=True)
class EmulatedSwitch:
    """A driver over the lab's switch model, with what must run around it (its emulator's server)."""

    switch: OpticalSwitch
    start: Callable[[], Awaitable[None]] | None = None
    """Before the switch connects (serve the emulator)."""
    close: Callable[[], Awaitable[None]] | None = None
    """After the switch has closed."""


class Emulator(Protocol):
    """A protocol emulator serving one switch model (labctl.emulators.core.SwitchEmulator)."""

    port: int

    async def start(self) -> None: ...

    async def close(self) -> None: ...


@dataclass(frozen=True)
class EmulatorOptions:
    """How `labctl emulate ocs` serves an emulator: where, whom it lets in, which faults it injects."""

    host: str = "127.0.0.1"
    port: int = 0
    users: Mapping[str, str] = field(default_factory=dict)
    faults: FaultPlan | None = None
    session_timeout_s: float | None = None


@dataclass(frozen=True)
class EmulatorFrontEnd:
    protocol: str
    """What it speaks, for `--help` and logs (e.g. "TL1 over TCP")."""
    default_port: int
    serve: Callable[[SwitchModel, EmulatorOptions], Emulator]
    password_env: str = "LABCTL_EMULATOR_PASSWORD"
    """Where `labctl emulate ocs` reads the password it accepts, unless told otherwise."""


@dataclass(frozen=True)
class SwitchDriver(Generic[C]):
    name: str
    config: type[C]
    description: str
    open: Callable[[str, C, EventSink], OpticalSwitch] | None = None
    emulate: Callable[[str, C, SwitchModel, EventSink], EmulatedSwitch] | None = None
    emulator: EmulatorFrontEnd | None = None
    measures_power: bool = True
    """The switch has optical power monitors; without them `port_power` reads None (nothing measured)
    for every port and the switch-power probe has nothing to sample."""


switch_drivers: Registry[SwitchDriver[Any]] = Registry("switch driver", "labctl.switch_drivers", SwitchDriver)


def config_union() -> Any:
    """Every registered driver's config model, told apart by `driver` (a pydantic discriminated union). A
    driver that does not load (a broken plugin, a name two packages claim) has a stand-in that refuses any
    switch naming it with the registry's one line, so every other driver still loads."""
    models: list[type[SwitchConfig]] = [entry.config for entry in switch_drivers.all().values()]
    models += [_unusable(name, problem) for name, problem in switch_drivers.problems().items()]
    return Annotated[Union[tuple(models)], Field(discriminator="driver")]  # noqa: UP007 - a runtime tuple


def _unusable(name: str, problem: Exception) -> type[SwitchConfig]:
    """A config model for `driver: NAME` whose validation fails with `problem`."""
    message = str(problem)

    def refuse(cls: type[SwitchConfig], data: Any) -> Any:
        raise ValueError(message)

    validator: Any = model_validator(mode="before")(classmethod(refuse))  # type: ignore[arg-type]
    return create_model(
        f"Unusable_{name}",
        __base__=SwitchConfig,
        __validators__={"_refuse": validator},
        driver=(cast(Any, Literal)[name], ...),
    )


def open_switch(name: str, config: SwitchConfig, emit: EventSink) -> OpticalSwitch:
    """The driver for an inventory switch that is hardware at an address."""
    entry = switch_drivers.get(config.driver)
    if entry.open is None:
        raise InputError(
            f"switch {name} ({config.driver}) exists only as a model inside a run; `labctl ocs` drives "
            "switches at an address"
        )
    if config.over_model:
        serve = f"`labctl emulate ocs {config.driver}`" if entry.emulator is not None else "its emulator"
        raise InputError(
            f"switch {name} ({config.driver}) is emulated inside each run (emulate: true); to drive one from "
            f"here, serve it with {serve} and give the switch that address instead"
        )
    switch = entry.open(name, config, emit)
    _report_connect_failures(switch, config)
    return switch


def _report_connect_failures(switch: OpticalSwitch, config: SwitchConfig) -> None:
    """A failed `connect` says in one line what stopped it: `switch NAME at ADDRESS: CAUSE` (decision 0066).
    The transport raises that line itself where it sees the cause; the switch's connect deadline cannot,
    so `connect` is wrapped to read how far the transport got (`labctl.ocs.connect_errors`). The wrapper is
    the instance's own `connect`: the switch stays the driver's class for whoever asks."""
    from labctl.ocs.connect_errors import report_connect_failures

    reporting = report_connect_failures(switch.name, switch.connect, config.timeout_s)
    with contextlib.suppress(AttributeError):  # a plugin driver without instance attributes: its own words
        setattr(switch, "connect", reporting)  # noqa: B010 - an instance attribute, not the class's method


class ServedSwitch:
    """A driver together with the emulator it talks to, as one `OpticalSwitch`: `connect` starts the
    emulator and then connects the driver; `close` closes the driver and then the emulator. Whoever drives
    it (a run, the scheduler's recovery, a test) starts and stops nothing else."""

    def __init__(self, emulated: EmulatedSwitch) -> None:
        self.switch = emulated.switch
        self.name = emulated.switch.name
        self.space = emulated.switch.space
        self._start = emulated.start
        self._stop = emulated.close
        self._serving = False

    async def connect(self) -> None:
        if self._start is not None and not self._serving:
            await self._start()
            self._serving = True
        try:
            await self.switch.connect()
        except BaseException:
            await self._stop_serving()
            raise

    async def close(self) -> None:
        try:
            await self.switch.close()
        finally:
            await self._stop_serving()

    async def _stop_serving(self) -> None:
        if self._serving:
            self._serving = False
            if self._stop is not None:
                await self._stop()

    async def get_mapping(self) -> Timed[Patches]:
        return await self.switch.get_mapping()

    async def apply(
        self,
        mapping: Iterable[tuple[int, int]],
        *,
        scope: Iterable[int] | None = None,
        context: dict[str, Any] | None = None,
    ) -> Timed[ApplyResult]:
        return await self.switch.apply(mapping, scope=scope, context=context)

    async def disconnect(
        self, ports: Iterable[int], *, context: dict[str, Any] | None = None
    ) -> Timed[ApplyResult]:
        return await self.switch.disconnect(ports, context=context)

    async def port_power(self, ports: Iterable[int]) -> Timed[dict[int, float | None]]:
        return await self.switch.port_power(ports)


def emulate_switch(name: str, config: SwitchConfig, model: SwitchModel, emit: EventSink) -> OpticalSwitch:
    """The driver for the lab's model of an inventory switch (`sim`, or `emulate: true`): with its
    emulator, if it has one, started on connect and stopped on close."""
    entry = switch_drivers.get(config.driver)
    if not config.over_model or entry.emulate is None:
        raise InputError(
            f"switch {name} ({config.driver}) is hardware at an address: it cannot light this lab's modeled "
            "NIC ports"
            + ("; set `emulate: true` to drive its emulator instead" if entry.emulate is not None else "")
        )
    emulated = entry.emulate(name, config, model, emit)
    if emulated.start is None and emulated.close is None:
        return emulated.switch
    return ServedSwitch(emulated)
