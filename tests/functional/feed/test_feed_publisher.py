"""df-feed's publisher: every committed write reaches every controller, whoever wrote it and
whatever happened between the commit and the publish."""

import itertools
import json
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from dfpubsub import Publisher, PublisherOptions, SubscriberOptions, load_driver
from dfpubsub.config import load_settings
from dfpubsub.controller import Controller
from dfpubsub.errors import StoreUnavailable, WriteOutcomeUnknown
from dfpubsub.metrics import Stats
from dfpubsub.nbapi import NbApi
from dfpubsub.store import FeedRetention, open_store
from tests.conftest import free_port, wait_for
from tests.functional.controller_helpers import TABLES, Node
from tests.functional.df_db_helpers import base_env, ok
from tests.functional.feed.cut_proxy import CutProxy
from tests.functional.feed.feed_helpers import FeedThread

WRITER = Path(__file__).with_name("feed_writer.py")
_prefix = itertools.count()


@pytest.fixture(params=["sqlite", "etcd", "redis"])
def where(request, tmp_path):
    """(url, prefix) of a fresh store location on each backend."""
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path}/nb.sqlite", ""
    server = request.getfixturevalue(f"shared_{request.param}")
    return server.url, f"fp{next(_prefix)}-{tmp_path.name}"


def _open(where, **options):
    url, prefix = where
    return open_store(url, TABLES, **({"prefix": prefix} if prefix else {}), **options)


def _converge(node, store, what):
    wait_for(lambda: node.converged(store), timeout=20, what=what)


def test_writes_with_no_publisher_reach_controllers(where):
    """Raw store calls (a controller registering itself, a tool) are published by the feed alone."""
    store, writer = _open(where), _open(where)
    feed = FeedThread(store)
    node = Node(store, feed.endpoint)
    try:
        # The feed publisher starts with no position: its hello makes the controller resync once.
        wait_for(lambda: node.ctrl.stats.get("hellos_in") and node.ctrl.stats.get("resync_requests"),
                 what="the controller to hear the feed publisher")
        _converge(node, store, "the first sync")
        resyncs = node.ctrl.stats.get("resync_requests")
        for i in range(30):
            writer.create(TABLES[i % 2], f"k{i}", {"i": i})
        for i in range(0, 30, 3):
            writer.update(TABLES[i % 2], f"k{i}", {"i": -i})
        for i in range(0, 30, 5):
            writer.delete(TABLES[i % 2], f"k{i}")
        _converge(node, store, "raw writes to reach the controller")
        assert node.ctrl.stats.get("resync_requests") == resyncs, "converged by resync, not by the feed's events"
        assert feed.stats.get("feed_published") > 0
    finally:
        node.ctrl.stop()
        feed.close()
        store.close()
        writer.close()


def test_a_subscriber_cut_off_while_a_publisher_writes_and_exits_converges(tmp_path):
    """The deterministic partition: cut off 4 s, 5 writes, the writer closes, the link comes back."""
    url = f"sqlite:///{tmp_path}/nb.sqlite"
    store = open_store(url, TABLES)
    feed = FeedThread(store)
    stats = Stats("p", "api")
    direct = load_driver("zmq+tcp://127.0.0.1:*").publisher(stats)
    api = NbApi(open_store(url, TABLES), Publisher(direct, "api", PublisherOptions(batch_linger=0.001,
                                                                                   max_idle_time=0.3), stats))
    node = Node(store, feed.endpoint)
    node.ctrl.connect(direct.uri)
    try:
        for i in range(5):
            api.create("port", f"before{i}", {"i": i})
        _converge(node, store, "the first five objects")
        # The feed may have brought those: the controller must know the writer's stream to lose it.
        writer = api.publisher.id
        wait_for(lambda: "port" in getattr(node.ctrl.subscriber.tracker.peers.get(writer), "streams", ()),
                 timeout=30, what="the controller to hear from the writer on 'port'")
        node.ctrl.subscriber.disconnect(direct.uri)  # cut off from the writer, not from df-feed
        cut = time.monotonic()
        # The writer falls silent; once declared dead (and resynced from) it is forgotten: before
        # the feed, what it wrote from then on was never seen.
        sub = node.ctrl.subscriber
        wait_for(lambda: sub.stats.get("resync_requests", "publisher_lost") and not sub.scheduler.pending(),
                 timeout=30, what="the controller to declare the writer dead and resync")
        for i in range(5):
            api.create("port", f"during{i}", {"i": i})
        api.close()
        time.sleep(max(0.0, 4 - (time.monotonic() - cut)))  # the partition lasts 4 s: the scenario itself
        node.ctrl.connect(direct.uri)  # the link is back; the writer is gone for good
        _converge(node, store, "the writes made during the partition")
        assert len(store.list()) == 10
    finally:
        node.ctrl.stop()
        feed.close()
        store.close()


