"""The NIC-side model's per-port optical state as numpy arrays, one row per field, and the lists few-port
readers keep of them between reads (`labctl.models.fabric` writes them, `labctl.models.fabric_reads` reads
them)."""

from __future__ import annotations

import numpy as np

NEVER = np.iinfo(np.int64).max
"""A transport that is not coming up (its link dropped, or never lit)."""


class _Field:
    """A `PortArrays` array (a field, or a block). While few-port readers hold the optics as lists
    (`PortArrays.lists`), getting or setting the attribute first writes back what they changed and lets
    the lists go (`PortArrays.sync`): every reader and writer of the arrays finds them current, and the
    next few-port read takes the lists again. (A reference to an array kept across such a read would miss
    it: take the attribute each time, as the model does.)"""

    def __set_name__(self, owner: type, name: str) -> None:
        self.key = f"_{name}"

    def __get__(self, arrays: PortArrays, owner: type | None = None) -> np.ndarray:
        if arrays.lists is not None:
            arrays.sync()
        array: np.ndarray = arrays.__dict__[self.key]
        return array

    def __set__(self, arrays: PortArrays, array: np.ndarray) -> None:
        if arrays.lists is not None:
            arrays.sync()
        arrays.__dict__[self.key] = array


class _Optics:
    """`PortArrays.ints` and `.floats` as lists of rows, each a list by slot (`PortArrays.take_lists`)."""

    __slots__ = ("floats", "ints", "noise_changed")

    def __init__(self, ints: np.ndarray, floats: np.ndarray) -> None:
        self.ints: list[list[int]] = ints.tolist()
        self.floats: list[list[float]] = floats.tolist()
        self.noise_changed = False
        """A read drew noise into the lists (noise_db, noise_t_ns): `sync` writes those rows back."""


class PortArrays:
    """The per-port state the vectorized readers need, one numpy array per field (index: the port's slot).

    Probes of hundreds of ports sample every port every millisecond; reading a Python object per port per
    sample saturates a core at 512 ports, so the optical state lives here and a whole lab is read with a
    few array operations (`SimFabric.rx_power_mw`, `SimFabric.traffic_ok`).

    The integer fields are rows of one 2-D array (`ints`, in `INT_ROWS` order) and the float fields rows
    of another (`floats`, `FLOAT_ROWS`): each field is a view of its row, written as any array. A reader of
    a few ports of a large lab takes every field of them in one gather and one `tolist()`; in a small lab
    (up to LIST_PORTS) few-port readers share the blocks as lists (`take_lists`), kept from read to read
    until an array is got or set: a 1 kHz read of a small lab is then no numpy call at all but its noise
    draw (`SimFabric._rx_power_mw_each`, `passes_each`)."""

    INT_ROWS = (
        "link_t_ns", "transport_up_ns",  # a ping reads rows 0-3,
        "lit_from", "light_t_ns",
        "settle_ns", "update_ns", "update_phase_ns", "noise_t_ns",  # an Rx power read rows 2-7
    )  # fmt: skip
    FLOAT_ROWS = ("level_dbm", "atten_db", "before_mw", "noise_db")

    ints = _Field()
    floats = _Field()
    lit_from = _Field()  # slot of the port whose light reaches this one; -1 dark
    light_t_ns = _Field()
    # The port's latest link: the model time it lit (both directions carried light), and the model time
    # its transport comes up (NEVER: none). Written with the light change that lit it, before any reaction
    # runs; trusted while the port's light has not changed since (light_t_ns <= link_t_ns).
    link_t_ns = _Field()
    transport_up_ns = _Field()
    settle_ns = _Field()
    update_ns = _Field()  # the module's DOM refresh interval (0: current on every read)
    update_phase_ns = _Field()
    noise_t_ns = _Field()  # the refresh the noise on the module's current reading belongs to
    level_dbm = _Field()
    atten_db = _Field()  # what the switch's attenuator on the port's receive fiber takes off
    before_mw = _Field()  # power before the last light change: what a stale module still shows
    noise_db = _Field()  # the noise on the module's current reading

    def __init__(self, n: int) -> None:
        self.lists: _Optics | None = None
        """The blocks as lists, the current copy while few-port readers run one after another."""
        self._bind(np.zeros((len(self.INT_ROWS), n), np.int64), np.zeros((len(self.FLOAT_ROWS), n)))
        self.transport = np.zeros(n, bool)  # the transport transition has run (what listeners were told)
        self.lit_from[:] = -1
        self.transport_up_ns[:] = NEVER
        self.noise_t_ns[:] = -1

    def _bind(self, ints: np.ndarray, floats: np.ndarray) -> None:
        """The blocks, and each field as a view of its row."""
        fields = self.__dict__
        fields["_ints"], fields["_floats"] = ints, floats
        for row, name in enumerate(self.INT_ROWS):
            fields[f"_{name}"] = ints[row]
        for row, name in enumerate(self.FLOAT_ROWS):
            fields[f"_{name}"] = floats[row]

    def take_lists(self) -> _Optics:
        """The blocks as lists, current from now on until an array is got or set (`sync`)."""
        if self.lists is None:
            self.lists = _Optics(self.__dict__["_ints"], self.__dict__["_floats"])
        return self.lists

    def sync(self) -> None:
        """The arrays current again: the noise the lists drew written back, and the lists let go."""
        lists, self.lists = self.lists, None
        if lists is not None and lists.noise_changed:
            noise_t = self.INT_ROWS.index("noise_t_ns")
            self.__dict__["_ints"][noise_t] = lists.ints[noise_t]
            self.__dict__["_noise_db"][:] = lists.floats[self.FLOAT_ROWS.index("noise_db")]

    # A copy (copy.deepcopy, pickle) copies the two blocks and binds the fields to the copies' rows: copied
    # one by one, a field would be an array of its own, no longer the row the block reads.
    def __getstate__(self) -> dict[str, np.ndarray]:
        return {"ints": self.ints, "floats": self.floats, "transport": self.transport}

    def __setstate__(self, state: dict[str, np.ndarray]) -> None:
        self.lists = None
        self._bind(state["ints"], state["floats"])
        self.transport = state["transport"]
