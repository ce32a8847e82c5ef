"""Polatis NETCONF transcripts: the exact XML the driver's codec writes and what it reads from replies;
the emulator's RFC 6242 framing (base:1.0 and base:1.1, split across reads at every byte), subtree
filters, and its replies to exact requests, byte for byte."""

from __future__ import annotations

import asyncio
import random
from typing import Any, cast

import pytest

from labctl.emulators.core import FaultPlan
from labctl.emulators.netconf import NetconfEmulator
from labctl.emulators.netconf_data import subtree_filter, to_xml
from labctl.emulators.netconf_session import (
    FramingError,
    NetconfSession,
    frame_chunked,
    frame_eom,
    take_chunked,
    take_eom,
)
from labctl.inventory.mapping import MappingDiff, PortSpace
from labctl.inventory.profiles import resolve_profile
from labctl.models.switch import SwitchModel
from labctl.ocs.drivers.polatis_netconf import codec
from labctl.ocs.drivers.polatis_netconf.codec import NetconfReplyError, RpcError

OPSW = "http://www.polatis.com/yang/optical-switch"
BASE = "urn:ietf:params:xml:ns:netconf:base:1.0"


# -- requests ------------------------------------------------------------------------------------------------
def test_a_remap_is_one_edit_config_of_deletes_and_merges() -> None:
    diff = MappingDiff(
        remove=frozenset({(1, 9), (2, 10), (4, 12)}),
        add=frozenset({(1, 10), (2, 9), (3, 11)}),
    )
    # 1 and 2 move (a merge on the key replaces the egress: no delete of the same entry), 4 goes, 3 comes.
    assert codec.edit_config(diff) == (
        "<edit-config><target><running/></target>"
        f'<config xmlns:nc="{BASE}"><cross-connects xmlns="{OPSW}">'
        '<pair nc:operation="delete"><ingress>4</ingress></pair>'
        '<pair nc:operation="merge"><ingress>1</ingress><egress>10</egress></pair>'
        '<pair nc:operation="merge"><ingress>2</ingress><egress>9</egress></pair>'
        '<pair nc:operation="merge"><ingress>3</ingress><egress>11</egress></pair>'
        "</cross-connects></config></edit-config>"
    )
    old = codec.edit_config(MappingDiff(remove=frozenset({(5, 13)}), add=frozenset()), "pairs")
    assert '<pairs nc:operation="delete"><ingress>5</ingress></pairs>' in old and "<pair " not in old


def test_requests_are_exact() -> None:
    assert codec.rpc("7", codec.get(codec.cross_connects_filter())) == (
        f'<rpc message-id="7" xmlns="{BASE}"><get><filter type="subtree">'
        f'<cross-connects xmlns="{OPSW}"/></filter></get></rpc>'
    )
    assert codec.opm_power_filter([10, 1, 10]) == (
        f'<opm-power xmlns="{OPSW}"><port><port-id>1</port-id><power/></port>'
        "<port><port-id>10</port-id><power/></port></opm-power>"
    )
    assert codec.port_set_state(enable=[3], disable=[1, 2]) == (
        f'<port-set-state xmlns="{OPSW}"><port-enab>3</port-enab>'
        "<port-disab>1</port-disab><port-disab>2</port-disab></port-set-state>"
    )
    assert codec.rpc('a"<', "<close-session/>").startswith('<rpc message-id="a&quot;&lt;"')


# -- capabilities and product ------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("revision", "name"),
    [("2015-09-14", "pairs"), ("2017-02-09", "pairs"), ("2017-08-04", "pair"), ("2018-03-22", "pair")],
)
def test_the_module_revision_names_the_list(revision: str, name: str) -> None:
    caps = [
        "urn:ietf:params:netconf:base:1.1",
        f"{OPSW}?module=optical-switch&amp;revision={revision}&amp;deviations=x",
    ]
    assert codec.module_revision(caps) == revision
    assert codec.list_name(revision) == name


