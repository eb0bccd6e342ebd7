"""Discovery in etcd (``etcd://host:port[,host:port...]``) over gRPC, with aetcd's messages and stubs.

Like the etcd store: gRPC's synchronous API on a thread-safe channel, aetcd's
generated stubs and protobuf messages only, a channel that failed is closed
and the next call connects to the next endpoint.

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
  three rounds and the stream is dropped and resumed.

gRPC does not survive a fork with a call in flight: open discovery after
forking workers (a forked child must open its own).
"""

from __future__ import annotations

import functools
import math
import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

import grpc
from aetcd import rpc
from aetcd.utils import prefix_range_end

from ..backends.etcd import UNAVAILABLE, Endpoints, keep_alive_once, status_code
from ..errors import StoreError, StoreUnavailable
from ..retry import Backoff
from .api import Discovery, PublisherRecord, RecordCallback, Watcher

__all__ = ["EtcdDiscovery"]

T = TypeVar("T")
_DELETE = 1  # mvccpb.Event.DELETE


class _LeaseGone(StoreError):
    """etcd no longer knows the lease (it expired)."""


@dataclass(frozen=True, slots=True)
class _Stubs:
    pid: int
    channel: grpc.Channel
    kv: Any
    lease: Any


class _Connection:
    """One lazily opened channel with KV and Lease stubs, shared by every unary call."""

    def __init__(self, url: str, timeout: float):
        self.url = url
        self.timeout = timeout
        self._endpoints = Endpoints(url)
        self._lock = threading.Lock()
        self._stubs: _Stubs | None = None

    def where(self) -> str:
        return self._endpoints.where()

    def new_channel(self) -> grpc.Channel:
        """A channel of the caller's own (for a stream), to the first endpoint that answers."""
        with self._lock:
            return self._endpoints.open()

    def call(self, what: str, fn: Callable[[_Stubs], T]) -> T:
        """Run ``fn(stubs)`` (RPCs with deadlines only); gRPC failures become typed errors."""
        with self._lock:
            stubs = self._stubs
            if stubs is None or stubs.pid != os.getpid():  # a forked child never touches the parent's channel
                channel = self._endpoints.open()
                stubs = self._stubs = _Stubs(os.getpid(), channel, rpc.KVStub(channel), rpc.LeaseStub(channel))
        try:
            return fn(stubs)
        except grpc.RpcError as exc:
            code = status_code(exc)
            details = exc.details() if isinstance(exc, grpc.Call) else str(exc)
            if code == grpc.StatusCode.NOT_FOUND and "lease not found" in (details or ""):
                raise _LeaseGone(f"etcd lease gone ({what})") from None
            if code is not None and code not in UNAVAILABLE:
                raise StoreError(f"etcd at {self.where()} refused {what}: {code.name}: {details}") from None
            self._drop(stubs)
            raise StoreUnavailable(f"etcd at {self.where()} is unavailable ({what}): {details}") from None
        except ValueError:  # gRPC refuses a call on a channel that a failure or close() closed
            raise StoreUnavailable(f"etcd discovery {self.url} was closed during {what}") from None

    def _drop(self, stubs: _Stubs) -> None:
        with self._lock:
            if self._stubs is stubs:
                self._stubs = None
                self._endpoints.failed()
        stubs.channel.close()

    def close(self) -> None:
        with self._lock:
            stubs, self._stubs = self._stubs, None
        if stubs is not None and stubs.pid == os.getpid():
            stubs.channel.close()


