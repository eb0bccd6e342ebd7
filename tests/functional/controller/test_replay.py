"""A repair by replay costs what was missed, on every store.

Two controllers hold a table of a few thousand objects; something is lost (an envelope, the feed's
history, a forged event's truth) and each repair must leave every cache equal to the store while
reading the store's feed and only the objects the feed says the cache missed: counted by the
controller (``replays``, ``replay_objects``, ``relists``), by a counting wrapper around each
controller's own store handle (the rows its reads returned), and by the server itself where it is
cheap (Redis ``INFO stats``, etcd ``/metrics``). The old relist-everything repair fails every one
of them (it reads the table, and counts a relist per gap).

Every test runs on a private SQLite file, redis-server or etcd (tests/conftest.py), so that server
counters and etcd compactions are this test's alone.
"""

from __future__ import annotations

import random
import signal
import threading
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor

import pytest
import zmq

from dfpubsub.codec import BatchHeader, encode_batch, pack_event, topic_frame
from dfpubsub.controller import ControllerOptions
from dfpubsub.errors import AlreadyExists, HistoryGone, NotFound
from dfpubsub.store import FeedRetention
from tests.conftest import wait_for
from tests.functional.controller_helpers import TABLES
from tests.functional.replay_helpers import PAD, Backend, Cluster, N, SlowAnswers, holds, replay_always, state


@pytest.fixture(params=["sqlite", "redis", "etcd"])
def backend(request, tmp_path):
    return Backend.of(request, tmp_path)


@pytest.fixture
def cluster_factory(backend):
    made = []

    def make(**kwargs):
        made.append(Cluster(backend, **kwargs))
        return made[-1]

    yield make
    for c in made:
        c.close()


# -- 1. a lost envelope ---------------------------------------------------------------------------


def test_a_lost_envelope_is_repaired_by_replay_reading_what_was_missed(backend, cluster_factory):
    c = cluster_factory()
    for node in c.nodes:
        assert node.relists() == {"first_sync": 1} and node.stat("relist_objects") == N + 20
    sync_cost = {k: c.after_sync[k] - c.before_sync[k] for k in c.after_sync}
    rows = [node.reads.total() for node in c.nodes]
    before = [node.ctrl.stats.snapshot() for node in c.nodes]
    counters = backend.server_counters()
    written = {}
    for i in range(30):  # the 10th write's envelope is lost
        obj = c.write(c.api.update, "port", f"k{i}", {"i": -i, "pad": PAD}, lose=i == 9)
        written[("port", obj.key)] = obj.version
    # Waits on the caches alone: a look at the store now would count in the server's counters.
    for node in c.nodes:
        wait_for(lambda: holds(node, written), what=f"{node.ctrl.name}: the lost write to be repaired")
    repair_cost = {k: v - counters[k] for k, v in backend.server_counters().items()}
    assert c.pub.transport.dropped == 1
    c.wait_converged()
    for node, rows_before, snap in zip(c.nodes, rows, before):
        name = node.ctrl.name
        assert node.stat("replays", "gap") > snap.get("replays:gap", 0), f"{name}: no replay counted for the gap"
        assert node.relists() == {"first_sync": 1}, f"{name}: relisted to repair: {node.relists()}"
        objects = node.stat("replay_objects") - snap.get("replay_objects", 0)
        assert 1 <= objects <= 30, f"{name}: the replay read {objects} objects for 1 lost write of 30"
        read = node.reads.total() - rows_before
        assert read == objects and node.reads.calls["list_packed_at"] + node.reads.calls["list_versions_at"] == 1, \
            f"{name}: its store handle returned {read} objects ({dict(node.reads.rows)})"
        assert node.stat("replay_entries") - snap.get("replay_entries", 0) <= 200
        print(f"{backend.name} {name}: replay read {objects} objects, {node.stat('replay_entries')} entries")
    # The server's own count: the repair of both controllers cost a small part of one listing.
    if backend.name != "sqlite":
        table_bytes = sync_cost["bytes"] / 2
        print(f"{backend.name}: first sync of both {sync_cost}, the 30 writes and both repairs {repair_cost}")
        assert repair_cost["bytes"] < table_bytes / 10, (repair_cost, sync_cost)
        if backend.name == "redis":  # the 30 writes' scripts are most of these
            assert repair_cost["commands"] < sync_cost["commands"] / 2 / 10, (repair_cost, sync_cost)