def test_no_optical_switch_module_and_product_sizes() -> None:
    assert codec.module_revision(["urn:ietf:params:netconf:base:1.0", f"{OPSW}?module=other"]) is None
    assert codec.size_from_model("N-VST-512x512-LA1-DMHNV-701") == PortSpace(512, 512)
    assert codec.size_from_model("N-OST-24x48") == PortSpace(24, 48)
    assert codec.size_from_model("Series 6000") is None


# -- replies -------------------------------------------------------------------------------------------------
def test_cross_connects_of_either_revision_and_bad_ports() -> None:
    for name in ("pair", "pairs"):
        raw = (
            f'<rpc-reply message-id="3" xmlns="{BASE}"><data><cross-connects xmlns="{OPSW}">'
            f"<{name}><ingress>1</ingress><egress>17</egress></{name}>"
            f"<{name}><ingress> 2 </ingress><egress>18</egress></{name}>"
            "</cross-connects></data></rpc-reply>"
        )
        reply = codec.parse_reply(raw)
        assert reply.message_id == "3" and not reply.ok and not reply.errors
        assert codec.parse_cross_connects(reply.data) == {(1, 17), (2, 18)}
    empty = codec.parse_reply(f'<rpc-reply message-id="4" xmlns="{BASE}"><data/></rpc-reply>')
    assert codec.parse_cross_connects(empty.data) == frozenset()
    bad = codec.parse_reply(
        f'<rpc-reply message-id="5" xmlns="{BASE}"><data><cross-connects xmlns="{OPSW}">'
        "<pair><ingress>x</ingress><egress>17</egress></pair></cross-connects></data></rpc-reply>"
    )
    with pytest.raises(NetconfReplyError, match="ingress 'x' is not a port number"):
        codec.parse_cross_connects(bad.data)
    with pytest.raises(NetconfReplyError, match="no <data>"):
        codec.parse_cross_connects(
            codec.parse_reply(f'<rpc-reply message-id="6" xmlns="{BASE}"><ok/></rpc-reply>').data
        )


def test_opm_power_no_light_is_none() -> None:
    raw = (
        f'<rpc-reply message-id="9" xmlns="{BASE}"><data><opm-power xmlns="{OPSW}">'
        "<port><port-id>1</port-id><power>-1.00</power></port>"
        "<port><port-id>17</port-id><power>-99.99</power></port>"
        "<port><port-id>18</port-id></port>"
        "</opm-power></data></rpc-reply>"
    )
    assert codec.parse_opm_power(codec.parse_reply(raw).data) == {1: -1.0, 17: None, 18: None}
    with pytest.raises(NetconfReplyError, match="not a number"):
        codec.parse_opm_power(codec.parse_reply(raw.replace("-1.00", "dark")).data)


def test_rpc_errors_become_one_line_with_the_error_tag() -> None:
    raw = (
        f'<rpc-reply message-id="2" xmlns="{BASE}"><rpc-error><error-type>application</error-type>'
        "<error-tag>operation-failed</error-tag><error-severity>error</error-severity>"
        '<error-message xml:lang="en">change\n refused</error-message></rpc-error>'
        "<rpc-error><error-type>protocol</error-type><error-tag>in-use</error-tag>"
        "<error-severity>error</error-severity><error-path>/cross-connects/pair[ingress=1]</error-path>"
        "</rpc-error>"
        "<rpc-error><error-tag>data-missing</error-tag><error-severity>warning</error-severity></rpc-error>"
        "</rpc-reply>"
    )
    reply = codec.parse_reply(raw)
    assert [e.tag for e in reply.errors] == ["operation-failed", "in-use"]
    assert [e.tag for e in reply.warnings] == ["data-missing"]
    error = codec.NetconfRpcError("ocs1", "edit-config", reply.errors)
    assert str(error) == (
        "ocs1: edit-config refused: operation-failed (application): change refused; "
        "in-use (protocol) at /cross-connects/pair[ingress=1]"
    )
    assert "\n" not in str(error)
    assert codec.error_line("s", "get", [RpcError("x")]) == "s: get refused: x"


