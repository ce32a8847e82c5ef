"""The TL1 codec, byte for byte, and the driver against scripted transcripts (PyMeasure expected_protocol
style: each expected request, exactly, then the reply the switch sends)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager

import pytest

from labctl.config import Secret
from labctl.drivers.polatis_tl1.codec import (
    Tl1Ack,
    Tl1Autonomous,
    Tl1Command,
    Tl1Decoder,
    Tl1Error,
    Tl1Noise,
    Tl1Response,
    format_ports,
    parse_patches,
    parse_power,
    parse_size,
)
from labctl.drivers.polatis_tl1.switch import PolatisTl1Switch, Tl1Deny, Tl1Endpoint
from labctl.errors import InputError
from labctl.events import Event
from labctl.mapping import PortSpace

PW = "Sw0rdf1sh-7"


def reply(ctag: str, *lines: str, status: str = "COMPLD", sid: str = "( nil )", eol: str = "\r\n") -> bytes:
    body = "".join(f'   "{line}"{eol}' for line in lines)
    return f"{eol}\n   {sid} 26-11-29 10:00:00{eol}M  {ctag} {status}{eol}{body};".encode()


def deny(ctag: str, code: str, comment: str = "") -> bytes:
    extra = f"   /* {comment} */\r\n" if comment else ""
    return f"\r\n\n   ( nil ) 26-11-29 10:00:00\r\nM  {ctag} DENY\r\n   {code}\r\n{extra};".encode()


def autonomous(atag: str, *lines: str, code: str = "A", verb: str = "REPT DBCHG") -> bytes:
    body = "".join(f'   "{line}"\r\n' for line in lines)
    return f"\r\n\n   ( nil ) 26-11-29 10:00:01\r\n{code}  {atag} {verb}\r\n{body};".encode()


# -- requests ------------------------------------------------------------------------------------------------
def test_request_bytes_are_exact_and_the_password_only_reaches_the_wire() -> None:
    login = Tl1Command("ACT-USER", "1", aid="admin", blocks=("", Secret("PW", PW)))
    assert login.encode() == f"ACT-USER::admin:1::{PW};\r\n".encode()
    assert PW not in str(login) and PW not in repr(login)
    assert str(login) == "ACT-USER::admin:1::********;"
    assert Tl1Command("ENT-PATCH", "7", aid="1,17").encode() == b"ENT-PATCH::1,17:7:;\r\n"
    assert Tl1Command("DLT-PATCH", "8", aid="1&&4&9").encode() == b"DLT-PATCH::1&&4&9:8:;\r\n"
    assert Tl1Command("RTRV-PATCH", "9").encode() == b"RTRV-PATCH:::9:;\r\n"
    assert (
        Tl1Command("RTRV-EQPT", "10", aid="SYSTEM", blocks=("", "", "PARAMETER=SIZE")).encode()
        == b"RTRV-EQPT::SYSTEM:10:::PARAMETER=SIZE;\r\n"
    )
    assert Tl1Command("CANC-USER", "11", aid="admin").encode() == b"CANC-USER::admin:11:;\r\n"


@pytest.mark.parametrize(
    ("verb", "ctag", "aid"),
    [("ent-patch", "1", ""), ("ENT-PATCH", "1234567", ""), ("ENT-PATCH", "1", "1;2"), ("ENT-PATCH", "", "")],
)
def test_malformed_requests_are_refused_before_sending(verb: str, ctag: str, aid: str) -> None:
    with pytest.raises(ValueError, match=r"not a TL1|contains"):
        Tl1Command(verb, ctag, aid=aid)


def test_port_lists_use_ampersand_and_ranges() -> None:
    assert format_ports([5, 1, 2, 3]) == "1&&3&5"
    assert format_ports([4]) == "4"
    assert format_ports([1, 2]) == "1&2"
    assert format_ports([1, 2, 3, 4, 10, 11, 12, 20]) == "1&&4&10&&12&20"
    with pytest.raises(ValueError, match="empty port list"):
        format_ports([])


# -- replies -------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("eol", ["\r\n", "\n"], ids=["crlf", "lf"])
def test_compld_with_nil_sid_and_payload(eol: str) -> None:
    msgs = Tl1Decoder().feed(reply("3", "1,17", "2,18", eol=eol))
    assert msgs == [
        Tl1Response(
            ctag="3", status="COMPLD", sid="( nil )", date="26-11-29", time="10:00:00", lines=("1,17", "2,18")
        )
    ]
    assert parse_patches(msgs[0].lines) == {(1, 17), (2, 18)}


def test_named_sid_and_empty_payload() -> None:
    (msg,) = Tl1Decoder().feed(reply("12", sid="POLATIS-LAB"))
    assert isinstance(msg, Tl1Response) and msg.sid == "POLATIS-LAB" and msg.lines == ()


def test_deny_carries_its_code_and_comment() -> None:
    (msg,) = Tl1Decoder().feed(deny("4", "IIAC", "port 99 out of range"))
    assert isinstance(msg, Tl1Response)
    assert (msg.status, msg.error_code, msg.comments) == ("DENY", "IIAC", ("port 99 out of range",))


def test_autonomous_messages_before_and_between_replies_are_kept_apart() -> None:
    stream = (
        autonomous("100", "ENT-PATCH:1,17")
        + reply("5", "1,17")
        + autonomous("101", code="*C", verb="REPT ALM EQPT")
        + reply("6")
    )
    msgs = Tl1Decoder().feed(stream)
    assert [type(m) for m in msgs] == [Tl1Autonomous, Tl1Response, Tl1Autonomous, Tl1Response]
    first, _, second, _ = msgs
    assert isinstance(first, Tl1Autonomous) and isinstance(second, Tl1Autonomous)
    assert (first.alarm, first.atag, first.verb, first.lines) == (
        "A",
        "100",
        "REPT DBCHG",
        ("ENT-PATCH:1,17",),
    )
    assert (second.alarm, second.verb) == ("*C", "REPT ALM EQPT")
    assert [m.ctag for m in msgs if isinstance(m, Tl1Response)] == ["5", "6"]


def test_in_progress_ack_and_prompt_lines_precede_the_reply() -> None:
    msgs = Tl1Decoder().feed(b"IP 7\r\n<" + reply("7", "1,17") + b"\r\n<")
    assert msgs[0] == Tl1Ack(ctag="7", code="IP")
    assert isinstance(msgs[1], Tl1Response) and msgs[1].lines == ("1,17",)
    assert len(msgs) == 2


def test_only_a_line_that_is_just_a_semicolon_ends_a_message() -> None:
    text = b'\r\n\n   ( nil ) 26-11-29 10:00:00\r\nM  8 COMPLD\r\n   "LABEL=a;b"\r\n   "2:x;"\r\n;'
    (msg,) = Tl1Decoder().feed(text)
    assert isinstance(msg, Tl1Response) and msg.lines == ("LABEL=a;b", "2:x;")


def test_byte_by_byte_feeding_gives_the_same_messages() -> None:
    stream = (
        b"IP 1\r\n<" + reply("1", "1,17") + autonomous("9", "x") + deny("2", "SAIS") + reply("3", eol="\n")
    )
    whole = Tl1Decoder().feed(stream)
    decoder = Tl1Decoder()
    pieces = [m for i in range(len(stream)) for m in decoder.feed(stream[i : i + 1])]
    assert pieces == whole and len(whole) == 5


def test_continued_response_parts_are_merged() -> None:
    part1 = reply("4", "1,17").replace(b";", b">")
    part2 = reply("4", "2,18")
    (msg,) = Tl1Decoder().feed(part1 + part2)
    assert isinstance(msg, Tl1Response) and msg.lines == ("1,17", "2,18")


def test_escaped_quotes_and_unquoted_indented_lines() -> None:
    text = b'\r\n\n   ( nil ) 26-11-29 10:00:00\r\nM  9 COMPLD\r\n   "LABEL=\\"rack 3\\""\r\n   1:OPEN\r\n;'
    (msg,) = Tl1Decoder().feed(text)
    assert isinstance(msg, Tl1Response) and msg.lines == ('LABEL="rack 3"', "1:OPEN")


def test_banner_lines_outside_messages_are_noise_not_errors() -> None:
    msgs = Tl1Decoder().feed(b"Welcome to the switch\r\n" + reply("1"))
    assert msgs[0] == Tl1Noise("Welcome to the switch") and isinstance(msgs[1], Tl1Response)


@pytest.mark.parametrize(
    "stream",
    [
        pytest.param(b"M  3 COMPLD\r\n;", id="status-without-header"),
        pytest.param(
            b"\r\n\n   ( nil ) 26-11-29 10:00:00\r\nM  3 COMPLD\x9f\x03garbage\r\n;", id="garbage-status"
        ),
        pytest.param(b"\r\n\n   ( nil ) 26-11-29 10:00:00\r\nM  3 COMPLD\r\nxx\x01\r\n;", id="garbage-body"),
        pytest.param(
            b"\r\n\n   ( nil ) 26-11-29 10:00:00\r\nM  3 COMPLD\r\n   ( nil ) 26-11-29 10:00:00\r\n",
            id="header-in-body",
        ),
        pytest.param(b"x" * (Tl1Decoder.MAX_LINE + 1), id="endless-line"),
    ],
)
def test_broken_framing_raises_the_codec_error(stream: bytes) -> None:
    decoder = Tl1Decoder()
    with pytest.raises(Tl1Error):
        decoder.feed(stream)
    # The decoder is reset and reads the next well-formed message.
    assert next(m for m in decoder.feed(reply("4")) if isinstance(m, Tl1Response)).ctag == "4"


def test_payload_parsers() -> None:
    assert parse_power(["1:-3.50", "33:-99.99", "34: -5.25"]) == {1: -3.5, 33: None, 34: -5.25}
    assert parse_size(["SYSTEM:SIZE=32x32"]) == PortSpace(32, 32)
    for bad in (lambda: parse_patches(["1-17"]), lambda: parse_power(["1:high"]), lambda: parse_size(["x"])):
        with pytest.raises(Tl1Error):
            bad()


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
            # apply([(1,5),(2,7)]): read, delete the old patch of port 2, enter both, read back
            (b"RTRV-PATCH:::4:;\r\n", reply("4", "2,6")),
            (b"DLT-PATCH::2:5:;\r\n", reply("5")),
            (b"ENT-PATCH::1,5:6:;\r\n", reply("6")),
            (b"ENT-PATCH::2,7:7:;\r\n", autonomous("51") + reply("7")),
            (b"RTRV-PATCH:::8:;\r\n", reply("8", "1,5", "2,7", eol="\n")),
            (b"CANC-USER::admin:9:;\r\n", reply("9")),
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
    assert io[0] == "ACT-USER::admin:1::********;" and "ENT-PATCH::2,7:7:;" in io
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
        with pytest.raises(Tl1Deny) as info:
            await sw.connect()
    assert info.value.code == "PIUC"
    assert PW not in str(info.value) and PW not in repr(info.value.args)
    assert all(PW not in str(e) for e in events)


async def test_transcript_size_mismatch_is_an_input_error() -> None:
    from labctl.errors import InputError

    script = ExpectedProtocol(
        [LOGIN[0], (b"RTRV-EQPT::SYSTEM:2:::PARAMETER=SIZE;\r\n", reply("2", "SYSTEM:SIZE=16x16"))]
    )
    async with script.serve():
        sw = make_driver(script.port, [])
        with pytest.raises(InputError, match="inventory says 4x4 but the switch reports 16x16"):
            await sw.connect()


@pytest.mark.parametrize("bad", ["a;b", "x:y", "line\nbreak", "pässword"])
def test_a_password_tl1_cannot_carry_is_refused_without_showing_it(bad: str) -> None:
    with pytest.raises(InputError) as info:
        Tl1Command("ACT-USER", "1", aid="admin", blocks=("", Secret("OCS_PW", bad)))
    assert bad not in str(info.value)
    assert "${OCS_PW}" in str(info.value)
