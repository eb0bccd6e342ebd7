"""Bookmarks: a controller's positions follow what a feed publisher's unbroken streams brought.

A feed publisher (df-feed) publishes every entry of the store's change feed in
revision order and, in its hellos, bookmarks how far it got: (``rev``, its
sequence per topic) says that every entry up to ``rev`` went out on each
topic's stream at a sequence up to the one given (docs/protocol.md §7.4). The
claim goes one way only: a hello carries the latest ``rev`` with the
sequences of the moment, so entries above ``rev`` may have gone out at or
below them too. A controller's position in the feed says up to which revision
its cache holds every committed write (docs/reliability.md); a replay moves it
by reading the feed. Bookmarks move it without reading anything, by this rule,
per (feed publisher, topic), on the dispatch thread, in order with the
envelopes:

- an **anchor** (``a``, ``r``) says: every entry of the topic above ``r`` comes
  at a sequence above ``a``, the cache holds every write up to ``r``, and
  every sequence after ``a`` was applied in order since. A complete repair at
  position ``P`` (it read the feed or the listing up to every write committed
  before it began) is one, with the stream's last sequence applied: whatever
  came at or before it was applied, or lost and so published, and committed,
  before the repair began, so at most ``P``. A bookmark (``q``, ``rev``) is one
  only on a stream applied *whole*, every sequence from 1 to ``q`` with none
  passed over (an idle topic's ``q`` = 0 included), once the position is at
  least its ``rev``: every entry above ``rev`` this publisher sends then
  arrives after what was applied. A bookmark on a stream met mid-stream is no
  anchor: the numbers before it were not applied, and one of them may carry an
  entry above its ``rev`` (found by the fleet benchmark: a hello's stale ``rev``
  with the sequence of an envelope the controller never received);
- while every sequence after the anchor is applied in order (no envelope
  skipped, none dropped, no run passed over), a bookmark (``q``, ``r``) with
  ``q`` at or after the anchor proves the cache holds every write up to ``r``:
  the entries between the anchor's ``rev`` and ``r`` came at sequences between
  the anchor's and ``q``, all applied. The position moves to ``r``; the anchor
  stays (a bookmark's sequences may already carry entries above its ``rev``,
  so it could not be one);
- any break (an envelope that does not follow the last one, numbers passed
  over by a resync request) drops the anchor until the next complete repair.

Only publishers the caller names as feeds count (discovery's ``role = feed``
rows, or a list): a bookmark of anyone else is ignored, a replayed one is a
duplicate or names a lower revision, and a forged one far ahead is refused
when the position is next proved against the store's head (the controller's
checkpoint, or a replay). The periodic reconcile stays the safety net
(docs/reliability.md, "Bookmarks").
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass

from ..events import Bookmark

__all__ = ["FeedIds", "FeedStreams"]


class FeedIds:
    """The publisher ids named as feeds, to hand to ``Controller(feeds=...)``: a set that may
    change while the controller runs (discovery's connector adds the ``role = feed`` rows as they
    come and removes them as they go). Calling it asks whether an id is one."""

    def __init__(self, ids: Iterable[str] = ()):
        self._ids = frozenset(ids)  # replaced whole: readers on other threads take no lock
        self._lock = threading.Lock()

    def __call__(self, publisher_id: str) -> bool:
        return publisher_id in self._ids

    def add(self, publisher_id: str) -> None:
        with self._lock:
            self._ids = self._ids | {publisher_id}

    def discard(self, publisher_id: str) -> None:
        with self._lock:
            self._ids = self._ids - {publisher_id}

    def __iter__(self) -> Iterator[str]:
        return iter(self._ids)


@dataclass(slots=True)
class _Stream:
    #: The last sequence applied, or passed over by a resync request.
    applied: int = 0
    #: The anchor's sequence (-1: none). Its revision is the position it was taken at: a move
    #: never needs it, since a bookmark moves a position only forward.
    seq: int = -1
    #: Every sequence from 1 to ``applied`` was applied in order, none passed over.
    whole: bool = True
    #: A replay was asked for to anchor this stream (not again until it anchors).
    asked: bool = False


class FeedStreams:
    """The (feed publisher, topic) streams of one controller, and what their bookmarks prove.

    ``is_feed(publisher_id)`` names the publishers whose bookmarks count. Not thread-safe: the
    controller calls it on its dispatch thread only.
    """

    def __init__(self, is_feed: Callable[[str], bool]):
        self.is_feed = is_feed
        self._streams: dict[tuple[str, str], _Stream] = {}
        self._feeds: set[str] = set()
        #: Bookmarks that moved a position, and those from publishers that are not feeds.
        self.moved = 0
        self.ignored = 0

    def applied(self, publisher_id: str, topic: str, first: int, last: int) -> None:
        """Sequences ``first``..``last`` of a feed's stream were applied to the cache."""
        st = self._stream(publisher_id, topic)
        if first != st.applied + 1:
            st.seq, st.whole = -1, False
        st.applied = last

    def broken(self, publisher_id: str, topic: str) -> None:
        """What was handed to the cache from this stream may not all be in it (a handler failed)."""
        st = self._streams.get((publisher_id, topic))
        if st is not None:
            st.seq, st.whole = -1, False

    def passed(self, publisher_id: str, topic: str, to: int) -> None:
        """The subscriber passed over this stream's sequences up to ``to`` (a resync request)."""
        if not self.is_feed(publisher_id):
            return
        st = self._stream(publisher_id, topic)
        st.seq, st.whole = -1, False
        st.applied = max(st.applied, to)

    def forget(self, publisher_id: str) -> None:
        """The publisher is gone (dead, said bye, left discovery): its streams prove nothing more."""
        self._feeds.discard(publisher_id)
        for ident in [i for i in self._streams if i[0] == publisher_id]:
            del self._streams[ident]

    def repaired(self, topics: Iterable[str]) -> None:
        """A complete repair brought ``topics`` to its position: anchor every known feed's streams
        of them at their last applied sequence."""
        for pid in self._feeds:
            for topic in topics:
                st = self._stream(pid, topic)
                st.seq, st.asked = st.applied, False

    def bookmark(self, bookmark: Bookmark, positions: dict[str, int]) -> tuple[dict[str, int], set[str]]:
        """What ``bookmark`` proves: the topics whose position it moves (to its revision), and the
        topics of a feed that it cannot anchor yet and for which no replay was asked (ask one:
        a complete repair anchors them)."""
        pid = bookmark.publisher_id
        moved: dict[str, int] = {}
        unanchored: set[str] = set()
        if not self.is_feed(pid):
            self.ignored += 1
            return moved, unanchored
        rev = bookmark.rev
        for topic, q in bookmark.seqs.items():
            position = positions.get(topic)
            if position is None:
                continue  # not synced yet: its first listing sets the position
            st = self._stream(pid, topic)
            if q > st.applied:  # numbers the dispatch thread never saw: passed over
                st.seq, st.applied, st.whole = -1, q, False
            if st.seq >= 0:
                # At or after the anchor: every sequence since is applied, q's included. Before
                # it: an older bookmark, nothing more to learn.
                if st.seq <= q and rev > position:
                    moved[topic] = rev
                continue
            if st.whole and rev <= position:
                st.seq, st.asked = q, False
            elif not st.asked:
                st.asked = True
                unanchored.add(topic)
        if moved:
            self.moved += 1
        return moved, unanchored

    def _stream(self, publisher_id: str, topic: str) -> _Stream:
        st = self._streams.get((publisher_id, topic))
        if st is None:
            st = self._streams[(publisher_id, topic)] = _Stream()
            self._feeds.add(publisher_id)
        return st
