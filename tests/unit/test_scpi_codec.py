"""The Polatis SCPI codec as command/response transcripts (in the style of PyMeasure's expected_protocol):
what goes on the wire for each request, what each reply line parses to, and one clear error for every
reply the query cannot return."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from labctl.inventory.mapping import PortSpace
from labctl.ocs.drivers.polatis_scpi.codec import (
    MAX_PAIRS_PER_COMMAND,
    MAX_PORTS_PER_QUERY,
    DeviceError,
    ScpiError,
    channel_list,
    connection_command,
    connection_commands,
    decode_reply,
    describe_errors,
    encode_command,
    parse_channel_list,
    parse_connections,
    parse_error,
    parse_identity,
    parse_operation_complete,
    parse_power,
    power_queries,
)


def expected_protocol(
    transcript: list[tuple[str, bytes | None]], session: Callable[[Callable[[str], str | None]], Any]
) -> Any:
    """Run `session` against a fake switch that expects exactly `transcript`'s commands, in order, and
    answers each with its reply line (None: a command without a reply); fails on any other command."""
    steps = iter(transcript)

    def send(command: str) -> str | None:
        wanted, raw = next(steps, (None, None))
        assert encode_command(command) == wanted, f"sent {command!r}, the transcript expects {wanted!r}"
        return None if raw is None else decode_reply(raw)

    result = session(send)
    assert next(steps, None) is None, "the session ended before the transcript"
    return result


# -- whole exchanges ------------------------------------------------------------------------------------------
def test_a_16_pair_remap_is_sub_then_add_each_checked_then_opc() -> None:
    before = {(i, 32 + i) for i in range(1, 17)}
    after = {(i, 32 + i % 16 + 1) for i in range(1, 17)}
    ins = ",".join(str(i) for i in range(1, 17))
    old_outs = ",".join(str(32 + i) for i in range(1, 17))
    new_outs = ",".join(str(32 + i % 16 + 1) for i in range(1, 17))
    transcript: list[tuple[str, bytes | None]] = [
        ("OXC:SWIT:CONN:STAT?", f"(@{ins}),(@{old_outs})\r\n".encode()),
        (f"OXC:SWIT:CONN:SUB (@{ins}),(@{old_outs})", None),
        ("SYST:ERR?", b'0,"No error"\n'),
        (f"OXC:SWIT:CONN:ADD (@{ins}),(@{new_outs})", None),
        ("SYST:ERR?", b'+0,"No error"\n'),
        ("*OPC?", b"1\n"),
        ("OXC:SWIT:CONN:STAT?", f"(@{ins}),(@{new_outs})\n".encode()),
    ]

    def remap(send: Callable[[str], str | None]) -> Any:
        current = parse_connections(send("OXC:SWIT:CONN:STAT?") or "")
        assert current == before
        for verb, pairs in (("SUB", current - after), ("ADD", after - current)):
            for command in connection_commands(verb, pairs):  # type: ignore[arg-type]
                assert send(command) is None
                assert parse_error(send("SYST:ERR?") or "").ok
        parse_operation_complete(send("*OPC?") or "")
        return parse_connections(send("OXC:SWIT:CONN:STAT?") or "")

    assert expected_protocol(transcript, remap) == after


def test_identity_then_power_in_chunks() -> None:
    ports = list(range(1, 301))  # more than one :PMON:POW? may ask for
    first, second = ports[:256], ports[256:]
    transcript: list[tuple[str, bytes | None]] = [
        ("*IDN?", b"Polatis,N-VST-192x192-LA1-DMHNV-701,001705,6.5.1.7\n"),
        (f":PMON:POW? {channel_list(first)}", ("(" + ",".join(["-3.50"] * 256) + ")\n").encode()),
        (f":PMON:POW? {channel_list(second)}", ("(" + ",".join(["-99.99"] * 44) + ")\n").encode()),
    ]

    def session(send: Callable[[str], str | None]) -> Any:
        identity = parse_identity(send("*IDN?") or "")
        powers: dict[int, float | None] = {}
        for chunk, command in power_queries(ports):
            powers.update(parse_power(send(command) or "", chunk))
        return identity, powers

    identity, powers = expected_protocol(transcript, session)
    assert identity.space == PortSpace(192, 192) and identity.serial == "001705"
    assert identity.firmware == "6.5.1.7" and identity.manufacturer == "Polatis"
    assert powers[1] == -3.5 and powers[256] == -3.5 and powers[257] is None and len(powers) == 300


def test_a_transcript_mismatch_fails() -> None:
    with pytest.raises(AssertionError, match="transcript expects"):
        expected_protocol([("*IDN?", b"x,y\n")], lambda send: send("*OPC?"))


# -- building commands ----------------------------------------------------------------------------------------
def test_channel_lists_and_connection_commands() -> None:
    assert channel_list([1, 2, 3]) == "(@1,2,3)" and channel_list([]) == "(@)"
    assert connection_command("ADD", [(2, 10), (1, 9)]) == "OXC:SWIT:CONN:ADD (@1,2),(@9,10)"
    assert connection_command("ONLY", [(3, 11)]) == "OXC:SWIT:CONN:ONLY (@3),(@11)"
    pairs = [(i, 1000 + i) for i in range(1, MAX_PAIRS_PER_COMMAND + 2)]
    split = connection_commands("SUB", pairs)
    assert len(split) == 2 and split[1] == f"OXC:SWIT:CONN:SUB (@{len(pairs)}),(@{1000 + len(pairs)})"
    assert connection_commands("ADD", []) == []
    assert [c for c, _ in power_queries([5])] == [[5]]
    assert len(power_queries(list(range(1, 2 * MAX_PORTS_PER_QUERY + 1)))) == 2


@pytest.mark.parametrize("bad", ["", "A\nB", "x\r", "café?"])
def test_a_command_is_one_ascii_line(bad: str) -> None:
    with pytest.raises(ValueError, match="one-line ASCII"):
        encode_command(bad)


# -- parsing replies ------------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("reply", "expected"),
    [
        ("(@1,2),(@9,10)", {(1, 9), (2, 10)}),
        (" (@ 3 ),(@ 11 ) ", {(3, 11)}),
        ("(@1:3),(@9:11)", {(1, 9), (2, 10), (3, 11)}),
        ("(@),(@)", set()),
        ("(@)", set()),
        ("", set()),
    ],
)
def test_connection_state(reply: str, expected: set[tuple[int, int]]) -> None:
    assert parse_connections(reply) == expected


@pytest.mark.parametrize(
    ("reply", "message"),
    [
        ("(@1,2),(@9)", "2 ingress but 1 egress"),
        ("(@1,2)", "expected"),
        ("(@1),(@9),(@10)", "expected"),
        ("(@1,1),(@9,10)", "appears twice"),
        ("(@1,x),(@9,10)", "bad channel"),
        ("(@3:1),(@9,10,11)", "bad channel range"),
        ("(1),(9)", "not a channel list"),
        ("(@1),(@9", "unbalanced"),
    ],
)
def test_bad_connection_state_is_one_scpi_error(reply: str, message: str) -> None:
    with pytest.raises(ScpiError, match=message) as info:
        parse_connections(reply)
    assert "\n" not in str(info.value)


def test_channel_list_parsing() -> None:
    assert parse_channel_list("(@1,5:7, 9)") == [1, 5, 6, 7, 9]
    assert parse_channel_list("(@)") == []
    with pytest.raises(ScpiError, match="bad channel range"):
        parse_channel_list("(@1:999999)")


@pytest.mark.parametrize(
    ("reply", "code", "message"),
    [
        ('0,"No error"', 0, "No error"),
        ('+0,"No error"', 0, "No error"),
        (
            '-221,"Settings conflict;port 9 is already connected"',
            -221,
            "Settings conflict;port 9 is already connected",
        ),
        ('-200,"Execution error;say ""no"""', -200, 'Execution error;say "no"'),
        ("0,No error", 0, "No error"),  # the unquoted form some instruments write
    ],
)
def test_error_queue_entries(reply: str, code: int, message: str) -> None:
    entry = parse_error(reply)
    assert (entry.code, entry.message, entry.ok) == (code, message, code == 0)


