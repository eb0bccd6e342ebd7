"""Sequence tracking per (publisher, topic): gaps, the delay window, duplicates.

The tracker is pure logic (no threads, no clock of its own: every call takes
``now``), so it can be tested exhaustively. It turns the envelopes a
subscriber receives into batches that are safe to deliver in order, and into
:class:`ResyncRequest` s for the topics where something was lost.
The rules are those of docs/protocol.md §8 (docs/reliability.md explains them).
"""

from __future__ import annotations

import math
from collections.abc import Collection
from dataclasses import dataclass, field

from .events import MAX_KEPT_ID, Bookmark, Bye, EventBatch, Hello, kept_id
from .metrics import Stats

__all__ = ["ResyncRequest", "SequenceTracker", "TrackerLimits"]


@dataclass(frozen=True, slots=True)
class TrackerLimits:
    """What one subscriber's tracker spends at most on publishers it cannot authenticate
    (docs/security.md, "Bounded damage"). Every drop they cause is counted with its reason."""

    #: Publishers tracked at once; beyond, the longest silent eighth is forgotten (and resynced).
    max_publishers: int = 10_000
    #: Bytes of envelopes held over all streams while gaps are open.
    max_held_bytes: int = 64 << 20
    #: An envelope or hello this far *below* the expected sequence restarts its stream there:
    #: a publisher sends in order, so only a number someone else made up can have moved the
    #: stream that far past the publisher's real one.
    max_seq_jump: int = 100_000
    #: A hello's finite, positive max_idle_time above this is taken as this.
    max_hello_idle: float = 3600.0
    #: Seconds after which a silent publisher whose hellos turn dead-publisher detection off
    #: (max_idle_time <= 0, NaN or infinite) is forgotten all the same.
    forget_silent_after: float = 3600.0


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
    #: The sequence expected next.
    next: int
    high: int = 0
    held: dict[int, EventBatch] = field(default_factory=dict)
    deadline: float | None = None
    #: When not 0, the numbers [claimed_from, next) were passed on a hello's word alone and
    #: nothing at or above them was delivered since (a first contact by a hello, or a gap only a
    #: hello claimed, given up). An envelope or a hello inside that run shows where the publisher
    #: really is (the claim was someone else's, or the run arrives late): the stream steps down
    #: to the run's start and waits for the numbers up to the frame (:meth:`_step_down`).
    #: Nothing above the run was delivered, so stepping down keeps delivery in order, never
    #: twice; the first envelope delivered closes the run (protocol.md §8.6).
    claimed_from: int = 0
    #: The first hole [hole_from, hole_to] of the last gap given up on with envelopes held
    #: above it (0, 0: none). Numbers above it were delivered, so an envelope arriving in it
    #: is not delivered, but it may carry a change made after that give-up's resync (its
    #: publisher was behind a forged envelope, or it was delayed past the window): resynced.
    hole_from: int = 0
    hole_to: int = 0


