"""Two controllers on a table of a few thousand objects, an API publishing through a lossy transport,
and what their repairs cost: counted by the controllers, by a counting wrapper around each one's
own store handle, and by the store's server (tests/functional/controller/test_replay.py,
tests/chaos/test_replay_chaos.py)."""

from __future__ import annotations

import queue
import re
import socket
import threading
import time
import urllib.request
from collections import Counter
from concurrent.futures import ThreadPoolExecutor

from dfpubsub import Publisher, PublisherOptions, SubscriberOptions, load_driver
from dfpubsub.controller import Controller, ControllerOptions
from dfpubsub.metrics import Stats
from dfpubsub.nbapi import NbApi
from dfpubsub.store import open_store
from dfpubsub.testing import LossyTransport
from tests.conftest import wait_for
from tests.functional.controller_helpers import TABLES, Mirror, Node, Seen

#: Objects of the "port" table the controllers hold (and 20 of "network").
N = 3000
PAD = "x" * 64


# -- the stores -----------------------------------------------------------------------------------


class Backend:
    """A private store location: opens handles on it, and reads its server's own counters."""

    def __init__(self, name, url, server=None):
        self.name, self.url, self.server = name, url, server

    @classmethod
    def of(cls, request, tmp_path):
        """The backend a fixture parametrized over sqlite, redis and etcd asks for: a file, or a
        private server of the test's own (its counters and compactions are the test's alone)."""
        if request.param == "sqlite":
            return cls("sqlite", f"sqlite:///{tmp_path}/nb.sqlite")
        server = request.getfixturevalue(f"{request.param}_server")
        return cls(request.param, server.url, server)

    def open(self, **options):
        return open_store(self.url, TABLES, **options)

    def server_counters(self) -> dict[str, int]:
        """What the server sent its clients so far (bytes; Redis also commands); {} for SQLite."""
        if self.name == "redis":
            import redis

            r = redis.Redis(host=self.server.host, port=self.server.port)
            try:
                info = r.info("stats")
            finally:
                r.close()
            return {"bytes": int(info["total_net_output_bytes"]), "commands": int(info["total_commands_processed"])}
        if self.name == "etcd":
            with urllib.request.urlopen(f"http://{self.server.host}:{self.server.port}/metrics", timeout=5) as r:
                text = r.read().decode()
            sent = re.search(r"^etcd_network_client_grpc_sent_bytes_total (\S+)$", text, re.M)
            assert sent is not None, "etcd's /metrics has no etcd_network_client_grpc_sent_bytes_total"
            return {"bytes": int(float(sent.group(1)))}
        return {}

    def compact_history(self, store, keep: int = 5) -> None:
        """Drop the feed's history but for the last ``keep`` revisions: SQLite and Redis trim their
        feed (``compact_feed`` with the store's retention), etcd compacts its own history."""
        if self.name == "etcd":
            import grpc
            from aetcd import rpc

            channel = grpc.insecure_channel(f"{self.server.host}:{self.server.port}")
            try:
                rpc.KVStub(channel).Compact(rpc.CompactionRequest(revision=store.feed_head() - keep, physical=True),
                                            timeout=10)
            finally:
                channel.close()
        else:
            store.compact_feed()


class Counted:
    """Counts the objects each read of a real store handle returns (its methods wrapped in place,
    the store itself untouched): what a controller reading through it cost the store."""

    READS = ("get", "get_many", "list", "list_topics", "list_versions", "list_at", "list_packed_at",
             "list_packed_tables_at", "list_versions_at")

    def __init__(self, store):
        self.store = store
        self.rows: Counter[str] = Counter()
        self.calls: Counter[str] = Counter()
        self._lock = threading.Lock()
        for name in self.READS:
            setattr(store, name, self._counting(name, getattr(store, name)))

    def _counting(self, name, real):
        def call(*args, **kwargs):
            out = real(*args, **kwargs)
            if name == "get":
                n = int(out is not None)
            elif name in ("list_at", "list_packed_at", "list_versions_at"):
                n = len(out[0])
            elif name == "list_packed_tables_at":
                n = sum(len(part.keys) for part in out[0])
            else:
                n = len(out)
            with self._lock:
                self.rows[name] += n
                self.calls[name] += 1
            return out

        return call

    def total(self) -> int:
        with self._lock:
            return sum(self.rows.values())


def populate(store, n=N, networks=20):
    """The table, written straight to the store (before any controller runs: nothing to publish)."""
    with ThreadPoolExecutor(8) as pool:
        list(pool.map(lambda i: store.create("port", f"k{i}", {"i": i, "pad": PAD}), range(n)))
        list(pool.map(lambda i: store.create("network", f"n{i}", {"i": i}), range(networks)))


def state(objects):
    """What a cache must equal: (table, key, version, value) of every object."""
    return {(o.table, o.key, o.version, repr(o.value)) for o in objects}


