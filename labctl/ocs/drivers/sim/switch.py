"""The simulated switch driver: `OpticalSwitch` over an in-process `SwitchModel`.

It has no transport and no codec, only the model; everything else (validation, diff, read-back,
retries, events, deadlines) is the same code path as the real drivers (`labctl.ocs.protocol.converge`).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from labctl.core.clock import now_ns
from labctl.core.errors import HardwareError, InputError
from labctl.core.events import Event, Kind
from labctl.inventory.mapping import Mapping, MappingDiff, PortSpace
from labctl.models.switch import SwitchModel, VoaSetting
from labctl.ocs.protocol import (
    OCS_VOA,
    ApplyResult,
    EventSink,
    SwitchOps,
    Timed,
    TimeoutPolicy,
    check_attenuation,
    check_owned,
    check_ports,
    converge,
)


class SimSwitch:
    """Satisfies `OpticalSwitch` and `VariableAttenuator`. Switching time comes from the model's delay
    profile; an attenuation is the model's RELATIVE attenuator setting, as the NETCONF driver sets it.

    `name` and `space` are what the inventory says (default: the model's); like a real driver, `connect`
    refuses a switch whose size differs from the inventory's."""

    def __init__(
        self,
        model: SwitchModel,
        emit: EventSink,
        timeouts: TimeoutPolicy | None = None,
        *,
        name: str | None = None,
        space: PortSpace | None = None,
        owned: frozenset[int] | None = None,
    ) -> None:
        self.model = model
        self.name = name or model.name
        self.space: PortSpace = space or model.space
        self.owned = owned
        self.timeouts = timeouts or TimeoutPolicy()
        self._emit = emit
        self._connected = False

    async def connect(self) -> None:
        if self.model.space != self.space:
            raise InputError(
                f"switch {self.name}: the inventory says {self.space} but the model is {self.model.space}"
            )
        self._connected = True

    async def close(self) -> None:
        self._connected = False

    def _require_connected(self) -> None:
        if not self._connected:
            raise HardwareError(f"{self.name}: not connected")

    async def _read(self) -> Mapping:
        return self.model.patches

    async def _send(self, diff: MappingDiff) -> None:
        await self.model.execute(diff)

    async def get_mapping(self) -> Timed[Mapping]:
        self._require_connected()
        start = now_ns()
        mapping = await self._read()
        end = now_ns()
        self._emit(
            Event(
                t_ns=end,
                kind=Kind.OCS_READ,
                source=f"ocs:{self.name}",
                value=len(mapping),
                meta={"patches": sorted(mapping), "elapsed_ns": end - start},
            )
        )
        return Timed(mapping, start, end)

    async def apply(
        self,
        mapping: Iterable[tuple[int, int]],
        *,
        scope: Iterable[int] | None = None,
        context: dict[str, Any] | None = None,
    ) -> Timed[ApplyResult]:
        self._require_connected()
        start = now_ns()
        async with self.timeouts.deadline(self.name, "apply"):
            result = await converge(
                self.name,
                self.space,
                SwitchOps(self._read, self._send, owned=self.owned),
                mapping,
                scope,
                self._emit,
                context,
            )
        return Timed(result, start, now_ns())

    async def disconnect(
        self, ports: Iterable[int], *, context: dict[str, Any] | None = None
    ) -> Timed[ApplyResult]:
        return await self.apply((), scope=ports, context=context)

    async def port_power(self, ports: Iterable[int]) -> Timed[dict[int, float | None]]:
        self._require_connected()
        wanted = check_ports(self.name, self.space, ports)
        start = now_ns()
        powers = {p: self.model.monitor_dbm(p) for p in wanted}
        end = now_ns()
        for port, dbm in powers.items():
            self._emit(
                Event(
                    t_ns=end,
                    kind=Kind.RX_POWER,
                    source=f"ocs:{self.name}/{port}",
                    value=dbm,
                    meta={"monitor": "switch"},
                )
            )
        return Timed(powers, start, end)

    # -- VariableAttenuator ---------------------------------------------------------------------------------
    async def set_attenuation(self, ports: Iterable[int], atten_db: float) -> Timed[None]:
        self._require_connected()
        wanted = check_attenuation(self.name, self.space, ports, atten_db)
        check_owned(self.name, self.owned, wanted, "the attenuation")
        start = now_ns()
        mode = "VOA_MODE_RELATIVE" if atten_db > 0 else "VOA_MODE_NONE"
        for port in wanted:
            self.model.set_voa(port, VoaSetting(mode, round(atten_db, 2) if atten_db > 0 else 0.0))
        end = now_ns()
        for port in wanted:
            self._emit(
                Event(
                    t_ns=end,
                    kind=OCS_VOA,
                    source=f"ocs:{self.name}/{port}",
                    value=float(atten_db),
                    meta={"port": port, "mode": mode, "level": float(atten_db)},
                )
            )
        return Timed(None, start, end)

    async def read_attenuation(self, ports: Iterable[int]) -> Timed[dict[int, float | None]]:
        self._require_connected()
        wanted = check_ports(self.name, self.space, ports)
        start = now_ns()
        out: dict[int, float | None] = {}
        for port in wanted:
            setting = self.model.voa_setting(port)
            relative = setting.mode == "VOA_MODE_RELATIVE" and setting.reference == 0
            out[port] = 0.0 if setting.mode == "VOA_MODE_NONE" else setting.level if relative else None
        return Timed(out, start, now_ns())
