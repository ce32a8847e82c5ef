"""Property tests of the TL1 reply parser: whatever a switch sends, the codec raises nothing but `Tl1Error`,
and well-formed replies come out exactly as sent however the bytes are split."""

from __future__ import annotations

import contextlib
import itertools
import random

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from labctl.ocs.drivers.polatis_tl1.codec import (
    Tl1Ack,
    Tl1Autonomous,
    Tl1Decoder,
    Tl1Error,
    Tl1Response,
    parse_patches,
    parse_port_values,
    parse_power,
    parse_size,
)

REPLIES_PER_EXAMPLE = 5
SEEDED_EXAMPLES = 2_000  # x 5 replies, plus 400 x 5 fully drawn ones: 12,000 generated replies per run

eol = st.sampled_from(["\r\n", "\n", "\r", "", "\n\r"])
ctag = st.one_of(st.integers(0, 999_999).map(str), st.text("ABCxyz019", min_size=0, max_size=8))
sid = st.one_of(st.just("( nil )"), st.just(""), st.text(min_size=0, max_size=12))
status = st.sampled_from(["COMPLD", "DENY", "PRTL", "DELAY", "RTRV", "compld", "WHAT"])
payload = st.one_of(
    st.tuples(st.integers(0, 999), st.integers(0, 999)).map(lambda p: f"{p[0]},{p[1]}"),
    st.tuples(st.integers(0, 999), st.floats(allow_nan=True)).map(lambda p: f"{p[0]}:{p[1]}"),
    st.just("SYSTEM:SIZE=32x32"),
    st.text(max_size=30),
)


@st.composite
def reply_text(draw: st.DrawFn) -> str:
    """A reply shaped like TL1, with every part liable to be wrong, missing or doubled."""
    e = draw(eol)
    out = []
    if draw(st.booleans()):
        out.append(draw(st.sampled_from(["IP", "PF", "OK", "NG", "XX"])) + " " + draw(ctag) + e + "<")
    out.append(draw(st.sampled_from(["\r\n\n", "\n", "", "\r\n\n\n"])))
    if draw(st.integers(0, 9)):
        out.append(f"   {draw(sid)} 26-11-29 10:00:00{e}")
    code = draw(st.sampled_from(["M ", "M  ", "A  ", "*C ", "** ", "*^ ", "", "X "]))
    out.append(f"{code}{draw(ctag)} {draw(status)}{e}")
    for _ in range(draw(st.integers(0, 4))):
        kind = draw(st.integers(0, 5))
        text = draw(payload)
        if kind == 0:
            out.append(f'   "{text}"{e}')
        elif kind == 1:
            out.append(f"   /* {text} */{e}")
        elif kind == 2:
            out.append(f"   {draw(st.sampled_from(['IIAC', 'SROF', 'PLNA', 'iiac']))}{e}")
        elif kind == 3:
            out.append(f"{text}{e}")
        elif kind == 4:
            out.append(f"   {text}{e}")
        else:
            out.append(f"<{e}")
    out.append(draw(st.sampled_from([";", ">", "", ";\r\n<", "; ", ">\r\n"])))
    return "".join(out)


@st.composite
def reply_bytes(draw: st.DrawFn) -> bytes:
    data = draw(reply_text()).encode("utf-8", "surrogatepass")
    mutation = draw(st.integers(0, 5))
    if mutation == 1 and data:  # corrupt a byte
        i = draw(st.integers(0, len(data) - 1))
        data = data[:i] + bytes([draw(st.integers(0, 255))]) + data[i + 1 :]
    elif mutation == 2:  # insert garbage
        i = draw(st.integers(0, len(data)))
        data = data[:i] + draw(st.binary(max_size=16)) + data[i:]
    elif mutation == 3 and data:  # cut short
        data = data[: draw(st.integers(0, len(data)))]
    elif mutation == 4:  # pure noise
        data = draw(st.binary(max_size=64))
    return data


def split(data: bytes, cuts: list[int]) -> list[bytes]:
    points = sorted({c % (len(data) + 1) for c in cuts})
    return [data[a:b] for a, b in itertools.pairwise([0, *points, len(data)])]


def feed_all(replies: list[bytes], cuts: list[int]) -> None:
    """Feed the stream in pieces; every message the decoder yields also goes through the payload parsers."""
    decoder = Tl1Decoder()
    for chunk in split(b"".join(replies), cuts):
        try:
            for message in decoder.feed(chunk):
                if isinstance(message, Tl1Response):
                    for parse in (parse_patches, parse_power, parse_size):
                        with contextlib.suppress(Tl1Error):
                            parse(message.lines)
        except Tl1Error:
            continue  # the decoder resets; the driver would reconnect


generated = {"structured": 0, "seeded": 0}


@settings(max_examples=400, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow])
@given(
    st.lists(reply_bytes(), min_size=REPLIES_PER_EXAMPLE, max_size=REPLIES_PER_EXAMPLE),
    st.lists(st.integers(0, 10_000), max_size=6),
)
def test_decoder_raises_only_its_own_error(replies: list[bytes], cuts: list[int]) -> None:
    """Every part drawn by hypothesis (so a failure shrinks to a minimal reply)."""
    generated["structured"] += len(replies)
    feed_all(replies, cuts)


_PIECES = {
    "eol": ["\r\n", "\n", "\r", "", "\n\r"],
    "lead": ["\r\n\n", "\n", "", "\r\n\n\n"],
    "sid": ["( nil )", "", "POLATIS", "( nil", "\x00\xff", "26-11-29"],
    "code": ["M ", "M  ", "A  ", "*C ", "** ", "*^ ", "", "X "],
    "status": ["COMPLD", "DENY", "PRTL", "DELAY", "RTRV", "compld", "WHAT", ""],
    "term": [";", ">", "", ";\r\n<", "; ", ">\r\n", ";IP 1\r\n<"],
    "errcode": ["IIAC", "SROF", "PLNA", "iiac", "TOOLONG"],
    "ack": ["IP", "PF", "OK", "NG", "XX"],
}


