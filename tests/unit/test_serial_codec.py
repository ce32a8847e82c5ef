"""The DiCon X1 codec against transcripts of its RS-232 ASCII protocol (decision 0033)."""

from __future__ import annotations

import pytest

from labctl.inventory.mapping import MappingDiff, PortSpace, diff_mapping
from labctl.ocs.drivers.dicon_serial.codec import (
    CONF_QUERY,
    DIM_QUERY,
    ERROR_QUERY,
    IDN_QUERY,
    DiconProtocolError,
    LineDecoder,
    SwitchError,
    change_commands,
    channel_query,
    encode,
    encode_all,
    mapping_from_channels,
    printable,
)

SPACE = PortSpace(8, 8)  # inputs 1..8 = ingress 1..8, outputs 1..8 = egress 9..16


def test_commands_are_ascii_lines_with_the_configured_ending() -> None:
    assert encode("X1 CH 3 5") == b"X1 CH 3 5\r"
    assert encode("X1 CH 3?", "LF") == b"X1 CH 3?\n"
    assert encode("*IDN?", "CRLF") == b"*IDN?\r\n"
    assert encode_all(["X1 CH 1 2", "SYST:ERR?"]) == b"X1 CH 1 2\rSYST:ERR?\r"


def test_lines_split_at_cr_lf_or_crlf_and_partial_lines_wait() -> None:
    decoder = LineDecoder()
    assert decoder.feed(b"3,5\r\n4,") == [b"3,5"]
    assert decoder.pending == b"4,"
    assert decoder.feed(b"0\r\r\n\n+0, No Error\n") == [b"4,0", b"+0, No Error"]
    assert decoder.pending == b""
    assert decoder.feed(b"x" * 5000) == [b"x" * 5000]  # no line end for this long: handed over as noise


def test_each_query_recognises_only_its_own_reply() -> None:
    q3 = channel_query(3)
    assert q3.text == "X1 CH 3?"
    assert q3.match(b"3,5") == 5
    assert q3.match(b" 3 , 0 ") == 0  # parked
    assert q3.match(b"4,5") is None  # another input's answer
    assert q3.match(b"3,5,1") is None
    assert q3.match(b"+0, No Error") is None
    assert DIM_QUERY.match(b"32,32") == PortSpace(32, 32)
    assert IDN_QUERY.match(b"Dicon Fiberoptics Inc, GP600, 19A0M10D0117, 7.0") == (
        "Dicon Fiberoptics Inc",
        "GP600",
        "19A0M10D0117",
        "7.0",
    )
    assert IDN_QUERY.match(b"7.0") is None
    assert CONF_QUERY.match(b"X1") == "X1"
    assert ERROR_QUERY.match(b"+0, No Error") == SwitchError(0, "No Error")
    assert ERROR_QUERY.match(b'-221, "Settings conflict"') == SwitchError(-221, "Settings conflict")
    assert str(SwitchError(-221, "Settings conflict")) == "-221, Settings conflict"


def test_a_line_with_noise_bytes_is_never_a_reply() -> None:
    """Line noise (a glitch, a wrong baud rate) is bytes outside printable ASCII: such a line is noise even
    where the printable part looks like an answer."""
    assert printable(b"3,5") == "3,5"
    assert printable(b"3\xfe,5") is None
    assert channel_query(3).match(b"3,\x855") is None
    assert ERROR_QUERY.match(b"+0\x93\xa7, No Error") is None


def test_read_backs_become_patches_in_labctl_numbering() -> None:
    assert mapping_from_channels(SPACE, {1: 1, 2: 0, 3: 8}) == {(1, 9), (3, 16)}
    with pytest.raises(DiconProtocolError, match=r"output 9, outside 1\.\.8"):
        mapping_from_channels(SPACE, {1: 9})


def commands_for(current: set[tuple[int, int]], desired: set[tuple[int, int]]) -> list[str]:
    return change_commands(SPACE, current, diff_mapping(current, frozenset(desired)))


def test_a_moved_input_is_one_command_and_a_lost_patch_parks_its_input() -> None:
    assert commands_for({(1, 9)}, {(1, 10)}) == ["X1 CH 1 2"]
    assert commands_for({(1, 9), (2, 10)}, {(1, 9)} | set()) == []  # (2, 10) is outside the desired ports
    change = MappingDiff(remove=frozenset({(2, 10)}), add=frozenset({(3, 10)}))
    assert change_commands(SPACE, {(2, 10)}, change) == ["X1 CH 2 0", "X1 CH 3 2"]


def test_an_output_is_named_only_after_its_holder_let_go() -> None:
    # 1 -> output 2 needs output 2, which input 2 holds until it moves on to output 3
    assert commands_for({(1, 9), (2, 10)}, {(1, 10), (2, 11)}) == ["X1 CH 2 3", "X1 CH 1 2"]


def test_a_swap_parks_one_input_first() -> None:
    assert commands_for({(1, 9), (2, 10)}, {(1, 10), (2, 9)}) == ["X1 CH 1 0", "X1 CH 2 1", "X1 CH 1 2"]


def test_a_rail_remap_of_16_pairs_takes_one_command_per_moved_input_plus_a_park_per_cycle() -> None:
    space = PortSpace(32, 32)
    dp = {(i, 32 + (i % 16) + 1) for i in range(1, 17)}  # each input one output along
    pp = {(i, 32 + ((i + 1) % 16) + 1) for i in range(1, 17)}  # two along: one 16-cycle
    commands = change_commands(space, dp, diff_mapping(dp, frozenset(pp)))
    assert len(commands) == 17  # 16 moves and the one park that breaks the cycle
    held: dict[int, int] = {e: i for i, e in dp}
    for command in commands:  # replaying them never names an output another input holds
        _, _, ingress, output = command.split()
        egress = 32 + int(output)
        for e, i in list(held.items()):
            if i == int(ingress):
                del held[e]
        if int(output):
            assert egress not in held, command
            held[egress] = int(ingress)
    assert {(i, e) for e, i in held.items()} == pp


def test_an_output_held_by_a_patch_the_diff_keeps_is_sent_anyway_for_the_switch_to_refuse() -> None:
    change = MappingDiff(remove=frozenset(), add=frozenset({(1, 9)}))
    assert change_commands(SPACE, {(2, 9)}, change) == ["X1 CH 1 0", "X1 CH 1 1"]
