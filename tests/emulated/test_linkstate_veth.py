"""The real LINKSTATE_GET request against a kernel device: a veth in a namespace (up/down; no extended
state, which veth does not implement), and one clear error for an interface that does not exist."""

from __future__ import annotations

import subprocess

import pytest

from labctl.linux.linkstate import LinkStateReader
from labctl.linux.netlink import NetlinkError
from tests.emulated.conftest import NetnsFactory

pytestmark = pytest.mark.emulated


def test_the_link_of_a_veth_follows_its_peer(netns: NetnsFactory) -> None:
    ns = netns("ls")
    subprocess.run(["ip", "-n", ns, "link", "add", "la", "type", "veth", "peer", "name", "lb"], check=True)
    subprocess.run(["ip", "-n", ns, "link", "set", "la", "up"], check=True)
    reader = LinkStateReader("la", ns)
    try:
        down = reader.read()  # peer down: no carrier
        assert (down.link, down.ext_state, down.label) == (False, None, "down")
        subprocess.run(["ip", "-n", ns, "link", "set", "lb", "up"], check=True)
        assert reader.read().label == "up"
    finally:
        reader.close()
    missing = LinkStateReader("nope0", ns)
    try:
        with pytest.raises(NetlinkError, match="no interface nope0"):
            missing.read()
    finally:
        missing.close()