# -- 4. history gone ------------------------------------------------------------------------------


def test_history_gone_below_the_position_is_one_relist_then_replays_again(backend, cluster_factory):
    # A replay may read any number of entries here: the feed's history alone stops it.
    c = cluster_factory(store_options={"feed_retention": FeedRetention(max_entries=100)},
                        runtimes=(replay_always(), replay_always()))
    before = [node.ctrl.stats.snapshot() for node in c.nodes]
    # Behind the pub/sub's back (as if every envelope were dropped): 700 writes, then the history
    # before them is dropped: no controller's position is in the feed any more.
    with ThreadPoolExecutor(4) as pool:
        list(pool.map(lambda i: c.store.update("port", f"k{i}", {"i": -i, "pad": PAD}), range(700)))
    c.backend.compact_history(c.store)
    with pytest.raises(HistoryGone):
        c.store.read_feed(min(c.nodes[0].ctrl.positions.values()))
    c.write(c.api.update, "port", "k1000", {"lost": True}, lose=True)
    c.write(c.api.update, "port", "k1001", {"seen": True})
    c.wait_converged()
    for node, snap in zip(c.nodes, before):
        assert node.relists() == {"first_sync": 1, "history_gone": 1}, node.relists()
        # The first sync, then every topic: all positions were as far behind as the gap's.
        assert node.stat("relist_objects") == 2 * (N + 20)
        assert node.stat("replays") == sum(v for k, v in snap.items() if k.startswith("replays:"))
    # The relist set the position again: the next loss is a replay.
    c.write(c.api.update, "port", "k1002", {"lost": True}, lose=True)
    c.write(c.api.update, "port", "k1003", {"seen": True})
    c.wait_converged()
    for node, snap in zip(c.nodes, before):
        assert node.relists() == {"first_sync": 1, "history_gone": 1}, node.relists()
        assert node.stat("replays", "gap") > snap.get("replays:gap", 0)


# -- 5. a replay racing writes --------------------------------------------------------------------


def test_replays_racing_writes_deletes_and_recreates_of_the_same_keys_converge(backend, cluster_factory):
    # However many writes pile up between two repairs, a replay (where a relist reads less is not
    # this test's concern).
    c = cluster_factory(runtimes=(replay_always(), replay_always()))
    before = [node.ctrl.stats.snapshot() for node in c.nodes]
    stop = threading.Event()
    done = Counter()
    rng = random.Random(7)

    def writer():
        i = 0
        while not stop.is_set():
            key = f"k{rng.randrange(40)}"
            i += 1
            with c.drop.lock:
                c.drop.pending += rng.random() < 0.15  # about one envelope in seven lost
            try:
                if rng.random() < 0.3:
                    c.api.delete("port", key)
                    done["delete"] += 1
                elif c.store.get("port", key) is None:
                    c.api.create("port", key, {"i": i, "pad": PAD})
                    done["create"] += 1
                else:
                    c.api.update("port", key, {"i": i, "pad": PAD})
                    done["update"] += 1
            except (NotFound, AlreadyExists):  # the other writer got there first
                done["conflict"] += 1
            c.pub.flush()

    threads = [threading.Thread(target=writer) for _ in range(2)]
    for t in threads:
        t.start()
    try:
        # Repairs happen while the writers go on: several replays each.
        for node, snap in zip(c.nodes, before):
            wait_for(lambda: node.stat("replays", "gap") >= snap.get("replays:gap", 0) + 3, timeout=30,
                     what=f"{node.ctrl.name}: replays while the writers write ({node.ctrl.stats.snapshot()}, "
                          f"{dict(done)})")
    finally:
        stop.set()
        for t in threads:
            t.join()
    assert done["delete"] and done["create"] and c.pub.transport.dropped, done
    c.write(c.api.update, "port", "k2999", {"last": True})  # one more, so that a late loss is a gap too
    c.wait_converged()
    for node, snap in zip(c.nodes, before):
        assert node.relists() == {"first_sync": 1}, node.relists()
        objects = node.stat("replay_objects") - snap.get("replay_objects", 0)
        writes = sum(done.values())
        print(f"{backend.name} {node.ctrl.name}: {dict(done)}; {node.stat('replays')} replays read {objects} objects")
        assert objects <= writes


