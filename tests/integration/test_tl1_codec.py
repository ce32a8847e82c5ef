"""The TL1 driver against scripted transcripts from a server on 127.0.0.1 (PyMeasure expected_protocol style:
each expected request, exactly, then the reply the switch sends). The codec byte for byte is
tests/unit/test_tl1_codec.py."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager

import pytest

from labctl.core.errors import InputError
from labctl.core.events import Event
from labctl.inventory.config import Secret
from labctl.inventory.mapping import PortSpace
from labctl.ocs.drivers.polatis_tl1.switch import PolatisTl1Switch, Tl1Deny, Tl1Endpoint, Tl1LoginRefused
from tests.helpers.tl1_codec import PW, autonomous, deny, reply


# -- the driver against a scripted transcript ----------------------------------------------------------------
class ExpectedProtocol:
    """A scripted switch on 127.0.0.1: checks each request line is exactly the expected bytes, then sends
    the scripted reply (which may hold several messages, or nothing)."""

    def __init__(self, transcript: Sequence[tuple[bytes, bytes]]) -> None:
        self.transcript = list(transcript)
        self.received: list[bytes] = []
        self.mismatch: str | None = None
        self.port = 0
        self._tasks: list[asyncio.Task[None]] = []
        self._writers: list[asyncio.StreamWriter] = []

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._tasks.append(task)
        self._writers.append(writer)
        try:
            for expected, answer in self.transcript:
                got = await reader.readuntil(b"\n")
                self.received.append(got)
                if got != expected:
                    self.mismatch = f"expected {expected!r}, got {got!r}"
                    return
                writer.write(answer)
            await reader.read()  # until the driver hangs up
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()

    @asynccontextmanager
    async def serve(self) -> AsyncIterator[ExpectedProtocol]:
        server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        self.port = server.sockets[0].getsockname()[1]
        try:
            yield self
        finally:
            server.close()
            for w in self._writers:
                w.transport.abort()  # ends each handler's read; no task is cancelled mid-callback
            await asyncio.gather(*self._tasks, return_exceptions=True)
            await server.wait_closed()
        assert self.mismatch is None, self.mismatch
        assert len(self.received) == len(self.transcript), f"only {len(self.received)} requests arrived"


def make_driver(port: int, events: list[Event], pipeline_depth: int = 16) -> PolatisTl1Switch:
    return PolatisTl1Switch(
        "ocs1",
        PortSpace(4, 4),
        endpoint=Tl1Endpoint("127.0.0.1", port),
        user="admin",
        password=Secret("PW", PW),
        emit=events.append,
        keepalive_s=None,
        pipeline_depth=pipeline_depth,
    )


LOGIN = [
    (f"ACT-USER::admin:1::{PW};\r\n".encode(), reply("1")),
    (b"RTRV-EQPT::SYSTEM:2:::PARAMETER=SIZE;\r\n", reply("2", "SYSTEM:SIZE=4x4")),
]


async def test_transcript_login_read_apply_logout() -> None:
    script = ExpectedProtocol(
        [
            *LOGIN,
            # an autonomous message arrives before the reply, and an IP ack with a prompt
            (b"RTRV-PATCH:::3:;\r\n", autonomous("50", "ENT-PATCH:2,6") + b"IP 3\r\n<" + reply("3", "2,6")),
            # apply([(1,5),(2,7)]): no read (the one just made is the diff's base, decision 0050), delete
            # the old patch of port 2, enter both, read back
            (b"DLT-PATCH::2:4:;\r\n", reply("4")),
            (b"ENT-PATCH::1,5:5:;\r\n", reply("5")),
            (b"ENT-PATCH::2,7:6:;\r\n", autonomous("51") + reply("6")),
            (b"RTRV-PATCH:::7:;\r\n", reply("7", "1,5", "2,7", eol="\n")),
            (b"CANC-USER::admin:8:;\r\n", reply("8")),
        ]
    )
    events: list[Event] = []
    async with script.serve():
        sw = make_driver(script.port, events, pipeline_depth=1)
        await sw.connect()
        assert sw.sid == "( nil )"
        assert (await sw.get_mapping()).value == {(2, 6)}
        result = await sw.apply([(1, 5), (2, 7)])
        assert result.value.mapping == {(1, 5), (2, 7)} and result.value.removed == {(2, 6)}
        await sw.close()
    reports = [e for e in events if e.kind == "ocs.report"]
    assert [e.meta["atag"] for e in reports] == ["50", "51"]
    assert any(e.kind == "ocs.session" and e.value == "ack" for e in events)
    io = [e.meta["command"] for e in events if e.kind == "ocs.io"]
    assert io[0] == "ACT-USER::admin:1::********;" and "ENT-PATCH::2,7:6:;" in io
    assert all(PW not in str(e) for e in events)


async def test_transcript_pipelined_replies_out_of_order_are_matched_by_ctag() -> None:
    # Both ENT-PATCH commands are in flight before either reply; the switch answers the second first.
    script = ExpectedProtocol(
        [
            *LOGIN,
            (b"RTRV-PATCH:::3:;\r\n", reply("3")),
            (b"ENT-PATCH::1,5:4:;\r\n", b""),
            (b"ENT-PATCH::2,6:5:;\r\n", reply("5") + autonomous("52") + reply("4")),
            (b"RTRV-PATCH:::6:;\r\n", reply("6", "1,5", "2,6")),
            (b"CANC-USER::admin:7:;\r\n", reply("7")),
        ]
    )
    events: list[Event] = []
    async with script.serve():
        sw = make_driver(script.port, events, pipeline_depth=16)
        await sw.connect()
        result = await sw.apply([(1, 5), (2, 6)])
        assert result.value.added == {(1, 5), (2, 6)}
        await sw.close()
    done = [e.meta["ctag"] for e in events if e.kind == "ocs.io" and e.meta["command"].startswith("ENT")]
    assert done == ["5", "4"]


async def test_transcript_deny_is_typed_with_code_and_command() -> None:
    script = ExpectedProtocol(
        [
            *LOGIN,
            (b"ENT-PATCH::1,5:3:;\r\n", deny("3", "SAIS", "port 5 is already in use")),
            (b"CANC-USER::admin:4:;\r\n", reply("4")),
        ]
    )
    async with script.serve():
        sw = make_driver(script.port, [])
        await sw.connect()
        with pytest.raises(Tl1Deny) as info:
            await sw.enter_patch(1, 5)
        assert info.value.code == "SAIS" and info.value.command == "ENT-PATCH::1,5:3:;"
        assert "already in use" in str(info.value)
        await sw.close()


async def test_transcript_login_denied_never_shows_the_password() -> None:
    script = ExpectedProtocol([(f"ACT-USER::admin:1::{PW};\r\n".encode(), deny("1", "PIUC", f"bad {PW}"))])
    events: list[Event] = []
    async with script.serve():
        sw = make_driver(script.port, events)
        with pytest.raises(Tl1LoginRefused) as info:
            await sw.connect()
    assert info.value.code == "PIUC" and "authentication failed for user 'admin'" in str(info.value)
    assert PW not in str(info.value) and PW not in repr(info.value.args)
    assert all(PW not in str(e) for e in events)


async def test_transcript_size_mismatch_is_an_input_error() -> None:

    script = ExpectedProtocol(
        [LOGIN[0], (b"RTRV-EQPT::SYSTEM:2:::PARAMETER=SIZE;\r\n", reply("2", "SYSTEM:SIZE=16x16"))]
    )
    async with script.serve():
        sw = make_driver(script.port, [])
        with pytest.raises(InputError, match="inventory says 4x4 but the switch reports 16x16"):
            await sw.connect()
