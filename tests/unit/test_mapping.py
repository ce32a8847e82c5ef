"""Mapping validation and diffing: a matching, ingress → egress, in range, each port once."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from labctl.core.errors import InputError, MappingError
from labctl.inventory.mapping import PortSpace, apply_diff, diff_mapping, validate_mapping

SPACE = PortSpace(4, 4)  # ingress 1..4, egress 5..8


def test_port_space_numbering() -> None:
    space = PortSpace.parse("32x32")
    assert space.ingress == range(1, 33)
    assert space.egress == range(33, 65)
    assert (
        space.describe(1) == "ingress"
        and space.describe(64) == "egress"
        and space.describe(65) == "out of range"
    )
    with pytest.raises(InputError):
        PortSpace.parse("32by32")


def test_valid_matching() -> None:
    assert validate_mapping([(1, 5), (2, 8)], SPACE) == frozenset({(1, 5), (2, 8)})
    assert validate_mapping([], SPACE) == frozenset()


@pytest.mark.parametrize(
    ("patches", "message"),
    [
        ([(1, 9)], "port 9 is out of range 1..8"),
        ([(0, 5)], "port 0 is out of range"),
        ([(5, 1)], "5 is not an ingress port"),
        ([(1, 2)], "2 is not an egress port"),
        ([(1, 5), (1, 6)], "ingress port 1 is used twice"),
        ([(1, 5), (2, 5)], "egress port 5 is used twice"),
        ([(1, 5, 6)], "is not a pair"),
        ([(1, True)], "is not a pair"),
    ],
)
def test_invalid_mappings_name_the_patch(patches: list[tuple[int, ...]], message: str) -> None:
    with pytest.raises(MappingError, match=message):
        validate_mapping(patches, SPACE, switch="ocs1")  # type: ignore[arg-type]


def test_diff_sends_only_changes_within_scope() -> None:
    current = frozenset({(1, 5), (2, 6), (3, 7)})
    desired = frozenset({(1, 6), (2, 5)})
    diff = diff_mapping(current, desired)
    # (3, 7) lies outside the ports desired names: untouched.
    assert diff.remove == {(1, 5), (2, 6)}
    assert diff.add == {(1, 6), (2, 5)}
    assert apply_diff(current, diff) == {(1, 6), (2, 5), (3, 7)}


def test_diff_scope_disconnects_ports_left_out() -> None:
    current = frozenset({(1, 5), (2, 6), (3, 7)})
    diff = diff_mapping(current, frozenset({(1, 5)}), scope={1, 2, 5, 6})
    assert diff.remove == {(2, 6)} and diff.add == frozenset()


def test_diff_of_identical_mapping_is_empty() -> None:
    current = frozenset({(1, 5)})
    assert diff_mapping(current, current).empty


matchings = st.permutations(range(5, 9)).flatmap(
    lambda egress: st.sets(st.integers(1, 4)).map(lambda ins: frozenset((i, egress[i - 1]) for i in ins))
)


@given(current=matchings, desired=matchings)
def test_diff_then_apply_reaches_desired(
    current: frozenset[tuple[int, int]], desired: frozenset[tuple[int, int]]
) -> None:
    scope = set(SPACE.all_ports)
    result = apply_diff(current, diff_mapping(current, desired, scope))
    assert result == desired
    validate_mapping(result, SPACE)


def test_a_frozen_mapping_is_checked_once_and_a_bad_one_every_time() -> None:
    space = PortSpace(4, 4)
    good = frozenset({(1, 5), (2, 6)})
    assert validate_mapping(good, space) is validate_mapping(good, space)  # the second from memory
    bad = frozenset({(1, 5), (1, 6)})
    for _ in range(2):  # a failure is not remembered as a pass
        with pytest.raises(MappingError, match="ocs9: ingress port 1 is used twice"):
            validate_mapping(bad, space, switch="ocs9")
