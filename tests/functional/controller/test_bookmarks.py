"""Bookmarks on every store: while a feed publisher's streams arrive unbroken, the controller's
positions follow its bookmarks and a checkpoint reads no feed entry; a lost envelope stops them
and the repair reads what was missed; bookmarks from anyone but a named feed, replayed ones and
ones far ahead of the store never make a cache skip a committed write."""

import itertools
import threading
import time

import pytest

from dfpubsub import Publisher, PublisherOptions, SubscriberOptions, load_driver
from dfpubsub.codec import encode_hello
from dfpubsub.controller import Controller, ControllerOptions, FeedIds
from dfpubsub.events import CONTROL_TOPIC, Hello
from dfpubsub.feed_publisher import FeedPublisher
from dfpubsub.metrics import Stats
from dfpubsub.nbapi import NbApi
from dfpubsub.store import open_store
from dfpubsub.testing import LossyTransport
from tests.conftest import wait_for
from tests.functional.store_helpers import backend_location

TOPICS = ["port", "network"]
_n = itertools.count()


@pytest.fixture(params=["sqlite", "redis", "etcd"])
def url_prefix(request, tmp_path):
    return backend_location(request, tmp_path, "bm")


class Rig:
    """A store, a writer that publishes nothing itself (``[nbapi] publish = feed``), a df-feed on an
    in-process bus (its envelopes dropped by ``drop`` if given), and a controller trusting it."""

    def __init__(self, url_prefix, drop=None, checkpoint=0.5, trust=True):
        url, kw = url_prefix
        self.bus = f"memory://bookmarks-{next(_n)}"
        self.store, feed_store, ctrl_store = (open_store(url, TOPICS, **kw) for _ in range(3))
        self.stores = [self.store, feed_store, ctrl_store]
        self.feed_stats = Stats("feed", "feed")
        transport = load_driver(self.bus).publisher(self.feed_stats)
        if drop is not None:
            transport = LossyTransport(transport, drop)
        self.publisher = Publisher(transport, "feed", PublisherOptions(max_idle_time=0.5), self.feed_stats)
        self.feed = FeedPublisher(feed_store, self.publisher, None, compact_interval=0, bookmark_interval=0.1)
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self.feed.run, args=(self.stop,), daemon=True)
        self.thread.start()
        self.feeds = FeedIds([self.publisher.id] if trust else [])
        self.ctrl = Controller(ctrl_store, load_driver(self.bus).subscriber(Stats("subscriber", "c")), TOPICS,
                               options=SubscriberOptions(max_idle_time=0.5, message_delay_window=0.2),
                               runtime=ControllerOptions(checkpoint_interval=checkpoint), feeds=self.feeds)
        self.ctrl.start()
        assert self.ctrl.synced.wait(20)
        self.api = NbApi(self.store)
        self.keys = itertools.count()

    def write(self, n, table="port"):
        for _ in range(n):
            self.api.create(table, f"k{next(self.keys)}", {"n": 1})

    def converged(self):
        truth = {(o.table, o.key): o.version for o in self.store.list()}
        return {(o.table, o.key): o.version for o in self.ctrl.cache.items()} == truth

    def wait_converged(self, what):
        wait_for(self.converged, timeout=20, what=what)

    def stat(self, name, **labels):
        return self.ctrl.stats.get(name, **labels)

    def forge(self, pid, seqs, rev):
        """A hello with a bookmark, sent on the bus by someone else than the feed."""
        raw = load_driver(self.bus).publisher(Stats("publisher", "forger"))
        raw.send(CONTROL_TOPIC, encode_hello(Hello(pid, "feed", time.time(), dict(seqs), "bookmark", 0.5, "x",
                                                   rev=rev)))
        raw.close()

    def close(self):
        self.ctrl.stop()
        self.stop.set()
        self.thread.join(10)
        self.feed.close()
        self.publisher.close()
        for store in self.stores:
            store.close()


@pytest.fixture
def rig(url_prefix):
    made = []

    def make(**kw):
        made.append(Rig(url_prefix, **kw))
        return made[-1]

    yield make
    for r in made:
        r.close()


def anchored(r):
    """Written, converged, and a bookmark moving the positions: the feed's streams are anchored.
    (A checkpoint's replay may move a position first: then the next write's bookmark moves it.)"""
    r.write(3)
    r.write(1, "network")
    r.wait_converged("the first writes")
    moves = r.stat("bookmark_moves")
    for _ in range(50):
        r.write(1)
        deadline = time.monotonic() + 1.0
        while r.stat("bookmark_moves") == moves and time.monotonic() < deadline:
            time.sleep(0.01)
        if r.stat("bookmark_moves") > moves:
            return
    pytest.fail(f"no bookmark moved the positions: {r.ctrl.stats.snapshot()}")