# -- 6. a forged event ----------------------------------------------------------------------------

FORGED = 10**12


def _forge(c, events):
    """A publisher of the attacker's own ("mallory"), whose envelope (valid shape, sequence 1) the
    controllers take through their transport: sent until both caches show it."""
    sock = zmq.Context.instance().socket(zmq.PUB)
    port = sock.bind_to_random_port("tcp://127.0.0.1")
    for node in c.nodes:
        node.ctrl.connect(f"tcp://127.0.0.1:{port}")
    frame = encode_batch(BatchHeader("mallory", "api", "port"), 1, time.time(),
                         [pack_event("port", key, action, FORGED, value, time.time()) for key, action, value in events])

    def taken():
        sock.send_multipart([topic_frame("port"), frame])
        return all(node.ctrl.cache.version("port", key) == FORGED for node in c.nodes for key, _, _ in events)

    wait_for(taken, what="the controllers to take the forged envelope")
    return sock


def test_a_forged_event_is_replaced_by_the_stores_object_at_the_next_replay(backend, cluster_factory):
    c = cluster_factory()
    before = [node.ctrl.stats.snapshot() for node in c.nodes]
    sock = _forge(c, [("k5", "update", {"owned": True}), ("ghost", "create", {"owned": True}),
                      ("k6", "delete", None)])
    try:
        assert all(node.ctrl.cache.get("port", "k5").value == {"owned": True} for node in c.nodes)
        # A gap, at once (before the attacker is given up for silence): its replay must fix the forgeries.
        c.write(c.api.update, "port", "k7", {"lost": True}, lose=True)
        c.write(c.api.update, "port", "k8", {"seen": True})
        for node, snap in zip(c.nodes, before):
            wait_for(lambda: node.stat("replays", "gap") > snap.get("replays:gap", 0), what="the gap's replay")
        c.wait_converged()
        for node, snap in zip(c.nodes, before):
            assert node.ctrl.cache.get("port", "k5") == c.store.get("port", "k5")
            assert node.ctrl.cache.get("port", "ghost") is None
            assert node.ctrl.cache.get("port", "k6") == c.store.get("port", "k6")
            assert node.relists() == {"first_sync": 1}, node.relists()
            # The lost write and the three forged objects: not the table.
            assert node.stat("replay_objects") - snap.get("replay_objects", 0) <= 6
    finally:
        sock.close(0)


@pytest.mark.parametrize("repair", ["replay", "relist"])
def test_a_forged_create_repaired_away_does_not_block_the_real_create(backend, cluster_factory, repair):
    """A forged create of an object the store does not have, at a version far ahead: the repair
    deletes it, and must not leave a tombstone at the forged version, which would make the real
    create's event look stale (the relist's rule: "a forged version must not block later writes")."""
    c = cluster_factory()
    sock = _forge(c, [("ghost", "create", {"owned": True})])
    try:
        if repair == "replay":  # a gap's replay
            c.write(c.api.update, "port", "k7", {"lost": True}, lose=True)
            c.write(c.api.update, "port", "k8", {"seen": True})
        else:  # the periodic reconcile's relist
            for node in c.nodes:
                node.ctrl.subscriber.request_resync(TABLES, reason="periodic")
        wait_for(lambda: all(node.ctrl.cache.get("port", "ghost") is None for node in c.nodes),
                 what="the forged object to be repaired away")
        # The attacker falls silent and is given up (a repair of its own, which finds nothing).
        for node in c.nodes:
            wait_for(lambda: node.stat("replays", "dead_publisher"), what="the attacker to be given up")
        stale = [node.stat("stale_events") for node in c.nodes]
        real = c.write(c.api.create, "port", "ghost", {"real": True})
        for node, s in zip(c.nodes, stale):
            wait_for(lambda: node.ctrl.cache.get("port", "ghost") == real or node.stat("stale_events") > s,
                     what="the real create's event")
            assert node.ctrl.cache.get("port", "ghost") == real, (
                f"{node.ctrl.name}: the real create (version {real.version}) was dropped as stale: the {repair} "
                f"left a tombstone at version {node.ctrl.cache.version('port', 'ghost')}")
    finally:
        sock.close(0)


