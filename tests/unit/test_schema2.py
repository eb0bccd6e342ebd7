"""Wire schema 2: values travel as their msgpack bytes, are proved by structure at receipt and by
their first decode, and a value that fails it never reaches a handler, reconciler, index or
transform (docs/protocol.md §4.6, §6.4)."""

import itertools
import threading

import msgpack
import pytest

from dfpubsub import InvalidEvent, Publisher, PublisherOptions, Subscriber, SubscriberOptions, load_driver
from dfpubsub.codec import BatchHeader, encode_batch
from dfpubsub.controller import Controller, ControllerOptions, VersionedCache
from dfpubsub.errors import BadValue
from dfpubsub.events import Action, Event
from dfpubsub.metrics import Stats
from tests.conftest import wait_for

_bus = itertools.count()
#: A map whose key is not UTF-8: sound structure, fails its first decode.
BAD = b"\x81\xa1\xff\x01"


def bus():
    return load_driver(f"memory://schema2-{next(_bus)}")


def forged(topic, seq, events, pid="f" * 32):
    """A schema 2 envelope made by hand: ``events`` are (table, key, action, version, value bytes)."""
    packed = [msgpack.packb((t, k, a, v, b, 1.0)) for t, k, a, v, b in events]
    return encode_batch(BatchHeader(pid, "forger", topic, 2), seq, 1.0, packed)


class Sink:
    def __init__(self, driver, packed=False):
        self.events, self.gaps = [], []
        self.sub = Subscriber(driver.subscriber(Stats("s", "s")), ["port"], self.events.append,
                              options=SubscriberOptions(initial_sync=False, packed_values=packed),
                              on_gap=self.gaps.append)
        self.sub.start()


def test_schema2_values_arrive_decoded_or_as_the_very_bytes_sent():
    driver = bus()
    plain, packed = Sink(driver), Sink(driver, packed=True)
    pub = Publisher(driver.publisher(Stats("p", "p")), "api", PublisherOptions(schema=2, batch_linger=0))
    try:
        blob = msgpack.packb({"mac": "fa:16:3e:00:00:01", "up": True})
        pub.publish("port", "port", "p1", "create", 3, packed=blob)
        pub.publish("port", "port", "p2", "update", 4, {"b": [1, 2]})
        pub.publish("port", "port", "p1", "delete", 5)
        wait_for(lambda: len(plain.events) == 3 and len(packed.events) == 3)
    finally:
        pub.close()
        plain.sub.close()
        packed.sub.close()
    assert [e.value for e in plain.events] == [{"mac": "fa:16:3e:00:00:01", "up": True}, {"b": [1, 2]}, None]
    assert [e.value for e in packed.events] == [None, None, None]
    assert packed.events[0].packed == blob and packed.events[1].packed == msgpack.packb({"b": [1, 2]})
    assert packed.events[2].action is Action.DELETE and packed.events[2].packed is None
    assert plain.sub.stats.get("envelopes_schema2") >= 1 and plain.sub.stats.get("envelopes_schema1") == 0


def test_schema2_carries_maps_only_and_schema1_decodes_the_bytes_it_is_handed():
    driver = bus()
    sink = Sink(driver)
    two = Publisher(driver.publisher(Stats("p", "2")), "two", PublisherOptions(schema=2, batch_linger=0))
    one = Publisher(driver.publisher(Stats("p", "1")), "one", PublisherOptions(batch_linger=0))
    try:
        for bad in ([1], "x", None):
            with pytest.raises(InvalidEvent):
                two.publish("port", "port", "k", "create", 1, bad)
        with pytest.raises(InvalidEvent):
            two.publish("port", "port", "k", "create", 1, packed=msgpack.packb([1]))
        with pytest.raises(InvalidEvent):
            one.publish("port", "port", "k", "create", 1, packed=BAD)
        with pytest.raises(ValueError):
            Publisher(driver.publisher(Stats("p", "3")), "three", PublisherOptions(schema=3))
        # A mixed fleet: one subscriber takes both schemas, and counts each.
        one.publish("port", "port", "a", "create", 1, packed=msgpack.packb({"n": 1}))
        two.publish("port", "port", "b", "create", 2, {"n": 2})
        wait_for(lambda: len(sink.events) == 2)
    finally:
        one.close()
        two.close()
        sink.sub.close()
    assert sorted((e.key, e.value["n"]) for e in sink.events) == [("a", 1), ("b", 2)]
    assert sink.sub.stats.get("envelopes_schema1") == 1 and sink.sub.stats.get("envelopes_schema2") == 1