def test_a_restarted_feed_publisher_resumes_from_its_cursor(tmp_path):
    url, cursor = f"sqlite:///{tmp_path}/nb.sqlite", str(tmp_path / "feed.cursor")
    store = open_store(url, TABLES)
    first = FeedThread(store, cursor, "feed-1")
    node = Node(store, first.endpoint)
    try:
        for i in range(10):
            store.create("port", f"a{i}", {"i": i})
        _converge(node, store, "the first writes")
        first.close()
        for i in range(10):
            store.update("port", f"a{i}", {"i": 100 + i})
        store.create("network", "n", {})
        second = FeedThread(store, cursor, "feed-2")
        node.ctrl.connect(second.endpoint)
        _converge(node, store, "the writes made while no feed publisher ran")
        assert second.stats.get("feed_declared_lost") == 0, "resumed from its cursor, not from nothing"
        assert second.stats.get("feed_published") == 11
        second.close()
    finally:
        node.ctrl.stop()
        store.close()


def test_history_compacted_below_the_cursor_makes_subscribers_resync(tmp_path):
    url, cursor = f"sqlite:///{tmp_path}/nb.sqlite", str(tmp_path / "feed.cursor")
    store = open_store(url, TABLES, feed_retention=FeedRetention(max_entries=100))
    first = FeedThread(store, cursor, "feed-1")
    node = Node(store, first.endpoint)
    try:
        store.create("port", "k", {"i": 0})
        _converge(node, store, "the first write")
        first.close()
        for i in range(1, 700):
            store.update("port", "k", {"i": i})
        second = FeedThread(store, cursor, "feed-2")
        node.ctrl.connect(second.endpoint)
        _converge(node, store, "the resync the lost history calls for")
        assert second.stats.get("feed_history_gone") == 1
        assert second.stats.get("feed_declared_lost") == 1
        second.close()
    finally:
        node.ctrl.stop()
        store.close()


class Recorder:
    """Records every version each key's handlers see, in order."""

    def __init__(self):
        self.seen = {}

    def on_create(self, obj):
        self.seen.setdefault(obj.key, []).append(obj.version)

    def on_update(self, obj, previous):
        self.seen.setdefault(obj.key, []).append(obj.version)

    def on_delete(self, previous):
        self.seen.setdefault(previous.key, []).append(-1)


def test_two_feed_publishers_and_concurrent_writer_processes_keep_per_key_order(where):
    store = _open(where)
    feeds = [FeedThread(store, name="feed-a"), FeedThread(store, name="feed-b")]
    recorder = Recorder()
    ctrl = Controller(store, load_driver("zmq").subscriber(Stats("s", "s")), TABLES, {"port": recorder},
                      SubscriberOptions(message_delay_window=0.2, max_idle_time=0.5))
    for f in feeds:
        ctrl.connect(f.endpoint)
    ctrl.start()
    try:
        ctrl.synced.wait(10)
        url, prefix = where
        procs = [subprocess.Popen([sys.executable, str(WRITER), "cas", url, prefix or "-", "5", "60"],
                                  stdout=subprocess.PIPE, text=True) for _ in range(3)]
        written = [json.loads(p.communicate(timeout=120)[0]) for p in procs]
        assert all(p.returncode == 0 for p in procs)
        final = {o.key: o.version for o in store.list("port")}
        assert sum(len(w) for w in written) == 180 and sum(o.value["n"] for o in store.list("port")) == 180
        wait_for(lambda: {o.key: o.version for o in ctrl.cache.items()} == final, timeout=20,
                 what="the controller to see every counter's last version")
        for key, versions in recorder.seen.items():
            assert versions == sorted(set(versions)), f"{key}: versions out of order or repeated: {versions}"
            assert versions[-1] == final[key]
        assert all(f.stats.get("feed_published") > 0 for f in feeds)
    finally:
        ctrl.stop()
        for f in feeds:
            f.close()
        store.close()


def test_a_writer_killed_between_commit_and_publish_is_published_by_the_feed(where):
    store = _open(where)
    feed = FeedThread(store)
    node = Node(store, feed.endpoint)
    try:
        node.ctrl.synced.wait(10)
        url, prefix = where
        proc = subprocess.run([sys.executable, str(WRITER), "kill", url, prefix or "-", "doomed"], timeout=60,
                              capture_output=True, text=True)
        assert proc.returncode == -signal.SIGKILL, proc.stderr
        committed = store.get("port", "doomed")
        assert committed is not None and committed.value == {"from": "doomed"}
        _converge(node, store, "the dead writer's committed write")
        assert node.ctrl.cache.get("port", "doomed").version == committed.version
    finally:
        node.ctrl.stop()
        feed.close()
        store.close()


