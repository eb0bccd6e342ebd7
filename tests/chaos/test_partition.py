"""A controller cut off by a real network partition (a veth pair into a network namespace, the
link taken down) from a writer that writes and exits meanwhile: its cache converges, on ZeroMQ
(the controller subscribes to the writer across the link), through a df-publisher-service on the
far side (the writer is one of its API workers), and on Redis Streams and etcd watch (the writer
reaches the server across the link, the controller on this side)."""

from __future__ import annotations

import itertools
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from dfpubsub import Publisher, PublisherOptions, load_driver
from dfpubsub.codec import decode, decode_events
from dfpubsub.errors import AlreadyExists, StoreUnavailable
from dfpubsub.events import Action, EventBatch
from dfpubsub.metrics import Stats
from dfpubsub.store import open_store
from dfpubsub.testing.servers import EtcdServer, RedisServer, free_port
from tests.chaos.netns import ip
from tests.conftest import wait_for
from tests.functional.controller_helpers import Node
from tests.functional.feed.feed_helpers import FeedThread

_prefix = itertools.count()

HERE = Path(__file__).parent
SERVICE = shutil.which("df-publisher-service", path=os.path.dirname(sys.executable))


@pytest.fixture(params=["zmq", "publisher-service", "redis", "etcd"])
def bus(request, far_side, tmp_path):
    """(the writer's driver URL and options, the same for this side's feed, this side's
    subscriber transport, whether the controller connects to the writer's endpoint)."""
    ns, far, near = far_side[0], far_side[2], far_side[3]
    feed = ("zmq+tcp://127.0.0.1:*", {})
    if request.param == "zmq":
        yield (f"zmq+tcp://{far}:*", {}), feed, load_driver("zmq").subscriber(Stats("s", "s")), True
        return
    if request.param == "publisher-service":
        # The API host on the far side: df-publisher-service and a worker publishing through it.
        driver, sock = f"zmq+tcp://{far}:{free_port()}", str(tmp_path / "service.sock")
        errors = tmp_path / "service.err"
        with open(errors, "w") as err:
            service = subprocess.Popen(["ip", "netns", "exec", ns, SERVICE, "--pubsub.driver", driver,
                                        "--pubsub.multiproc-socket", sock, "--pubsub.max-idle-time", "0.3",
                                        # the controller connects to it: no discovery table to announce in
                                        "--publisher-service.announce", "false"],
                                       stderr=err)
        try:
            wait_for(lambda: os.path.exists(sock) or service.poll() is not None, timeout=60,
                     what="the publisher service")
            assert service.poll() is None, errors.read_text()[-2000:]
            yield (driver, {"multiproc_socket": sock}), feed, load_driver("zmq").subscriber(Stats("s", "s")), True
        finally:
            service.terminate()
            service.wait(15)
        return
    # The server listens on this side's end of the link: the writer reaches it across the link,
    # the controller and the feed locally, so taking the link down cuts the writer off alone.
    server = (RedisServer if request.param == "redis" else EtcdServer)(tmp_path / request.param, host=near).start()
    options = {"prefix": f"part{next(_prefix)}-{os.getpid()}"}
    try:
        yield ((server.url, options), (server.url, options),
               load_driver(server.url, options).subscriber(Stats("s", "s")), False)
    finally:
        server.stop()


def test_a_writer_that_writes_and_exits_during_a_partition_reaches_the_controller(far_side, bus, tmp_path):
    ns, link = far_side[:2]
    (writer_driver, writer_options), (feed_driver, feed_options), transport, connect = bus
    url = f"sqlite:///{tmp_path}/nb.sqlite"
    store = open_store(url, ["port", "network"])
    feed = FeedThread(store, driver=feed_driver, options=feed_options)  # df-feed, on this side: what closes the hole
    writer = subprocess.Popen(["ip", "netns", "exec", ns, sys.executable, str(HERE / "partition_writer.py"), url,
                               writer_driver, json.dumps(writer_options)], stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, text=True, env={**os.environ, "PYTHONPATH": str(HERE.parents[1])})
    node = Node(store, feed.endpoint, transport)
    try:
        assert writer.stdout is not None and writer.stdin is not None
        endpoint = writer.stdout.readline().strip()
        if connect:
            node.ctrl.connect(endpoint)  # the writer's own endpoint, across the link

        def write(prefix: str) -> None:
            writer.stdin.write(f"{prefix} 5\n")
            writer.stdin.flush()
            assert writer.stdout.readline().strip() == "done"

        write("before")
        wait_for(lambda: node.converged(store), timeout=30, what="the writes before the partition")
        # The feed may have brought those: the controller must know the writer itself to lose it.
        # Its hello alone is not enough: a publisher lost before any of its streams was seen leaves
        # nothing to resync (the feed covers what it wrote).
        peers = node.ctrl.subscriber.tracker.peers
        wait_for(lambda: any("port" in peer.streams for pid, peer in list(peers.items()) if pid != feed.publisher.id),
                 timeout=30, what="the controller to hear from the writer on 'port'")
        ip("link", "set", link, "down")
        # The controller gives the silent writer up and resyncs once; what the writer writes after
        # that is the hole (an outside soak left such writes stale for good).
        wait_for(lambda: any(g.reason == "publisher_lost" for g in list(node.gaps)), timeout=30,
                 what="the controller to give the cut-off writer up")
        write("during")
        writer.stdin.write("exit\n")
        writer.stdin.flush()
        assert writer.wait(30) == 0
        ip("link", "set", link, "up")
        wait_for(lambda: node.converged(store), timeout=30, what="the writes made during the partition")
        assert len(store.list()) == 10
    finally:
        writer.kill()
        node.ctrl.stop()
        feed.close()
        store.close()


