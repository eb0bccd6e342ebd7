"""A userspace TCP proxy that puts a WAN between a client and a server: delay, jitter and loss.

Tests use it where the kernel has no netem (``tc qdisc ... netem`` needs the
``sch_netem`` module, which this machine's kernel lacks): a client connects
to the proxy's loopback port and the proxy forwards to the server, each
direction delayed by half the round trip give or take half the jitter
(uniformly), so a request and its answer take ``rtt ± jitter``.

**Loss over TCP is a stall, not a hole.** TCP retransmits what the network
drops, so an application never sees bytes go missing: it sees a segment
arrive about one retransmission timeout (RTO) late, and everything behind it
wait (head-of-line blocking). Dropping bytes in a proxy would corrupt the
stream, which real loss never does, and dropping whole connections would be
a far harsher network than 1% loss. So each chunk (a read of up to 64 KiB,
for small RPCs one segment) is, with probability ``loss``, held for one more
RTO: Linux's ``srtt + max(200 ms, 4 rttvar)``, taken as ``rtt +
max(0.2, 4 * jitter)``. A connection's handshake costs one round trip before
its first byte moves, and with probability ``loss`` the initial RTO of 1 s
more (a lost SYN). :meth:`WanProxy.cut` resets every connection (a member
that vanished, a middlebox that forgot them); the proxy keeps accepting new
ones, which fail as the server does (refused: the client's connection is
closed at once).

Order is kept per direction: a chunk is never delivered before the one read
before it. The proxy runs an asyncio loop on a thread of its own.
"""

from __future__ import annotations

import asyncio
import random
import socket
import struct
import threading
import time
from typing import Self

__all__ = ["WanProxy"]

_CHUNK = 64 << 10
#: Chunks in flight per direction: a bounded pipe, as a real path's window bounds what is in flight.
_IN_FLIGHT = 256
_INITIAL_RTO = 1.0


class WanProxy:
    """Forwards ``127.0.0.1:port`` (``port`` 0: any free one) to ``target`` with ``rtt`` seconds of
    round trip, ``jitter`` either way, and ``loss`` (a probability per chunk) turned into stalls."""

    def __init__(self, target: tuple[str, int], rtt: float = 0.150, jitter: float = 0.020, loss: float = 0.01,
                 seed: int | None = None, host: str = "127.0.0.1", port: int = 0):
        self.target = target
        self.rtt = rtt
        self.jitter = jitter
        self.loss = loss
        self.host = host
        self.port = port
        self.rto = rtt + max(0.2, 4 * jitter)
        self._rng = random.Random(seed)
        self._loop = asyncio.new_event_loop()
        self._server: asyncio.Server | None = None
        self._conns: set[asyncio.Task[None]] = set()
        self._thread = threading.Thread(target=self._loop.run_forever, name=f"wanproxy-{target[1]}", daemon=True)
        #: Connections accepted, stalls added (chunks "lost" and retransmitted), connections cut.
        self.accepted = 0
        self.stalls = 0

    @property
    def address(self) -> str:
        """``host:port`` clients connect to."""
        return f"{self.host}:{self.port}"

    def start(self) -> Self:
        """Listen and forward (returns once listening)."""
        self._thread.start()
        self._server = asyncio.run_coroutine_threadsafe(self._listen(), self._loop).result(10)
        self.port = self._server.sockets[0].getsockname()[1]
        return self

    def cut(self) -> None:
        """Reset every connection now; new ones are still accepted."""
        asyncio.run_coroutine_threadsafe(self._cut(), self._loop).result(10)

    def close(self) -> None:
        """Stop listening, reset every connection and end the thread."""
        if not self._thread.is_alive():
            return
        asyncio.run_coroutine_threadsafe(self._shutdown(), self._loop).result(10)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)
        self._loop.close()

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- on the loop's thread -----------------------------------------------------------------

    async def _listen(self) -> asyncio.Server:
        return await asyncio.start_server(self._accept, self.host, self.port)

    async def _cut(self) -> None:
        for task in list(self._conns):
            task.cancel()
        await asyncio.gather(*self._conns, return_exceptions=True)

    async def _shutdown(self) -> None:
        assert self._server is not None
        self._server.close()
        await self._cut()
        await self._server.wait_closed()

    def _one_way(self) -> float:
        """One direction's delay of a chunk, a stall included when it is "lost"."""
        delay = self.rtt / 2 + self._rng.uniform(-self.jitter / 2, self.jitter / 2)
        if self._rng.random() < self.loss:
            self.stalls += 1
            delay += self.rto
        return delay

    async def _accept(self, client_r: asyncio.StreamReader, client_w: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._conns.add(task)
        self.accepted += 1
        server_w: asyncio.StreamWriter | None = None
        pipes: list[asyncio.Future[None]] = []
        try:
            handshake = self.rtt + (_INITIAL_RTO if self._rng.random() < self.loss else 0.0)
            await asyncio.sleep(handshake)  # SYN, SYN-ACK: nothing moves before
            try:
                server_r, server_w = await asyncio.open_connection(*self.target)
            except OSError:
                return  # refused: the client's connection closes as a refused one would fail
            pipes = [asyncio.ensure_future(self._pipe(client_r, server_w)),
                     asyncio.ensure_future(self._pipe(server_r, client_w))]
            await asyncio.wait(pipes, return_when=asyncio.FIRST_EXCEPTION)
            if any(p.done() and not p.cancelled() and p.exception() for p in pipes):
                raise ConnectionResetError  # one side broke: the other learns it as a reset
        except (asyncio.CancelledError, OSError):
            for w in (client_w, server_w):
                if w is not None:
                    _reset(w)
        finally:
            for p in pipes:
                p.cancel()
            await asyncio.gather(*pipes, return_exceptions=True)
            for w in (client_w, server_w):
                if w is not None:
                    w.close()
            self._conns.discard(task)

    async def _pipe(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        """Copy ``reader`` to ``writer``, each chunk delivered its delay after it was read, in order."""
        queue: asyncio.Queue[tuple[float, bytes]] = asyncio.Queue(_IN_FLIGHT)

        async def deliver() -> None:
            while True:
                at, data = await queue.get()
                wait = at - time.monotonic()
                if wait > 0:
                    await asyncio.sleep(wait)
                if not data:
                    break
                writer.write(data)
                await writer.drain()
            if writer.can_write_eof():
                writer.write_eof()

        sender = asyncio.ensure_future(deliver())
        last = 0.0
        try:
            while True:
                data = await reader.read(_CHUNK)
                last = max(last, time.monotonic() + self._one_way())
                await queue.put((last, data))
                if not data:
                    break
            await sender
        finally:
            sender.cancel()


def _reset(writer: asyncio.StreamWriter) -> None:
    """Close with RST rather than FIN (SO_LINGER 0): the peer sees its connection reset."""
    sock = writer.get_extra_info("socket")
    if sock is not None:
        try:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        except OSError:
            pass
    writer.transport.abort()