def test_a_value_that_fails_its_first_decode_is_counted_resynced_and_never_delivered():
    driver = bus()
    sink = Sink(driver)
    send = driver.publisher(Stats("p", "p")).send
    try:
        send("port", forged("port", 1, [("port", "bad", "create", 7, BAD),
                                        ("port", "ok", "create", 8, msgpack.packb({"n": 1}))]))
        wait_for(lambda: sink.events and sink.gaps)
    finally:
        sink.sub.close()
    assert [(e.key, e.value) for e in sink.events] == [("ok", {"n": 1})]
    assert [(g.topic, g.reason) for g in sink.gaps] == [("port", "bad_value")]
    assert sink.sub.stats.get("bad_values") == 1


def test_the_cache_keeps_the_bytes_that_came_and_decodes_on_read():
    bad: list[tuple] = []
    cache = VersionedCache(decoded=8, on_bad_value=lambda *a: bad.append(a[:3]))
    cache.take_touched()  # as a controller that replays does
    blob = msgpack.packb({"n": 1})
    assert cache.apply(Event("port", "port", "k", Action.CREATE, 1, None, packed=blob))
    assert cache._tables["port"]["k"][2] is blob and ("port", "k") not in cache._decoded
    assert cache.get("port", "k").value == {"n": 1}
    assert cache.apply(Event("port", "port", "k", Action.UPDATE, 2, None, packed=BAD))
    with pytest.raises(BadValue):
        cache.get("port", "k")
    # Evicted without a tombstone: whatever version the store holds replaces it.
    assert cache.get("port", "k") is None and cache.version("port", "k") == 0
    assert bad == [("port", "port", "k")] and cache.bad_values == 1
    # The next replay reads it from the store, even if a bookmark moved the position past its write.
    assert ("port", "k") in cache.take_touched()
    cache.apply(Event("port", "port", "j", Action.CREATE, 3, None, packed=BAD))
    assert [o.key for o in cache.items()] == [] and cache.bad_values == 2


def test_tables_with_indexes_or_transforms_decode_once_as_applied_and_refuse_a_bad_value():
    bad: list[tuple] = []
    cache = VersionedCache(decoded_tables={"port"}, transforms={"network": lambda v: {"id": v["id"]}},
                           on_bad_value=lambda *a: bad.append(a[:3]))
    blob = msgpack.packb({"n": 1})
    assert cache.apply(Event("port", "port", "k", Action.CREATE, 1, None, packed=blob))
    assert cache._decoded[("port", "k")].value == {"n": 1} and cache._tables["port"]["k"][2] is blob
    assert cache.apply(Event("network", "network", "n", Action.CREATE, 1, None,
                             packed=msgpack.packb({"id": 1, "big": "x" * 100})))
    assert cache.get("network", "n").value == {"id": 1}
    cache.take_touched()
    assert not cache.apply(Event("port", "port", "k", Action.UPDATE, 2, None, packed=BAD))
    assert cache.get("port", "k").version == 1 and bad == [("port", "port", "k")]
    assert cache.take_touched() == {("port", "k")}


class Reader:
    """A reconciler that reads every key it is handed, and keeps every value it saw."""

    def __init__(self):
        self.seen = {}
        self.lock = threading.Lock()

    def reconcile(self, key, obj):
        with self.lock:
            self.seen.setdefault(key.key, []).append(None if obj is None else obj.value)


