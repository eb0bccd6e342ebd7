"""Wire schema 2 end to end on real stores: df-feed sends the store's bytes without decoding them,
controllers keep them as they came, a mixed fleet (schema 1 and 2 publishers) converges, and a
forged value that fails its first decode is counted and repaired, never reconciled
(docs/protocol.md §4.6, §6.4)."""

import time

import msgpack
import zmq

from dfpubsub import Publisher, PublisherOptions, load_driver
from dfpubsub.codec import BatchHeader, encode_batch, topic_frame
from dfpubsub.metrics import Stats
from tests.conftest import free_port, wait_for
from tests.functional.controller.test_relist import store
from tests.functional.controller_helpers import TABLES, Node
from tests.functional.feed.feed_helpers import FeedThread
from tests.functional.zmq_helpers import subscribed

__all__ = ["store"]  # the fixture: each test on SQLite, etcd and Redis


def _write(store, n, start=0):
    for i in range(start, start + n):
        store.create(TABLES[i % 2], f"k{i}", {"i": i, "name": f"obj-{i}", "tags": ["a", "b"]})
    for i in range(start, start + n, 3):
        store.update(TABLES[i % 2], f"k{i}", {"i": -i})
    for i in range(start, start + n, 5):
        store.delete(TABLES[i % 2], f"k{i}")


def test_df_feed_in_schema_2_reaches_controllers_with_the_stores_own_bytes(store):
    feed = FeedThread(store, schema=2)
    node = Node(store, feed.endpoint)
    try:
        # The feed publisher starts with no position: its hello makes the controller resync once.
        wait_for(lambda: node.ctrl.stats.get("hellos_in") and node.ctrl.stats.get("resync_requests"),
                 what="the controller to hear the feed publisher")
        wait_for(lambda: node.converged(store), timeout=30, what="the first sync")
        resyncs = node.ctrl.stats.get("resync_requests")
        _write(store, 40)
        wait_for(lambda: node.converged(store), timeout=30, what="the feed's events to reach the controller")
        assert node.ctrl.stats.get("resync_requests") == resyncs, "converged by resync, not by the feed's events"
        assert node.ctrl.stats.get("envelopes_schema2") > 0 and node.ctrl.stats.get("envelopes_schema1") == 0
        assert node.ctrl.stats.get("bad_values") == 0 and feed.stats.get("feed_undecodable") == 0
        # What the cache holds is, byte for byte, what the store holds.
        objects, blobs = store.get_many_packed([(o.table, o.key) for o in store.list()])
        held = {(t, k): rec[2] for t, rows in node.ctrl.cache._tables.items() for k, rec in rows.items()}
        assert {(o.table, o.key): b for o, b in zip(objects, blobs)} == held
        assert all(msgpack.unpackb(b) == o.value for o, b in zip(store.list(), [held[(o.table, o.key)]
                                                                                for o in store.list()]))
    finally:
        node.ctrl.stop()
        feed.close()


def test_a_mixed_fleet_of_schema_1_and_2_publishers_converges(store):
    feed = FeedThread(store, schema=2)
    driver = load_driver("zmq+tcp://127.0.0.1:*")
    transport = driver.publisher(Stats("p", "api"))
    api = Publisher(transport, "api", PublisherOptions(batch_linger=0, max_idle_time=0.3))  # schema 1
    node = Node(store, feed.endpoint)
    node.ctrl.connect(transport.uri)
    try:
        wait_for(lambda: node.converged(store), timeout=30, what="the first sync")
        for table in TABLES:  # else the first writes may go out before the controller's subscriptions arrive
            subscribed(api, table)
        for i in range(30):  # written and published directly in schema 1, and by df-feed in schema 2
            obj = store.create(TABLES[i % 2], f"m{i}", {"i": i})
            api.publish(obj.topic, obj.table, obj.key, "create", obj.version, obj.value)
        wait_for(lambda: node.converged(store), timeout=30, what="both publishers' events")
        wait_for(lambda: node.ctrl.stats.get("envelopes_schema1") > 0 and node.ctrl.stats.get("envelopes_schema2") > 0,
                 timeout=30, what="envelopes of both schemas")
    finally:
        node.ctrl.stop()
        api.close()
        feed.close()


def test_a_forged_value_that_fails_its_first_decode_is_repaired_and_never_reconciled(store):
    feed = FeedThread(store, schema=2)
    node = Node(store, feed.endpoint)
    ctx = zmq.Context.instance()
    forger = ctx.socket(zmq.PUB)
    port = free_port()
    forger.bind(f"tcp://127.0.0.1:{port}")
    try:
        wait_for(lambda: node.converged(store), timeout=30, what="the first sync")
        obj = store.create("network", "n1", {"cidr": "10.0.0.0/24"})
        wait_for(lambda: node.converged(store), timeout=30, what="the real network")
        called = []  # every object the reconciler is called with from now on
        node.seen.act = lambda key, o: called.append(o)
        node.ctrl.connect(f"tcp://127.0.0.1:{port}")
        # A map whose key is not UTF-8, at a version above the store's: sound structure, bad content.
        bad = msgpack.packb(("network", "n1", "update", obj.version + 1000, b"\x81\xa1\xff\x01", time.time()))
        frame = encode_batch(BatchHeader("f" * 32, "forger", "network", 2), 1, time.time(), [bad])
        deadline = time.monotonic() + 30
        while node.ctrl.stats.get("bad_values") == 0 and time.monotonic() < deadline:
            forger.send_multipart([topic_frame("network"), frame])  # until the subscription has reached it
            time.sleep(0.1)
        assert node.ctrl.stats.get("bad_values") >= 1
        wait_for(lambda: node.converged(store), timeout=30, what="the key to be repaired from the store")
        assert node.ctrl.cache.get("network", "n1").version == obj.version
        assert node.seen.objects["n1"].value == {"cidr": "10.0.0.0/24"}
        assert node.ctrl.stats.get("resync_requests", reason="bad_value") >= 1
        assert all(o is None or (o.version == obj.version and o.value == obj.value) for o in called), called
    finally:
        forger.close(0)
        node.ctrl.stop()
        feed.close()
