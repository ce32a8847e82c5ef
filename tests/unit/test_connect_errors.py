"""The words of a failed connection (labctl.ocs.connect_errors, decision 0066)."""

from __future__ import annotations

import errno
import logging
import os
import socket
import threading

import pytest

from labctl.core.errors import HardwareError
from labctl.ocs.connect_errors import (
    ConnectAttempt,
    ConnectFailed,
    answered_not,
    format_address,
    os_cause,
    report_connect_failures,
    sample,
)


def test_the_line_names_switch_address_and_cause() -> None:
    e = ConnectFailed("ocs1", format_address("::1", 830), "connection refused")
    assert str(e) == "switch ocs1 at [::1]:830: connection refused" and isinstance(e, HardwareError)
    assert format_address("socket://10.0.0.5:10001") == "socket://10.0.0.5:10001"


@pytest.mark.parametrize(
    ("error", "cause"),
    [
        (OSError(errno.ECONNREFUSED, "Connection refused"), "connection refused"),
        (OSError(errno.EHOSTUNREACH, "No route to host"), "no route to host"),
        (OSError(errno.ENETUNREACH, "Network is unreachable"), "network unreachable"),
        (TimeoutError("timed out"), "timed out after 2 s: no answer to the connection request"),
        (socket.gaierror(socket.EAI_NONAME, "Name or service not known"), "cannot resolve the host name 'x'"),
    ],
)
def test_os_errors_are_named(error: OSError, cause: str) -> None:
    assert os_cause(error, 2.0, "x").startswith(cause)


def test_a_wrapped_os_error_is_found_in_the_chain() -> None:
    inner = OSError(errno.EHOSTUNREACH, os.strerror(errno.EHOSTUNREACH))
    outer = RuntimeError("Could not open port socket://h:1: [Errno 113]")
    outer.__context__ = inner  # as a library's `raise ... ` inside its `except OSError` leaves it
    assert os_cause(outer) == "no route to host"


def test_what_a_peer_sent_is_quoted_short_and_printable() -> None:
    assert sample(b"\x00\xffgarbage\xfe\n") == "'\\x00\\xffgarbage\\xfe'"
    assert sample(b"HTTP/1.1 400 Bad Request\r\nServer: x\r\n") == "'HTTP/1.1 400 Bad Request'…"
    assert answered_not("TL1", b"SSH-2.0-OpenSSH_9.6\r\n") == (
        "answered, but not with TL1 (an SSH server sent 'SSH-2.0-OpenSSH_9.6')"
    )
    assert answered_not("SCPI", b"hello\n") == "answered, but not with SCPI (it sent 'hello')"


def test_an_attempt_says_where_the_deadline_stopped_it() -> None:
    attempt = ConnectAttempt("ocs1", 2.0)
    assert attempt.explain() is None  # nothing dialled: nothing to add
    attempt.dialling("127.0.0.1:3082", "TL1")
    assert attempt.explain() is None  # not interrupted, nothing heard: the error says it already
    attempt.interrupted = True
    assert attempt.explain() == "timed out after 2 s: no answer to the connection request"
    attempt.connected, attempt.waiting_for = True, "no answer to ACT-USER"
    assert attempt.explain() == "timed out after 2 s: connected, but no answer to ACT-USER"
    attempt.hear(b"SSH-2.0-x\r\n")
    assert attempt.explain() == "answered, but not with TL1 (an SSH server sent 'SSH-2.0-x')"
    attempt.understood = True
    assert attempt.explain() == "timed out after 2 s: connected, but no answer to ACT-USER"


async def test_the_wrapper_rewrites_only_what_the_record_explains() -> None:
    from labctl.ocs.connect_errors import current_attempt

    async def deadline_passes() -> None:
        attempt = current_attempt("ocs1")
        attempt.dialling("127.0.0.1:5025", "SCPI")
        attempt.connected, attempt.waiting_for, attempt.interrupted = True, "no answer to *IDN?", True
        raise HardwareError("ocs1: connect did not finish within 2 s")

    async def other_failure() -> None:
        raise HardwareError("ocs1: something else")

    with pytest.raises(ConnectFailed) as caught:
        await report_connect_failures("ocs1", deadline_passes, 2.0)()
    assert str(caught.value) == (
        "switch ocs1 at 127.0.0.1:5025: timed out after 2 s: connected, but no answer to *IDN?"
    )
    with pytest.raises(HardwareError, match=r"^ocs1: something else$"):
        await report_connect_failures("ocs1", other_failure, 2.0)()


def test_third_party_logs_are_kept_from_the_terminal_only_for_labctl_threads(
    caplog: pytest.LogCaptureFixture,
) -> None:
    pytest.importorskip("ncclient")
    from labctl.ocs.drivers.polatis_netconf import connection

    connection._quiet_third_party_logs()
    logger = logging.getLogger("paramiko.transport")
    with caplog.at_level(logging.DEBUG):
        logger.error("someone else's session failed")  # not one of labctl's threads: kept
        ours = threading.Thread(target=lambda: logger.error("Traceback (most recent call last): ..."))
        connection._own(ours)
        ours.start()
        ours.join()
    messages = [(r.name, r.levelno) for r in caplog.records]
    assert ("paramiko.transport", logging.ERROR) in messages
    assert messages.count(("paramiko.transport", logging.ERROR)) == 1  # labctl's went to DEBUG
    assert any(
        r.name == "labctl.ocs.drivers.polatis_netconf" and r.levelno == logging.DEBUG for r in caplog.records
    )
