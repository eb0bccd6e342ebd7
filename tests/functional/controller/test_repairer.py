"""A plain Subscriber with a store repairs by replay too (dfpubsub.Repairer): its first sync is a
listing, a later resync reads the store's change feed from where the cache is complete and only the
objects the cache missed, and a feed whose history is gone below that is one relist."""

from __future__ import annotations

import pytest

from dfpubsub import Repairer, Subscriber, SubscriberOptions, VersionedCache, load_driver, open_store
from dfpubsub.controller.relist import Relisted
from dfpubsub.controller.replay import Replayed
from dfpubsub.metrics import Stats
from dfpubsub.store import FeedRetention
from tests.conftest import wait_for

N = 300  # objects in the table: a relist reads them all, a replay what changed


@pytest.fixture(params=["sqlite", "redis", "etcd"])
def url(request, tmp_path):
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path}/nb.sqlite"
    return request.getfixturevalue(f"{request.param}_server").url


def _subscribed(store, cache, repair):
    sub = Subscriber(load_driver("memory").subscriber(Stats("subscriber", "t")), ["port"], cache.apply, repair,
                     SubscriberOptions(resync_base_interval=0.01))
    sub.start()
    assert sub.wait_synced(30)
    return sub


def _equal(store, cache) -> bool:
    truth = {(o.key, o.version) for o in store.list("port")}
    held = {(k, cache.get("port", k).version) for (_, k) in cache.keys()}
    return truth == held


def test_a_resync_after_the_first_sync_replays_what_was_missed(url):
    store = open_store(url, ["port"])
    for i in range(N):
        store.create("port", f"k{i}", {"i": i})
    cache = VersionedCache()
    found: list = []
    repair = Repairer(store, cache, on_changes=lambda topics, changes: found.append(changes))
    sub = _subscribed(store, cache, repair)
    try:
        assert (repair.relists, repair.replays) == (1, 0) and isinstance(repair.last, Relisted)
        assert len(cache) == N
        # Writes nobody published (a writer that died before publishing), then a gap reported.
        store.update("port", "k7", {"i": -7})
        store.delete("port", "k8")
        store.create("port", "new", {"i": 1})
        sub.request_resync(["port"], reason="gap")
        wait_for(lambda: repair.replays == 1, what="the repair by replay")
        done = repair.last
        assert isinstance(done, Replayed)
        assert repair.relists == 1, "the repair relisted"
        assert done.objects == 2 and done.entries >= 3, done  # k7 and new read back; k8's delete from its entry
        assert {(c.key, c.action.value) for c in found[-1]} == {("k7", "update"), ("k8", "delete"), ("new", "create")}
        assert _equal(store, cache)
        assert cache.get("port", "k7").value == {"i": -7}
    finally:
        sub.close()
        store.close()


@pytest.mark.parametrize("url", ["sqlite", "redis"], indirect=True)  # etcd: compaction is its own bound
def test_history_gone_below_the_position_is_one_relist(url):
    store = open_store(url, ["port"], feed_retention=FeedRetention(max_entries=10))
    for i in range(N):
        store.create("port", f"k{i}", {"i": i})
    cache = VersionedCache()
    repair = Repairer(store, cache)
    sub = _subscribed(store, cache, repair)
    try:
        for i in range(N):  # far more than the feed keeps (SQLite trims every 256 revisions)
            store.update("port", f"k{i}", {"i": -i})
        sub.request_resync(["port"], reason="gap")
        wait_for(lambda: repair.relists == 2, what="the relist the trimmed feed calls for")
        assert repair.replays == 0 and _equal(store, cache)
        store.update("port", "k1", {"i": 1})  # and from the relist's revision on, replays again
        sub.request_resync(["port"], reason="gap")
        wait_for(lambda: repair.replays == 1, what="a replay after the relist")
        assert repair.relists == 2 and _equal(store, cache)
    finally:
        sub.close()
        store.close()
