"""FeedBackfill on a real SQLite store and segment writer: the writes an archiver did not receive
are read from the change feed, a restart resumes at the log's reach marker without reading twice
what was archived, and a feed whose history is gone leaves a marker saying so."""

import os
from collections import Counter

import msgpack
import pytest

pytest.importorskip("pyarrow")

from dfpubsub.archive import SegmentWriter  # noqa: E402
from dfpubsub.archive.marks import newest_reach  # noqa: E402
from dfpubsub.archive.schema import FEED_PUBLISHER, HISTORY_GONE, OBJECT_ACTIONS, REACH  # noqa: E402
from dfpubsub.events import Action, Event  # noqa: E402
from dfpubsub.metrics import Stats  # noqa: E402
from dfpubsub.pipeline.backfill import FeedBackfill  # noqa: E402
from dfpubsub.store import FeedRetention, open_store  # noqa: E402
from tests.conftest import wait_for  # noqa: E402
from tests.functional.pipeline.archiver_helpers import published_rows  # noqa: E402


class Clock:
    """Monotonic time the test moves: ``grace`` passes when the test says so."""

    def __init__(self):
        self.now = 1000.0

    def __call__(self):
        return self.now


@pytest.fixture
def store(tmp_path):
    s = open_store(f"sqlite:///{tmp_path}/nb.sqlite", ["port", "network"])
    s.initialize()
    yield s
    s.close()


class Archive:
    """A segment writer on ``log`` with its FeedBackfill, as df-archiver wires them."""

    def __init__(self, store, log, clock, topics=("port",)):
        self.stats = Stats("archiver", "t")
        self.writer = SegmentWriter(str(log), 1 << 20, 3600, False, self.stats)
        self.writer.recover()
        self.backfill = FeedBackfill(store, topics, self.writer, self.stats, grace=5.0, mark_every=0.0, clock=clock)
        self.found = self.backfill.start()

    def receive(self, obj, action="create", seq=1):
        event = Event(obj.topic, obj.table, obj.key, Action(action), obj.version, obj.value, 1.0, "p" * 32, seq, 1.0)
        self.backfill.received(event, self.writer.append_event(event))

    def close(self):
        self.backfill.close()
        self.writer.close()


def writes(log):
    """Counter of (key, version, source) of the log's object rows."""
    return Counter((r["key"], r["version"], "feed" if r["publisher_id"] == FEED_PUBLISHER else "live")
                   for r in published_rows(log) if r["action"] in OBJECT_ACTIONS)


def test_writes_not_received_are_read_from_the_feed_after_the_grace_and_the_reach_follows(store, tmp_path):
    clock, log = Clock(), tmp_path / "log"
    a = Archive(store, log, clock)
    assert a.found is None and a.backfill.reach == store.feed_head()  # a new log starts at the head
    received = store.create("port", "r1", {"n": 1})
    lost = store.create("port", "l1", {"n": 2})
    gone_since = store.create("port", "l2", {"n": 3})
    store.update("port", "l2", {"n": 4}, gone_since.version)  # only the update is received
    newer = store.get("port", "l2")
    deleted = store.create("port", "l3", {"n": 5})
    store.delete("port", "l3")
    other = store.create("network", "n1", {"n": 6})  # not an archived topic
    a.receive(received)
    a.receive(newer, "update")
    a.backfill.step()
    assert a.backfill.reach == received.version  # l1 waits for its event
    assert a.stats.get("backfilled") == 0
    clock.now += 6
    a.backfill.step()
    assert a.backfill.reach == store.feed_head() >= other.version
    assert a.stats.get("backfilled") == 4  # l1, l2's create, l3's create and delete
    a.close()
    rows = {(r["key"], r["version"]): r for r in published_rows(log) if r["action"] in OBJECT_ACTIONS}
    assert writes(log) == Counter({("r1", received.version, "live"): 1, ("l2", newer.version, "live"): 1,
                                   ("l1", lost.version, "feed"): 1, ("l2", gone_since.version, "feed"): 1,
                                   ("l3", deleted.version, "feed"): 1, ("l3", deleted.version + 1, "feed"): 1})
    assert msgpack.unpackb(rows[("l1", lost.version)]["value"]) == {"n": 2}  # the store still holds that version
    assert rows[("l2", gone_since.version)]["value"] is None  # changed since: its value is gone
    assert rows[("l3", deleted.version + 1)]["action"] == "delete"
    assert rows[("l1", lost.version)]["seq"] == lost.version  # a feed row's seq is its revision
    assert newest_reach(str(log), ["port"]).revision == store.feed_head()


