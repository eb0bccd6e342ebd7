"""Discovery in etcd (``etcd://host:port[,host:port...]``) over gRPC, with aetcd's messages and stubs.

Like the etcd store, on the shared :class:`~dfpubsub.backends.etcd.EtcdChannel`: gRPC's
synchronous API on a thread-safe channel, aetcd's generated stubs and protobuf messages only, a
channel that failed is closed and the next call connects to the next endpoint, and around an
``os.fork()`` the channels are closed (the calls in flight cancelled: a renewal or the watch
then resumes) and reopened on both sides.

- A registration is a lease with the TTL (etcd counts whole seconds and
  raises a TTL below its minimum, 2 s by default: :attr:`EtcdDiscovery.lease_ttl`
  is what it granted) and the key ``/{prefix}/publishers/{publisher_id}``
  holding the record as JSON, attached to the lease. When the keep-alives
  stop, etcd revokes the lease and deletes the key by itself.
- A renewal is one ``LeaseKeepAlive`` exchange (a stream opened for one
  request and its answer: at one renewal per ``renew_interval`` a standing
  stream would save little and need a thread of its own), then one ``Txn``
  that rewrites the key if asked, or if it is no longer attached to the lease
  (deleted by someone). A lease that expired (TTL 0 in the answer: an outage
  longer than the TTL) is replaced by a new one and the key re-created.
- A watcher lists the prefix, then watches it from the listing's revision
  + 1 on a channel of its own; after a broken stream it resumes from the
  last revision it processed, and lists again only if etcd compacted that
  revision away. Progress requests every few seconds detect a stream that
  went silent (a network partition does not close it); no answer within
  three rounds and the stream is dropped and resumed (on the next endpoint).
"""

from __future__ import annotations

import functools
import math
import threading
import time
from collections.abc import Callable
from typing import Any, NamedTuple, TypeVar

from aetcd import rpc
from aetcd.utils import prefix_range_end

from ..backends.etcd import EtcdChannel, keep_alive_once, register_fork_hooks, unregister_fork_hooks
from ..errors import StoreError, StoreUnavailable
from ..retry import Backoff
from .api import Discovery, PublisherRecord, RecordCallback, Watcher

__all__ = ["EtcdDiscovery"]

T = TypeVar("T")
_DELETE = 1  # mvccpb.Event.DELETE


class _LeaseGone(StoreError):
    """etcd no longer knows the lease (it expired)."""


class _Stubs(NamedTuple):
    kv: Any
    lease: Any


