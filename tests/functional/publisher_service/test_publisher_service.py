"""df-publisher-service with forked API workers, on real ZeroMQ sockets and a real store."""

import os
import signal
import stat
import time
from collections import defaultdict

import pytest
import zmq

from dfpubsub.codec import encode_hello
from dfpubsub.discovery import DiscoveryConnector, open_discovery
from dfpubsub.events import Hello
from dfpubsub.factory import create_publisher
from dfpubsub.multiproc import WorkerPublisher
from dfpubsub.nbapi import NbApi
from dfpubsub.store import open_store
from tests.conftest import free_port, undetected, wait_for
from tests.functional.controller_helpers import TABLES, Node
from tests.functional.publisher_service.service_helpers import PUBSUB, Service, fork, reap, worker_settings
from tests.functional.zmq_helpers import Sink, raw_envelope

NO_ANNOUNCE = ("--publisher_service.announce", "false")


def _paths(tmp_path):
    return free_port(), str(tmp_path / "run" / "publisher.sock")


def _probe_until_seen(wp, sinks):
    """Publish probes until every sink has one: subscriptions reached the service."""
    n = iter(range(1, 1_000_000))

    def seen():
        wp.publish("probe", "probe", "p", "create", next(n), {})  # a map: what schema 2 carries
        return all(s.keys("probe") for s in sinks)

    wait_for(seen, what="the subscribers' subscriptions to reach the service")


@pytest.mark.parametrize("schema", [1, 2])
def test_forked_workers_reach_two_subscribers_exactly_once_in_worker_order(tmp_path, schema):
    """In either wire schema: the service relays schema 2 envelopes as it relays schema 1's."""
    port, sock = _paths(tmp_path)
    svc = Service(port, sock, *NO_ANNOUNCE).start()
    sinks = [Sink(["port", "probe"], [svc.uri]) for _ in range(2)]
    settings = worker_settings(port, sock)
    settings.pubsub.schema_version = schema
    # Made in the parent before forking, with its thread running, as a preloading master does.
    wp = create_publisher(settings)
    assert isinstance(wp, WorkerPublisher)
    try:
        for s in sinks:
            s.sub.start()
        _probe_until_seen(wp, sinks)
        workers, per_worker = 4, 5000

        def work(i):
            for k in range(per_worker):
                wp.publish("port", "port", f"{i}:{k}", "create", k + 1, {"w": i})
            wp.close()

        pids = [fork(lambda i=i: work(i)) for i in range(workers)]
        assert [reap(p) for p in pids] == [0] * workers
        for s in sinks:
            wait_for(lambda s=s: len(s.keys("port")) >= workers * per_worker, timeout=30,
                     what="every worker's events")
        for s in sinks:
            by_pub = defaultdict(list)
            with s.lock:
                for e in s.events:
                    if e.topic == "port":
                        by_pub[e.publisher_id].append((e.seq, e.key))
            assert len(by_pub) == workers and wp.id not in by_pub
            for items in by_pub.values():
                assert [seq for seq, _ in items] == list(range(1, per_worker + 1))
                w = items[0][1].split(":")[0]
                assert [key for _, key in items] == [f"{w}:{k}" for k in range(per_worker)]
            assert [g for g in s.gaps if g.topic == "port"] == []
            assert all(e.value == {"w": int(e.key.split(":")[0])} for e in s.events if e.topic == "port")
            assert s.stats.get(f"envelopes_schema{schema}") > 0 and s.stats.get(f"envelopes_schema{3 - schema}") == 0
    finally:
        wp.close()
        for s in sinks:
            s.sub.close()
        svc.kill()


def _writer(wp, db, i, stop_file, keys=20):
    """A forked API worker writing through NbApi until ``stop_file`` appears."""
    def run():
        api = NbApi(open_store(db, TABLES), wp)  # the store is opened after the fork
        for k in range(keys):
            api.create("port", f"w{i}-{k}", {"n": 0})
        n = 0
        while not os.path.exists(stop_file):
            n += 1
            key = f"w{i}-{n % keys}"
            if n % 50 == 0:
                api.delete("port", key)
                api.create("port", key, {"n": n})
            else:
                api.update("port", key, {"n": n})
        api.close()
    return run


