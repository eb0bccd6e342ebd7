"""The controller converges on the store, whatever the transport and the store go through."""

import itertools
import threading

import pytest

from dfpubsub import Publisher, PublisherOptions, SubscriberOptions, load_driver
from dfpubsub.controller import Controller
from dfpubsub.errors import StoreUnavailable, TransportError
from dfpubsub.events import Action, Event, VersionedObject
from dfpubsub.metrics import Stats
from dfpubsub.nbapi import NbApi
from dfpubsub.store import open_store
from dfpubsub.testing import LossyTransport, drop_every
from tests.conftest import wait_for
from tests.functional.controller_helpers import TABLES, Node
from tests.functional.store_helpers import backend_store

_prefix = itertools.count()


def make_pub(transport_wrap=None, url="zmq+tcp://127.0.0.1:*"):
    stats = Stats("p", "p")
    transport = load_driver(url).publisher(stats)
    if transport_wrap:
        transport = transport_wrap(transport)
    return Publisher(transport, "api", PublisherOptions(batch_linger=0.001, max_idle_time=0.3), stats)


def rebind(endpoint):
    """A new publisher on ``endpoint``, once ZeroMQ has released it (closing is asynchronous)."""
    made = []

    def attempt():
        try:
            made.append(make_pub(url=f"zmq+{endpoint}"))
        except TransportError:
            return False
        return True

    wait_for(attempt, what="the closed publisher's port to be free again")
    return made[0]


@pytest.fixture(params=["sqlite", "etcd", "redis"])
def store(request, tmp_path):
    s = backend_store(request, tmp_path, TABLES, "ctl")
    yield s
    s.close()


def churn(api, n, start=0):
    for i in range(start, start + n):
        table = TABLES[i % 2]
        key = f"{table}-{i % 17}"
        if api.get(table, key) is None:
            api.create(table, key, {"i": i})
        elif i % 5 == 0:
            api.delete(table, key)
        else:
            api.update(table, key, {"i": i})


def test_converges_after_dropped_events(store):
    pub = make_pub(lambda t: LossyTransport(t, drop_every(7)))
    node = Node(store, pub.transport.uri)
    assert node.ctrl.synced.wait(10)
    api = NbApi(store, pub)
    churn(api, 300)
    # A first-contact resync may already have listed every write: the gaps expire a little later.
    wait_for(lambda: node.ctrl.stats.get("resync_requests", "gap_expired") > 0, what="a gap to expire")
    wait_for(lambda: node.converged(store), timeout=20, what="convergence after loss")
    assert pub.transport.dropped > 0
    node.ctrl.stop()
    pub.close()


def test_converges_after_a_subscriber_and_a_publisher_restart(store):
    pub = make_pub()
    node = Node(store, pub.transport.uri)
    node.ctrl.synced.wait(10)
    api = NbApi(store, pub)
    churn(api, 100)
    wait_for(lambda: node.converged(store), what="first convergence")
    node.ctrl.stop()
    churn(api, 100, start=100)  # written while no subscriber runs
    node = Node(store, pub.transport.uri)  # a restarted controller: empty cache, full sync
    wait_for(lambda: node.converged(store), what="convergence after the subscriber restart")
    endpoint = pub.transport.uri
    pub.close()
    pub2 = rebind(endpoint)  # restarted on the same address with a new id
    churn(NbApi(store, pub2), 100, start=200)
    wait_for(lambda: node.converged(store), what="convergence after the publisher restart")
    node.ctrl.stop()
    pub2.close()


