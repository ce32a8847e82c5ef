"""The private attributes of client libraries the drivers use, one test each: an upgrade that removes one
fails here, by name, not in a lab (issue 26). Each is pinned below the next minor release in
pyproject.toml; the rest of what the drivers use is public API."""

from __future__ import annotations

import inspect
import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


def test_ncclient_sshsession_still_has_its_private_writer() -> None:
    # labctl.ocs.drivers.polatis_netconf.connection._write: the framed request straight onto the channel
    ssh = pytest.importorskip("ncclient.transport.ssh")
    writer = getattr(ssh.SSHSession, "_transport_write", None)
    assert callable(writer), "ncclient's SSHSession._transport_write is gone: see connection._write"
    assert list(inspect.signature(writer).parameters) == ["self", "data"]


def test_pyvisa_py_socket_session_still_buffers_in_pending_buffer() -> None:
    # labctl.ocs.drivers.polatis_scpi.connection._buffered / _socket_of
    tcpip = pytest.importorskip("pyvisa_py.tcpip")
    source = inspect.getsource(tcpip.TCPIPSocketSession)
    assert "self._pending_buffer" in source, "pyvisa-py's TCPIPSocketSession._pending_buffer is gone"
    assert "self.interface" in source, "pyvisa-py's TCPIPSocketSession.interface is gone"


OWN = {"connection"}
"""Names in the drivers that are labctl's own objects (a listener class reaching its connection)."""
TESTED = {"_transport_write", "_pending_buffer"}


def test_every_private_attribute_the_drivers_read_of_another_object_is_tested_here() -> None:
    found = set()
    for path in (REPO / "labctl/ocs/drivers").rglob("*.py"):
        text = path.read_text()
        for owner, name in re.findall(r"\b([a-z_]+)\.(_[a-z][a-z_]*)", text):
            if owner not in {"self", "cls", "super", *OWN}:
                found.add(name)
        found.update(re.findall(r"getattr\([^)]*\"(_[a-z][a-z_]*)\"", text))
    assert found == TESTED, f"a library's private attribute without its test here: {sorted(found - TESTED)}"


def test_the_pins_bound_those_libraries() -> None:
    text = (REPO / "pyproject.toml").read_text()
    assert '"ncclient>=0.6.15,<0.8"' in text and '"pyvisa-py>=0.7,<0.9"' in text
    assert '"ncclient>=0.6.15"' not in text and '"pyvisa-py>=0.7"' not in text
