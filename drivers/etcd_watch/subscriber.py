"""The etcd subscriber transport: a thread watches the prefix into a bounded inbox, resuming after failures and compaction."""

from __future__ import annotations

import logging
import threading
from collections import deque
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import grpc
from aetcd import rpc
from aetcd.utils import prefix_range_end

from dfpubsub.backends.etcd import register_fork_hooks, unregister_fork_hooks
from dfpubsub.errors import ClosedError, TransportError
from dfpubsub.events import CONTROL_TOPIC
from dfpubsub.logs import RateLimitedLog
from dfpubsub.metrics import Stats
from dfpubsub.retry import Backoff
from dfpubsub.transport import SubscriberTransport

from .connection import Stubs, connect

if TYPE_CHECKING:
    from . import EtcdWatchOptions

__all__ = ["EtcdSubscriber"]

log = logging.getLogger(__package__)  # the driver's logger, as before the split

_RECV_BATCH = 512  # most frames one recv() returns
_MIN_BACKOFF, _MAX_BACKOFF = 0.05, 1.0  # between attempts to watch again after a failure


class EtcdSubscriber(SubscriberTransport):
    """One Watch stream over the prefix, read by a thread of its own into a bounded inbox."""

    def __init__(self, url: str, opts: EtcdWatchOptions, stats: Stats):
        self.stats = stats
        self._timeout = opts.timeout
        self._conn = connect(url, opts.timeout)
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
        register_fork_hooks(self)

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
        self._conn.close(final=True)
        unregister_fork_hooks(self)

    def _current_revision(self, stubs: Stubs | None = None) -> int:
        """etcd's current revision, or 0 if etcd cannot tell now (``stubs``: within a call already)."""
        error: Exception
        try:
            if stubs is None:
                return self._conn.call(self._revision)
            try:
                return self._revision(stubs)
            except (grpc.RpcError, ValueError) as exc:
                error = self._conn.error(stubs, exc)
        except (TransportError, ClosedError) as exc:
            error = exc
        self._badlog.warning("revision", "cannot read etcd's revision; the watch will start at the current one",
                             error=str(error))
        return 0

    def _revision(self, stubs: Stubs) -> int:
        return int(stubs.kv.Range(rpc.RangeRequest(key=self._root), timeout=self._timeout).header.revision)

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
        backoff = Backoff(_MIN_BACKOFF, _MAX_BACKOFF)
        while True:
            with self._cond:
                # A watch paused by a full inbox resumes once recv() took half of it.
                self._cond.wait_for(lambda: self._closed or (not self._forking and self._pending <= self._resume_at))
                if self._closed:
                    return
                start = self._next_rev
            try:
                self._watch(start)
                backoff.reset()
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
                self._cond.wait(backoff.failed())

    def _watch(self, start: int) -> None:
        """Watch from revision ``start`` (0: the current one) until the inbox is full or history is lost.

        Raises :class:`TransportError` when the stream fails.
        """
        self._conn.call(lambda stubs: self._follow(stubs, start))

    def _follow(self, stubs: Stubs, start: int) -> None:
        """:meth:`_watch` on ``stubs``: a gRPC error is left to the connection's call to map."""
        create = rpc.WatchCreateRequest(key=self._root, range_end=prefix_range_end(self._root),
                                        start_revision=start, filters=[rpc.WatchCreateRequest.NODELETE])
        stop = threading.Event()

        def requests() -> Iterator[rpc.WatchRequest]:
            yield rpc.WatchRequest(create_request=create)
            stop.wait()  # keep our side open: a watch is meant to end only when cancelled

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
        finally:
            stop.set()
            if call is not None:
                call.cancel()
            with self._cond:
                self._watching = None

    def _receive(self, stubs: Stubs, response: Any, start: int) -> bool:
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

    def before_fork(self) -> None:
        """Stop the watch, close the channel and hold the inbox until :meth:`after_fork`."""
        with self._cond:
            self._forking = True
            watching = self._watching
        if watching is not None:
            watching.cancel()
        self._conn.before_fork()
        self._cond.acquire()

    def after_fork(self, child: bool) -> None:
        if child:  # the watch thread did not come along
            self._closed = True
        self._forking = False
        self._cond.notify_all()
        self._cond.release()
        self._conn.after_fork(child)