@pytest.mark.parametrize("reply", ["", "No error", "1", '-221,"unterminated', "x,y"])
def test_bad_error_entries_are_one_scpi_error(reply: str) -> None:
    with pytest.raises(ScpiError, match="SYST:ERR"):
        parse_error(reply)


def test_errors_read_as_one_line() -> None:
    errors = [
        DeviceError(-221, "Settings conflict;port 9 is already connected"),
        DeviceError(-350, "Queue overflow"),
    ]
    line = describe_errors("ocs1", "OXC:SWIT:CONN:ADD (@1),(@9)", errors)
    assert line == (
        "ocs1: OXC:SWIT:CONN:ADD (@1),(@9) failed: -221 Settings conflict;port 9 is already connected; "
        "-350 Queue overflow"
    )
    long = describe_errors("ocs1", "OXC:SWIT:CONN:ADD " + "(@1" + ",1" * 200 + ")", errors[:1])
    assert "\n" not in long and len(long) < 400


@pytest.mark.parametrize(
    ("reply", "space"),
    [
        ("Polatis,N-VST-192x192-LA1-DMHNV-701,001705,6.5.1.7", PortSpace(192, 192)),
        ("Polatis,N-OST-24x24-LA1-DMHNS", PortSpace(24, 24)),
        ("POLATIS,n-ost-16X32-la1,1,2", PortSpace(16, 32)),  # case-insensitive
        ("Polatis,N-OST-8x8", PortSpace(8, 8)),  # size at the end of the code
        ("Polatis,Series 7000,1,2", None),
        ("Polatis,N-OST-0x8-LA1,1,2", None),
    ],
)
def test_identity_and_its_size(reply: str, space: PortSpace | None) -> None:
    assert parse_identity(reply).space == space