class EtcdDiscovery(Discovery):
    """``etcd://host:port``; records under ``/{prefix}/publishers/``."""

    backend = "etcd"

    def __init__(self, url: str, ttl: float, renew_interval: float, prefix: str = "dfpubsub",
                 timeout: float | None = None):
        super().__init__(url, ttl, renew_interval, prefix, timeout)
        self._conn = EtcdChannel(url, self.timeout, lambda ch: _Stubs(rpc.KVStub(ch), rpc.LeaseStub(ch)))
        register_fork_hooks(self._conn)
        self.root = f"/{prefix}/publishers/".encode()
        #: The lease TTL asked for; etcd may grant more (see :attr:`lease_ttl`).
        self._asked_ttl = max(1, math.ceil(self.ttl))
        #: Whole seconds a lease lives without keep-alive, as etcd granted it.
        self.lease_ttl = self._asked_ttl

    def _call(self, fn: Callable[[_Stubs], T]) -> T:
        """``fn(stubs)`` on the shared channel (RPCs with deadlines only); a lease etcd no longer
        knows is :class:`_LeaseGone`."""
        try:
            return self._conn.call(fn)
        except StoreError as exc:
            if not isinstance(exc, StoreUnavailable) and "lease not found" in str(exc):
                raise _LeaseGone(str(exc)) from None
            raise

    @property
    def effective_ttl(self) -> float:
        return float(max(self.lease_ttl, self.ttl))

    def _key(self, record: PublisherRecord) -> bytes:
        return self.root + record.publisher_id.encode()

    def _put(self, record: PublisherRecord, lease: int) -> rpc.RequestOp:
        return rpc.RequestOp(request_put=rpc.PutRequest(key=self._key(record), value=record.to_json(), lease=lease))

    def _create(self, record: PublisherRecord) -> int:
        t = self.timeout
        grant = self._call(lambda s: s.lease.LeaseGrant(rpc.LeaseGrantRequest(TTL=self._asked_ttl), timeout=t))
        if grant.error:
            raise StoreError(f"etcd refused a lease: {grant.error}")
        self.lease_ttl = int(grant.TTL)
        try:
            self._call(lambda s: s.kv.Txn(rpc.TxnRequest(success=[self._put(record, grant.ID)]), timeout=t))
        except StoreError:
            try:
                self._revoke(grant.ID)
            except StoreError:
                pass  # unreachable too: the lease expires by itself, with nothing attached
            raise
        return int(grant.ID)

    def _keep_alive(self, lease: int) -> int:
        """One keep-alive exchange; the lease's TTL after it (0: the lease is gone)."""
        return self._call(lambda s: keep_alive_once(s.lease, lease, self.timeout))

    def _renew(self, handle: Any, record: PublisherRecord, rewrite: bool) -> int:
        lease = int(handle)
        if self._keep_alive(lease) <= 0:
            self._trouble.warning(f"vanished-{record.publisher_id}", "discovery lease expired; registering again",
                                  backend=self.backend, publisher_id=record.publisher_id)
            return self._create(record)
        # Rewrite when asked, or when the key is no longer ours (compare LEASE: 0 for a missing key).
        attached = rpc.Compare(key=self._key(record), target=rpc.Compare.LEASE, result=rpc.Compare.EQUAL, lease=lease)
        request = rpc.TxnRequest(compare=[attached], success=[self._put(record, lease)] if rewrite else [],
                                 failure=[self._put(record, lease)])
        try:
            response = self._call(lambda s: s.kv.Txn(request, timeout=self.timeout))
        except _LeaseGone:  # expired between the keep-alive and the write
            return self._create(record)
        if not response.succeeded:
            self._trouble.warning(f"vanished-{record.publisher_id}", "discovery key vanished; re-created it",
                                  backend=self.backend, publisher_id=record.publisher_id)
        return lease

    def _revoke(self, lease: int) -> None:
        try:
            self._call(lambda s: s.lease.LeaseRevoke(rpc.LeaseRevokeRequest(ID=lease), timeout=self.timeout))
        except _LeaseGone:
            pass

    def _remove(self, handle: Any, record: PublisherRecord) -> None:
        key = self._key(record)
        self._call(lambda s: s.kv.DeleteRange(rpc.DeleteRangeRequest(key=key), timeout=self.timeout))
        self._revoke(int(handle))

    def _range(self) -> tuple[dict[str, PublisherRecord], dict[str, int], int]:
        """The records under the prefix, their leases and the revision read."""
        request = rpc.RangeRequest(key=self.root, range_end=prefix_range_end(self.root))
        response = self._call(lambda s: s.kv.Range(request, timeout=self.timeout))
        records: dict[str, PublisherRecord] = {}
        leases: dict[str, int] = {}
        skip = len(self.root)
        for kv in response.kvs:
            publisher_id = kv.key[skip:].decode(errors="replace")
            record = self._parse_row(publisher_id, kv.value, None)
            if record is not None:
                records[publisher_id] = record
                leases[publisher_id] = kv.lease
        return records, leases, int(response.header.revision)

    def _time_to_live(self, lease: int, stub: Any) -> Any:
        return stub.lease.LeaseTimeToLive(rpc.LeaseTimeToLiveRequest(ID=lease), timeout=self.timeout)

    def _snapshot(self) -> dict[str, PublisherRecord]:
        records, leases, _ = self._range()
        out: dict[str, PublisherRecord] = {}
        for publisher_id, record in records.items():
            lease = leases[publisher_id]
            left: float | None = None
            if lease:
                ttl = self._call(functools.partial(self._time_to_live, lease)).TTL
                if ttl < 0:  # expired, the key not yet deleted
                    continue
                left = float(ttl)
            out[publisher_id] = PublisherRecord(**record.to_dict(), lease_left=left)
        return out

    def _watcher(self, on_added: RecordCallback, on_removed: RecordCallback,
                 on_updated: RecordCallback | None) -> Watcher:
        return _EtcdWatcher(self, on_added, on_removed, on_updated)

    def _close(self) -> None:
        unregister_fork_hooks(self._conn)
        self._conn.close(final=True)