def _keys(frames: list[bytes]) -> list[str]:
    """The keys of the events in envelope ``frames`` (hellos and byes have none)."""
    envelopes = [decode(f) for f in frames]
    return [e.key for env in envelopes if isinstance(env, EventBatch) for e in decode_events(env)]


def _until(fn, timeout: float = 30.0):
    """``fn()``'s first result that is not empty, retrying while the store is unavailable."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            out = fn()
        except StoreUnavailable:
            out = None
        if out:
            return out
        time.sleep(0.1)
    raise AssertionError(f"nothing after {timeout}s")


def _create(store, table: str, key: str) -> bool:
    """Create ``key``. Right after a partition heals, a create can land while its answer is lost
    (WriteOutcomeUnknown): the retry then finds the object there, which is the same outcome."""
    try:
        store.create(table, key, {})
    except AlreadyExists:
        assert store.get(table, key) is not None
    return True


def test_an_etcd_member_cut_off_but_alive_is_noticed_by_the_feed_follower_and_the_watching_subscriber(far_side,
                                                                                                    tmp_path):
    """etcd on the far side of the link: taken down, the member is alive but answers nothing, and no
    connection is refused or reset. The feed's follower notices by its unanswered progress
    requests, the driver's watch by its keepalive pings; both read again once the link is back."""
    ns, link, far = far_side[:3]

    class FarEtcd(EtcdServer):
        def argv(self) -> list[str]:
            return ["ip", "netns", "exec", ns, *super().argv()]

    server = FarEtcd(tmp_path / "etcd", host=far).start()
    store = open_store(server.url, ["port", "network"], timeout=1.0)
    reader = store.follow_feed(store.feed_head())
    options = {"prefix": f"part{next(_prefix)}-{os.getpid()}", "timeout": 1.0}
    watch = load_driver(server.url, options).subscriber(Stats("s", "s"))
    watch.subscribe("port")
    pub = Publisher(load_driver(server.url, options).publisher(Stats("p", "p")), "near",
                    PublisherOptions(batch_linger=0.001, max_idle_time=0))
    try:
        store.create("port", "before", {})
        assert [x.key for x in _until(lambda: reader.read(timeout=0.5))] == ["before"]
        pub.publish("port", "port", "before", Action.CREATE, 1, {})
        pub.flush()
        assert _until(lambda: _keys(watch.recv(0.5))) == ["before"]
        ip("link", "set", link, "down")
        started = time.monotonic()
        with pytest.raises(StoreUnavailable):
            while time.monotonic() - started < 20:
                reader.read(timeout=0.5)
        assert time.monotonic() - started < 10, "the follower waited on a silent member"
        ip("link", "set", link, "up")
        _until(lambda: _create(store, "port", "after"))
        assert [x.key for x in _until(lambda: reader.read(timeout=0.5))] == ["after"]
        # The watch's stream died with the link (keepalive), and it watches again from where it was.
        versions = itertools.count(2)

        def published_and_watched() -> list[str]:  # a publish may fail while the channel reconnects
            pub.publish("port", "port", "after", Action.UPDATE, next(versions), {})
            pub.flush()
            return _keys(watch.recv(1.0))

        assert set(_until(published_and_watched, timeout=60)) == {"after"}
    finally:
        pub.close()
        watch.close()
        reader.close()
        store.close()
        server.stop()