@pytest.mark.parametrize(
    ("raw", "match"),
    [
        ("<rpc-reply", "not XML"),
        (f'<hello xmlns="{BASE}"/>', "expected rpc-reply"),
        ('<!DOCTYPE x [<!ENTITY a "b">]><rpc-reply/>', "DTD"),
        ('<rpc-reply message-id="1"><ok/></rpc-reply>', "expected rpc-reply"),  # no namespace: not NETCONF
    ],
)
def test_replies_that_are_not_netconf_are_refused(raw: str, match: str) -> None:
    with pytest.raises(NetconfReplyError, match=match):
        codec.parse_reply(raw)


# -- framing (the emulator's, RFC 6242) ------------------------------------------------------------------------
def _feed_bytewise(framed: bytes, take: Any) -> list[bytes]:
    """Feed one byte per read, taking messages as they complete: every chunk boundary split."""
    buf, out = bytearray(), []
    for i in range(len(framed)):
        buf += framed[i : i + 1]
        while (message := take(buf)) is not None:
            out.append(message)
    assert not buf
    return out


def test_base10_end_of_message_split_across_reads() -> None:
    messages = [b"<rpc>one</rpc>", b"<rpc>]]></rpc>"[:6] + b"x</rpc>", b"<rpc>three</rpc>"]
    framed = b"".join(frame_eom(m) for m in messages)
    assert frame_eom(b"<a/>") == b"<a/>]]>]]>"
    assert _feed_bytewise(framed, take_eom) == messages
    assert _feed_bytewise(b"\n  <a/>\n]]>]]>", take_eom) == [b"<a/>"]  # whitespace around it


def test_base11_chunks_split_at_every_byte() -> None:
    message = b'<rpc message-id="1" xmlns="urn:ietf:params:xml:ns:netconf:base:1.0"><get/></rpc>'
    assert frame_chunked(message) == b"\n#%d\n%s\n##\n" % (len(message), message)
    assert frame_chunked(b"abcdefg", 3) == b"\n#3\nabc\n#3\ndef\n#1\ng\n##\n"
    for size in (1, 2, 7, 64, len(message)):
        framed = frame_chunked(message, size) + frame_chunked(b"<second/>", 4)
        assert _feed_bytewise(framed, take_chunked) == [message, b"<second/>"]
    # RFC 6242 §4.2's example: two chunks, the second one byte
    assert take_chunked(bytearray(b'\n#4\n<rpc\n#18\n message-id="102"\n\n#1\n>\n##\n')) == (
        b'<rpc message-id="102"\n>'
    )


@pytest.mark.parametrize(
    "framed",
    [
        b"<rpc/>\n##\n",  # no chunk header
        b"\n#0\n\n##\n",  # chunk size 0
        b"\n#01\na\n##\n",  # leading zero
        b"\n#12345678901\n",  # more than 10 digits
        b"\n#4294967296\n",  # above the maximum
        b"\n##\n",  # a message of no chunk
        b"\n#1\na\n##x",  # end marker without its newline
        b"\n#1\nab\n##\n",  # a chunk longer than it said
        b"garbage\n#1\na\n##\n",
    ],
)
def test_broken_base11_framing_is_an_error(framed: bytes) -> None:
    with pytest.raises(FramingError):
        take_chunked(bytearray(framed))


def test_incomplete_base11_waits() -> None:
    for part in (b"", b"\n", b"\n#", b"\n#12", b"\n#3\nab", b"\n#3\nabc", b"\n#3\nabc\n#", b"\n#3\nabc\n##"):
        buf = bytearray(part)
        assert take_chunked(buf) is None and bytes(buf) == part


# -- subtree filters (the emulator's) ---------------------------------------------------------------------------
def _tree(xml: str) -> list[Any]:
    import xml.etree.ElementTree as ET

    return list(ET.fromstring(f"<data>{xml}</data>"))