def _events_from_all(nodes, count):
    return all(n.ctrl.stats.get("events_in") >= count for n in nodes)


def test_worker_killed_mid_stream_is_found_dead_and_caches_converge(tmp_path):
    port, sock = _paths(tmp_path)
    db = f"sqlite:///{tmp_path}/nb.sqlite"
    store = open_store(db, TABLES)
    svc = Service(port, sock, *NO_ANNOUNCE).start()
    nodes = [Node(store, svc.uri) for _ in range(2)]
    wp = create_publisher(worker_settings(port, sock))
    stop = str(tmp_path / "stop")
    pids = []
    try:
        for n in nodes:
            wait_for(n.ctrl.synced.is_set, what="initial sync")
        pids = [fork(_writer(wp, db, i, stop)) for i in range(3)]
        wait_for(lambda: _events_from_all(nodes, 300), timeout=30, what="events from the workers")
        os.kill(pids[0], signal.SIGKILL)
        assert reap(pids[0]) == -signal.SIGKILL
        wait_for(lambda: all(any(g.reason == "publisher_lost" for g in n.gaps) for n in nodes), timeout=20,
                 what="the killed worker to be declared dead")
        open(stop, "w").close()
        assert [reap(p) for p in pids[1:]] == [0, 0]
        for n in nodes:
            wait_for(lambda n=n: n.converged(store), timeout=20, what="the caches to converge")
    finally:
        open(stop, "w").close()
        for n in nodes:
            n.ctrl.stop()
        wp.close()
        svc.kill()
        store.close()


def test_service_killed_and_restarted_under_load_loses_nothing_undetected(tmp_path):
    port, sock = _paths(tmp_path)
    db = f"sqlite:///{tmp_path}/nb.sqlite"
    store = open_store(db, TABLES)
    svc = Service(port, sock, *NO_ANNOUNCE).start()
    nodes = [Node(store, svc.uri) for _ in range(2)]
    sink = Sink(["port"], [svc.uri])
    wp = create_publisher(worker_settings(port, sock))
    stop = str(tmp_path / "stop")
    try:
        sink.sub.start()
        for n in nodes:
            wait_for(n.ctrl.synced.is_set, what="initial sync")
        pids = [fork(_writer(wp, db, i, stop)) for i in range(3)]
        wait_for(lambda: _events_from_all(nodes, 500), timeout=30, what="events from the workers")
        svc.kill()
        assert os.path.exists(sock), "a killed service leaves its socket file behind"
        before = sink.stats.get("events_in")
        svc.start()  # the stale socket file is cleared, the same port bound again
        wait_for(lambda: sink.stats.get("events_in") > before + 500, timeout=30,
                 what="events through the restarted service")
        open(stop, "w").close()
        assert [reap(p) for p in pids] == [0, 0, 0]
        for n in nodes:
            wait_for(lambda n=n: n.converged(store), timeout=20, what="the caches to converge")
        # Every worker closed cleanly: its bye gave the last sequence; whatever did not
        # arrive lies inside a hole the sink reported.
        last = {}
        with sink.lock:
            delivered = defaultdict(list)
            for e in sink.events:
                delivered[e.publisher_id].append(e.seq)
        for g in sink.gaps:
            if g.missing:
                last[g.publisher_id] = max(last.get(g.publisher_id, 0), g.missing[1])
        assert len(delivered) == 3
        for pid, seqs in delivered.items():
            holes = [g.missing for g in sink.gaps if g.publisher_id == pid]
            top = max(max(seqs), last.get(pid, 0))
            assert undetected(seqs, holes, top) == []
    finally:
        open(stop, "w").close()
        for n in nodes:
            n.ctrl.stop()
        sink.sub.close()
        wp.close()
        svc.kill()
        store.close()


