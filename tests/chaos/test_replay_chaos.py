"""Repair by replay through crashes and a partition, on every store: a publisher killed -9 with
nothing lost, df-feed killed -9 in the middle of a batch (alone, and beside a second df-feed), and a
real network partition of ~10 s during which ~1000 writes happen. Two controllers hold a table of
3000 objects; each repair must be a replay of the store's feed that reads what was missed (none
when nothing was), never the table (tests/functional/replay_helpers.py counts it). Their
``replay_max_ratio`` lets a replay read any number of entries: where a relist would read less is
tests/functional/controller/test_replay.py's concern, not these."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from dfpubsub.testing.servers import EtcdServer, RedisServer
from tests.chaos.netns import ip
from tests.conftest import wait_for
from tests.functional.replay_helpers import PAD, Backend, populate, replay_always, start_nodes, wait_converged

# What each repair reads (counted by the controllers), not how fast it is: the partition's ten
# seconds are the scenario, timed by the test, not a bound on anything.
pytestmark = pytest.mark.beside

HERE = Path(__file__).parent
ENV = {**os.environ, "PYTHONPATH": str(HERE.parents[1])}


@pytest.fixture(params=["sqlite", "redis", "etcd"])
def backend(request, tmp_path):
    return Backend.of(request, tmp_path)


def child(script, *args, ns=None):
    """A child process of this folder's ``script``, inside network namespace ``ns`` if given; its
    first line (the URI it publishes on) is read."""
    argv = [sys.executable, str(HERE / script), *map(str, args)]
    if ns is not None:
        argv = ["ip", "netns", "exec", ns, *argv]
    proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=ENV)
    proc.uri = proc.stdout.readline().strip()
    assert proc.uri.startswith("tcp://"), proc.uri
    return proc


def command(proc, line, timeout=60):
    """Send ``line`` to a replay_writer and return the version its ``done`` reports."""
    proc.stdin.write(line + "\n")
    proc.stdin.flush()
    answer = proc.stdout.readline().split()
    assert answer and answer[0] == "done", answer
    return int(answer[1])


def kill(proc):
    if proc.poll() is None:
        proc.send_signal(signal.SIGKILL)
    proc.wait(10)


def snapshots(nodes):
    return [node.ctrl.stats.snapshot() for node in nodes]


def delta(node, snap, counter):
    return node.stat(counter) - snap.get(counter, 0)


def caches_hold(nodes, store, keys):
    """Whether every cache holds ``keys`` of "port" at the store's versions (values come along)."""
    truth = {o.key: o.version for o in store.get_many([("port", k) for k in keys])}
    return all(all(getattr(node.ctrl.cache.get("port", k), "version", None) == v for k, v in truth.items())
               for node in nodes)


# -- a publisher killed -9 after everything it wrote arrived --------------------------------------


def test_a_publisher_killed_with_nothing_lost_is_repaired_by_a_replay_that_reads_no_object(backend):
    store = backend.open()
    populate(store)
    options = {} if backend.name == "sqlite" else {"timeout": 5.0}
    writer = child("replay_writer.py", backend.url, json.dumps(options), "zmq+tcp://127.0.0.1:*")
    nodes = start_nodes(backend, [writer.uri], (replay_always(), replay_always()))
    try:
        command(writer, "0 300 0")
        wait_for(lambda: caches_hold(nodes, store, [f"k{i}" for i in range(300)]),
                 what="every event of the writer to arrive")
        before = snapshots(nodes)
        kill(writer)  # nothing in flight: it flushed, and everything it published arrived
        for node, snap in zip(nodes, before):
            wait_for(lambda: node.stat("replays", "dead_publisher") > snap.get("replays:dead_publisher", 0),
                     what=f"{node.ctrl.name}: the dead publisher's repair")
        wait_converged(nodes, store)
        for node, snap in zip(nodes, before):
            assert node.relists() == {"first_sync": 1}, node.relists()
            assert delta(node, snap, "replay_objects") == 0, node.ctrl.stats.snapshot()
            assert 300 <= delta(node, snap, "replay_entries") <= 301  # the feed since the listing, once
            print(f"{backend.name} {node.ctrl.name}: {node.ctrl.stats.by_reason('replays')}, "
                  f"{delta(node, snap, 'replay_entries')} entries, {delta(node, snap, 'replay_objects')} objects")
    finally:
        kill(writer)
        for node in nodes:
            node.close()
        store.close()


# -- df-feed killed -9 in the middle of a batch -----------------------------------------------------