CROSS = (
    f'<cross-connects xmlns="{OPSW}"><pair><ingress>1</ingress><egress>9</egress></pair>'
    "<pair><ingress>2</ingress><egress>10</egress></pair></cross-connects>"
)
PORTS = (
    f'<opm-power xmlns="{OPSW}"><port><port-id>1</port-id><power>-1.00</power></port>'
    "<port><port-id>2</port-id><power>-99.99</power></port></opm-power>"
)


@pytest.mark.parametrize(
    ("flt", "expected"),
    [
        (f'<cross-connects xmlns="{OPSW}"/>', CROSS),  # the empty-container form ONOS sends
        (f'<cross-connects xmlns="{OPSW}"><pair/></cross-connects>', CROSS),
        ("<cross-connects/>", CROSS),  # no namespace: any namespace
        ('<cross-connects xmlns="urn:other"/>', ""),
        (
            f'<cross-connects xmlns="{OPSW}"><pair><ingress>2</ingress></pair></cross-connects>',
            f'<cross-connects xmlns="{OPSW}"><pair><ingress>2</ingress><egress>10</egress></pair></cross-connects>',
        ),
        (
            f'<opm-power xmlns="{OPSW}"><port><port-id>2</port-id><power/></port></opm-power>',
            f'<opm-power xmlns="{OPSW}"><port><port-id>2</port-id><power>-99.99</power></port></opm-power>',
        ),
        (
            f'<opm-power xmlns="{OPSW}"><port><port-id>1</port-id></port><port><port-id>2</port-id></port>'
            "</opm-power>",
            PORTS,
        ),
        (f'<opm-power xmlns="{OPSW}"><port><port-id>3</port-id></port></opm-power>', ""),
        (
            f'<opm-power xmlns="{OPSW}"><port><power/></port></opm-power>',
            PORTS.replace("<port-id>1</port-id>", "").replace("<port-id>2</port-id>", ""),
        ),
    ],
)
def test_subtree_filters(flt: str, expected: str) -> None:
    selected = subtree_filter(_tree(CROSS + PORTS), _tree(flt))
    assert "".join(to_xml(e) for e in selected) == expected


# -- the emulator's replies to exact requests -------------------------------------------------------------------
class _Wire:
    """The writer end of a session: what the emulator wrote, and whether it hung up."""

    def __init__(self) -> None:
        self.data = bytearray()
        self.closed = False
        self.aborted = False
        self.transport = self

    def write(self, data: bytes) -> None:
        self.data += data

    def is_closing(self) -> bool:
        return self.closed

    def close(self) -> None:
        self.closed = True

    def abort(self) -> None:
        self.aborted = True

    def take(self) -> bytes:
        out = bytes(self.data)
        self.data.clear()
        return out


async def _transcript(
    emulator: NetconfEmulator, session: NetconfSession, request: bytes, wire: _Wire
) -> bytes:
    buf = bytearray(request)
    while (text := emulator.frame(session, buf)) is not None:
        await emulator.handle(session, text)
    await asyncio.gather(*session.replies)
    return wire.take()


@pytest.fixture
def emulator() -> Any:
    model = SwitchModel("ocs1", PortSpace(8, 8), resolve_profile("fast"), random.Random(0))
    yield NetconfEmulator(model, users={"admin": "pw"})
    model.cancel_pending()


