"""The etcd store's change feed: etcd's own revision history, read by a watch.

A reader keeps one watch of the store's keys open from its position, on a
channel of its own, in a thread that turns each revision's events into a
:class:`~dfpubsub.store.feed.FeedEntry` and queues it (a bounded queue: a slow
reader holds the stream back, it never grows memory). Nothing is written for
the feed: a write's ``Txn`` *is* its entry. The value key's event gives the
table, key and action (a put whose ``create_revision`` is its ``mod_revision``
is a create); the topic key's event in the same revision, when there is one,
gives the topic. Retention is the server's compaction
(``--auto-compaction-retention``): a watch from a compacted revision answers
``compact_revision`` and the reader raises HistoryGone.

A member cut off from its cluster but alive keeps a stream open and silent;
the reader asks for progress every second and :meth:`read` cancels a stream
silent for three rounds (and the store's timeout), so that it raises
StoreUnavailable and the next call watches again. The check is the reader's,
not the request stream's: gRPC pulls the next request only once the last one
was sent, so a stream whose first request never leaves (a connection that
never comes up) would never run a check placed there.
"""

from __future__ import annotations

import queue
import threading
import time
from typing import TYPE_CHECKING, Any

import grpc
from aetcd import rpc
from aetcd.utils import prefix_range_end

from ..backends.etcd import open_channel
from ..errors import HistoryGone, StoreError, StoreUnavailable
from ..events import Action
from .feed import DEFAULT_BATCH, FeedEntry, FeedReader

if TYPE_CHECKING:
    from .etcd import EtcdStore

__all__ = ["EtcdFeedReader"]

_DELETE = rpc.Event.EventType.DELETE
_PROGRESS_EVERY = 1.0
_QUEUED = 10_000
_MAX_MESSAGE = 64 << 20  # one revision's events carry whole values: gRPC's 4 MiB default would cap them


class EtcdFeedReader(FeedReader):
    """A watch of ``store``'s objects and topics from ``after + 1``."""

    store: EtcdStore

    def __init__(self, store: EtcdStore, after: int):
        super().__init__(store, after)
        self._queue: queue.Queue[Any] = queue.Queue(_QUEUED)
        self._stop = threading.Event()
        self._call: Any = None
        self._thread: threading.Thread | None = None
        self._last_seen = time.monotonic()  # the stream's last answer (or start)

    def read(self, limit: int = DEFAULT_BATCH, timeout: float = 0.0) -> list[FeedEntry]:
        if self._thread is None or not self._thread.is_alive():
            self._start()
        elif time.monotonic() - self._last_seen > 3 * _PROGRESS_EVERY + self.store.timeout:
            call = self._call
            if call is not None:
                call.cancel()  # silent too long: the thread ends with an error, the next read watches again
        out: list[FeedEntry] = []
        try:
            item = self._queue.get(timeout=timeout) if timeout > 0 else self._queue.get_nowait()
            while True:
                if isinstance(item, Exception):
                    self._thread = None  # the stream ended with it; the next read watches again
                    if out:  # deliver what came before; the error comes back at the next read
                        self._queue = _requeued(item)
                        break
                    raise item
                revision, entry = item
                self.position = max(self.position, revision)
                if entry is None:
                    self.store.feed_skipped += 1
                else:
                    out.append(entry)
                if len(out) >= limit:
                    break
                item = self._queue.get_nowait()
        except queue.Empty:
            pass
        return out

    def close(self) -> None:
        self._stop.set()
        call = self._call
        if call is not None:
            call.cancel()
        if self._thread is not None:
            self._thread.join(5)

    def _start(self) -> None:
        self._last_seen = time.monotonic()
        self._queue = queue.Queue(_QUEUED)
        self._thread = threading.Thread(target=self._run, args=(self._queue, self.position), daemon=True,
                                        name="dfpubsub-etcd-feed")
        self._thread.start()

    def _run(self, out: queue.Queue[Any], after: int) -> None:
        store = self.store
        root = store._root[:-1]  # ".../nb": both the object and the topic keys
        ended = threading.Event()

        def requests() -> Any:
            yield rpc.WatchRequest(create_request=rpc.WatchCreateRequest(
                key=root, range_end=prefix_range_end(root), start_revision=after + 1, prev_kv=True))
            while not (self._stop.wait(_PROGRESS_EVERY) or ended.is_set()):
                yield rpc.WatchRequest(progress_request=rpc.WatchProgressRequest())

        error: Exception
        channel = open_channel(store._where(), [("grpc.max_receive_message_length", _MAX_MESSAGE)])
        try:
            self._call = responses = rpc.WatchStub(channel).Watch(requests())
            for response in responses:
                self._last_seen = time.monotonic()
                if response.compact_revision:
                    raise HistoryGone(after, int(response.compact_revision) - 1)
                if response.canceled:
                    raise StoreError(f"etcd canceled the feed watch: {response.cancel_reason}")
                for item in _entries(store, response.events):
                    out.put(item)
            error = StoreUnavailable(f"etcd at {store._where()} ended the feed watch")
        except grpc.RpcError as exc:
            details = exc.details() if isinstance(exc, grpc.Call) else str(exc)
            error = StoreUnavailable(f"etcd at {store._where()}: feed watch broke: {details}")
        except StoreError as exc:
            error = exc
        finally:
            ended.set()
            self._call = None
            channel.close()
        if not self._stop.is_set():
            out.put(error)


def _requeued(first: Exception) -> queue.Queue[Any]:
    q: queue.Queue[Any] = queue.Queue(_QUEUED)
    q.put(first)
    return q


def _entries(store: EtcdStore, events: Any) -> list[tuple[int, FeedEntry | None]]:
    """(revision, entry or None for a foreign key) per revision of ``events``, in order."""
    by_revision: dict[int, list[Any]] = {}
    for event in events:
        by_revision.setdefault(int(event.kv.mod_revision), []).append(event)
    out: list[tuple[int, FeedEntry | None]] = []
    root, topic_root = store._root, store._topic_root
    for revision, group in by_revision.items():
        value = next((e for e in group if e.kv.key.startswith(root)), None)
        if value is None:
            continue  # a topic key alone: written by something else; its object's event says it all
        topic_event = next((e for e in group if e.kv.key.startswith(topic_root)), None)
        out.append((revision, _entry(store, revision, value, topic_event)))
    return out


def _entry(store: EtcdStore, revision: int, value: Any, topic_event: Any) -> FeedEntry | None:
    try:
        table, _, key = value.kv.key[len(store._root):].decode().partition("/")
    except UnicodeDecodeError:
        return None
    if table not in store.tables or not key:
        return None
    topic = table
    if topic_event is not None:
        kv = topic_event.kv if topic_event.type != _DELETE else topic_event.prev_kv
        if topic_event.type != _DELETE or value.type == _DELETE:
            topic = kv.value.decode(errors="replace") or table
    if value.type == _DELETE:
        action = Action.DELETE
    elif value.kv.create_revision == value.kv.mod_revision:
        action = Action.CREATE
    else:
        action = Action.UPDATE
    return FeedEntry(revision, topic, table, key, action)
