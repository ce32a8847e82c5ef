"""The TL1 codec, byte for byte. The driver against scripted transcripts over a socket is
tests/integration/test_tl1_codec.py."""

from __future__ import annotations

import pytest

from labctl.core.errors import InputError
from labctl.inventory.config import Secret
from labctl.inventory.mapping import PortSpace
from labctl.ocs.drivers.polatis_tl1.codec import (
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
from tests.helpers.tl1_codec import PW, autonomous, deny, reply


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


@pytest.mark.parametrize("bad", ["a;b", "x:y", "line\nbreak", "pässword"])
def test_a_password_tl1_cannot_carry_is_refused_without_showing_it(bad: str) -> None:
    with pytest.raises(InputError) as info:
        Tl1Command("ACT-USER", "1", aid="admin", blocks=("", Secret("OCS_PW", bad)))
    assert bad not in str(info.value)
    assert "${OCS_PW}" in str(info.value)
