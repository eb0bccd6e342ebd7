"""Controllers, df-feed and a writer on a Redis store reached through Sentinel while the master
fails, several times in a row (a kill twice, so that a former master is promoted again; each other
fault once; three times each under ``--soak``): killed with kill -9 mid-stream (with its replicas in step, or
behind it), or stopped with SIGSTOP past the sentinels' down-after-milliseconds; and a master
cut off in a network namespace that goes on taking writes. Afterwards every controller's cache equals the store (truth
wins), whatever the failover lost: df-feed and the controllers are told that the store's history
went back (HistoryRewound) when they had read past it, and relist under that reason."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
from pathlib import Path

import pytest
import redis
from dfpubsub.tools.webhook import WebhookReceiver

from dfpubsub.nbapi import NbApi
from dfpubsub.notify import NotificationConfig, NotificationRegistry, Topic
from dfpubsub.notify.producer import Notifier
from dfpubsub.queues import open_queues
from dfpubsub.store import open_store
from dfpubsub.testing.servers import RedisSentinelCluster, RedisServer
from tests.chaos.netns import ip
from tests.conftest import stopped, wait_for
from tests.functional.controller_helpers import Node
from tests.functional.failover.failover_helpers import Writer
from tests.functional.feed.feed_helpers import FeedThread
from tests.functional.notify_helpers import delivered_keys, delivery, wait_drained

# Every wait here is for an outcome (a failover, convergence, delivery) with room to spare, and
# Sentinel times its failovers itself: nothing this proves depends on a free CPU.
pytestmark = pytest.mark.beside

HERE = Path(__file__).parent


def failovers(fault: str, soak: bool) -> int:
    """Failovers in a row: every fault at least once in the default suite, and two kills, so that a
    master that came back as a replica is promoted again; three of each under ``--soak``."""
    return 3 if soak else 2 if fault == "kill" else 1
ENV = {**os.environ, "PYTHONPATH": str(HERE.parents[1])}


@pytest.mark.parametrize("fault", ["kill", "kill_lagging", "sigstop"])
def test_controllers_converge_across_failovers(tmp_path, fault, soak):
    """With ``kill_lagging`` the promoted replica lacks writes df-feed and the controllers had seen."""
    cluster = RedisSentinelCluster(tmp_path / "sentinel", down_after=1000).start()
    store = open_store(cluster.url, ["port", "network"], prefix="chaos", timeout=2.0)
    store.initialize()
    feed = FeedThread(store)
    nodes = [Node(store, feed.endpoint), Node(store, feed.endpoint)]
    writer = Writer(store, topic="port")
    try:
        for _ in range(failovers(fault, soak)):
            fail_over(cluster, fault, writer)
        writer.stop()
        for node in nodes:
            wait_for(lambda: node.converged(store), timeout=60, what="a controller to equal the store")
        survived = {o.key: o.version for o in store.list("port")}
        assert all(survived[k] == v for k, v in writer.acked.items() if k in survived)
        for node in nodes:
            reasons = node.ctrl.stats.by_reason("relists")
            assert not reasons.get("history_gone"), reasons  # nothing trimmed: only a rewind may relist
        if fault == "kill_lagging":
            # Writes that returned were lost with the master, and df-feed, which had published
            # them, was told its history went back (and made the controllers resync).
            assert [k for k in writer.acked if k not in survived]
            assert feed.stats.get("feed_history_gone") >= 1
    finally:
        writer.stop()
        for node in nodes:
            node.ctrl.stop()
        feed.close()
        store.close()
        cluster.kill()


def fail_over(cluster, fault, writer):
    """Wait for 300 writes, fail the master by ``fault`` (``kill``; ``kill_lagging``: its replicas
    stopped and cut off from it while 100 writes go on, then it is killed before they resume, so
    the promoted one lacks those writes; ``sigstop``: stopped past down-after), wait for 300 writes
    on the new master, and bring the old one back as a replica."""
    count = len(writer.acked)
    wait_for(lambda: len(writer.acked) >= count + 300, timeout=30, what="writes before the fault")
    old = cluster.master()
    if fault == "kill":
        old.kill()
    elif fault == "kill_lagging":
        replicas = [r for r in cluster.redis if r is not old]
        for r in replicas:
            os.kill(r.proc.pid, signal.SIGSTOP)
        # What the master sent them waits in their sockets; cut the links, so that it sends them
        # nothing more while they are stopped and cannot reconnect.
        raw = redis.Redis(port=old.port)
        raw.client_kill_filter(_type="replica")
        raw.close()
        count = len(writer.acked)
        wait_for(lambda: len(writer.acked) >= count + 100, timeout=30, what="writes the replicas miss")
        old.kill()
        for r in replicas:
            os.kill(r.proc.pid, signal.SIGCONT)
    else:
        os.kill(old.proc.pid, signal.SIGSTOP)
        wait_for(lambda: stopped(old.proc.pid), what="the master to stop")
    cluster.wait_master_change(old)
    count = len(writer.acked)
    wait_for(lambda: len(writer.acked) >= count + 300, timeout=60, what="writes on the new master")
    if fault != "sigstop":
        old.start()
    else:
        os.kill(old.proc.pid, signal.SIGCONT)
    cluster.wait_replica(old)


@pytest.mark.parametrize("fault", ["kill", "kill_lagging"])
def test_every_notification_of_a_write_that_survived_is_delivered(tmp_path, fault, soak):
    """NbApi writers with persistent notifications (their queue entries written in the store's
    own script), a delivery worker and a webhook, through failovers in a row: every object the store
    holds afterwards had its notification delivered (at least once). A write the failover lost
    took its queue entry with it; its notification may have gone out before (at least once,
    of a write that did not survive: what asynchronous replication allows, wait_replicas not)."""
    cluster = RedisSentinelCluster(tmp_path / "sentinel", down_after=1000).start()
    store = open_store(cluster.url, ["port"], prefix="nfo", timeout=2.0)
    store.initialize()
    queues = open_queues(cluster.url, prefix="nfo", timeout=2.0)
    assert queues.shares_store(store)
    registry = NotificationRegistry(queues)
    with WebhookReceiver() as webhook:
        registry.create_topic(Topic("orders", webhook.url, persistent=True, shards=2, retry_sleep=0.05))
        registry.put_configuration(NotificationConfig("all", "port", "orders"))
        worker = delivery(queues)
        writer = Writer(NbApi(store, None, Notifier(registry, queues)), topic="port")
        try:
            for _ in range(failovers(fault, soak)):
                fail_over(cluster, fault, writer)
            writer.stop()
            wait_drained(registry, "orders", timeout=60)
            survived = {(o.key, o.version) for o in store.list("port")}
            delivered = set(delivered_keys(webhook))
            assert survived - delivered == set()
            if fault == "kill_lagging":
                assert [k for k in writer.acked if (k, writer.acked[k]) not in survived]  # some were lost
        finally:
            writer.stop()
            worker.stop()
    queues.close()
    store.close()
    cluster.kill()


class _FarRedis(RedisServer):
    """A redis-server run inside network namespace ``ns`` (``ip netns exec``: the process is the
    server's own, so a kill reaches it)."""

    def __init__(self, workdir, ns, host):
        super().__init__(workdir, host=host, args=("--repl-diskless-sync-delay", "0"))
        self.ns = ns

    def argv(self):
        return ["ip", "netns", "exec", self.ns, *super().argv()]


@pytest.mark.alone  # the writes lost at the cut are bounded by replication lag, which a busy CPU stretches
def test_an_old_master_cut_off_keeps_taking_writes_and_what_it_took_is_detected(far_side, tmp_path):
    """The master, a writer and a feed reader in a network namespace, cut off from the sentinels,
    the replicas and this side's writer and reader: a replica is promoted here while the old
    master acknowledges the far writer's writes. Once the link is back the old master is made a
    replica and loses them: the far writes are counted lost, the far reader (which read them) is
    told its history went back, and everything this side wrote through Sentinel is there."""
    ns, link, far, near = far_side
    master = _FarRedis(tmp_path / "far-master", ns, far)
    cluster = RedisSentinelCluster(tmp_path / "sentinel", down_after=1000, host=near, master=master).start()
    store = open_store(cluster.url, ["port", "network"], prefix="cut", timeout=2.0)
    store.initialize()
    side = subprocess.Popen(["ip", "netns", "exec", ns, sys.executable, str(HERE / "old_master_side.py"),
                             master.url, "cut"], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=ENV)
    lines: list[str] = []

    def pump():
        for line in side.stdout:
            lines.append(line)

    threading.Thread(target=pump, daemon=True).start()
    try:
        wait_for(lambda: "ready\n" in lines, timeout=30, what="the far side to start")
        writer = Writer(store, topic="t")
        wait_for(lambda: len(writer.acked) >= 200, timeout=30, what="this side's writes")

        def far_writes(n):
            start = lines.count("done\n")
            side.stdin.write(f"write {n}\n")
            side.stdin.flush()
            wait_for(lambda: lines.count("done\n") > start, timeout=60, what="the far writes")

        far_writes(100)
        ip("link", "set", link, "down")
        new = cluster.wait_master_change(master)  # promoted on this side, the old master still up there
        far_writes(200)  # acknowledged by the old master, which no replica hears any more
        count = len(writer.acked)
        wait_for(lambda: len(writer.acked) >= count + 200, timeout=30, what="this side's writes on the new master")
        ip("link", "set", link, "up")
        cluster.wait_replica(master)  # the sentinels demote it: it takes the new master's data
        wait_for(lambda: any(line.startswith(("rewound", "gone")) for line in list(lines)), timeout=30,
                 what="the far reader to learn its history went back")
        writer.stop()
        survived = {o.key: o.version for o in store.list("port")}
        acked_far = dict(line.split()[1:] for line in list(lines) if line.startswith("acked"))
        lost_far = [k for k in acked_far if k not in survived]
        assert len(lost_far) >= 150  # what the old master acknowledged alone is gone...
        assert [line for line in lines if line.startswith(("rewound", "gone"))][0].startswith("rewound")  # ...and told
        # Everything this side's writer was told happened is there (its writes before the cut
        # reached the replicas, those after went to the new master), but for the writes in flight
        # to the old master at the cut (their outcome was unknown, or they were acked then lost).
        missing = [k for k in writer.acked if k not in survived]
        assert len(missing) <= 5, missing
        assert new.port != master.port
    finally:
        if "writer" in locals():
            writer.stop()
        side.kill()
        store.close()
        cluster.kill()
