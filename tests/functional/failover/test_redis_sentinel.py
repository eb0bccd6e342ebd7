"""The Redis store, queues and leases through Sentinel (``redis+sentinel://``), each test on a
master with two replicas and three sentinels of its own, failed over mid-stream: kill -9 of the
master, SIGSTOP past down-after-milliseconds. Afterwards nothing is silently wrong: a reader
that had read writes the failover lost is told so (HistoryRewound) and relists, and its view
equals the store; with ``wait_replicas = 1`` no write that returned is lost; tokens, revisions
and queue markers never go backwards."""

from __future__ import annotations

import os
import signal
import time

import pytest
import redis

from dfpubsub.backends import access
from dfpubsub.backends.redis import TAKEOVER_JUMP
from dfpubsub.errors import HistoryRewound
from dfpubsub.leader.redis import RedisLease
from dfpubsub.queues.redis import RedisQueues
from dfpubsub.store import open_store
from tests.conftest import stopped, wait_for
from tests.functional.failover.failover_helpers import Follower, Writer

TABLES = ["port", "network"]


def _store(cluster, prefix="fo"):
    store = open_store(cluster.url, TABLES, prefix=prefix, timeout=2.0)
    store.initialize()
    return store


def _converged(follower, store):
    try:
        truth = {o.key: o.version for o in store.list("port")}
    except Exception:  # noqa: BLE001 - unavailable for a moment: not yet
        return False
    return follower.view == truth


def test_a_killed_master_is_followed_and_what_it_lost_is_detected(sentinel_cluster):
    store = _store(sentinel_cluster)
    assert store.location == "sentinel:mymaster/0"
    follower = Follower(store)
    writer = Writer(store)
    try:
        wait_for(lambda: len(writer.acked) >= 300 and follower.read_up_to >= 200, timeout=30, what="writes flowing")
        old = sentinel_cluster.master()
        old.kill()  # kill -9, mid-stream: what the replicas had not received is gone
        killed_at = time.monotonic()  # once the process is gone: a write returning later went to another
        new = sentinel_cluster.wait_master_change(old)
        # The writer goes on by itself through the new master (how soon: ./dev bench failover).
        wait_for(lambda: writer.first_ack_after(killed_at) is not None, timeout=30, what="a write after the kill")
        count = len(writer.acked)
        wait_for(lambda: len(writer.acked) >= count + 100, timeout=30, what="writes on the new master")
    finally:
        writer.stop()
    survived = {o.key: o.version for o in store.list("port")}
    lost = {k: v for k, v in writer.acked.items() if k not in survived}
    # What survived is exactly what the writer was told (versions included), but for the lost
    # writes: the suffix the new master never received, all below the takeover's jump.
    assert all(survived[k] == v for k, v in writer.acked.items() if k in survived)
    kept = max((v for v in survived.values() if v < TAKEOVER_JUMP), default=0)
    assert all(kept < v < TAKEOVER_JUMP for v in lost.values())
    assert min(v for v in survived.values() if v > TAKEOVER_JUMP) > kept + TAKEOVER_JUMP
    wait_for(lambda: _converged(follower, store), timeout=30, what="the reader to equal the store")
    follower.stop()
    # A reader that had read past what the new master kept was told its history went backwards.
    if follower.read_up_to > kept and lost:
        assert follower.relists.get("history_rewound", 0) >= 1
    assert follower.relists.get("history_gone", 0) == 0
    assert new.port != old.port
    store.close()


def test_with_wait_replicas_no_write_that_returned_is_lost(sentinel_cluster, redis_settings):
    access.configure(redis=access.RedisAccess(wait_replicas=1, wait_timeout=1.0))
    store = _store(sentinel_cluster, "wait")
    writer = Writer(store)
    try:
        wait_for(lambda: len(writer.acked) >= 300, timeout=30, what="writes flowing")
        old = sentinel_cluster.master()
        old.kill()
        sentinel_cluster.wait_master_change(old)
        count = len(writer.acked)
        wait_for(lambda: len(writer.acked) >= count + 50, timeout=30, what="writes on the new master")
    finally:
        writer.stop()
    survived = {o.key: o.version for o in store.list("port")}
    assert {k: survived.get(k) for k in writer.acked} == writer.acked  # every write that returned
    store.close()


def test_a_master_stopped_past_down_after_is_left_and_rejoins_as_a_replica(sentinel_cluster):
    store = _store(sentinel_cluster, "stop")
    follower = Follower(store)
    writer = Writer(store)
    old = sentinel_cluster.master()
    try:
        wait_for(lambda: len(writer.acked) >= 200, timeout=30, what="writes flowing")
        os.kill(old.proc.pid, signal.SIGSTOP)
        wait_for(lambda: stopped(old.proc.pid), what="the master to stop")
        stopped_at = time.monotonic()
        sentinel_cluster.wait_master_change(old)
        # The write in flight on the stopped master times out (2 s), its outcome unknown; the
        # writer goes on through the new master.
        wait_for(lambda: writer.first_ack_after(stopped_at) is not None, timeout=30, what="a write after the stop")
    finally:
        os.kill(old.proc.pid, signal.SIGCONT)
    try:
        # The sentinels turn the old master into a replica of the new one.
        wait_for(lambda: redis.Redis(port=old.port).info("replication")["role"] == "slave", timeout=30,
                 what="the old master to rejoin as a replica")
        count = len(writer.acked)
        wait_for(lambda: len(writer.acked) >= count + 100, timeout=30, what="writes after the rejoin")
    finally:
        writer.stop()
    survived = {o.key: o.version for o in store.list("port")}
    assert all(survived[k] == v for k, v in writer.acked.items() if k in survived)
    wait_for(lambda: _converged(follower, store), timeout=30, what="the reader to equal the store")
    follower.stop()
    store.close()


