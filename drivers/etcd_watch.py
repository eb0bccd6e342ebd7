"""etcd driver (``etcd://host:port[,host:port...]``): envelopes are leased keys, subscribers watch them.

A publisher puts each envelope under ``/{prefix}/ps/{topic}/{writer}-{n}``
(``writer`` is random per transport, ``n`` counts up). A thread writes them:
whatever queued up while one transaction was in flight goes in the next, up
to ``max_txn_ops`` envelopes or 1 MiB (group commit), so a lone envelope is
written at once and a busy publisher makes few round trips; ``send()`` waits
only while the next transaction is full. Keys carry a lease so that etcd does
not grow without bound. Leases are never kept alive: a fresh one is granted
every ``lease_ttl / 2`` seconds with a TTL of ``1.5 * lease_ttl``, and new
keys take the current one, so an envelope lives ``lease_ttl`` to
``1.5 * lease_ttl`` seconds.

A subscriber watches the whole ``/{prefix}/ps/`` range on one Watch stream and
keeps the envelopes of its topics (the key names the topic; the core checks
again); DELETE events (leases expiring) are filtered out by etcd. The watch
starts at the revision current when the first topic was subscribed, plus one.
After a lost connection, a restarted etcd, a fork, or a pause (``recv()`` not
keeping up with ``max_pending_bytes``), it resumes at the revision after the
last one received, so nothing written meanwhile is missed. When etcd has
compacted that revision away the history is gone: ``on_lost(topic,
"compacted")`` is called for every subscribed topic and the watch continues
from the current revision.

gRPC is used as in :mod:`dfpubsub.store.etcd`: aetcd's generated stubs and
messages on a synchronous channel (aetcd's own client is asyncio-only). A
channel is opened on first use, dropped after a failure (the next call
connects again, to the next endpoint) and closed just before ``os.fork()``
once the calls in flight have ended; both processes then reopen it.
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading
import time
import uuid
import weakref
from collections import deque
from collections.abc import Iterator, Mapping
from typing import Any

import grpc
from aetcd import rpc
from aetcd.utils import prefix_range_end
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from dfpubsub.api import Driver, PublisherTransport, SubscriberTransport
from dfpubsub.errors import ClosedError, ConfigError, TransportError
from dfpubsub.etcd_client import RECONNECT_OPTIONS, UNAVAILABLE, answers, parse_endpoints
from dfpubsub.events import CONTROL_TOPIC
from dfpubsub.logs import RateLimitedLog
from dfpubsub.metrics import Stats

__all__ = ["EtcdWatchDriver", "EtcdWatchOptions"]

log = logging.getLogger(__name__)

_CHANNEL_OPTIONS: list[tuple[str, Any]] = [
    # One watch response carries up to 1000 revisions: far above gRPC's default 4 MiB.
    ("grpc.max_receive_message_length", -1),
    ("grpc.max_send_message_length", -1),
    *RECONNECT_OPTIONS,
    # A watch may wait for writes for ever: pings find a server that vanished without a word
    # (etcd refuses pings more often than every 5 s).
    ("grpc.keepalive_time_ms", 10_000),
    ("grpc.http2.max_pings_without_data", 0),
]
_RECV_BATCH = 512  # most frames one recv() returns
_TXN_BYTES = 1 << 20  # most envelope bytes in one transaction: below etcd's default --max-request-bytes, 1.5 MiB
_MIN_BACKOFF, _MAX_BACKOFF = 0.05, 1.0  # between attempts to watch again after a failure


class EtcdWatchOptions(BaseModel):
    """Options of the ``etcd`` driver (config table ``[driver.etcd]``)."""

    model_config = ConfigDict(extra="forbid")

    prefix: str = Field("dfpubsub", min_length=1, pattern=r"^[^/\x00]+$",
                        description="Envelopes live under /{prefix}/ps/.")
    lease_ttl: int = Field(60, ge=1, le=10**9, description="Seconds envelopes live in etcd (up to 1.5 times that).")
    timeout: float = Field(5.0, gt=0, description="Deadline of each etcd request, seconds.")
    max_txn_ops: int = Field(128, ge=1, description="Envelopes per transaction at most (etcd's --max-txn-ops).")
    max_pending_bytes: int = Field(
        64 << 20, ge=1, description="Bytes a subscriber holds for recv(); beyond, its watch pauses and later resumes."
    )


class _Stubs:
    """A channel and the stubs of the etcd services on it."""

    __slots__ = ("channel", "kv", "lease", "watch")

    def __init__(self, channel: grpc.Channel):
        self.channel = channel
        self.kv = rpc.KVStub(channel)
        self.lease = rpc.LeaseStub(channel)
        self.watch = rpc.WatchStub(channel)


class _Conn:
    """The gRPC channel of one transport: opened on demand, dropped after a failure, closed before a fork."""

    def __init__(self, url: str, timeout: float):
        self.url = url
        self.timeout = timeout
        self._endpoints = [f"{host}:{port}" for host, port in parse_endpoints(url)]
        self._index = 0  # endpoint in use; moves on after a failure
        self._cond = threading.Condition(threading.Lock())  # guards the fields below
        self._stubs: _Stubs | None = None
        self._pid = os.getpid()
        self._calls = 0  # calls in flight
        self._suspended = False  # a fork is under way: new calls wait
        self._closed = False

    @contextlib.contextmanager
    def call(self) -> Iterator[_Stubs]:
        """The stubs to make calls with; a fork waits until the block is left."""
        with self._cond:
            if self._pid != os.getpid():  # forked without our hooks: the parent's channel is not ours
                self._stubs, self._calls, self._suspended, self._pid = None, 0, False, os.getpid()
            self._cond.wait_for(lambda: not self._suspended)
            if self._closed:
                raise ClosedError(f"etcd connection to {self.url} is closed")
            if self._stubs is None:
                self._stubs = _Stubs(self._open())
            stubs = self._stubs
            self._calls += 1
        try:
            yield stubs
        finally:
            del stubs
            with self._cond:
                self._calls -= 1
                if not self._calls:
                    self._cond.notify_all()

    def _open(self) -> grpc.Channel:
        first, n = self._index, len(self._endpoints)
        options = [*_CHANNEL_OPTIONS, ("grpc.keepalive_timeout_ms", int(self.timeout * 1000))]
        for i in range(n):
            self._index = (first + i) % n
            channel = grpc.insecure_channel(self._endpoints[self._index], options=options)
            if n == 1 or answers(channel, self.timeout / n):  # several: take the first that answers
                return channel
            channel.close()
        raise TransportError(f"none of the etcd endpoints of {self.url} answered")

    def error(self, stubs: _Stubs, exc: grpc.RpcError | ValueError) -> TransportError:
        """What a failed call means; a lost or slow server also drops the channel (the next call reconnects)."""
        where = self._endpoints[self._index]
        if isinstance(exc, ValueError):  # gRPC refuses calls on a channel that a failure or a fork closed
            return TransportError(f"etcd channel to {where} was closed during the call")
        code = exc.code() if isinstance(exc, grpc.Call) else None
        details = exc.details() if isinstance(exc, grpc.Call) else str(exc)
        if code is not None and code not in UNAVAILABLE:
            return TransportError(f"etcd at {where} refused the request: {code.name}: {details}")
        with self._cond:
            if stubs is self._stubs:
                self._stubs = None
                stubs.channel.close()
                self._index = (self._index + 1) % len(self._endpoints)
        return TransportError(f"etcd at {where} is unavailable: {details}")

    def close(self) -> None:
        with self._cond:
            self._closed = True
            stubs, self._stubs = self._stubs, None
            self._cond.notify_all()
        if stubs is not None and self._pid == os.getpid():
            stubs.channel.close()

    def before_fork(self) -> None:
        """Close the channel once the calls in flight have ended (cancelling them after ``timeout``);
        return holding the lock, so that no call starts until :meth:`after_fork`."""
        self._cond.acquire()
        self._suspended = True
        stubs, self._stubs = self._stubs, None
        if stubs is not None and self._pid == os.getpid():
            if not self._cond.wait_for(lambda: not self._calls, self.timeout):
                stubs.channel.close()
                self._cond.wait_for(lambda: not self._calls, self.timeout)
            stubs.channel.close()

    def after_fork(self, child: bool) -> None:
        if child:
            self._pid, self._calls = os.getpid(), 0
        self._suspended = False
        self._cond.notify_all()
        self._cond.release()


# -- fork safety -----------------------------------------------------------------------------
# gRPC cannot fork while a thread is inside it (the child crashes or hangs): every live
# transport stops its calls and closes its channel just before a fork, and starts again after.

_LIVE: weakref.WeakSet[Any] = weakref.WeakSet()
_FORKING: list[Any] = []


def _before_fork() -> None:
    for transport in list(_LIVE):
        transport._before_fork()
        _FORKING.append(transport)


def _after_fork(child: bool) -> None:
    while _FORKING:
        _FORKING.pop()._after_fork(child)


os.register_at_fork(before=_before_fork, after_in_parent=lambda: _after_fork(False),
                    after_in_child=lambda: _after_fork(True))


# -- publisher -----------------------------------------------------------------------------


class _EtcdPublisher(PublisherTransport):
    """Queues envelopes; a thread writes them as leased keys, all that queued up in one transaction.

    While one transaction is in flight the next fills (group commit): a lone
    envelope is written at once, a busy publisher gets transactions of up to
    128 envelopes, and ``send()`` waits only when the next one is full. A
    transaction that fails loses its envelopes (the subscribers see the gap):
    the next ``send()`` raises the error and is dropped too.
    """

    def __init__(self, url: str, opts: EtcdWatchOptions, stats: Stats):
        self.stats = stats
        self._url = url
        self._timeout = opts.timeout
        self._conn = _Conn(url, opts.timeout)
        self._root = f"/{opts.prefix}/ps/"
        self._writer = uuid.uuid4().hex[:16]
        self._prefixes: dict[str, bytes] = {}  # topic -> key prefix
        self._n = 0
        self._ttl = opts.lease_ttl + (opts.lease_ttl + 1) // 2
        self._rotate = opts.lease_ttl / 2
        self._max_ops = opts.max_txn_ops
        self._lease = 0  # used by the writer thread only
        self._lease_due = float("-inf")  # when a new lease is needed (monotonic time)
        self._cond = threading.Condition(threading.Lock())  # guards the fields below
        self._queue: list[rpc.PutRequest] = []  # the next transaction
        self._queued = 0  # bytes in it
        self._failed: TransportError | None = None  # a transaction failed since the last send()
        self._lost = 0  # envelopes lost with it
        self._closed = False
        self._thread: threading.Thread | None = None
        _LIVE.add(self)

    @property
    def uri(self) -> str:
        return self._url

    def send(self, topic: str, frame: bytes) -> None:
        prefix = self._prefixes.get(topic)
        if prefix is None:
            prefix = self._prefixes[topic] = f"{self._root}{topic}/{self._writer}-".encode()
        self._n += 1
        put = rpc.PutRequest(key=prefix + b"%012x" % self._n, value=frame)
        size = len(frame)
        with self._cond:
            while not self._closed and self._failed is None and self._queue and (
                    len(self._queue) >= self._max_ops or self._queued + size > _TXN_BYTES):
                self._cond.wait()  # the transaction in flight must end first
            if self._closed:
                raise ClosedError("etcd publisher is closed")
            failed, lost = self._failed, self._lost
            if failed is None:
                self._queue.append(put)
                self._queued += size
                if len(self._queue) == 1:
                    self._cond.notify_all()
                if self._thread is None:
                    self._thread = threading.Thread(target=self._run, name=f"dfpubsub-etcdpub-{self._writer}",
                                                    daemon=True)
                    self._thread.start()
            else:
                self._failed, self._lost = None, 0
        if failed is not None:
            self.stats.inc("drops", lost, reason="txn_failed")
            raise failed

    def close(self) -> None:
        with self._cond:
            if self._closed:
                return
            self._closed = True
            thread = self._thread
            self._cond.notify_all()
        if thread is not None:  # it writes what is queued first
            thread.join(2 * self._timeout)
        self._conn.close()
        _LIVE.discard(self)

    def _run(self) -> None:
        while True:
            with self._cond:
                self._cond.wait_for(lambda: self._queue or self._closed)
                if not self._queue:
                    return
                batch, self._queue, self._queued = self._queue, [], 0
                self._cond.notify_all()  # room for senders
            try:
                self._write(batch)
                continue
            except (TransportError, ClosedError) as exc:
                error = exc if isinstance(exc, TransportError) else TransportError(str(exc))
            with self._cond:
                self._failed = error
                self._lost += len(batch)

    def _write(self, batch: list[rpc.PutRequest]) -> None:
        """Write ``batch`` in one request, with the current lease (a new one if it expired meanwhile)."""
        for attempt in range(2):
            with self._conn.call() as stubs:
                try:
                    if time.monotonic() >= self._lease_due:
                        self._grant(stubs)
                    for put in batch:
                        put.lease = self._lease
                    if len(batch) == 1:
                        stubs.kv.Put(batch[0], timeout=self._timeout)
                    else:
                        stubs.kv.Txn(rpc.TxnRequest(success=[rpc.RequestOp(request_put=p) for p in batch]),
                                     timeout=self._timeout)
                    return
                except grpc.RpcError as exc:
                    if attempt == 0 and isinstance(exc, grpc.Call) and exc.code() == grpc.StatusCode.NOT_FOUND:
                        self._lease_due = float("-inf")  # the lease expired (etcd was down too long): a new one
                        continue
                    raise self._conn.error(stubs, exc) from None
                except ValueError as exc:
                    raise self._conn.error(stubs, exc) from None

    def _grant(self, stubs: _Stubs) -> None:
        now = time.monotonic()
        response = stubs.lease.LeaseGrant(rpc.LeaseGrantRequest(TTL=self._ttl), timeout=self._timeout)
        if response.error:
            raise TransportError(f"etcd refused a lease: {response.error}")
        self._lease, self._lease_due = response.ID, now + self._rotate

    def _before_fork(self) -> None:
        self._conn.before_fork()
        self._cond.acquire()

    def _after_fork(self, child: bool) -> None:
        if child:  # the writer thread did not come along, and what it had queued is the parent's to write
            self._thread, self._queue, self._queued = None, [], 0
        self._cond.release()
        self._conn.after_fork(child)


# -- subscriber ----------------------------------------------------------------------------


class _EtcdSubscriber(SubscriberTransport):
    """One Watch stream over the prefix, read by a thread of its own into a bounded inbox."""

    def __init__(self, url: str, opts: EtcdWatchOptions, stats: Stats):
        self.stats = stats
        self._timeout = opts.timeout
        self._conn = _Conn(url, opts.timeout)
        self._root = f"/{opts.prefix}/ps/".encode()
        self._max_pending = opts.max_pending_bytes
        self._resume_at = opts.max_pending_bytes // 2
        self._cond = threading.Condition(threading.Lock())  # guards the fields below
        self._topics: dict[bytes, str] = {}  # copy-on-write: UTF-8 topic -> topic
        self._inbox: deque[bytes | str] = deque()  # frames; a str marks where history was lost, and why
        self._pending = 0  # bytes in the inbox
        self._next_rev = 0  # where the watch (re)starts; 0: not known yet (the server's current revision)
        self._errors = 0  # connection failures not yet counted by recv()
        self._closed = False
        self._forking = False
        self._watching: grpc.Call | None = None  # the Watch call in progress
        self._thread: threading.Thread | None = None
        self._badlog = RateLimitedLog(log)
        _LIVE.add(self)

    # -- any thread --------------------------------------------------------------------------

    @property
    def revision(self) -> int:
        """The etcd revision received up to (0 before the watch started)."""
        return max(self._next_rev - 1, 0)

    @property
    def paused(self) -> bool:
        """Whether the watch stopped reading until recv() takes half of ``max_pending_bytes``."""
        return self._pending >= self._max_pending

    def subscribe(self, topic: str) -> None:
        with self._cond:
            if self._closed:
                raise ClosedError("etcd subscriber is closed")
            self._topics = {**self._topics, topic.encode(): topic}
            first = self._thread is None and not self._next_rev
        revision = 0
        if first:
            revision = self._current_revision()
        with self._cond:
            if first and revision and not self._next_rev:
                self._next_rev = revision + 1
            if self._thread is None and not self._closed:
                self._thread = threading.Thread(target=self._run, name=f"dfpubsub-etcdwatch-{id(self):x}",
                                                daemon=True)
                self._thread.start()

    def unsubscribe(self, topic: str) -> None:
        with self._cond:
            self._topics = {k: t for k, t in self._topics.items() if t != topic}

    def close(self) -> None:
        with self._cond:
            if self._closed:
                return
            self._closed = True
            watching, thread = self._watching, self._thread
            self._cond.notify_all()
        if watching is not None:
            watching.cancel()
        if thread is not None and thread is not threading.current_thread():
            thread.join(self._timeout)
        self._conn.close()
        _LIVE.discard(self)

    def _current_revision(self, stubs: _Stubs | None = None) -> int:
        """etcd's current revision, or 0 if etcd cannot tell now (``stubs``: within a call already)."""
        error: Exception
        try:
            with contextlib.nullcontext(stubs) if stubs is not None else self._conn.call() as on:
                try:
                    return int(on.kv.Range(rpc.RangeRequest(key=self._root), timeout=self._timeout).header.revision)
                except (grpc.RpcError, ValueError) as exc:
                    error = self._conn.error(on, exc)
        except (TransportError, ClosedError) as exc:
            error = exc
        self._badlog.warning("revision", "cannot read etcd's revision; the watch will start at the current one",
                             error=str(error))
        return 0

    # -- receive thread ----------------------------------------------------------------------

    def recv(self, timeout: float) -> list[bytes]:
        with self._cond:
            if not self._inbox and not self._errors and not self._closed:
                self._cond.wait(timeout)
            if self._closed:
                raise ClosedError("etcd subscriber is closed")
            inbox = self._inbox
            lost = inbox.popleft() if inbox and isinstance(inbox[0], str) else None
            frames: list[bytes] = []
            size = 0
            while inbox and len(frames) < _RECV_BATCH:
                frame = inbox[0]
                if isinstance(frame, str):  # history lost: told at the start of the next call
                    break
                inbox.popleft()
                size += len(frame)
                frames.append(frame)
            if size:
                self._pending -= size
                self._cond.notify_all()  # the watch may be paused, waiting for room
            errors, self._errors = self._errors, 0
            topics = list(self._topics.values())
        if errors:
            self.stats.inc("drops", errors, reason="disconnected")
        if isinstance(lost, str) and self.on_lost is not None:
            for topic in topics:
                if topic != CONTROL_TOPIC:
                    self.on_lost(topic, lost)
        return frames

    # -- watch thread ------------------------------------------------------------------------

    def _run(self) -> None:
        backoff = _MIN_BACKOFF
        while True:
            with self._cond:
                # A watch paused by a full inbox resumes once recv() took half of it.
                self._cond.wait_for(lambda: self._closed or (not self._forking and self._pending <= self._resume_at))
                if self._closed:
                    return
                start = self._next_rev
            try:
                self._watch(start)
                backoff = _MIN_BACKOFF
                continue
            except (TransportError, ClosedError) as exc:
                error = exc
            with self._cond:
                if self._closed:
                    return
                if self._forking:
                    continue
                self._errors += 1
                self._cond.notify_all()
                self._badlog.warning("disconnected", "etcd watch failed; resuming at the next revision received",
                                     error=str(error), revision=self._next_rev)
                self._cond.wait(backoff)
            backoff = min(backoff * 2, _MAX_BACKOFF)

    def _watch(self, start: int) -> None:
        """Watch from revision ``start`` (0: the current one) until the inbox is full or history is lost.

        Raises :class:`TransportError` when the stream fails.
        """
        create = rpc.WatchCreateRequest(key=self._root, range_end=prefix_range_end(self._root),
                                        start_revision=start, filters=[rpc.WatchCreateRequest.NODELETE])
        stop = threading.Event()

        def requests() -> Iterator[rpc.WatchRequest]:
            yield rpc.WatchRequest(create_request=create)
            stop.wait()  # keep our side open: a watch is meant to end only when cancelled

        with self._conn.call() as stubs:
            call = None
            try:
                call = stubs.watch.Watch(requests())
                with self._cond:
                    if self._closed or self._forking:
                        return
                    self._watching = call
                for response in call:
                    if not self._receive(stubs, response, start):
                        return
                raise TransportError("etcd ended the watch")
            except (grpc.RpcError, ValueError) as exc:
                raise self._conn.error(stubs, exc) from None
            finally:
                stop.set()
                if call is not None:
                    call.cancel()
                with self._cond:
                    self._watching = None

    def _receive(self, stubs: _Stubs, response: Any, start: int) -> bool:
        """Take one watch response; False when the watch must start again."""
        if response.compact_revision:
            self._lose("compacted", response.header.revision or self._current_revision(stubs))
            return False
        if response.canceled:
            raise TransportError(f"etcd cancelled the watch: {response.cancel_reason or 'no reason given'}")
        if response.created:
            revision = response.header.revision
            if start > revision + 1:  # etcd's history is behind ours: it was restored or replaced
                self._lose("history_lost", revision)
                return False
            with self._cond:
                if not self._next_rev:
                    self._next_rev = revision + 1
            return True
        events = response.events
        if not events:
            return True
        topics, skip = self._topics, len(self._root)
        frames = []
        for event in events:
            kv = event.kv
            key = kv.key
            if event.type == rpc.Event.PUT and key[skip:key.rfind(b"/")] in topics:
                frames.append(kv.value)
        with self._cond:
            self._next_rev = events[-1].kv.mod_revision + 1
            if frames:
                self._inbox.extend(frames)
                self._pending += sum(map(len, frames))
                self._cond.notify_all()
            return self._pending < self._max_pending and not self._closed

    def _lose(self, reason: str, revision: int) -> None:
        """History from ``_next_rev`` on is gone: mark it for recv() and go on from ``revision + 1``."""
        with self._cond:
            if not (self._inbox and isinstance(self._inbox[-1], str)):  # one mark per gap
                self._inbox.append(reason)
            self._next_rev = revision + 1 if revision else 0
            self._cond.notify_all()
        self._badlog.warning(reason, "etcd no longer has the history the watch needed; resyncing",
                             revision=revision)

    # -- fork ----------------------------------------------------------------------------------

    def _before_fork(self) -> None:
        with self._cond:
            self._forking = True
            watching = self._watching
        if watching is not None:
            watching.cancel()
        self._conn.before_fork()
        self._cond.acquire()

    def _after_fork(self, child: bool) -> None:
        if child:  # the watch thread did not come along
            self._closed = True
        self._forking = False
        self._cond.notify_all()
        self._cond.release()
        self._conn.after_fork(child)


class EtcdWatchDriver(Driver):
    """``etcd://host:port[,host:port...]``: envelopes are leased etcd keys that subscribers watch."""

    name = "etcd"

    def __init__(self, url: str | None = None, options: Mapping[str, Any] | None = None):
        super().__init__(url, options)
        try:
            self.etcd_options = EtcdWatchOptions(**self.options)
        except ValidationError as exc:
            raise ConfigError(f"invalid [driver.etcd] options: {exc}") from exc
        if not url:
            raise ConfigError("the etcd driver needs a URL such as etcd://127.0.0.1:2379")
        parse_endpoints(url)
        self._url: str = url

    def publisher(self, stats: Stats) -> PublisherTransport:
        return _EtcdPublisher(self._url, self.etcd_options, stats)

    def subscriber(self, stats: Stats) -> SubscriberTransport:
        return _EtcdSubscriber(self._url, self.etcd_options, stats)