def test_a_controller_repairs_a_bad_value_from_the_store_and_no_reconciler_sees_it(sqlite_store):
    store = sqlite_store
    for i in range(20):
        store.create("port", f"p{i}", {"n": i})
    driver = bus()
    reader = Reader()
    ctrl = Controller(store, driver.subscriber(Stats("s", "c")), ["port"], reconcilers={"port": reader},
                      options=SubscriberOptions(message_delay_window=0.2),
                      runtime=ControllerOptions(decoded_cache=4, checkpoint_interval=0)).start()
    pub = Publisher(driver.publisher(Stats("p", "p")), "api", PublisherOptions(schema=2, batch_linger=0))
    try:
        assert ctrl.synced.wait(30)
        for i in range(20):
            obj = store.update("port", f"p{i}", {"n": i + 100})
            pub.publish("port", "port", f"p{i}", "update", obj.version, packed=msgpack.packb(obj.value))
        wait_for(lambda: all(reader.seen.get(f"p{i}", [None])[-1] == {"n": i + 100} for i in range(20)), 30)
        # The decoded window stays its size while a reconciler reads every key.
        assert len(ctrl.cache._decoded) <= 4
        # A forged envelope: p3 at a version above the store's, with a value that does not decode.
        driver.publisher(Stats("p", "f")).send("port", forged("port", 1, [("port", "p3", "update", 10**6, BAD)]))
        wait_for(lambda: ctrl.stats.get("bad_values") >= 1, 30)
        wait_for(lambda: ctrl.cache.live_version("port", "p3") == store.get("port", "p3").version, 30)
    finally:
        pub.close()
        ctrl.stop()
    assert ctrl.cache.get("port", "p3").value == {"n": 103}
    assert all(v is None or type(v) is dict for vs in reader.seen.values() for v in vs)
    assert reader.seen["p3"][-1] == {"n": 103}
    assert ctrl.stats.get("envelopes_schema2") >= 20


@pytest.mark.parametrize("value, reason", [
    (b"\xc1", "not_msgpack"),                       # not msgpack
    (msgpack.packb([1, 2]), "malformed"),             # not a map
    (b"\x81\xc0" + b"\x91" * 1021 + b"\xc0", "not_msgpack"),  # 1022 containers: too deep
    (b"\x82\xa1a\x01", "not_msgpack"),                # a map that ends early
    (msgpack.packb({"a": 1}) + b"\x01", "not_msgpack"),  # trailing bytes
])
def test_a_frame_whose_value_fails_the_check_at_receipt_is_refused_whole(sqlite_store, value, reason):
    store = sqlite_store
    obj = store.create("port", "p1", {"n": 1})
    driver = bus()
    reader = Reader()
    ctrl = Controller(store, driver.subscriber(Stats("s", "c")), ["port"], reconcilers={"port": reader},
                      options=SubscriberOptions(message_delay_window=0.2),
                      runtime=ControllerOptions(checkpoint_interval=0)).start()
    try:
        assert ctrl.synced.wait(30)
        good = msgpack.packb({"n": 2})
        send = driver.publisher(Stats("p", "f")).send
        # Two events: the bad value refuses the whole envelope, the good one with it.
        send("port", forged("port", 1, [("port", "p1", "update", obj.version + 5, good),
                                        ("port", "p2", "create", obj.version + 6, value)]))
        wait_for(lambda: ctrl.stats.get("decode_errors", reason=reason) == 1, 30)
        wait_for(lambda: ctrl.stats.get("resync_requests", reason="bad_event") == 1, 30)
        wait_for(lambda: ctrl.queue.wait_idle(0.1), 30)
    finally:
        ctrl.stop()
    assert ctrl.cache.get("port", "p1").version == obj.version and ctrl.cache.get("port", "p2") is None
    assert "p2" not in reader.seen and all(v == {"n": 1} for v in reader.seen["p1"])
    assert ctrl.stats.get("bad_values") == 0 and ctrl.stats.get("envelopes_schema2") == 1
