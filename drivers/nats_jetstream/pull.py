"""Pull requests to a consumer, one at a time, with the messages they bring handed on in stream order.

nats-py's ``fetch`` holds the messages of a lingering request until its batch is
full or it expires, which would add up to the expiry to every event's latency
when traffic is light. Here each message is handed on as it arrives, a request
ends with its batch or with the server's status (404/408: nothing more; 409
Leadership Change: the consumer's leader moved, ask again; any other 409: the
consumer is gone or refused), and the next is sent only while the inbox has
room, so a stalled subscriber leaves the messages in the stream.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from typing import Protocol

from nats.aio.client import Client
from nats.aio.msg import Msg
from nats.aio.subscription import Subscription
from nats.errors import Error as NatsError

from dfpubsub.errors import TransportError

__all__ = ["Pull", "Sink"]


class Sink(Protocol):
    @property
    def full(self) -> bool: ...

    def take(self, seq: int, subject: str, data: bytes) -> None: ...


def stream_seq(reply: str) -> int:
    """The stream sequence in a JetStream ack subject (``$JS.ACK.<stream>.<consumer>.<delivered>.<sseq>...``
    or, from servers with domains, ``$JS.ACK.<domain>.<account>.<stream>.<consumer>.<delivered>.<sseq>...``)."""
    tokens = reply.split(".")
    return int(tokens[5] if len(tokens) == 9 else tokens[7])


class Pull:
    """Reads one consumer for :meth:`run`'s lifetime."""

    def __init__(self, sink: Sink, nc: Client, api_subject: str, batch: int, expires: float):
        self._sink = sink
        self._nc = nc
        self._api = api_subject
        self._batch = batch
        self._expires = expires
        self._request = json.dumps({"batch": batch, "expires": int(expires * 1e9)}).encode()
        self._left = 0
        self._done = asyncio.Event()
        self._error = ""
        self._sub: Subscription | None = None

    async def run(self, stop: Callable[[], bool]) -> None:
        """Pull until ``stop()``, or until a request went unanswered (a reconnect, a consumer gone):
        the caller then checks the consumer."""
        inbox = self._nc.new_inbox()
        self._sub = await self._nc.subscribe(inbox, cb=self._on_msg, pending_msgs_limit=self._batch * 4,
                                             pending_bytes_limit=-1)
        while not stop():
            if self._sink.full:
                await asyncio.sleep(0.005)  # recv() catches up; the stream keeps the rest meanwhile
                continue
            self._done.clear()
            self._left = self._batch
            await self._nc.publish(self._api, self._request, reply=inbox)
            try:
                await asyncio.wait_for(self._done.wait(), self._expires + 1.0)
            except TimeoutError:
                return
            if self._error:
                raise TransportError(f"the NATS consumer refused a pull: {self._error}")

    async def _on_msg(self, msg: Msg) -> None:
        headers = msg.headers
        status = headers.get("Status") if headers else None
        if status:
            if status == "100":  # heartbeat
                return
            why = headers.get("Description", "") if headers else ""
            # 409 Leadership Change: the consumer's leader moved (a server died or stepped down);
            # the consumer is there, and the next request goes to its new leader.
            if status.startswith("409") and "leadership change" not in why.lower():
                self._error = f"{status} {why}".strip()
            self._done.set()  # 404 no messages, 408 expired, 409 leadership change: the request is over
            return
        if not msg.reply:
            return
        try:
            seq = stream_seq(msg.reply)
        except (ValueError, IndexError):
            return
        self._sink.take(seq, msg.subject, msg.data)
        self._left -= 1
        if self._left <= 0:
            self._done.set()

    async def stop(self) -> None:
        if self._sub is not None:
            try:
                await self._sub.unsubscribe()
            except NatsError:
                pass