def test_a_feed_publisher_killed_mid_stream_and_restarted_loses_nothing(tmp_path):
    """df-feed itself killed -9 while writes stream in, restarted on the same cursor."""
    url, cursor = f"sqlite:///{tmp_path}/nb.sqlite", tmp_path / "feed.cursor"
    store = open_store(url, TABLES)
    config = tmp_path / "feed.toml"

    def start(port):
        config.write_text(f'[store]\nurl = "{url}"\ntables = {json.dumps(TABLES)}\n'
                          f'[pubsub]\ndriver = "zmq+tcp://127.0.0.1:{port}"\nmax_idle_time = 0.3\n'
                          f'[feed]\ncursor = "{cursor}"\nannounce = false\n')
        return subprocess.Popen([sys.executable, "-m", "dfpubsub.services.feed", "--config", str(config)],
                                stderr=subprocess.DEVNULL)

    ports = [free_port(), free_port()]
    proc = start(ports[0])
    node = Node(store, f"tcp://127.0.0.1:{ports[0]}")
    node.ctrl.connect(f"tcp://127.0.0.1:{ports[1]}")
    stop = threading.Event()

    def churn():
        i = 0
        while not stop.is_set():
            key = f"k{i % 40}"
            if store.get("port", key) is None:
                store.create("port", key, {"i": i})
            else:
                store.update("port", key, {"i": i})
            i += 1
            time.sleep(0.001)

    writer = threading.Thread(target=churn)
    writer.start()
    try:
        wait_for(lambda: cursor.exists(), timeout=20, what="df-feed to save its first position")
        proc.send_signal(signal.SIGKILL)
        proc.wait(10)
        time.sleep(0.3)  # writes land while no df-feed runs
        proc = start(ports[1])
        time.sleep(0.5)
        stop.set()
        writer.join()
        _converge(node, store, "every write, across the kill")
    finally:
        stop.set()
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(10) == 0
        node.ctrl.stop()
        store.close()


@pytest.mark.parametrize("backend", ["etcd", "redis"])
def test_a_server_killed_after_committing_an_unanswered_write_is_settled_by_the_feed(backend, request, tmp_path):
    """The server commits, dies before answering: the writer gets WriteOutcomeUnknown, and the
    write still reaches the controller once the server is back."""
    server = request.getfixturevalue(f"{backend}_server")
    proxy = CutProxy(server.port)
    scheme = "etcd" if backend == "etcd" else "redis"
    writer_url = f"{scheme}://127.0.0.1:{proxy.port}" + ("" if backend == "etcd" else "/0")
    store = open_store(server.url, TABLES)
    writer = open_store(writer_url, TABLES, timeout=3.0)
    feed = FeedThread(store)
    node = Node(store, feed.endpoint)
    warm, go = threading.Event(), threading.Event()
    outcome = []

    def write():
        # The writing thread's connection and the scripts ready (a Redis store's thread keeps its
        # own connection): only the write is in flight while the proxy holds the answers.
        writer.create("port", "warm", {})
        warm.set()
        go.wait()
        try:
            outcome.append(writer.create("port", "ambiguous", {"v": 1}))
        except Exception as exc:  # noqa: BLE001 - the test asserts its type below
            outcome.append(exc)

    thread = threading.Thread(target=write)
    try:
        thread.start()
        assert warm.wait(10)
        _converge(node, store, "the first write")
        proxy.holding = True
        go.set()
        wait_for(lambda: store.get("port", "ambiguous") is not None, what="the server to commit the write")
        server.kill()
        proxy.cut()
        thread.join(10)
        assert isinstance(outcome[0], WriteOutcomeUnknown) and isinstance(outcome[0], StoreUnavailable), outcome
        server.restart()
        proxy.holding = False
        committed = wait_value(lambda: store.get("port", "ambiguous"))
        assert committed.value == {"v": 1}
        _converge(node, store, "the unanswered write, once the server is back")
    finally:
        go.set()  # a test that failed before its write must not leave the thread waiting
        node.ctrl.stop()
        feed.close()
        for s in (store, writer):
            s.close()
        proxy.close()


def wait_value(read):
    got = []

    def attempt():
        try:
            got.append(read())
        except StoreUnavailable:
            return False
        return got[-1] is not None

    wait_for(attempt, timeout=20, what="the store to answer")
    return got[-1]


def test_df_db_writes_with_publishing_off_reach_controllers(tmp_path):
    url = f"sqlite:///{tmp_path}/nb.sqlite"
    store = open_store(url, TABLES)
    feed = FeedThread(store)
    node = Node(store, feed.endpoint)
    try:
        env = base_env()
        ok(env, "--store", url, "add", "port", '{"key": "quiet", "value": 1}', "--no-publish")
        ok(env, "--store", url, "update", "port", '{"key": "quiet", "value": 2}', "--no-publish")
        _converge(node, store, "df-db's unpublished writes")
        assert node.ctrl.cache.get("port", "quiet").value == 2
    finally:
        node.ctrl.stop()
        feed.close()
        store.close()


@pytest.mark.parametrize("mode,publishes", [("direct", True), ("feed", False), ("both", True)])
def test_nbapi_publish_modes(mode, publishes, tmp_path):
    settings = load_settings(None, {"store": {"url": f"sqlite:///{tmp_path}/nb.sqlite", "tables": TABLES},
                                    "pubsub": {"driver": "memory"}, "nbapi": {"publish": mode},
                                    "feed": {"max_entries": 500}})
    with NbApi.from_settings(settings) as api:
        assert (api.publisher is not None) is publishes
        assert api.store.feed_retention.max_entries == 500
        head = api.store.feed_head()
        api.create("port", "p", {})
        assert [e.key for e in api.store.read_feed(head)] == ["p"]  # the feed has it in every mode
    assert load_settings().nbapi.publish == "both"