# -- 8. too far behind ----------------------------------------------------------------------------


def test_a_feed_longer_than_the_ratio_allows_is_a_relist_too_far_behind(backend, cluster_factory):
    """Two controllers, one with a small ``replay_max_ratio`` (0.1: a replay may read ~300 entries for
    its 3020 objects, fewer on etcd whose entries cost more), one with a huge one: 1200 entries since
    their position. The first relists (cause too_far_behind) and the second replays; both converge,
    and the next loss (a few entries) is a replay for both: the relist set the position again."""
    c = cluster_factory(runtimes=(ControllerOptions(workers=2, replay_max_ratio=0.1), replay_always()))
    small, generous = c.nodes
    before = [node.ctrl.stats.snapshot() for node in c.nodes]
    with ThreadPoolExecutor(4) as pool:  # behind the pub/sub's back, as if every envelope were lost
        list(pool.map(lambda i: c.store.update("port", f"k{i}", {"i": -i, "pad": PAD}), range(1199)))
    c.write(c.api.update, "port", "k1500", {"lost": True}, lose=True)
    c.write(c.api.update, "port", "k1501", {"seen": True})
    c.wait_converged()
    assert small.relists() == {"first_sync": 1, "too_far_behind": 1}, small.relists()
    assert small.stat("replays") == sum(v for k, v in before[0].items() if k.startswith("replays:"))
    assert generous.relists() == {"first_sync": 1}, generous.relists()
    objects = generous.stat("replay_objects") - before[1].get("replay_objects", 0)
    assert 1199 <= objects <= 1201, objects
    c.write(c.api.update, "port", "k1502", {"lost": True}, lose=True)
    c.write(c.api.update, "port", "k1503", {"seen": True})
    c.wait_converged()
    for node, snap in zip(c.nodes, before):
        expected = {"first_sync": 1, "too_far_behind": 1} if node is small else {"first_sync": 1}
        assert node.relists() == expected, (
            f"{node.ctrl.name}: relisted for the next loss again: {node.relists()}, positions {node.ctrl.positions}")
        assert node.stat("replays", "gap") > snap.get("replays:gap", 0), node.ctrl.stats.snapshot()


# -- etcd's entries name the table for an update that kept its topic ------------------------------


def test_a_missed_create_and_update_in_a_topic_named_otherwise_than_its_table_are_replayed(backend, cluster_factory):
    """Objects of table "port" in topic "tenant": their create and their update are both lost. The
    replay must find them (etcd's feed entry of the update names the table, not the topic)."""
    c = cluster_factory(topics=["tenant"], populate_table=False)
    c.drop.topic = "tenant"
    for i in range(5):
        c.write(c.api.create, "port", f"t{i}", {"i": i}, "tenant")
    for node in c.nodes:
        wait_for(lambda: len(node.ctrl.cache) == 5, what="the first creates")
    before = [node.ctrl.stats.snapshot() for node in c.nodes]
    c.write(c.api.create, "port", "missed", {"v": 1}, "tenant", lose=True)
    c.write(c.api.update, "port", "missed", {"v": 2}, lose=True)
    c.write(c.api.update, "port", "t0", {"seen": True})
    truth = state(c.store.list(topic="tenant"))
    for node, snap in zip(c.nodes, before):
        wait_for(lambda: node.stat("replays", "gap") > snap.get("replays:gap", 0), what="the gap's replay")
        wait_for(lambda: state(node.ctrl.cache.items()) == truth, timeout=5,
                 what=f"{node.ctrl.name}: the cache to hold the object whose create and update were lost "
                      f"(has {sorted(o.key for o in node.ctrl.cache.items())})")