def seeded_reply(rng: random.Random) -> bytes:
    """The same shapes as `reply_text`, drawn from a seeded generator: ~100x cheaper per reply."""
    pick = rng.choice
    e = pick(_PIECES["eol"])

    def text() -> str:
        return "".join(chr(rng.randrange(0, 0x250)) for _ in range(rng.randrange(0, 24)))

    def tag() -> str:
        return str(rng.randrange(0, 10**7)) if rng.random() < 0.8 else text()[:8]

    out = []
    if rng.random() < 0.3:
        out.append(f"{pick(_PIECES['ack'])} {tag()}{e}<")
    out.append(pick(_PIECES["lead"]))
    if rng.random() < 0.9:
        out.append(f"   {pick(_PIECES['sid'])} 26-11-29 10:00:00{e}")
    out.append(f"{pick(_PIECES['code'])}{tag()} {pick(_PIECES['status'])}{e}")
    for _ in range(rng.randrange(0, 6)):
        line = pick(
            [
                f"{rng.randrange(1000)},{rng.randrange(1000)}",
                f"{rng.randrange(99)}:{rng.uniform(-120, 9)}",
                "SYSTEM:SIZE=32x32",
                text(),
            ]
        )
        out.append(
            pick(
                [
                    f'   "{line}"',
                    f"   /* {line} */",
                    f"   {pick(_PIECES['errcode'])}",
                    line,
                    f"   {line}",
                    "<",
                ]
            )
            + e
        )
    out.append(pick(_PIECES["term"]))
    data = "".join(out).encode("utf-8", "surrogatepass")
    mutation = rng.randrange(6)
    if mutation == 1 and data:
        i = rng.randrange(len(data))
        data = data[:i] + bytes([rng.randrange(256)]) + data[i + 1 :]
    elif mutation == 2:
        i = rng.randrange(len(data) + 1)
        data = data[:i] + rng.randbytes(rng.randrange(17)) + data[i:]
    elif mutation == 3 and data:
        data = data[: rng.randrange(len(data) + 1)]
    elif mutation == 4:
        data = rng.randbytes(rng.randrange(65))
    return data


@settings(max_examples=SEEDED_EXAMPLES, deadline=None, derandomize=True)
@given(st.randoms(use_true_random=True), st.lists(st.integers(0, 10_000), max_size=6))
def test_decoder_raises_only_its_own_error_seeded(rng: random.Random, cuts: list[int]) -> None:
    """Hypothesis seeds a generator that writes the replies: the bulk of the >=10,000, quickly."""
    replies = [seeded_reply(rng) for _ in range(REPLIES_PER_EXAMPLE)]
    generated["seeded"] += len(replies)
    feed_all(replies, cuts)


def test_at_least_ten_thousand_replies_were_generated() -> None:
    # Runs after the fuzz tests in file order; guards against the example count being cut down silently.
    if all(generated.values()):
        assert sum(generated.values()) >= 10_000


@settings(max_examples=300, deadline=None, derandomize=True)
@given(
    st.lists(
        st.tuples(
            st.integers(1, 999_999).map(str),
            st.sampled_from(["COMPLD", "DENY"]),
            st.lists(
                st.text(
                    st.characters(min_codepoint=32, max_codepoint=126, exclude_characters='"\\'), max_size=20
                ),
                max_size=4,
            ),
            st.booleans(),
        ),
        min_size=1,
        max_size=4,
    ),
    st.sampled_from(["\r\n", "\n"]),
    st.lists(st.integers(0, 5_000), max_size=8),
)
def test_well_formed_replies_round_trip_however_split(
    items: list[tuple[str, str, list[str], bool]], e: str, cuts: list[int]
) -> None:
    stream = ""
    expected: list[object] = []
    for n, (tag, st_, lines, with_report) in enumerate(items):
        if with_report:
            stream += f'{e}\n   ( nil ) 26-11-29 10:00:00{e}A  {n} REPT DBCHG{e}   "x"{e};'
            expected.append(("A", str(n)))
        code = f"   IIAC{e}" if st_ == "DENY" else ""
        body = "".join(f'   "{line}"{e}' for line in lines)
        stream += f"IP {tag}{e}<{e}\n   ( nil ) 26-11-29 10:00:00{e}M  {tag} {st_}{e}{code}{body};"
        expected.append(("IP", tag))
        expected.append((tag, st_, tuple(lines), "IIAC" if st_ == "DENY" else None))
    decoder = Tl1Decoder()
    got: list[object] = []
    for chunk in split(stream.encode(), cuts):
        for m in decoder.feed(chunk):
            if isinstance(m, Tl1Response):
                got.append((m.ctag, m.status, m.lines, m.error_code))
            elif isinstance(m, Tl1Autonomous):
                got.append((m.alarm, m.atag))
            elif isinstance(m, Tl1Ack):
                got.append((m.code, m.ctag))
    assert got == expected


@settings(max_examples=500, deadline=None, derandomize=True)
@given(st.lists(st.text(max_size=40), max_size=5))
def test_payload_parsers_raise_only_the_codec_error(lines: list[str]) -> None:
    for parse in (parse_patches, parse_power, parse_size, lambda x: parse_port_values(x, "X")):
        with contextlib.suppress(Tl1Error):
            parse(lines)
