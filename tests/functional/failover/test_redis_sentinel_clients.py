"""The Redis Streams driver, the Redis endpoint, discovery, df-db and df-config through Sentinel
(``redis+sentinel://``), on a master with two replicas and three sentinels of the test's own:
the driver's transports and the endpoint reconnect to the master the sentinels promote, and what
the failover lost is delivered or detected."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import uuid
from types import SimpleNamespace

import redis

from dfpubsub.discovery import PublisherRecord, open_discovery
from dfpubsub.endpoints import open_endpoint
from dfpubsub.errors import EndpointError
from dfpubsub.notify.notification import make_notification
from tests.conftest import wait_for
from tests.functional.df_db_helpers import base_env, ok
from tests.functional.drivers.test_driver_redis import Sink, make_pub
from tests.functional.sink_helpers import publishing_forever


def test_the_streams_driver_follows_a_failover_and_every_loss_is_detected(sentinel_cluster):
    server = SimpleNamespace(url=sentinel_cluster.url)  # what the driver tests' helpers take
    prefix = f"fo-{uuid.uuid4().hex[:8]}"
    pub = make_pub(server, prefix)
    live = Sink(server, prefix, ["a", "b"])
    live.sub.start()
    with publishing_forever(pub):
        wait_for(lambda: len(live.keys()) >= 2000, timeout=20, what="traffic before the failover")
        old = sentinel_cluster.master()
        assert redis.Redis(port=old.port).xlen(f"{prefix}:ps:a") > 0  # on the master the sentinels name
        old.kill()
        new = sentinel_cluster.wait_master_change(old)
        mark = len(live.keys())
        wait_for(lambda: len(live.keys()) >= mark + 2000, timeout=30, what="traffic through the new master")
        assert redis.Redis(port=new.port).xlen(f"{prefix}:ps:a") > 0
    pub.close()
    sent = pub.sequences()
    wait_for(lambda: live.undetected_losses(pub.id, sent) == {t: [] for t in sent}, timeout=30, interval=0.2,
             what="every loss to be delivered or detected")
    live.close()


def test_the_redis_endpoint_delivers_through_the_new_master(sentinel_cluster):
    def batch(n, topic):
        return [make_notification(topic, "s3:ObjectCreated:Put", "create", "media", f"k{i}", 100 + i, {"i": i})
                for i in range(n)]

    async def scenario() -> None:
        url = f"{sentinel_cluster.url}?stream=notify:{{topic}}"
        async with open_endpoint(url, options={"timeout": "2"}) as ep:
            await ep.send(batch(20, "before"))
            old = sentinel_cluster.master()
            old.kill()
            new = await asyncio.to_thread(sentinel_cluster.wait_master_change, old)
            for _ in range(200):  # the delivery's retries, until the connection is remade to the new master
                try:
                    await ep.send(batch(5, "after"))
                    break
                except EndpointError:
                    await asyncio.sleep(0.05)
            client = redis.Redis(port=new.port)
            assert client.xlen("notify:after") >= 5
            client.close()

    asyncio.run(scenario())


def test_df_db_and_df_config_take_a_sentinel_url(sentinel_cluster):
    env = base_env()
    s = ("--store", sentinel_cluster.url)
    assert ok(env, *s, "init")["backend"] == "redis"
    added = ok(env, *s, "add", "port", '{"key": "p1", "value": 1}')
    assert ok(env, *s, "ls", "port") == added
    check = subprocess.run([os.path.join(os.path.dirname(sys.executable), "df-config"), "check"],
                           env={**env, "DFPUBSUB_STORE__URL": sentinel_cluster.url,
                                "DFPUBSUB_NOTIFY__URL": "redis+sentinel://127.0.0.1:1/m/x"},
                           capture_output=True, text=True, timeout=60)
    assert check.returncode != 0 and check.stderr.count("\n") == 1 and "notify.url" in check.stderr


def test_discovery_rows_come_back_on_the_new_master(sentinel_cluster):
    publisher_side = open_discovery(sentinel_cluster.url, ttl=3.0, renew_interval=0.5, prefix="disc")
    subscriber_side = open_discovery(sentinel_cluster.url, ttl=3.0, renew_interval=0.5, prefix="disc")
    try:
        publisher_side.register(PublisherRecord("pub1", "neutron-1", ["tcp://10.0.0.1:8866"], "host-1", 4242,
                                                1_700_000_000.5, ["port"]))
        assert [r.publisher_id for r in subscriber_side.list()] == ["pub1"]
        old = sentinel_cluster.master()
        old.kill()
        sentinel_cluster.wait_master_change(old)
        # Whether or not the row reached a replica, the renewals write it on the new master.
        wait_for(lambda: [r.publisher_id for r in subscriber_side.list()] == ["pub1"], timeout=30,
                 what="the row on the new master")
    finally:
        publisher_side.close()
        subscriber_side.close()