async def test_hello_then_rpcs_in_base11_byte_for_byte(emulator: NetconfEmulator) -> None:
    wire = _Wire()
    session = NetconfSession(cast(Any, wire), user="admin", session_id=4)
    hello = emulator._hello(4)
    assert f"<capability>{OPSW}?module=optical-switch&amp;revision=2018-03-22</capability>" in hello
    assert "<capability>urn:ietf:params:netconf:base:1.1</capability>" in hello
    assert hello.endswith("<session-id>4</session-id></hello>")

    client_hello = (
        f'<hello xmlns="{BASE}"><capabilities><capability>urn:ietf:params:netconf:base:1.0</capability>'
        "<capability>urn:ietf:params:netconf:base:1.1</capability></capabilities></hello>]]>]]>"
    )
    assert await _transcript(emulator, session, client_hello.encode(), wire) == b""
    assert session.hello_done and session.base == "1.1"

    edit = codec.rpc("101", codec.edit_config(MappingDiff(remove=frozenset(), add=frozenset({(1, 9)}))))
    reply = await _transcript(emulator, session, frame_chunked(edit.encode(), 17), wire)
    ok = f'<rpc-reply xmlns="{BASE}" message-id="101"><ok/></rpc-reply>'.encode()
    assert reply == b"\n#%d\n%s\n##\n" % (len(ok), ok)
    assert emulator.model.patches == {(1, 9)}

    get = codec.rpc("102", codec.get(codec.cross_connects_filter()))
    reply = await _transcript(emulator, session, frame_chunked(get.encode()), wire)
    data = (
        f'<rpc-reply xmlns="{BASE}" message-id="102"><data><cross-connects xmlns="{OPSW}">'
        "<pair><ingress>1</ingress><egress>9</egress></pair></cross-connects></data></rpc-reply>"
    ).encode()
    assert reply == frame_chunked(data)


async def test_rpc_errors_and_base10_from_a_base10_client(emulator: NetconfEmulator) -> None:
    wire = _Wire()
    session = NetconfSession(cast(Any, wire), user="admin", session_id=1)
    client_hello = (
        f'<hello xmlns="{BASE}"><capabilities><capability>urn:ietf:params:netconf:base:1.0</capability>'
        "</capabilities></hello>]]>]]>"
    )
    await _transcript(emulator, session, client_hello.encode(), wire)
    assert session.base == "1.0"

    emulator.model.refusals = 1
    edit = codec.rpc("7", codec.edit_config(MappingDiff(remove=frozenset(), add=frozenset({(2, 10)}))))
    reply = await _transcript(emulator, session, frame_eom(edit.encode()), wire)
    assert reply.endswith(b"]]>]]>")
    parsed = codec.parse_reply(reply[:-6].decode())
    assert parsed.message_id == "7" and [e.tag for e in parsed.errors] == ["operation-failed"]
    assert emulator.model.patches == frozenset()

    # the old list name on a 2018 revision is an unknown element; a delete of nothing is data-missing;
    # a second ingress on one egress is in-use; an egress where an ingress belongs is invalid-value
    for body, tag in [
        (
            codec.edit_config(MappingDiff(remove=frozenset(), add=frozenset({(1, 9)})), "pairs"),
            "unknown-element",
        ),
        (codec.edit_config(MappingDiff(remove=frozenset({(3, 11)}), add=frozenset())), "data-missing"),
        (codec.edit_config(MappingDiff(remove=frozenset(), add=frozenset({(1, 9), (2, 9)}))), "in-use"),
        (codec.edit_config(MappingDiff(remove=frozenset(), add=frozenset({(9, 1)}))), "invalid-value"),
        ("<get-config><source><candidate/></source></get-config>", "invalid-value"),
        ("<kill-session><session-id>2</session-id></kill-session>", "operation-not-supported"),
        ('<get><filter type="xpath" select="/cross-connects"/></get>', "operation-not-supported"),
    ]:
        reply = await _transcript(emulator, session, frame_eom(codec.rpc("8", body).encode()), wire)
        assert [e.tag for e in codec.parse_reply(reply[:-6].decode()).errors] == [tag], body
    no_id = f'<rpc xmlns="{BASE}"><get/></rpc>]]>]]>'.encode()
    assert b"<error-tag>missing-attribute</error-tag>" in await _transcript(emulator, session, no_id, wire)
    no_ns = b"<rpc message-id='2'><get/></rpc>]]>]]>"
    assert b"<error-tag>unknown-element</error-tag>" in await _transcript(emulator, session, no_ns, wire)
    reply = await _transcript(emulator, session, b"<rpc message-id='1'><get>]]>]]>", wire)
    assert b"<error-tag>malformed-message</error-tag>" in reply
    assert emulator.model.patches == frozenset()