def test_a_lease_token_never_goes_backwards_across_a_failover(sentinel_cluster):
    a = RedisLease(sentinel_cluster.url, "ctl", timeout=2.0)
    b = RedisLease(sentinel_cluster.url, "ctl", timeout=2.0)
    token = a.acquire("a", 1.0)
    assert token is not None
    old = sentinel_cluster.master()
    old.kill()
    sentinel_cluster.wait_master_change(old)
    # Whether or not the acquisition reached a replica, the lease expires and b takes it with a
    # token past every one the old master gave: a's fencing token is the stale one.
    wait_for(lambda: b.acquire("b", 5.0) is not None, timeout=30, what="b to take the lease")
    holder = b.holder()
    assert holder is not None and holder.identity == "b"
    assert holder.token > token + TAKEOVER_JUMP - 1
    assert not a.renew("a", token, 1.0)
    a.close()
    b.close()


def test_queue_markers_and_reservations_move_past_the_old_master(sentinel_cluster):
    queues = RedisQueues(sentinel_cluster.url, prefix="q", timeout=2.0)
    queues.create_queue("shard", max_bytes=1 << 20, max_entries=1000)
    for _ in range(5):
        queues.commit("shard", queues.reserve("shard", 10), b"before")
    listed, _ = queues.list("shard", 100)
    pending = queues.reserve("shard", 10)  # reserved on the old master, never committed there
    old = sentinel_cluster.master()
    old.kill()
    sentinel_cluster.wait_master_change(old)
    fresh = queues.reserve("shard", 10)
    assert fresh != pending  # a reservation id the old master gave is never given again
    queues.commit("shard", fresh, b"after")
    after, _ = queues.list("shard", 100)
    assert int(after[-1].marker) > int(listed[-1].marker) + TAKEOVER_JUMP - 1
    # A worker that delivered what it listed on the old master removes up to its last marker:
    # the entry committed after the failover stays, to be delivered.
    queues.remove("shard", listed[-1].marker)
    assert [e.data for e in queues.list("shard", 100)[0]] == [b"after"]
    queues.close()


def test_a_reader_inside_a_takeovers_hole_is_told_its_history_went_back(sentinel_cluster):
    store = _store(sentinel_cluster, "hole")
    for i in range(5):
        store.create("port", f"p{i}", i, topic="t")
    head = store.feed_head()
    old = sentinel_cluster.master()
    wait_for(lambda: all(redis.Redis(port=r.port).get("hole:nb:rev") == str(head).encode()
                         for r in sentinel_cluster.redis), what="the replicas to have every write")
    old.kill()
    sentinel_cluster.wait_master_change(old)
    store.create("port", "after", 1, topic="t")
    # A reader at head + 2 had read writes the new master never received (as a reader past the
    # replicas does when the master dies): its position lies in the takeover's hole.
    with pytest.raises(HistoryRewound) as gone:
        store.feed_since(head + 2)
    assert gone.value.reason == "history_rewound" and gone.value.horizon == head
    assert store.feed_since(head)[1] == 1  # on the surviving history: one entry since, the jump not counted
    with pytest.raises(HistoryRewound):
        store.follow_feed(head + 2).read()
    assert [e.key for e in store.follow_feed(head).read()] == ["after"]
    store.close()


def test_a_threads_connection_moves_to_the_new_master_before_it_writes(sentinel_cluster):
    """After a failover a thread's next call goes to the new master, not to the old one, which still
    takes writes until the sentinels tell it: a kept connection to a server the sentinels no
    longer name is dropped before the call (they are asked at most once a second)."""
    store = _store(sentinel_cluster, "move")
    store.create("port", "a", 1, topic="t")  # this thread's connection, to the first master
    old = sentinel_cluster.master()
    scripts = store._client.get().scripts  # noqa: SLF001 - the check itself, on a connection kept to the old master
    kept = store._client.get().r.connection_pool.make_connection()  # noqa: SLF001
    kept.connect()
    assert not scripts._master_moved(kept)  # noqa: SLF001
    sentinel = redis.Redis(host=sentinel_cluster.sentinels[0].host, port=sentinel_cluster.sentinels[0].port)
    sentinel.execute_command("SENTINEL", "FAILOVER", sentinel_cluster.service)  # old stays up, demoted
    sentinel.close()
    new = sentinel_cluster.wait_master_change(old)
    # Sentinel tells the old master of its demotion (and closes its clients) some 10 s later: until
    # then it is a master the sentinels no longer name, taking writes. Ask them at every call.
    scripts.recheck = 0
    assert scripts._master_moved(kept)  # noqa: SLF001
    kept.disconnect()
    on_old = redis.Redis(port=old.port)
    before = on_old.info("commandstats")["cmdstat_evalsha"]["calls"]  # NOSCRIPT, then the create
    store.update("port", "a", 2)
    assert on_old.info("commandstats")["cmdstat_evalsha"]["calls"] == before  # not tried there first
    on_old.close()
    assert store.get("port", "a").value == 2 and new.port != old.port
    store.close()