class SlowAnswers:
    """A TCP proxy on loopback in front of ``port``. The connections it accepts while ``armed`` get
    the server's answers ``delay`` seconds late, in order, all but the first (the protocol's
    greeting, so that the client connects): a server slow to answer, as a loaded etcd is in
    delivering a watch's history."""

    def __init__(self, port: int, delay: float):
        self.target, self.delay = port, delay
        self.armed = False
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port = self._listener.getsockname()[1]
        self._conns: list[socket.socket] = []
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self._listener.accept()
                server = socket.create_connection(("127.0.0.1", self.target))
            except OSError:
                return
            self._conns += [client, server]
            delay = self.delay if self.armed else 0.0
            for src, dst, late in ((client, server, 0.0), (server, client, delay)):
                pending: queue.Queue = queue.Queue()
                threading.Thread(target=self._read, args=(src, pending, late), daemon=True).start()
                threading.Thread(target=self._write, args=(dst, pending), daemon=True).start()

    @staticmethod
    def _read(src: socket.socket, pending: queue.Queue, delay: float) -> None:
        first = True
        try:
            while data := src.recv(65536):
                pending.put((time.monotonic() + (0.0 if first else delay), data))
                first = False
        except OSError:
            pass
        pending.put((time.monotonic() + delay, b""))

    @staticmethod
    def _write(dst: socket.socket, pending: queue.Queue) -> None:
        while True:
            due, data = pending.get()
            time.sleep(max(0.0, due - time.monotonic()))  # the server's slowness itself
            try:
                if not data:
                    dst.shutdown(socket.SHUT_WR)
                    return
                dst.sendall(data)
            except OSError:
                return

    def close(self) -> None:
        self._listener.close()
        for s in self._conns:
            try:
                s.close()
            except OSError:
                pass


# -- the controllers ------------------------------------------------------------------------------


class Drop:
    """A LossyTransport rule: drops the next ``pending`` envelopes of ``topic``."""

    def __init__(self, topic="port"):
        self.topic = topic
        self.pending = 0
        self.lock = threading.Lock()

    def __call__(self, topic, n):
        with self.lock:
            if topic != self.topic or self.pending <= 0:
                return False
            self.pending -= 1
            return True


class ReplayNode(Node):
    """``Node`` (mirrors, a reconciler, ``converged``) with runtime options and a store handle of
    its own, counted."""

    def __init__(self, store, endpoints, name, runtime=None, topics=TABLES, transport=None):
        self.mirrors = {"port": Mirror()}
        self.seen = Seen()
        self.gaps = []
        self.reads = Counted(store)
        self.store = store
        self.ctrl = Controller(store, transport or load_driver("zmq").subscriber(Stats("s", name)), topics,
                               self.mirrors, SubscriberOptions(message_delay_window=0.2, max_idle_time=0.5),
                               name=name, on_gap=self.gaps.append, reconcilers={"network": self.seen},
                               runtime=runtime or ControllerOptions(workers=2))
        for ep in endpoints:
            self.ctrl.connect(ep)
        self.ctrl.start()

    def stat(self, counter, reason=None):
        return self.ctrl.stats.get(counter, reason)

    def relists(self):
        return self.ctrl.stats.by_reason("relists")

    def close(self):
        self.ctrl.stop()
        self.store.close()


def replay_always():
    """Runtime options under which a repair replays however long the feed since the position (the
    threshold where a relist reads less is tested apart): for tests of what a replay reads."""
    return ControllerOptions(workers=2, replay_max_ratio=1000.0)


def start_nodes(backend, endpoints, runtimes=(None, None), topics=TABLES, **store_options):
    """Controllers (one per ``runtimes``), each on a store handle of its own, synced and hearing
    every publisher at ``endpoints`` (its hello): from then on a lost envelope is a gap, never a
    first contact."""
    if backend.name != "sqlite":
        store_options.setdefault("timeout", 5.0)
    nodes = [ReplayNode(backend.open(**store_options), endpoints, f"ctl{i}", rt, topics)
             for i, rt in enumerate(runtimes)]
    for node in nodes:
        assert node.ctrl.synced.wait(30), f"{node.ctrl.name} never synced"
    wait_for(lambda: all(len(n.ctrl.subscriber.tracker.peers) >= len(endpoints) for n in nodes),
             what="the controllers to hear every publisher")
    return nodes


def wait_converged(nodes, store, timeout=30, what="every cache to equal the store"):
    """Every controller's cache, handlers and reconcilers equal to ``store``, (table, key, version, value)."""
    for node in nodes:
        wait_for(lambda: node.converged(store), timeout=timeout, what=f"{node.ctrl.name}: {what}")
        assert state(node.ctrl.cache.items()) == state(store.list())


class Cluster:
    """A table of N objects in ``backend``, an API publishing through a LossyTransport that drops
    what ``self.drop`` says, and two controllers synced on the table and hearing the publisher."""

    def __init__(self, backend, runtimes=(None, None), store_options=None, topics=TABLES, populate_table=True,
                 node_store_options=None, node_backend=None):
        self.backend = backend
        self.store = backend.open(**(store_options or {}))  # the API's, and the truth tests compare with
        if populate_table:
            populate(self.store)
        self.drop = Drop()
        stats = Stats("p", "api")
        transport = LossyTransport(load_driver("zmq+tcp://127.0.0.1:*").publisher(stats), self.drop)
        self.pub = Publisher(transport, "api", PublisherOptions(batch_linger=0.001, max_idle_time=0.3), stats)
        self.api = NbApi(self.store, self.pub)
        self.before_sync = backend.server_counters()
        self.nodes = start_nodes(node_backend or backend, [transport.uri], runtimes, topics,
                                 **(node_store_options or {}))
        self.after_sync = backend.server_counters()

    def write(self, fn, *args, lose=False):
        """One write through the API, in an envelope of its own (lost if ``lose``)."""
        if lose:
            with self.drop.lock:
                self.drop.pending += 1
        obj = fn(*args)
        self.pub.flush()
        return obj

    def wait_converged(self, timeout=30, what="every cache to equal the store"):
        wait_converged(self.nodes, self.store, timeout, what)

    def close(self):
        for node in self.nodes:
            node.close()
        self.pub.close()
        self.store.close()


def holds(node, expected):
    """Whether ``node``'s cache holds each (table, key) at the version given (None: absent); reads no store."""
    for (table, key), version in expected.items():
        obj = node.ctrl.cache.get(table, key)
        if (None if obj is None else obj.version) != version:
            return False
    return True
