"""A process-wide read-only switch over every path through which labctl changes a Linux host.

On a machine that is only lent (bench/device_check.py on a GPU server), nothing may change a setting: no
link mode, FEC or private flag, no link taken down or up, no sysctl. `forbid_writes()` turns the switch on
for the rest of the process; from then on every SET path calls `check_write()` first and raises
`WritesForbidden` before a byte is sent. The paths that check it: the ethtool netlink SETs
(labctl.linux.ethtool_link.EthtoolLink.set_linkmodes / set_fec / set_privflags: LINKMODES_SET, FEC_SET,
PRIVFLAGS_SET), every rtnetlink request that changes something (labctl.linux.rtnl.Rtnl.request: link
up/down, veth creation, qdiscs, filters) and labctl.linux.netns.write_sysctl. Reads (GETs, dumps, module
EEPROM reads) are not affected.

`read_only()` is the same switch for a `with` block (tests), restoring what was there before.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

from labctl.core.errors import LabctlError


class WritesForbidden(LabctlError):
    """A SET path was called while writes are forbidden in this process."""


_forbidden = False


def forbid_writes() -> None:
    """Refuse every SET path for the rest of this process."""
    global _forbidden
    _forbidden = True


def writes_forbidden() -> bool:
    return _forbidden


def check_write(what: str) -> None:
    """Raise WritesForbidden (naming `what`) when writes are forbidden; do nothing otherwise."""
    if _forbidden:
        raise WritesForbidden(f"read-only: refused to {what} (writes are forbidden in this process)")


@contextlib.contextmanager
def read_only() -> Iterator[None]:
    """Writes forbidden inside the block; the switch as it was afterwards."""
    global _forbidden
    before = _forbidden
    _forbidden = True
    try:
        yield
    finally:
        _forbidden = before