async def test_garbage_inside_breaks_the_xml_not_the_framing(emulator: NetconfEmulator) -> None:
    wire = _Wire()
    session = NetconfSession(cast(Any, wire), user="admin", session_id=1, hello_done=True, base="1.1")
    emulator.set_faults(FaultPlan(garbage_every=1))
    get = codec.rpc("1", codec.get(codec.cross_connects_filter()))
    reply = await _transcript(emulator, session, frame_chunked(get.encode()), wire)
    message = take_chunked(bytearray(reply))
    assert message is not None and message.startswith(f'<rpc-reply xmlns="{BASE}" message-id="1">'.encode())
    with pytest.raises(NetconfReplyError, match="not XML"):
        codec.parse_reply(message.decode("utf-8", errors="replace"))


async def test_a_client_hello_without_a_base_ends_the_session(emulator: NetconfEmulator) -> None:
    wire = _Wire()
    session = NetconfSession(cast(Any, wire), user="admin", session_id=1)
    hello = f'<hello xmlns="{BASE}"><capabilities><capability>urn:x</capability></capabilities></hello>]]>]]>'
    await _transcript(emulator, session, hello.encode(), wire)
    assert wire.aborted and session.closed and not session.hello_done


async def test_port_shutter_set_state_is_answered_like_port_set_state(emulator: NetconfEmulator) -> None:
    """The polatis-switch shutter RPC in the form a public client sends it (tcdona3: pretty-printed, one
    port per leaf): `<ok/>`, and the ports' status is what port-set-state would have made it."""
    plts = "http://www.polatis.com/yang/polatis-switch"
    wire = _Wire()
    session = NetconfSession(cast(Any, wire), user="admin", session_id=1, hello_done=True, base="1.0")

    def shutter(message_id: str, leaves: str) -> bytes:
        request = (
            f'<rpc message-id="{message_id}" xmlns="{BASE}">\n'
            f'        <port-shutter-set-state xmlns="{plts}">\n'
            f"          {leaves}\n"
            "        </port-shutter-set-state>\n"
            "</rpc>"
        )
        return frame_eom(request.encode())

    reply = await _transcript(emulator, session, shutter("11", "<port-disab>3</port-disab>"), wire)
    assert reply == frame_eom(f'<rpc-reply xmlns="{BASE}" message-id="11"><ok/></rpc-reply>'.encode())
    assert emulator.disabled == {3}

    get = codec.rpc("12", codec.get(codec.port_status_filter([3, 4])))
    reply = await _transcript(emulator, session, frame_eom(get.encode()), wire)
    assert reply == frame_eom(
        (
            f'<rpc-reply xmlns="{BASE}" message-id="12"><data><port-config xmlns="{OPSW}">'
            "<port><port-id>3</port-id><status>DISABLED</status></port>"
            "<port><port-id>4</port-id><status>ENABLED</status></port>"
            "</port-config></data></rpc-reply>"
        ).encode()
    )

    both = "<port-disab>4</port-disab><port-enab>3</port-enab>"
    reply = await _transcript(emulator, session, shutter("13", both), wire)
    assert reply == frame_eom(f'<rpc-reply xmlns="{BASE}" message-id="13"><ok/></rpc-reply>'.encode())
    assert emulator.disabled == {4}

    # what port-set-state refuses, the shutter RPC refuses the same way, naming itself; nothing changes
    for leaves, tag, message in [
        ("<port-close>4</port-close>", "unknown-element", "port-shutter-set-state has no port-close"),
        ("<port-enab>17</port-enab>", "invalid-value", "port-enab '17' is not a port 1..16"),
    ]:
        reply = await _transcript(emulator, session, shutter("14", leaves), wire)
        errors = codec.parse_reply(reply[:-6].decode()).errors
        assert [(e.tag, e.message) for e in errors] == [(tag, message)], leaves
    assert emulator.disabled == {4}
