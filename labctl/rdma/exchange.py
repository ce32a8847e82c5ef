"""How the two ends of an RC circuit learn each other's QP (number, PSN, GID/LID, buffer): behind one small
Protocol, in process where both ends are this probe's, else over a TCP side channel (decision 0029).

An exchange is asymmetric: the asking end has reset its QP and sends it; the answering end resets its own,
connects it to the asker's and answers with it; the asker then connects to the answer. Both ends may ask at
once (both QPs errored in the same dark gap): the end whose port source sorts first wins, the other gets
PeerBusy and is connected by the winner's request instead (labctl.probes.verbs_rc).
"""

from __future__ import annotations

import asyncio
import socket
from collections.abc import Sequence
from typing import Protocol

from labctl.linux import netns
from labctl.rdma.oob import (
    Answer,
    ExchangeError,
    ExchangeRequest,
    QpInfo,
    request_exchange,
    serve_requests,
)

OOB_PORT = 47_002
"""The TCP port each port address answers QP exchanges on."""


class PortEndpoint(Protocol):
    """A NIC port's address (labctl.probes.traffic.PortEndpoint has these)."""

    @property
    def source(self) -> str: ...
    @property
    def address(self) -> str: ...
    @property
    def ifname(self) -> str: ...
    @property
    def netns(self) -> str | None: ...


class QpExchange(Protocol):
    async def open(self, answer: Answer) -> None:
        """Start answering for this probe's ports: `answer(local, peer, their QP)` → local's QP."""
        ...

    async def exchange(self, local: str, peer: str, mine: QpInfo) -> QpInfo:
        """Ask `peer`'s end to connect to `mine`; its QP (ExchangeError / PeerBusy in one line)."""
        ...

    async def close(self) -> None: ...


class LocalExchange:
    """Both ends in this process. Probes that share one `registry` reach each other's ports (tests: two
    hosts' probes in one process)."""

    def __init__(self, sources: Sequence[str], registry: dict[str, Answer] | None = None) -> None:
        self.sources = list(sources)
        self.registry: dict[str, Answer] = {} if registry is None else registry

    async def open(self, answer: Answer) -> None:
        for source in self.sources:
            self.registry[source] = answer

    async def exchange(self, local: str, peer: str, mine: QpInfo) -> QpInfo:
        answer = self.registry.get(peer)
        if answer is None:
            raise ExchangeError(f"QP exchange with {peer}: no end for it in this process")
        return await answer(peer, local, mine)

    async def close(self) -> None:
        for source in self.sources:
            self.registry.pop(source, None)


class PortExchange:
    """In process for peers among this probe's ports; otherwise TCP to the peer port's inventory address,
    from the local port's address and interface (as `ib_send_lat` given the peer's RoCE address): the
    exchange rides the circuit it is for, so it goes through once that circuit carries IP."""

    def __init__(
        self,
        endpoints: Sequence[PortEndpoint],
        peers: Sequence[PortEndpoint],
        *,
        port: int = OOB_PORT,
        bind_device: bool = True,
        timeout_s: float = 2.0,
    ) -> None:
        self.local = LocalExchange([e.source for e in endpoints])
        self.by_source = {e.source: e for e in endpoints}
        self.peer_book = {**{e.source: e for e in peers}, **self.by_source}
        self.port = port
        self.bind_device = bind_device
        self.timeout_s = timeout_s
        self._servers: list[asyncio.Server] = []

    def _socket(self, ep: PortEndpoint, port: int) -> socket.socket:
        sock = netns.socket_in(ep.netns, socket.AF_INET, socket.SOCK_STREAM)
        try:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            if self.bind_device:  # the port's own interface, whatever the routing table prefers
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_BINDTODEVICE, ep.ifname.encode())
            sock.bind((ep.address, port))
        except BaseException:
            sock.close()
            raise
        return sock

    async def open(self, answer: Answer) -> None:
        await self.local.open(answer)
        sources = set(self.by_source)

        async def routed(to: str, sender: str, theirs: QpInfo) -> QpInfo:
            if to not in sources:
                raise ExchangeError(f"no port {to} here")
            return await answer(to, sender, theirs)

        try:
            for ep in self.by_source.values():
                sock = self._socket(ep, self.port)
                sock.listen(16)
                self._servers.append(await serve_requests(sock, routed, self.timeout_s))
        except OSError as e:
            await self.close()
            raise ExchangeError(
                f"QP exchange: cannot listen on {ep.address}:{self.port} ({ep.source}): {e.strerror or e}"
            ) from None

    async def exchange(self, local: str, peer: str, mine: QpInfo) -> QpInfo:
        if peer in self.local.registry:
            return await self.local.exchange(local, peer, mine)
        far = self.peer_book.get(peer)
        if far is None:
            raise ExchangeError(f"QP exchange with {peer}: not a port of this lab")
        try:
            sock = self._socket(self.by_source[local], 0)
        except OSError as e:
            raise ExchangeError(f"QP exchange from {local}: {e.strerror or e}") from None
        request = ExchangeRequest(to=peer, sender=local, qp=mine)
        return await request_exchange(sock, (far.address, self.port), request, self.timeout_s)

    async def close(self) -> None:
        await self.local.close()
        servers, self._servers = self._servers, []
        for server in servers:
            server.close()
            await server.wait_closed()