def test_service_is_found_through_discovery_and_vanishes_when_killed(tmp_path, etcd_server):
    port, sock = _paths(tmp_path)
    url = f"etcd://127.0.0.1:{etcd_server.port}"
    svc = Service(port, sock, "--discovery.url", url, "--discovery.ttl", "2", "--discovery.renew-interval", "0.5",
                  "--pubsub.publisher-name", "api-host-1").start()
    discovery = open_discovery(url, ttl=2, renew_interval=0.5)
    sink = Sink(["port"])
    connector = DiscoveryConnector(discovery, sink.sub)
    wp = create_publisher(worker_settings(port, sock))
    try:
        wait_for(lambda: [r for r in discovery.list() if r.name == "api-host-1"], what="the service's row")
        (row,) = [r for r in discovery.list() if r.name == "api-host-1"]
        assert row.uris == [svc.uri] and row.pid == svc.proc.pid
        sink.sub.start()
        wait_for(lambda: svc.uri in connector.connected, what="the connector to connect")
        n = iter(range(1, 1_000_000))
        wait_for(lambda: wp.publish("port", "port", "k", "update", next(n)) and sink.keys("port"),
                 what="an event found through discovery")
        svc.kill()
        wait_for(lambda: not [r for r in discovery.list() if r.name == "api-host-1"], timeout=10,
                 what="the lease to expire")
        wait_for(lambda: svc.uri not in connector.connected, what="the connector to disconnect")
    finally:
        connector.close()
        sink.sub.close()
        wp.close()
        discovery.close()
        svc.kill()


def test_sigterm_drains_unregisters_and_removes_the_socket(tmp_path):
    port, sock = _paths(tmp_path)
    url = f"sqlite:///{tmp_path}/discovery.sqlite"
    discovery = open_discovery(url, ttl=10, renew_interval=3)  # made first: the service does not create it
    svc = Service(port, sock, "--discovery.url", url, "--pubsub.publisher-name", "svc").start()
    sink = Sink(["port", "probe"], [svc.uri])
    wp = create_publisher(worker_settings(port, sock))
    try:
        sink.sub.start()
        _probe_until_seen(wp, [sink])
        for k in range(2000):
            wp.publish("port", "port", f"k{k}", "create", k + 1)
        wp.flush()
        assert svc.terminate() == 0
        assert not os.path.exists(sock)
        assert not [r for r in discovery.list() if r.name == "svc"], "unregistered at once, not at lease expiry"
        assert svc.logged("publisher service stopping")
        wait_for(lambda: len(sink.keys("port")) == 2000, what="the drained events")
    finally:
        sink.sub.close()
        wp.close()
        discovery.close()
        svc.kill()


def test_socket_is_not_world_writable_and_a_live_one_is_refused(tmp_path):
    port, sock = _paths(tmp_path)
    svc = Service(port, sock, *NO_ANNOUNCE).start()
    try:
        assert stat.S_IMODE(os.stat(sock).st_mode) == 0o660
        second = Service(free_port(), sock, *NO_ANNOUNCE).start(wait=False)
        assert second.proc.wait(timeout=15) == 1
        # One line, as every start-up failure says it (the reader thread may still be at it).
        wait_for(lambda: any(line.startswith("df-publisher-service: ") and "in use by a live process" in line
                             for line in list(second.lines)), what="the refusal on stderr")
    finally:
        svc.kill()


