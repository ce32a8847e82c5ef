"""The QP out-of-band exchange over a TCP side channel on 127.0.0.1: both sides learn the other's QP; a
silent, closed or nonsense peer is one line naming it. The QP description's checks are
tests/unit/test_rdma_oob.py."""

from __future__ import annotations

import asyncio

import pytest

from labctl.rdma.oob import ExchangeError, QpInfo, connect_exchange, serve_exchange


async def test_both_ends_learn_each_others_qp() -> None:
    seen: list[QpInfo] = []

    async def mine(theirs: QpInfo) -> QpInfo:
        seen.append(theirs)
        return QpInfo(qpn=0x22, psn=0x2222, gid="fe80::2", addr=0x2000, rkey=7)

    server = await serve_exchange("127.0.0.1", 0, mine)
    port = server.sockets[0].getsockname()[1]
    try:
        ours = QpInfo(qpn=0x11, psn=0x1111, gid="fe80::1", addr=0x1000, rkey=5)
        theirs = await connect_exchange("127.0.0.1", port, ours)
        assert theirs == QpInfo(qpn=0x22, psn=0x2222, gid="fe80::2", addr=0x2000, rkey=7)
        assert seen == [ours]
        # A client sending nonsense is dropped; the next one is served.
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(b'{"qpn": 0, "psn": 1}\n')  # QP number 0 is not a QP
        await writer.drain()
        assert await reader.read() == b""
        writer.close()
        await writer.wait_closed()
        assert (await connect_exchange("127.0.0.1", port, ours)).qpn == 0x22
    finally:
        server.close()
        await server.wait_closed()


async def test_a_peer_that_is_not_there_or_silent_is_one_line() -> None:
    with pytest.raises(ExchangeError, match=r"^QP exchange with 127\.0\.0\.1:1: ") as info:
        await connect_exchange("127.0.0.1", 1, QpInfo(qpn=1, psn=1))
    assert "\n" not in str(info.value)

    done = asyncio.Event()

    async def silent(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            await reader.read()  # until the client gives up and closes
        finally:
            writer.close()
            done.set()

    server = await asyncio.start_server(silent, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    try:
        with pytest.raises(ExchangeError, match=r"no answer within 0\.2 s"):
            await connect_exchange("127.0.0.1", port, QpInfo(qpn=1, psn=1), timeout_s=0.2)
        await asyncio.wait_for(done.wait(), 2)
    finally:
        server.close()
        await server.wait_closed()
