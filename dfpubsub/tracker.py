"""Sequence tracking per (publisher, topic): gaps, the delay window, duplicates.

The tracker is pure logic (no threads, no clock of its own: every call takes
``now``), so it can be tested exhaustively. It turns the envelopes a
subscriber receives into batches that are safe to deliver in order, and into
:class:`ResyncRequest` s for the topics where something was lost.
The rules are those of docs/reliability.md.
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass, field

from .events import Bye, EventBatch, Hello
from .metrics import Stats

__all__ = ["ResyncRequest", "SequenceTracker"]


@dataclass(frozen=True, slots=True)
class ResyncRequest:
    """A topic whose cache may have missed changes.

    ``missing`` is the inclusive range of sequence numbers of ``publisher_id``
    within which messages were not received, when known.
    """

    topic: str
    reason: str
    publisher_id: str = ""
    missing: tuple[int, int] | None = None


@dataclass(slots=True)
class _Stream:
    next: int
    high: int = 0
    held: dict[int, EventBatch] = field(default_factory=dict)
    deadline: float | None = None


@dataclass(slots=True)
class _Peer:
    name: str
    last_seen: float
    #: Advertised by its last hello; None before one came. 0 or less: it sends no idle hellos.
    max_idle: float | None = None
    #: The subscribed topics when the last part of its last hello came (None: no hello yet).
    hello_topics: Collection[str] | None = None
    said_bye: bool = False
    streams: dict[str, _Stream] = field(default_factory=dict)


class SequenceTracker:
    """Tracks every (publisher, topic) stream of one subscriber.

    ``topics`` is the live set of subscribed topics (shared, not copied);
    ``window`` is the message delay window in seconds; ``max_held`` bounds the
    envelopes held per stream while a gap is open; a publisher silent for
    ``dead_after_idles`` times its advertised ``max_idle_time`` (or
    ``assumed_max_idle`` before its first hello; never if that is 0 or less) is taken as dead, and its
    topics are resynced (its last messages may be lost with it).
    """

    def __init__(
        self,
        topics: Collection[str],
        window: float,
        stats: Stats,
        max_held: int = 1024,
        dead_after_idles: float = 3.0,
        assumed_max_idle: float = 5.0,
    ):
        self.topics = topics
        self.window = window
        self.stats = stats
        self.max_held = max_held
        self.dead_after_idles = dead_after_idles
        self.assumed_max_idle = assumed_max_idle
        self.peers: dict[str, _Peer] = {}
        self.requests: list[ResyncRequest] = []
        self._open: set[tuple[str, str]] = set()

    # -- inputs -------------------------------------------------------------

    def on_batch(self, batch: EventBatch, now: float) -> list[EventBatch]:
        """Take one event envelope; return the batches now deliverable, in order."""
        peer = self._peer(batch.publisher_id, batch.publisher_name, now)
        topic = batch.topic
        st = peer.streams.get(topic)
        if st is None:
            if peer.hello_topics is not None and topic in peer.hello_topics:
                # Its hello did not list a topic we already took: the stream began after it, at 1.
                st = peer.streams[topic] = _Stream(next=1)
            else:
                # Never heard of it: what came before may be newer than our last sync.
                st = peer.streams[topic] = _Stream(next=batch.seq)
                if batch.seq > 1:
                    self._request(topic, "first_seen", batch.publisher_id, (1, batch.seq - 1))
        if batch.seq > st.next:
            return self._hold(batch.publisher_id, topic, st, batch, now)
        out: list[EventBatch] = []
        self._append_new(st, batch, out)
        if st.held:
            self._drain(st, out)
        if st.deadline is not None and not st.held and st.high < st.next:
            st.deadline = None
            self._open.discard((batch.publisher_id, topic))
            self.stats.inc("gaps_filled")
            self._forget_if_gone(batch.publisher_id, peer)
        return out

    def on_hello(self, hello: Hello | Bye, now: float) -> None:
        """Take a hello or bye: register the publisher, open gaps it reveals."""
        pid = hello.publisher_id
        peer = self._peer(pid, hello.publisher_name, now)
        known_topics = peer.hello_topics or ()
        if isinstance(hello, Hello):
            peer.max_idle = hello.max_idle_time
            # Only a hello's last part says that a topic it does not list has not been used.
            if not hello.more:
                peer.hello_topics = self.topics
        else:
            peer.hello_topics = self.topics
            peer.said_bye = True
        topics = self.topics
        for topic, seq in hello.seqs.items():
            if topic not in topics:
                continue
            st = peer.streams.get(topic)
            if st is None and topic in known_topics:
                st = peer.streams[topic] = _Stream(next=1)
            if st is None:
                peer.streams[topic] = _Stream(next=seq + 1)
                if seq > 0:
                    self._request(topic, "first_seen", pid, (1, seq))
            elif seq >= st.next and seq > st.high:
                # The publisher sent more than we have: lost, or still in flight on
                # a transport that reorders; the delay window decides.
                st.high = seq
                self._open_gap(pid, topic, st, now)
        self._forget_if_gone(pid, peer)

    def tick(self, now: float) -> list[EventBatch]:
        """Expire gaps whose window passed and publishers that went silent."""
        out: list[EventBatch] = []
        for pid, topic in [k for k in self._open if self._deadline(k) <= now]:
            peer = self.peers[pid]
            self._give_up(pid, topic, peer.streams[topic], out, "gap_expired")
            self._forget_if_gone(pid, peer)
        for pid, peer in list(self.peers.items()):
            max_idle = self.assumed_max_idle if peer.max_idle is None else peer.max_idle
            if max_idle > 0 and now - peer.last_seen > self.dead_after_idles * max_idle:
                self.forget_publisher(pid, out, reason="publisher_lost")
        return out

    def forget_publisher(self, pid: str, out: list[EventBatch], reason: str = "publisher_gone") -> None:
        """Drop a publisher's state, delivering what it held and resyncing its topics."""
        peer = self.peers.pop(pid, None)
        if peer is None:
            return
        for topic, st in peer.streams.items():
            if st.held or st.deadline is not None:
                self._give_up(pid, topic, st, out, reason)
            elif topic in self.topics:
                self._request(topic, reason, pid, None)

    def forget_topic(self, topic: str) -> None:
        """Forget every stream of an unsubscribed topic."""
        for pid, peer in self.peers.items():
            if peer.streams.pop(topic, None) is not None:
                self._open.discard((pid, topic))

    def next_deadline(self) -> float | None:
        """Earliest time :meth:`tick` has work to do about an open gap."""
        if not self._open:
            return None
        return min(self._deadline(k) for k in self._open)

    def pop_requests(self) -> list[ResyncRequest]:
        """Return and clear the resync requests made since the last call."""
        reqs, self.requests = self.requests, []
        return reqs

    def gap_open(self, pid: str, topic: str) -> bool:
        """Whether a gap is open on this stream (for tests and df-db)."""
        return (pid, topic) in self._open

    # -- internals ----------------------------------------------------------

    def _peer(self, pid: str, name: str, now: float) -> _Peer:
        peer = self.peers.get(pid)
        if peer is None:
            peer = self.peers[pid] = _Peer(name, now)
        else:
            peer.last_seen = now
        return peer

    def _forget_if_gone(self, pid: str, peer: _Peer) -> None:
        """A publisher that said bye is forgotten once none of its gaps is open."""
        if peer.said_bye and not any(s.deadline is not None for s in peer.streams.values()):
            self.peers.pop(pid, None)

    def _deadline(self, key: tuple[str, str]) -> float:
        return self.peers[key[0]].streams[key[1]].deadline  # type: ignore[return-value]

    def _request(self, topic: str, reason: str, pid: str, missing: tuple[int, int] | None) -> None:
        self.requests.append(ResyncRequest(topic, reason, pid, missing))

    def _open_gap(self, pid: str, topic: str, st: _Stream, now: float) -> None:
        if st.deadline is None:
            st.deadline = now + self.window
            self._open.add((pid, topic))
            self.stats.inc("gaps")

    def _hold(self, pid: str, topic: str, st: _Stream, batch: EventBatch, now: float) -> list[EventBatch]:
        prev = st.held.get(batch.seq)
        if prev is not None and prev.last_seq >= batch.last_seq:
            self.stats.inc("duplicates", batch.count)
            return []
        st.held[batch.seq] = batch
        st.high = max(st.high, batch.last_seq)
        self._open_gap(pid, topic, st, now)
        out: list[EventBatch] = []
        if len(st.held) > self.max_held:
            # Holding more would be unbounded memory: stop waiting for the hole.
            self._give_up(pid, topic, st, out, "hold_overflow")
        return out

    def _append_new(self, st: _Stream, batch: EventBatch, out: list[EventBatch]) -> None:
        """Append the part of ``batch`` at or after ``st.next``; count the rest as duplicates."""
        last = batch.last_seq
        if last < st.next:
            self.stats.inc("duplicates", batch.count)
            return
        skip = st.next - batch.seq
        if skip > 0:
            self.stats.inc("duplicates", skip)
            batch = EventBatch(
                batch.publisher_id, batch.publisher_name, batch.topic, st.next,
                batch.sent_at, None if batch.events is None else batch.events[skip:],
                batch.count - skip, batch.frame,
            )
        out.append(batch)
        st.next = last + 1

    def _drain(self, st: _Stream, out: list[EventBatch]) -> None:
        held = st.held
        while held:
            first = min(held)
            if first > st.next:
                return
            self._append_new(st, held.pop(first), out)

    @staticmethod
    def _missing(st: _Stream) -> tuple[int, int]:
        """First and last sequence number not received (the holes may be several)."""
        last_missing = st.high
        expect = st.next
        for seq in sorted(st.held):
            if seq > expect:
                last_missing = seq - 1
            expect = max(expect, st.held[seq].last_seq + 1)
        if st.high >= expect:
            last_missing = st.high
        return (st.next, max(last_missing, st.next))

    def _give_up(self, pid: str, topic: str, st: _Stream, out: list[EventBatch], reason: str) -> None:
        self._request(topic, reason, pid, self._missing(st))
        for seq in sorted(st.held):
            batch = st.held[seq]
            if seq > st.next:
                st.next = seq
            self._append_new(st, batch, out)
        st.held.clear()
        st.next = max(st.next, st.high + 1)
        st.deadline = None
        self._open.discard((pid, topic))
