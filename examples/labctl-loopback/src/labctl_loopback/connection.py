"""The loopback protocol's transport: one request line out, one reply line back, in order.

A real driver's transport owns a socket (TCP: labctl/ocs/drivers/polatis_tl1/connection.py) or a serial line
(labctl/ocs/drivers/dicon_serial/port.py) and knows nothing of what the lines mean. Here the far end is a
responder in this process that answers from the lab's `SwitchModel`, so the example runs anywhere.
"""

from __future__ import annotations

from labctl.inventory.mapping import MappingDiff
from labctl.models.switch import ChangeRefused, SwitchModel


class LoopbackConnection:
    def __init__(self, model: SwitchModel) -> None:
        self.model = model

    async def request(self, line: str) -> str:
        verb, *args = line.split()
        ports = [int(a) for a in args]
        model = self.model
        if verb == "SIZE?":
            return str(model.space)
        if verb == "PATCHES?":
            return ",".join(f"{i}>{e}" for i, e in sorted(model.patches))
        if verb == "POWER?":
            dbm = model.power_dbm(ports[0])
            return "DARK" if dbm is None else f"{dbm:.2f}"
        if verb == "CONNECT":
            diff = MappingDiff(frozenset(), frozenset({(ports[0], ports[1])}))
        elif verb == "DISCONNECT":
            diff = MappingDiff(frozenset(p for p in model.patches if p[0] == ports[0]), frozenset())
        else:
            return f"ERR unknown command {verb}"
        try:
            await model.execute(diff)  # returns once the mirrors have moved (the profile's switching time)
        except ChangeRefused as e:
            return f"ERR {e}"
        return "OK"