def test_a_restart_reads_what_it_missed_from_the_reach_and_nothing_archived_twice(store, tmp_path):
    clock, log = Clock(), tmp_path / "log"
    a = Archive(store, log, clock)
    first = store.create("port", "a", {"n": 1})
    a.receive(first)
    a.backfill.step()
    a.backfill.close()  # the reach is marked at `first`...
    # ... then a write received but not yet matched when the archiver dies (its journal survives)
    late = store.create("port", "b", {"n": 2})
    a.receive(late)
    a.writer.roll()
    # and writes made while no archiver runs
    missed = [store.create("port", f"m{i}", {"n": i}) for i in range(5)]
    b = Archive(store, log, clock)
    assert b.found is not None and b.found.revision == first.version
    fresh = store.create("port", "c", {"n": 3})
    b.receive(fresh)
    b.backfill.step()  # the grace counts from when the feed said so
    assert b.stats.get("backfilled") == 0
    clock.now += 6
    b.backfill.step()
    b.close()
    got = writes(log)
    assert set(got.values()) == {1}  # nothing twice
    assert {(k, v) for k, v, _ in got} == {(o.key, o.version) for o in [first, late, fresh, *missed]}
    assert {k for k, _, src in got if src == "feed"} == {o.key for o in missed}


def test_history_gone_below_the_reach_leaves_a_marker_and_goes_on(tmp_path):
    store = open_store(f"sqlite:///{tmp_path}/nb.sqlite", ["port"], feed_retention=FeedRetention(max_entries=10))
    store.initialize()
    try:
        clock, log = Clock(), tmp_path / "log"
        a = Archive(store, log, clock)
        reach = a.backfill.reach
        a.close()
        for i in range(600):  # far past what the feed keeps: the archiver was away too long
            store.create("port", f"k{i}", {"n": i})
        b = Archive(store, log, clock)
        b.backfill.step()  # history gone: marked, and the reader moves to what is kept

        def turn():
            b.backfill.step()
            clock.now += 6
            return b.backfill.reach == store.feed_head()

        wait_for(turn, what="the reach at the head")
        b.close()
        rows = published_rows(log)
        gone = [r for r in rows if r["action"] == HISTORY_GONE]
        assert len(gone) == 1 and gone[0]["seq"] == reach and reach < gone[0]["version"] < store.feed_head()
        assert msgpack.unpackb(gone[0]["value"]) == {"after": reach}
        kept = [r for r in rows if r["action"] in OBJECT_ACTIONS]
        assert kept and all(r["version"] > gone[0]["version"] for r in kept)  # what the feed still had
        assert max(r["version"] for r in rows if r["action"] == REACH) == store.feed_head()
        assert b.stats.get("history_gone") == 1
    finally:
        store.close()


@pytest.mark.parametrize("backend", ["etcd", "redis"])
def test_the_same_on_etcd_and_redis_stores(backend, request, tmp_path):
    server = request.getfixturevalue(f"shared_{backend}")
    store = open_store(server.url, ["port", "network"], prefix=f"bf{os.getpid()}-{tmp_path.name}")
    store.initialize()
    try:
        clock, log = Clock(), tmp_path / "log"
        a = Archive(store, log, clock, topics=("port", "net"))  # a topic that is no table's name
        received = store.create("port", "r1", {"n": 1})
        lost = store.create("port", "l1", {"n": 2})
        moved = store.create("network", "n1", {"n": 3}, topic="net")
        updated = store.update("network", "n1", {"n": 4}, moved.version)  # etcd's feed names the table as its topic
        other = store.create("network", "n2", {"n": 5})  # topic "network": not archived
        a.receive(received)

        def settled():
            a.backfill.step()
            clock.now += 6
            return a.backfill.reach >= other.version

        wait_for(settled, timeout=30, what="the reach past the last write")
        a.close()
        assert writes(log) == Counter({("r1", received.version, "live"): 1, ("l1", lost.version, "feed"): 1,
                                       ("n1", moved.version, "feed"): 1, ("n1", updated.version, "feed"): 1})
    finally:
        store.close()
