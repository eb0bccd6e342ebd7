"""The etcd publisher transport: a writer thread puts queued envelopes as leased keys, in group-committed transactions."""

from __future__ import annotations

import threading
import time
import uuid
from typing import TYPE_CHECKING

import grpc
from aetcd import rpc

from dfpubsub.backends.etcd import register_fork_hooks, status_code, unregister_fork_hooks
from dfpubsub.errors import ClosedError, TransportError
from dfpubsub.metrics import Stats
from dfpubsub.transport import PublisherTransport

from .connection import Stubs, connect

if TYPE_CHECKING:
    from . import EtcdWatchOptions

__all__ = ["EtcdPublisher"]

_TXN_BYTES = 1 << 20  # most envelope bytes in one transaction: below etcd's default --max-request-bytes, 1.5 MiB
#: What an envelope costs etcd and the watchers beyond the publisher: a key written through raft
#: and the MVCC store (and expired with its lease), and an event in every watcher's stream.
_ENVELOPE_COST = 50e-6


class EtcdPublisher(PublisherTransport):
    """Queues envelopes; a thread writes them as leased keys, all that queued up in one transaction.

    While one transaction is in flight the next fills (group commit): a lone
    envelope is written at once, a busy publisher gets transactions of up to
    128 envelopes, and ``send()`` waits only when the next one is full. A
    transaction that fails loses its envelopes (the subscribers see the gap):
    the next ``send()`` raises the error and is dropped too.
    """

    envelope_cost = _ENVELOPE_COST
    send_waits = True  # for room, when the next transaction is full

    def __init__(self, url: str, opts: EtcdWatchOptions, stats: Stats):
        self.stats = stats
        self._url = url
        self._timeout = opts.timeout
        self._conn = connect(url, opts.timeout)
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
        register_fork_hooks(self)

    @property
    def uri(self) -> str:
        return self._url

    @property
    def backlog(self) -> int:
        return len(self._queue)  # read without the lock: a hint, and the list is replaced whole

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
        self._conn.close(final=True)
        unregister_fork_hooks(self)

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
        self._conn.call(lambda stubs: self._put(stubs, batch))

    def _put(self, stubs: Stubs, batch: list[rpc.PutRequest]) -> None:
        """:meth:`_write` on ``stubs``: a gRPC error is left to the connection's call to map."""
        for attempt in range(2):
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
                if attempt or status_code(exc) != grpc.StatusCode.NOT_FOUND:
                    raise
                self._lease_due = float("-inf")  # the lease expired (etcd was down too long): a new one

    def _grant(self, stubs: Stubs) -> None:
        now = time.monotonic()
        response = stubs.lease.LeaseGrant(rpc.LeaseGrantRequest(TTL=self._ttl), timeout=self._timeout)
        if response.error:
            raise TransportError(f"etcd refused a lease: {response.error}")
        self._lease, self._lease_due = response.ID, now + self._rotate

    def before_fork(self) -> None:
        """Let the write in flight end, close the channel and hold the queue until :meth:`after_fork`."""
        self._conn.before_fork()
        self._cond.acquire()

    def after_fork(self, child: bool) -> None:
        if child:  # the writer thread did not come along, and what it had queued is the parent's to write
            self._thread, self._queue, self._queued = None, [], 0
        self._cond.release()
        self._conn.after_fork(child)