@pytest.mark.parametrize("reply", ["", "Polatis", ",model", "Polatis,"])
def test_bad_identity_is_one_scpi_error(reply: str) -> None:
    with pytest.raises(ScpiError, match=r"\*IDN\?"):
        parse_identity(reply)


def test_power_values() -> None:
    assert parse_power("(-1.00,-2.50,-99.99)", [1, 9, 10]) == {1: -1.0, 9: -2.5, 10: None}
    assert parse_power("-1.5,+2E-1", [3, 4]) == {3: -1.5, 4: 0.2}  # without parentheses
    assert parse_power("(NAN,9.91E37)", [1, 2]) == {1: None, 2: None}  # SCPI's not-a-number
    with pytest.raises(ScpiError, match="2 ports asked, 1 values"):
        parse_power("(-1.0)", [1, 2])
    with pytest.raises(ScpiError, match="port 2: 'dark' is not a dBm value"):
        parse_power("(-1.0,dark)", [1, 2])
    with pytest.raises(ScpiError, match="0 values"):
        parse_power("()", [1])


def test_operation_complete() -> None:
    parse_operation_complete("1")
    parse_operation_complete("+1")
    for bad in ("0", "", "1;1", "x1"):
        with pytest.raises(ScpiError, match=r"\*OPC\?"):
            parse_operation_complete(bad)


# -- framing --------------------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("raw", "text"),
    [(b"1\n", "1"), (b'0,"No error"\r\n', '0,"No error"'), (b"\n", "")],
)
def test_reply_lines(raw: bytes, text: str) -> None:
    assert decode_reply(raw) == text


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        (b"1", "cut short"),  # a hang-up half way through the reply
        (b'0,"No er', "cut short"),
        (b"\xff\xfe1\n", "not ASCII"),
        (b"1\x07\n", "control characters"),
    ],
)
def test_bad_reply_lines_are_one_scpi_error(raw: bytes, message: str) -> None:
    with pytest.raises(ScpiError, match=message) as info:
        decode_reply(raw)
    assert "\n" not in str(info.value)
