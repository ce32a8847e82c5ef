"""The out-of-band exchange that connecting two RC queue pairs needs: each side's QP number, starting PSN,
GID/LID and the buffer it may be written to (address, rkey), over a TCP side channel.

One JSON line each way (`QpInfo`), then the connection closes: as rdma-core's tests and perftest do it, but
on asyncio, bounded in size and time, and with one-line errors naming the peer. The verbs-rc probe uses the
routed form (`ExchangeRequest` / `ExchangeReply`): one server per port address answers for the circuit
ends named in each request (labctl.rdma.exchange).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
from collections.abc import Awaitable, Callable

import msgspec

from labctl.core.errors import HardwareError, LabctlError

log = logging.getLogger("labctl.rdma")

MAX_LINE = 4096
EXCHANGE_TIMEOUT_S = 5.0


class QpInfo(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """What one end of an RC connection tells the other."""

    qpn: int
    psn: int
    gid: str = ""  # RoCE: the GID (IPv6 notation) of the port's address; IB: empty
    lid: int = 0  # IB: the port's LID; RoCE: 0
    addr: int = 0  # the registered buffer's address (RDMA WRITE ping-pong)
    rkey: int = 0

    def __post_init__(self) -> None:
        if not 0 < self.qpn < 1 << 24 or not 0 <= self.psn < 1 << 24:
            raise ValueError(f"qpn {self.qpn} / psn {self.psn} out of the 24-bit range")


class ExchangeError(HardwareError):
    """The side channel failed: the peer unreachable, silent or talking nonsense."""


_decoder = msgspec.json.Decoder(QpInfo)


async def _swap(
    reader: asyncio.StreamReader, writer: asyncio.StreamWriter, mine: QpInfo, peer: str
) -> QpInfo:
    writer.write(msgspec.json.encode(mine) + b"\n")
    await writer.drain()
    try:
        line = await reader.readuntil(b"\n")
    except asyncio.LimitOverrunError:
        raise ExchangeError(f"QP exchange with {peer}: a line over {MAX_LINE} bytes") from None
    except asyncio.IncompleteReadError:
        raise ExchangeError(f"QP exchange with {peer}: the peer closed before sending its QP") from None
    try:
        return _decoder.decode(line)
    except (msgspec.DecodeError, msgspec.ValidationError, ValueError) as e:
        raise ExchangeError(f"QP exchange with {peer}: not a QP description ({e})") from None


async def connect_exchange(
    host: str, port: int, mine: QpInfo, timeout_s: float = EXCHANGE_TIMEOUT_S
) -> QpInfo:
    """The client side: send ours, receive theirs."""
    peer = f"{host}:{port}"
    try:
        async with asyncio.timeout(timeout_s):
            reader, writer = await asyncio.open_connection(host, port, limit=MAX_LINE)
            try:
                return await _swap(reader, writer, mine, peer)
            finally:
                writer.close()
                await writer.wait_closed()
    except TimeoutError:
        raise ExchangeError(f"QP exchange with {peer}: no answer within {timeout_s:g} s") from None
    except OSError as e:
        raise ExchangeError(f"QP exchange with {peer}: {e.strerror or e}") from None


async def serve_exchange(
    host: str,
    port: int,
    mine: Callable[[QpInfo], Awaitable[QpInfo]],
    timeout_s: float = EXCHANGE_TIMEOUT_S,
) -> asyncio.Server:
    """The server side (127.0.0.1 unless told otherwise): for each client, read its QP, answer with the one
    `mine(theirs)` creates for it. A bad client is closed; the server goes on."""

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        peer = ":".join(str(x) for x in (writer.get_extra_info("peername") or ("?",))[:2])
        try:
            async with asyncio.timeout(timeout_s):
                theirs = _decoder.decode(await reader.readuntil(b"\n"))
                writer.write(msgspec.json.encode(await mine(theirs)) + b"\n")
                await writer.drain()
        except (TimeoutError, asyncio.IncompleteReadError, asyncio.LimitOverrunError, OSError) as e:
            log.warning("QP exchange: %s went away or stayed silent (%s)", peer, type(e).__name__)
        except (msgspec.DecodeError, msgspec.ValidationError, ValueError) as e:
            log.warning("QP exchange: %s sent no QP description (%s)", peer, e)
        finally:  # a bad or gone client cannot stop the server; its own exchange reports the failure
            writer.close()

    return await asyncio.start_server(handle, host, port, limit=MAX_LINE)


# -- the routed exchange: many circuit ends behind one server ---------------------------------------------
class PeerBusy(ExchangeError):
    """The peer is (re)connecting this circuit itself at this moment: its own request will reach us."""


class ExchangeRequest(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """The asking end (`sender`, a port source) to the answering end (`to`) of one circuit: connect to my
    QP, answer with yours."""

    to: str
    sender: str
    qp: QpInfo


class ExchangeReply(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    qp: QpInfo | None = None
    busy: bool = False
    error: str = ""


Answer = Callable[[str, str, QpInfo], Awaitable[QpInfo]]
"""(answering end, asking end, the asking end's QP) → the answering end's QP, connected to it."""

_request_decoder = msgspec.json.Decoder(ExchangeRequest)
_reply_decoder = msgspec.json.Decoder(ExchangeReply)


async def request_exchange(
    sock: socket.socket,
    address: tuple[str, int],
    request: ExchangeRequest,
    timeout_s: float = EXCHANGE_TIMEOUT_S,
) -> QpInfo:
    """Connect `sock` (bound as the caller wants: to a port's address and interface) to `address`, ask,
    and return the answering end's QP; ExchangeError (PeerBusy) in one line otherwise. Closes `sock`."""
    peer = f"{request.to} at {address[0]}:{address[1]}"
    loop = asyncio.get_running_loop()
    try:
        async with asyncio.timeout(timeout_s):
            sock.setblocking(False)
            await loop.sock_connect(sock, address)
            reader, writer = await asyncio.open_connection(sock=sock, limit=MAX_LINE)
            try:
                writer.write(msgspec.json.encode(request) + b"\n")
                await writer.drain()
                line = await reader.readuntil(b"\n")
            finally:
                writer.close()
                with contextlib.suppress(OSError):
                    await writer.wait_closed()
    except TimeoutError:
        raise ExchangeError(f"QP exchange with {peer}: no answer within {timeout_s:g} s") from None
    except (asyncio.IncompleteReadError, asyncio.LimitOverrunError):
        raise ExchangeError(f"QP exchange with {peer}: the peer closed without an answer") from None
    except OSError as e:
        raise ExchangeError(f"QP exchange with {peer}: {e.strerror or e}") from None
    finally:
        sock.close()
    try:
        reply = _reply_decoder.decode(line)
    except (msgspec.DecodeError, msgspec.ValidationError, ValueError) as e:
        raise ExchangeError(f"QP exchange with {peer}: not an answer ({e})") from None
    if reply.busy:
        raise PeerBusy(f"QP exchange with {peer}: it is connecting this circuit itself")
    if reply.qp is None:
        raise ExchangeError(f"QP exchange with {peer}: {reply.error or 'refused'}")
    return reply.qp


async def serve_requests(
    sock: socket.socket, answer: Answer, timeout_s: float = EXCHANGE_TIMEOUT_S
) -> asyncio.Server:
    """Answer ExchangeRequests on the listening `sock`. A bad client is closed and logged; an answer that
    fails is sent back as its one line (PeerBusy as `busy`); the server goes on."""

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        peer = ":".join(str(x) for x in (writer.get_extra_info("peername") or ("?",))[:2])
        try:
            async with asyncio.timeout(timeout_s):
                request = _request_decoder.decode(await reader.readuntil(b"\n"))
                try:
                    reply = ExchangeReply(qp=await answer(request.to, request.sender, request.qp))
                except PeerBusy:
                    reply = ExchangeReply(busy=True)
                except LabctlError as e:
                    reply = ExchangeReply(error=str(e))
                writer.write(msgspec.json.encode(reply) + b"\n")
                await writer.drain()
        except (TimeoutError, asyncio.IncompleteReadError, asyncio.LimitOverrunError, OSError) as e:
            log.warning("QP exchange: %s went away or stayed silent (%s)", peer, type(e).__name__)
        except (msgspec.DecodeError, msgspec.ValidationError, ValueError) as e:
            log.warning("QP exchange: %s sent no exchange request (%s)", peer, e)
        finally:
            writer.close()

    return await asyncio.start_server(handle, sock=sock, limit=MAX_LINE)