# -- a repair that failed keeps its cause ---------------------------------------------------------


@pytest.mark.parametrize("backend", ["redis", "etcd"], indirect=True)
def test_a_replay_retried_after_the_store_failed_is_counted_under_its_cause(backend, cluster_factory):
    """The gap's repair fails while the server is frozen (SIGSTOP: every request times out) and is
    retried once it answers: the replay that repairs it counts as the gap's, not as "manual"."""
    c = cluster_factory(node_store_options={"timeout": 1.0})
    before = [node.ctrl.stats.snapshot() for node in c.nodes]
    c.write(c.api.update, "port", "k1", {"lost": True}, lose=True)
    backend.server.proc.send_signal(signal.SIGSTOP)  # the gap shows at the next hello, 0.3 s away at most
    try:
        for node in c.nodes:
            wait_for(lambda: node.stat("resync_failures"), what=f"{node.ctrl.name}: the repair to fail")
    finally:
        backend.server.proc.send_signal(signal.SIGCONT)
    c.wait_converged()
    for node, snap in zip(c.nodes, before):
        assert node.relists() == {"first_sync": 1}, node.relists()
        replays = {k: v - snap.get(f"replays:{k}", 0) for k, v in node.ctrl.stats.by_reason("replays").items()}
        replays = {k: v for k, v in replays.items() if v}
        # Never "manual" (a retry that lost its reasons). A loaded machine may also declare the
        # publisher dead while the server is frozen: that repair counts under its own cause, and a
        # retry coalesced with it under the higher of the two.
        assert "manual" not in replays and set(replays) <= {"gap", "dead_publisher"} and replays, \
            f"{node.ctrl.name}: the retried repair counted as {replays}"
        assert replays.get("gap") == 1 or "dead_publisher" in replays, replays


# -- etcd slow to deliver a watch's history ----------------------------------------------------------


@pytest.mark.parametrize("backend", ["etcd"], indirect=True)
def test_a_replay_that_could_not_read_the_feed_up_to_the_head_does_not_count_the_loss_repaired(backend,
                                                                                                cluster_factory):
    """etcd delivers a new watch's history 0.7 s late (loaded; every other request answers at once).
    A replay that succeeds must have read the feed up to the head it saw (or found it holds nothing
    more); one that could not must fail and be retried, never repair nothing and let the lost write
    wait for the next checkpoint (a minute)."""
    proxy = SlowAnswers(backend.server.port, 0.7)
    distant = Backend(backend.name, f"etcd://127.0.0.1:{proxy.port}", backend.server)
    try:
        c = cluster_factory(node_backend=distant)
        proxy.armed = True  # the controllers' channels are open: only the replays' new watches are slow
        before = [node.ctrl.stats.snapshot() for node in c.nodes]
        lost = c.write(c.api.update, "port", "k1", {"lost": True}, lose=True)
        c.write(c.api.update, "port", "k2", {"seen": True})
        for node, snap in zip(c.nodes, before):
            wait_for(lambda: node.stat("replays") > sum(v for k, v in snap.items() if k.startswith("replays:")),
                     what=f"{node.ctrl.name}: the gap's replay")
        for node, snap in zip(c.nodes, before):
            wait_for(lambda: node.ctrl.cache.get("port", "k1") == lost, timeout=10,
                     what=f"{node.ctrl.name}: the lost write (the replays {node.ctrl.stats.by_reason('replays')} "
                          f"read {node.stat('replay_entries') - snap.get('replay_entries', 0)} entries; its position "
                          f"is {node.ctrl.positions}, the head {c.store.feed_head()})")
        c.wait_converged()
    finally:
        proxy.close()