@dataclass(slots=True)
class _Peer:
    # No name: a publisher's name is informational, and a kept one costs what its hello says.
    last_seen: float
    #: Advertised by its last hello (clamped); None before one came. 0: it sends no idle hellos.
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
        limits: TrackerLimits = TrackerLimits(),
    ):
        self.topics = topics
        self.window = window
        self.stats = stats
        self.max_held = max_held
        self.dead_after_idles = dead_after_idles
        self.assumed_max_idle = assumed_max_idle
        self.limits = limits
        self.peers: dict[str, _Peer] = {}
        self.requests: list[ResyncRequest] = []
        #: Bookmarks of the hellos taken since the last :meth:`pop_bookmarks` (see :meth:`on_hello`).
        self.bookmarks: list[Bookmark] = []
        self._open: set[tuple[str, str]] = set()
        self._held_bytes = 0

    # -- inputs -------------------------------------------------------------

    def on_batch(self, batch: EventBatch, now: float) -> list[EventBatch]:
        """Take one event envelope; return the batches now deliverable, in order."""
        pid = batch.publisher_id
        if len(pid) > MAX_KEPT_ID:
            pid = self._key(pid)
        peer = self._peer(pid, now)
        topic = batch.topic
        st = peer.streams.get(topic)
        if st is None:
            if peer.hello_topics is not None and topic in peer.hello_topics:
                # Its hello did not list a topic we already took: the stream began after it, at 1.
                st = peer.streams[topic] = _Stream(next=1)
            else:
                st = self._first_contact(pid, peer, topic, batch.seq)
        if batch.seq < st.next:
            st = self._below(pid, peer, topic, st, batch)
        if batch.seq > st.next:  # ahead, or inside a claimed run above its start
            return self._hold(pid, topic, st, batch, now)
        out: list[EventBatch] = []
        self._append_new(st, batch, out)
        if st.held:
            self._drain(st, out)
        if st.deadline is not None and not st.held and st.high < st.next:
            st.deadline = None
            self._open.discard((pid, topic))
            self.stats.inc("gaps_filled")
            self._forget_if_gone(pid, peer)
        return out

    def _below(self, pid: str, peer: _Peer, topic: str, st: _Stream, batch: EventBatch) -> _Stream:
        """An envelope that starts below ``next``: step down, restart, or a late one in a hole
        (protocol.md §8.3 step 4); the part at or above ``next`` is delivered all the same."""
        if st.claimed_from and st.claimed_from <= batch.seq:
            self._step_down(st)
        elif st.next - batch.seq > self.limits.max_seq_jump:
            return self._restart(pid, peer, topic, batch.seq)
        elif st.hole_from <= batch.seq <= st.hole_to:
            self._request(topic, "late", pid, (batch.seq, min(batch.last_seq, st.hole_to)))
        return st

    def on_hello(self, hello: Hello | Bye, now: float) -> None:
        """Take a hello or bye: register the publisher, open gaps it reveals."""
        pid = self._key(hello.publisher_id)
        peer = self._peer(pid, now)
        known_topics = peer.hello_topics or ()
        if isinstance(hello, Hello):
            peer.max_idle = self._max_idle(hello.max_idle_time)
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
                st = self._first_contact(pid, peer, topic, seq + 1)
                if seq > 0:
                    st.claimed_from = 1
            elif st.claimed_from and st.claimed_from <= seq + 1 < st.next:
                self._step_down(st)
                if seq >= st.next:  # it sent numbers of the run: lost, or still in flight
                    st.high = max(st.high, seq)
                    self._open_gap(pid, topic, st, now)
            elif st.next - (seq + 1) > self.limits.max_seq_jump:
                # Taken up like a first contact by this hello, whose claim may be false too.
                self._restart(pid, peer, topic, seq + 1).claimed_from = 1 if seq > 0 else 0
            elif seq >= st.next and seq > st.high:
                # The publisher sent more than we have: lost, or still in flight on
                # a transport that reorders; the delay window decides.
                st.high = seq
                self._open_gap(pid, topic, st, now)
        if isinstance(hello, Hello) and hello.rev is not None:
            self._bookmark(pid, peer, hello, hello.rev)
        self._forget_if_gone(pid, peer)

    def _bookmark(self, pid: str, peer: _Peer, hello: Hello, rev: int) -> None:
        """Pass on the hello's bookmark for the streams in agreement with it: nothing held, no gap
        open, no run claimed, and everything up to its sequence delivered (a topic it does not
        list, on its last part, has not been used: 0, if nothing came on it either). Whether a
        bookmark moves anything is the receiver's to judge (dfpubsub.controller.bookmarks)."""
        seqs: dict[str, int] = {}
        for topic in self.topics:
            q = hello.seqs.get(topic)
            st = peer.streams.get(topic)
            if q is None:
                if hello.more or (st is not None and st.next != 1):
                    continue
                q = 0
            if st is None:
                if q == 0:
                    seqs[topic] = 0
            elif not st.held and st.deadline is None and not st.claimed_from and st.next - 1 >= q:
                seqs[topic] = q
        if seqs:
            self.bookmarks.append(Bookmark(pid, rev, seqs))

    def tick(self, now: float) -> list[EventBatch]:
        """Expire gaps whose window passed and publishers that went silent."""
        out: list[EventBatch] = []
        for pid, topic in [k for k in self._open if self._deadline(k) <= now]:
            peer = self.peers[pid]
            self._give_up(pid, topic, peer.streams[topic], out, "gap_expired")
            self._forget_if_gone(pid, peer)
        forget_silent_after = self.limits.forget_silent_after
        for pid, peer in list(self.peers.items()):
            max_idle = self.assumed_max_idle if peer.max_idle is None else peer.max_idle
            silent = now - peer.last_seen
            if max_idle > 0 and silent > self.dead_after_idles * max_idle:
                self.forget_publisher(pid, out, reason="publisher_lost")
            elif max_idle <= 0 and silent > forget_silent_after:
                self.stats.inc("drops", reason="publisher_silent")
                self.forget_publisher(pid, out, reason="publisher_silent")
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
            st = peer.streams.pop(topic, None)
            if st is not None:
                self._release(st)
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

    def pop_bookmarks(self) -> list[Bookmark]:
        """Return and clear the bookmarks passed on since the last call."""
        out, self.bookmarks = self.bookmarks, []
        return out

    def gap_open(self, pid: str, topic: str) -> bool:
        """Whether a gap is open on this stream (for tests and df-db)."""
        return (pid, topic) in self._open

    # -- internals ----------------------------------------------------------

    def _key(self, pid: str) -> str:
        key = kept_id(pid)
        if key is not pid:
            self.stats.inc("strings_clamped", reason="pub")
        return key

    def _peer(self, pid: str, now: float) -> _Peer:
        peer = self.peers.get(pid)
        if peer is None:
            if len(self.peers) >= self.limits.max_publishers:
                self._evict()
            peer = self.peers[pid] = _Peer(now)
        else:
            peer.last_seen = now
        return peer

    def _max_idle(self, advertised: float) -> float:
        """The max_idle_time believed of a hello: 0 (no idle hellos) unless positive and finite."""
        if not (advertised > 0 and math.isfinite(advertised)):
            return 0.0
        return min(advertised, self.limits.max_hello_idle)

    def _first_contact(self, pid: str, peer: _Peer, topic: str, next_seq: int) -> _Stream:
        """A stream met past its start: what came before may be newer than our last sync."""
        st = peer.streams[topic] = _Stream(next=next_seq)
        if next_seq > 1:
            self._request(topic, "first_seen", pid, (1, next_seq - 1))
        return st

    def _evict(self) -> None:
        """Forget the longest silent eighth of the publishers (at least one), resyncing their
        topics: a flood of made-up ids costs bounded memory and sorting once per eighth."""
        n = max(1, len(self.peers) // 8)
        oldest = sorted(self.peers.items(), key=lambda item: item[1].last_seen)[:n]
        dropped: list[EventBatch] = []  # their held envelopes: the resync covers them
        for pid, _ in oldest:
            self.forget_publisher(pid, dropped, reason="publisher_evicted")
        self.stats.inc("drops", n, reason="publisher_evicted")

    def _restart(self, pid: str, peer: _Peer, topic: str, next_seq: int) -> _Stream:
        """Start a stream anew at ``next_seq``, more than ``max_seq_jump`` below where it was:
        a number someone else made up moved it there. What it held is dropped and the topic
        resynced, since the duplicates it dropped meanwhile may have been the publisher's."""
        old = peer.streams[topic]
        self.stats.inc("drops", sum(b.count for b in old.held.values()), reason="seq_jump")
        self._release(old)
        self._open.discard((pid, topic))
        st = peer.streams[topic] = _Stream(next=next_seq)
        self.stats.inc("streams_restarted")
        self._request(topic, "seq_jump", pid, None)
        return st

    def _step_down(self, st: _Stream) -> None:
        """A frame inside the stream's claimed run shows where its publisher really is: the claim
        was someone else's, or the run arrives late. Back to the run's start: the numbers of the
        run below the frame were passed on the claim's word, and the resync that pass asked for
        covers them only if they were sent before it ran, which a false claim does not say (a
        forged hello ahead, its gap given up and resynced, then the real publisher's next envelope
        lost). So they are waited for like any gap, and given up and resynced if they do not come
        (protocol.md §8.6). With no gap open, ``high`` goes back below the run too: a number a
        false claim put there must not make the real publisher's next hello look stale."""
        st.next, st.claimed_from = st.claimed_from, 0
        if st.deadline is None:
            st.high = st.next - 1
        self.stats.inc("streams_rebased")

    def _release(self, st: _Stream) -> None:
        self._held_bytes -= sum(_size(b) for b in st.held.values())
        st.held.clear()

    def _forget_if_gone(self, pid: str, peer: _Peer) -> None:
        """A publisher that said bye is forgotten once none of its gaps is open."""
        if peer.said_bye and not any(s.deadline is not None for s in peer.streams.values()):
            self.peers.pop(pid, None)

    def _deadline(self, key: tuple[str, str]) -> float:
        return self.peers[key[0]].streams[key[1]].deadline  # type: ignore[return-value]  # set while the gap is open

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
        if prev is not None:
            self._held_bytes -= _size(prev)
        st.held[batch.seq] = batch
        self._held_bytes += _size(batch)
        st.high = max(st.high, batch.last_seq)
        self._open_gap(pid, topic, st, now)
        out: list[EventBatch] = []
        if len(st.held) > self.max_held or self._held_bytes > self.limits.max_held_bytes:
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
        if st.claimed_from:
            st.claimed_from = 0

    def _drain(self, st: _Stream, out: list[EventBatch]) -> None:
        held = st.held
        while held:
            first = min(held)
            if first > st.next:
                return
            batch = held.pop(first)
            self._held_bytes -= _size(batch)
            self._append_new(st, batch, out)

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
        if st.held and (first := min(st.held)) > st.next:
            st.hole_from, st.hole_to = st.next, first - 1
        for seq in sorted(st.held):
            batch = st.held[seq]
            if seq > st.next:
                st.next = seq
            self._append_new(st, batch, out)
        if not st.held and st.high >= st.next and not st.claimed_from:
            st.claimed_from = st.next  # only a hello claimed this run
        self._release(st)
        st.next = max(st.next, st.high + 1)
        st.deadline = None
        self._open.discard((pid, topic))


def _size(batch: EventBatch) -> int:
    """Bytes an envelope holds (its frame, or a guess per event when it was built in memory)."""
    return len(batch.frame) or 64 * batch.count
