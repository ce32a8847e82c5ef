"""One publisher, many page clients, each behind a bounded queue: publishing never waits, and a client that
falls `maxsize` messages behind is dropped (its stream ends; the browser's EventSource reconnects and gets
a fresh snapshot). So a slow or stalled page costs the server one queue's memory at most, and nothing it
does reaches the run, whose event log never knows a page exists."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field

DEFAULT_MAXSIZE = 64
CLOSED = b""
"""What a dropped or closed client reads last: its stream ends."""


@dataclass(eq=False)
class Client:
    queue: asyncio.Queue[bytes]
    dropped: bool = False
    sent: int = field(default=0)

    async def next(self) -> bytes:
        """The next message, or CLOSED once the client was dropped or the stream closed."""
        message = await self.queue.get()
        self.sent += 1
        return message

    async def next_batch(self) -> list[bytes]:
        """The next message and every one queued behind it (a page then gets them in one write, not one
        each); CLOSED, if there, is last."""
        batch = [await self.next()]
        while batch[-1] != CLOSED and not self.queue.empty():
            batch.append(self.queue.get_nowait())
            self.sent += 1
        return batch


class Fanout:
    """Bounded per-client queues behind one `publish`."""

    def __init__(self, maxsize: int = DEFAULT_MAXSIZE) -> None:
        self.maxsize = maxsize
        self.clients: set[Client] = set()
        self.dropped = 0

    def subscribe(self, first: list[bytes] | None = None) -> Client:
        """A new client, its queue primed with `first` (a snapshot), cut to fit."""
        client = Client(asyncio.Queue(self.maxsize))
        for message in (first or [])[-(self.maxsize - 1) :]:
            client.queue.put_nowait(message)
        self.clients.add(client)
        return client

    def unsubscribe(self, client: Client) -> None:
        self.clients.discard(client)

    def publish(self, message: bytes) -> None:
        for client in list(self.clients):
            try:
                client.queue.put_nowait(message)
            except asyncio.QueueFull:
                self._drop(client)

    def close(self) -> None:
        """End every client's stream (the server is stopping)."""
        for client in list(self.clients):
            self._end(client)
        self.clients.clear()

    def _drop(self, client: Client) -> None:
        client.dropped = True
        self.dropped += 1
        self._end(client)
        self.clients.discard(client)

    @staticmethod
    def _end(client: Client) -> None:
        while not client.queue.empty():  # make room for the end marker: what it had not read is lost anyway
            client.queue.get_nowait()
        client.queue.put_nowait(CLOSED)