@pytest.mark.parametrize("feeds", ["one", "two"])
def test_df_feed_killed_mid_batch_is_repaired_by_replay(backend, tmp_path, feeds):
    """500 raw writes (no API publishes them: df-feed does) in one batch; df-feed dies as it is to
    send the envelope that would take it past 100 events (at most 128 of the 500 sent). Alone, its
    successor (same cursor) and a replay close the hole, the replay reading exactly what the dead
    one had not sent; beside a second df-feed that already published everything, the dead one's
    repair reads no object."""
    store = backend.open()
    populate(store)
    options = {} if backend.name == "sqlite" else {"timeout": 5.0}
    cursor = tmp_path / "feed.cursor"
    cursor.write_text(f"{store.feed_head()}\n")  # the feeds start here: nothing to declare lost
    procs = [child("replay_feed.py", backend.url, json.dumps(options), "zmq+tcp://127.0.0.1:*", cursor, 100)]
    if feeds == "two":
        second = tmp_path / "feed2.cursor"
        second.write_text(cursor.read_text())
        procs.append(child("replay_feed.py", backend.url, json.dumps(options), "zmq+tcp://127.0.0.1:*", second, 0))
    nodes = start_nodes(backend, [p.uri for p in procs], (replay_always(), replay_always()))
    keys = [f"k{i}" for i in range(500)]
    try:
        for i, key in enumerate(keys):
            store.update("port", key, {"i": -i, "pad": PAD})
        if feeds == "two":  # the healthy one publishes all 500 first
            procs[1].stdin.write("go\n")
            procs[1].stdin.flush()
            wait_for(lambda: caches_hold(nodes, store, keys), timeout=30, what="the second df-feed's events")
        before = snapshots(nodes)
        procs[0].stdin.write("go\n")
        procs[0].stdin.flush()
        assert procs[0].wait(30) == -signal.SIGKILL
        for node, snap in zip(nodes, before):
            wait_for(lambda: node.stat("replays", "dead_publisher") > snap.get("replays:dead_publisher", 0),
                     what=f"{node.ctrl.name}: the dead df-feed's repair: {node.ctrl.stats.snapshot()} {node.gaps}")
        # The events of the dead one's batch that arrived, and what its repair read: the rest.
        applied = [delta(node, snap, "events_in") for node, snap in zip(nodes, before)]
        fetched = [delta(node, snap, "replay_objects") for node, snap in zip(nodes, before)]
        if feeds == "one":  # its successor resumes from the cursor the dead one never moved
            procs.append(child("replay_feed.py", backend.url, json.dumps(options), "zmq+tcp://127.0.0.1:*",
                               cursor, 0))
            for node in nodes:
                node.ctrl.connect(procs[-1].uri)
            procs[-1].stdin.write("go\n")
            procs[-1].stdin.flush()
        wait_converged(nodes, store)
        for node, snap, events, objects in zip(nodes, before, applied, fetched):
            print(f"{backend.name} {feeds} df-feed {node.ctrl.name}: {node.ctrl.stats.by_reason('replays')}, "
                  f"{delta(node, snap, 'replay_entries')} entries, {objects} objects; the dead df-feed's {events} "
                  f"events arrived")
            assert node.relists() == {"first_sync": 1}, node.relists()
            assert 0 < events < 500, "the kill was not in the middle of the batch"
            if feeds == "two":  # the healthy one had published all: the dead one's repair reads nothing
                assert objects == 0, node.ctrl.stats.snapshot()
            else:  # exactly what the dead one had not sent
                assert objects == 500 - events, node.ctrl.stats.snapshot()
    finally:
        for p in procs:
            kill(p)
        for node in nodes:
            node.close()
        store.close()


# -- a network partition of ~10 s during which ~1000 writes happen --------------------------------


@pytest.fixture(params=["sqlite", "redis", "etcd"])
def far_backend(request, far_side, tmp_path):
    """The store on the far side of the link with the writer (Redis and etcd: their server runs in
    the namespace; SQLite: a file both sides open): the partition cuts the controllers off from
    the writer, and from the server too."""
    ns, far = far_side[0], far_side[2]
    if request.param == "sqlite":
        yield Backend("sqlite", f"sqlite:///{tmp_path}/nb.sqlite")
        return
    base = RedisServer if request.param == "redis" else EtcdServer

    class Far(base):
        def argv(self) -> list[str]:
            return ["ip", "netns", "exec", ns, *super().argv()]

    server = Far(tmp_path / request.param, host=far).start()
    try:
        yield Backend(request.param, server.url, server)
    finally:
        server.kill()


def test_a_partition_of_ten_seconds_with_a_thousand_writes_is_repaired_by_replay(far_side, far_backend):
    ns, link, far = far_side[:3]
    backend = far_backend
    store = backend.open(**({} if backend.name == "sqlite" else {"timeout": 2.0}))
    populate(store)
    writer = child("replay_writer.py", backend.url, "{}", f"zmq+tcp://{far}:*", ns=ns)
    nodes = start_nodes(backend, [writer.uri], (replay_always(), replay_always()),
                        **({} if backend.name == "sqlite" else {"timeout": 1.0}))
    try:
        command(writer, "0 20 0")
        wait_converged(nodes, store, what="the writes before the partition")
        before = snapshots(nodes)
        reads = [node.reads.total() for node in nodes]
        ip("link", "set", link, "down")
        cut = time.monotonic()
        command(writer, "1000 1000 110")  # ~9 s of writes the controllers cannot hear
        time.sleep(max(0.0, 10 - (time.monotonic() - cut)))  # the partition lasts 10 s: the scenario itself
        ip("link", "set", link, "up")
        wait_converged(nodes, store, timeout=60, what="the writes made during the partition")
        for node, snap, read_before in zip(nodes, before, reads):
            objects = delta(node, snap, "replay_objects")
            read = node.reads.total() - read_before
            print(f"{backend.name} partition {node.ctrl.name}: {node.ctrl.stats.by_reason('replays')}, "
                  f"{delta(node, snap, 'replay_entries')} entries, {objects} objects ({read} rows read), "
                  f"{delta(node, snap, 'events_in')} events, {delta(node, snap, 'resync_failures')} failed repairs")
            assert node.relists() == {"first_sync": 1}, node.relists()
            assert node.stat("replays") > sum(v for k, v in snap.items() if k.startswith("replays:"))
            # What the partition hid: at most the 1000 writes (fewer when the link's backlog of
            # envelopes arrived before the replay), never the table.
            events = delta(node, snap, "events_in")
            assert 1000 - events <= objects <= 1000 and read == objects, (objects, events, read, dict(node.reads.rows))
            assert delta(node, snap, "replay_entries") <= 1000 + 50
    finally:
        subprocess.run(["ip", "link", "set", link, "up"], capture_output=True, timeout=30)
        kill(writer)
        for node in nodes:
            node.close()
        store.close()