class _EtcdWatcher(Watcher):
    """A real etcd watch of the prefix, resumed by revision after a broken stream."""

    discovery: EtcdDiscovery

    def __init__(self, discovery: EtcdDiscovery, on_added: RecordCallback, on_removed: RecordCallback,
                 on_updated: RecordCallback | None):
        super().__init__(discovery, on_added, on_removed, on_updated)
        self._revision = 0  # last revision processed; 0: list again
        # The stream's own channel (a failure there leaves the renewals' alone); its failures move
        # it to the next endpoint, and a fork cancels the stream, which resumes after it.
        self._channel = EtcdChannel(discovery.url, discovery.timeout, rpc.WatchStub)
        register_fork_hooks(self._channel)
        self._stream_lock = threading.Lock()
        self._stream: Any = None  # the Watch call in progress, for close() to cancel
        self._progress_every = max(1.0, discovery.renew_interval)
        self._stale_after = 3 * self._progress_every + discovery.timeout
        #: Streams opened, and listings made after a compaction (for tests and metrics).
        self.streams = 0
        self.relists = 0

    def _start(self) -> None:
        self._relist()
        self._thread.start()

    def _relist(self) -> None:
        records, _, revision = self.discovery._range()
        self._apply(records)
        self._revision = revision

    def _interrupt(self) -> None:
        with self._stream_lock:
            if self._stream is not None:
                self._stream.cancel()

    def _run(self) -> None:
        backoff = Backoff(0.1, 1.0)
        try:
            while not self._stop.is_set():
                try:
                    if self._revision == 0:
                        self.relists += 1
                        self._relist()
                    if self._channel.call(self._follow):
                        backoff.reset()
                except StoreError as exc:
                    if self._stop.is_set():
                        return
                    self.discovery._trouble.warning("watch-etcd", "discovery watch broke; resuming",
                                                    error=str(exc), revision=self._revision)
                self._stop.wait(backoff.failed())
        finally:
            unregister_fork_hooks(self._channel)
            self._channel.close(final=True)

    def _follow(self, watch: Any) -> bool:
        """Watch from ``_revision + 1`` on ``watch`` (the Watch stub) until the stream ends; whether
        anything was received. A gRPC error is left to the channel's call to map."""
        root = self.discovery.root
        last_seen = [time.monotonic()]
        received = False

        def requests() -> Any:
            yield rpc.WatchRequest(create_request=rpc.WatchCreateRequest(
                key=root, range_end=prefix_range_end(root), start_revision=self._revision + 1))
            while not self._stop.wait(self._progress_every):
                if time.monotonic() - last_seen[0] > self._stale_after:
                    self._interrupt()  # silent for three rounds: drop the stream and resume
                    return
                yield rpc.WatchRequest(progress_request=rpc.WatchProgressRequest())

        try:
            with self._stream_lock:
                if self._stop.is_set():
                    return False
                self._stream = responses = watch.Watch(requests())
                self.streams += 1
            skip = len(root)
            for response in responses:
                last_seen[0] = time.monotonic()
                received = True
                if response.compact_revision:  # our revision is gone: list again
                    self._revision = 0
                    return True
                if response.canceled:
                    raise StoreError(f"etcd canceled the discovery watch: {response.cancel_reason}")
                for event in response.events:
                    # Progress answers carry a revision that may run ahead of events not yet sent
                    # (etcd 3.4), so only events move the resume point.
                    publisher_id = event.kv.key[skip:].decode(errors="replace")
                    record = None
                    if event.type != _DELETE:
                        record = self.discovery._parse_row(publisher_id, event.kv.value, None)
                    if record is None:
                        self._delete(publisher_id)
                    else:
                        self._put(record)
                    self._revision = max(self._revision, int(event.kv.mod_revision))
            return received
        finally:
            with self._stream_lock:
                self._stream = None