class EtcdDiscovery(Discovery):
    """``etcd://host:port``; records under ``/{prefix}/publishers/``."""

    backend = "etcd"

    def __init__(self, url: str, ttl: float, renew_interval: float, prefix: str = "dfpubsub",
                 timeout: float | None = None):
        super().__init__(url, ttl, renew_interval, prefix, timeout)
        self._conn = _Connection(url, self.timeout)
        self.root = f"/{prefix}/publishers/".encode()
        #: The lease TTL asked for; etcd may grant more (see :attr:`lease_ttl`).
        self._asked_ttl = max(1, math.ceil(self.ttl))
        #: Whole seconds a lease lives without keep-alive, as etcd granted it.
        self.lease_ttl = self._asked_ttl

    @property
    def effective_ttl(self) -> float:
        return float(max(self.lease_ttl, self.ttl))

    def _key(self, record: PublisherRecord) -> bytes:
        return self.root + record.publisher_id.encode()

    def _put(self, record: PublisherRecord, lease: int) -> rpc.RequestOp:
        return rpc.RequestOp(request_put=rpc.PutRequest(key=self._key(record), value=record.to_json(), lease=lease))

    def _create(self, record: PublisherRecord) -> int:
        t = self.timeout
        grant = self._conn.call("lease grant", lambda s: s.lease.LeaseGrant(
            rpc.LeaseGrantRequest(TTL=self._asked_ttl), timeout=t))
        if grant.error:
            raise StoreError(f"etcd refused a lease: {grant.error}")
        self.lease_ttl = int(grant.TTL)
        try:
            self._conn.call("register", lambda s: s.kv.Txn(rpc.TxnRequest(success=[self._put(record, grant.ID)]),
                                                           timeout=t))
        except StoreError:
            try:
                self._revoke(grant.ID)
            except StoreError:
                pass  # unreachable too: the lease expires by itself, with nothing attached
            raise
        return int(grant.ID)

    def _keep_alive(self, lease: int) -> int:
        """One keep-alive exchange; the lease's TTL after it (0: the lease is gone)."""
        return self._conn.call("lease keep-alive", lambda s: keep_alive_once(s.lease, lease, self.timeout))

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
            response = self._conn.call("renew", lambda s: s.kv.Txn(request, timeout=self.timeout))
        except _LeaseGone:  # expired between the keep-alive and the write
            return self._create(record)
        if not response.succeeded:
            self._trouble.warning(f"vanished-{record.publisher_id}", "discovery key vanished; re-created it",
                                  backend=self.backend, publisher_id=record.publisher_id)
        return lease

    def _revoke(self, lease: int) -> None:
        try:
            self._conn.call("lease revoke", lambda s: s.lease.LeaseRevoke(rpc.LeaseRevokeRequest(ID=lease),
                                                                          timeout=self.timeout))
        except _LeaseGone:
            pass

    def _remove(self, handle: Any, record: PublisherRecord) -> None:
        key = self._key(record)
        self._conn.call("unregister", lambda s: s.kv.DeleteRange(rpc.DeleteRangeRequest(key=key),
                                                                 timeout=self.timeout))
        self._revoke(int(handle))

    def _range(self) -> tuple[dict[str, PublisherRecord], dict[str, int], int]:
        """The records under the prefix, their leases and the revision read."""
        request = rpc.RangeRequest(key=self.root, range_end=prefix_range_end(self.root))
        response = self._conn.call("list", lambda s: s.kv.Range(request, timeout=self.timeout))
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
                ttl = self._conn.call("lease time-to-live", functools.partial(self._time_to_live, lease)).TTL
                if ttl < 0:  # expired, the key not yet deleted
                    continue
                left = float(ttl)
            out[publisher_id] = PublisherRecord(**record.to_dict(), lease_left=left)
        return out

    def _watcher(self, on_added: RecordCallback, on_removed: RecordCallback,
                 on_updated: RecordCallback | None) -> Watcher:
        return _EtcdWatcher(self, on_added, on_removed, on_updated)

    def _close(self) -> None:
        self._conn.close()


class _EtcdWatcher(Watcher):
    """A real etcd watch of the prefix, resumed by revision after a broken stream."""

    discovery: EtcdDiscovery

    def __init__(self, discovery: EtcdDiscovery, on_added: RecordCallback, on_removed: RecordCallback,
                 on_updated: RecordCallback | None):
        super().__init__(discovery, on_added, on_removed, on_updated)
        self._revision = 0  # last revision processed; 0: list again
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
        while not self._stop.is_set():
            try:
                if self._revision == 0:
                    self.relists += 1
                    self._relist()
                if self._follow():
                    backoff.reset()
            except grpc.RpcError as exc:
                if self._stop.is_set():
                    return
                details = exc.details() if isinstance(exc, grpc.Call) else str(exc)
                self.discovery._trouble.warning("watch-etcd", "discovery watch broke; resuming",
                                                error=str(details), revision=self._revision)
            except StoreError as exc:
                self.discovery._trouble.warning("watch-etcd", "discovery watch failed; retrying", error=str(exc))
            self._stop.wait(backoff.failed())

    def _follow(self) -> bool:
        """Watch from ``_revision + 1`` until the stream ends; whether anything was received."""
        channel = self.discovery._conn.new_channel()
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
                self._stream = responses = rpc.WatchStub(channel).Watch(requests())
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
            channel.close()