def test_worker_never_blocks_while_the_service_is_down_and_the_drop_is_found(tmp_path):
    port, sock = _paths(tmp_path)
    settings = worker_settings(port, sock, multiproc_batch_linger=0)
    settings.driver["zmq"] = {"worker_hwm": 100}
    svc = Service(port, sock, *NO_ANNOUNCE).start()
    wp = create_publisher(settings)
    sink = Sink(["port"], [svc.uri])
    try:
        sink.sub.start()
        n = iter(range(1, 1_000_000))
        wait_for(lambda: wp.publish("port", "port", "probe", "create", next(n)) and sink.keys("port"),
                 what="the sink to know the worker")
        svc.kill()
        start = time.monotonic()
        for k in range(1000):
            last = wp.publish("port", "port", f"k{k}", "create", k + 1)
        assert time.monotonic() - start < 5, "publishing must not wait for the absent service"
        drops = wp.publisher.stats.get("drops", "send_failed")
        assert 800 <= drops <= 1000 - 50
        svc.start()
        # What the buffer held arrives after the restart; the drops behind it are one hole.
        holes = lambda: [g for g in sink.gaps if g.missing and g.missing[0] <= last <= g.missing[1]]  # noqa: E731
        wait_for(lambda: wp.publish("port", "port", "late", "create", 1) and holes(),
                 what="the dropped events to show as a gap")
        (gap, *_) = holes()
        assert gap.publisher_id == wp.id and gap.missing[1] - gap.missing[0] + 1 >= drops
    finally:
        sink.sub.close()
        wp.close()
        svc.kill()


def test_relay_drops_bad_frames_and_welcomes_subscribers_for_its_workers(tmp_path):
    port, sock = _paths(tmp_path)
    # A raw worker sends no hellos: a long max idle keeps the relay from forgetting it mid-test.
    svc = Service(port, sock, *NO_ANNOUNCE, "--pubsub.max-idle-time", "30").start()
    push = zmq.Context.instance().socket(zmq.PUSH)
    push.connect(f"ipc://{sock}")
    early = Sink(["a"], [svc.uri])
    late = Sink(["a"], [svc.uri])
    try:
        early.sub.start()
        n = iter(range(1, 1_000_000))
        wait_for(lambda: push.send_multipart([b"a\x00", raw_envelope("a", next(n), "probe")]) or early.keys("a"),
                 what="the raw worker's envelopes to arrive")
        before = list(early.gaps)  # a first contact may be reported, depending on who came first
        for frames in ([b"a\x00", b"\xc1 junk"], [b"a\x00"], [b"b\x00", raw_envelope("a", 1, "x")],
                       [b"$ctl\x00", encode_hello(Hello("raw-pub", "raw", 0.0, {"a": 10**6}, "idle", 0.4, "h"))[:-3]]):
            push.send_multipart(frames)
        last = next(n)
        push.send_multipart([b"a\x00", raw_envelope("a", last, "after-junk")])
        wait_for(lambda: "after-junk" in early.keys("a"), what="traffic after the junk")
        assert early.gaps == before and early.stats.get("decode_errors") == 0, "junk is stopped at the service"
        # A subscriber joining now is told the raw worker's sequence: it sees the next event in order.
        late.sub.start()
        wait_for(lambda: late.stats.get("hellos_in") >= 1, what="the welcome hello")
        push.send_multipart([b"a\x00", raw_envelope("a", last + 2, "skips-one")])
        wait_for(lambda: [g for g in late.gaps if g.missing == (last + 1, last + 1)],
                 what="the late subscriber to find the hole from the welcome's sequence")
    finally:
        push.close(0)
        early.sub.close()
        late.sub.close()
        svc.kill()


def test_multiproc_with_a_connect_based_driver_is_a_config_error():
    from dfpubsub.config import load_settings
    from dfpubsub.errors import ConfigError

    settings = load_settings(None, {"pubsub": {"driver": "memory", "multiproc": True, **PUBSUB}})
    try:
        create_publisher(settings)
    except ConfigError as exc:
        assert "no publisher service" in str(exc)
    else:
        raise AssertionError("expected ConfigError")


def test_workers_batch_for_their_own_linger(tmp_path):
    settings = worker_settings(free_port(), str(tmp_path / "publisher.sock"), multiproc_batch_linger=0.007)
    pub = create_publisher(settings)
    try:
        assert isinstance(pub, WorkerPublisher) and pub.publisher.options.batch_linger == 0.007
    finally:
        pub.close()