def test_an_unbroken_feed_stream_moves_every_position_and_checkpoints_read_no_entry(rig):
    r = rig()
    anchored(r)
    before = {k: r.stat(k) for k in ("replay_entries", "replay_objects", "relist_objects", "checkpoint_proofs")}
    for _ in range(10):
        r.write(10)  # port only: network is idle and must move too
        time.sleep(0.05)
    # A checkpoint proves positions that bookmarks moved since the last one (one that finds them
    # where it left them replays nothing from there): writes go on until two checkpoints have, as
    # many as a loaded machine needs.
    proofs = before["checkpoint_proofs"]
    wait_for(lambda: r.stat("checkpoint_proofs") >= proofs + 2 or r.write(1), timeout=60, interval=0.1,
             what="two checkpoints proved by the head alone")
    r.wait_converged("the steady writes")
    head = r.store.feed_head()
    wait_for(lambda: min(r.ctrl.positions.values()) >= head - 0, what="every position, the idle topic's too, to reach the last write")
    assert r.stat("replay_entries") == before["replay_entries"], "a checkpoint read feed entries"
    assert r.stat("replay_objects") == before["replay_objects"]
    assert r.stat("relist_objects") == before["relist_objects"]


def test_a_lost_envelope_stops_the_positions_and_the_replay_reads_what_was_missed(rig):
    lose = threading.Event()
    r = rig(drop=lambda topic, n: lose.is_set() and topic == "port" and not lose.clear())
    anchored(r)
    entries, replays = r.stat("replay_entries"), r.stat("replays", reason="gap")
    lose.set()
    r.write(5)  # the first envelope after this is lost
    r.wait_converged("the lost write, by replay")
    wait_for(lambda: r.stat("replays", reason="gap") > replays, what="the gap's repair")
    assert r.stat("relists", reason="history_gone") == 0
    assert r.stat("replay_entries") - entries <= 10, "the replay read more than what happened since the position"
    moves = r.stat("bookmark_moves")
    r.write(3)
    wait_for(lambda: r.stat("bookmark_moves") > moves, what="bookmarks to move the positions again after the repair")
    r.wait_converged("writes after the repair")


def test_bookmarks_of_a_publisher_not_named_as_a_feed_move_nothing(rig):
    r = rig(trust=False, checkpoint=3600)
    r.write(3)
    r.wait_converged("the writes")
    positions = dict(r.ctrl.positions)
    r.forge("e" * 32, {}, 10**12)
    r.forge(r.publisher.id, r.publisher.sequences(), 10**12)  # the feed's id, but not named as a feed here
    r.write(1)
    r.wait_converged("a write after the forged bookmarks")
    assert r.ctrl.positions == positions
    assert r.stat("bookmark_moves") == 0


def test_a_replayed_bookmark_moves_nothing_back_and_nothing_forward(rig):
    r = rig()
    anchored(r)
    old = dict(r.publisher.sequences())
    old_rev = r.ctrl.positions["port"]
    r.write(5)
    r.wait_converged("the writes")
    wait_for(lambda: r.ctrl.positions["port"] > old_rev, what="bookmarks to move on")
    positions = dict(r.ctrl.positions)
    r.forge(r.publisher.id, old, old_rev)  # an old bookmark of the feed, sent again
    r.write(1)
    r.wait_converged("a write after the replayed bookmark")
    assert all(r.ctrl.positions[t] >= positions[t] for t in TOPICS)


def test_a_bookmark_far_ahead_of_the_store_never_makes_the_cache_skip_a_committed_write(rig):
    lose = threading.Event()
    r = rig(drop=lambda topic, n: lose.is_set() and topic == "port" and not lose.clear(), checkpoint=3600)
    anchored(r)
    proven = dict(r.ctrl.positions)
    far = r.store.feed_head() + 10**9
    r.forge(r.publisher.id, r.publisher.sequences(), far)  # the feed's id and its very sequences
    wait_for(lambda: r.ctrl.positions["port"] == far, what="the forged bookmark to be taken (it cannot be told yet)")
    lose.set()
    r.write(2)  # the first is lost: the repair must read it although the position claims far beyond
    r.wait_converged("the lost write, despite the forged position")
    assert r.stat("bookmarks_refused", reason="ahead_of_store") == 1
    assert max(r.ctrl.positions.values()) <= r.store.feed_head()
    assert all(r.ctrl.positions[t] >= proven[t] for t in TOPICS)


def test_a_checkpoint_refuses_a_bookmark_ahead_of_the_store(rig):
    r = rig(checkpoint=0.5)
    anchored(r)
    far = r.store.feed_head() + 10**9
    r.forge(r.publisher.id, r.publisher.sequences(), far)
    wait_for(lambda: r.stat("bookmarks_refused", reason="ahead_of_store") == 1, what="the checkpoint to refuse it")
    wait_for(lambda: max(r.ctrl.positions.values()) <= r.store.feed_head(), what="the positions back")
    r.write(3)
    r.wait_converged("writes after the refusal")