@pytest.mark.parametrize("backend", ["etcd", "redis"])
def test_converges_after_the_store_is_killed_and_restarted_under_load(backend, request, tmp_path):
    server = request.getfixturevalue(f"{backend}_server")
    store = open_store(server.url, TABLES, timeout=2.0)
    pub = make_pub(lambda t: LossyTransport(t, drop_every(11)))
    node = Node(store, pub.transport.uri)
    assert node.ctrl.synced.wait(10)
    api = NbApi(store, pub)
    stop = threading.Event()
    writes = {"ok": 0, "failed": 0}

    def writer():
        i = 0
        while not stop.is_set():
            try:
                churn(api, 1, start=i)
                writes["ok"] += 1
            except StoreUnavailable:
                writes["failed"] += 1
                stop.wait(0.05)
            i += 1

    t = threading.Thread(target=writer)
    t.start()
    wait_for(lambda: writes["ok"] > 100, what="load before the kill")
    server.kill()
    wait_for(lambda: writes["failed"] > 0, what="writes to fail while the store is down")
    server.start()
    ok_at_restart = writes["ok"]
    wait_for(lambda: writes["ok"] > ok_at_restart + 100, timeout=30, what="load after the restart")
    stop.set()
    t.join()
    wait_for(lambda: node.converged(store), timeout=30, what="convergence after the store restart")
    node.ctrl.stop()
    pub.close()
    store.close()


def test_handlers_see_changes_found_by_resync(tmp_path):
    store = open_store(f"sqlite:///{tmp_path}/nb.sqlite", TABLES)
    store.create("port", "before", 1)
    pub = make_pub()
    node = Node(store, pub.transport.uri)
    node.ctrl.synced.wait(10)
    assert set(node.mirrors["port"].objects) == {"before"}
    store.update("port", "before", 2)  # behind the pub/sub's back
    store.create("port", "sneaky", 3)
    node.ctrl.subscriber.request_resync(["port"])
    wait_for(lambda: node.converged(store))
    assert node.mirrors["port"].objects["before"].value == 2
    node.ctrl.stop()
    pub.close()
    store.close()


def test_periodic_reconcile_repairs_a_write_that_was_never_published(tmp_path):
    store = open_store(f"sqlite:///{tmp_path}/nb.sqlite", TABLES)
    pub = make_pub()
    ctrl = Controller(store, load_driver("zmq").subscriber(Stats("s", "s")), TABLES, {},
                      SubscriberOptions(message_delay_window=0.2), reconcile_interval=0.2)
    ctrl.connect(pub.transport.uri)
    ctrl.start()
    ctrl.synced.wait(10)
    store.create("network", "orphan", {"written": "but never published"})
    wait_for(lambda: ctrl.cache.get("network", "orphan") is not None, what="the periodic reconcile")
    assert isinstance(ctrl.cache.get("network", "orphan"), VersionedObject)
    ctrl.stop()
    pub.close()
    store.close()


def test_a_late_event_at_or_below_the_position_does_not_bring_back_a_deleted_object(store, tmp_path):
    """The model's counterexample (docs/model.md): a create's envelope arrives late, after a repair
    whose listing no longer held the object (deleted since; a listing leaves no tombstone for what
    it did not see). The cache is complete up to its position, so the late event is stale, not a
    resurrection."""
    ctrl = Controller(store, load_driver(f"memory://late-{next(_prefix)}").subscriber(Stats("s", "late")),
                      ["port"], options=SubscriberOptions(max_idle_time=0.5)).start()
    try:
        assert ctrl.subscriber.wait_synced(30)
        created = store.create("port", "gone", {"i": 1})  # neither write reaches the controller
        store.delete("port", "gone", created.version)
        store.create("port", "kept", {"i": 2})
        ctrl.subscriber.request_resync({"port"}, reason="manual")
        wait_for(lambda: ctrl.cache.get("port", "kept") is not None, what="the repair")
        assert ctrl.positions["port"] >= created.version
        stale = ctrl.stats.get("stale_events")
        ctrl._on_events([Event("port", "port", "gone", Action.CREATE, created.version, {"i": 1},
                               publisher_id="api", seq=1)])
        assert ctrl.cache.get("port", "gone") is None
        assert ctrl.stats.get("stale_events") == stale + 1
    finally:
        ctrl.stop()
