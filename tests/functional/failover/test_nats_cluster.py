"""The NATS JetStream driver and endpoint on a three-node JetStream cluster of the test's own:
the stream is made R3, and with traffic live the stream's leader and a consumer's leader are
killed with kill -9 and made to step down through ``$JS.API.*.LEADER.STEPDOWN``: subscribers see
every envelope or resync for what they missed. Two of three servers down is unavailable (publishes
fail and are counted), never wrong."""

from __future__ import annotations

import asyncio
import json
from types import SimpleNamespace

import nats
import pytest

from dfpubsub.endpoints import open_endpoint
from dfpubsub.errors import EndpointError
from dfpubsub.notify.notification import make_notification
from dfpubsub.testing.servers import NatsCluster
from tests.conftest import wait_for
from tests.functional.drivers.test_driver_nats import Sink, make_pub, new_options
from tests.functional.sink_helpers import publishing_forever


@pytest.fixture
def cluster(tmp_path):
    nodes = NatsCluster(tmp_path / "nats").start()
    yield nodes
    nodes.kill()


def _api(cluster, subject, payload=b""):
    """A request to the JetStream API of the cluster (what an operator's nats CLI sends)."""
    servers = [f"nats://{s.host}:{s.port}" for s in cluster.servers if s.proc and s.proc.poll() is None]

    async def first():
        nc = await nats.connect(servers, connect_timeout=2)
        try:
            reply = await nc.request(subject, payload, timeout=5)
            return json.loads(reply.data)
        finally:
            await nc.close()
    return asyncio.run(first())


def _replicas(cluster, stream):
    return _api(cluster, f"$JS.API.STREAM.INFO.{stream}")["config"]["num_replicas"]


def _every_loss_accounted(pub, sinks):
    sent = pub.sequences()
    for s in sinks:
        wait_for(lambda: s.undetected_losses(pub.id, sent) == {t: [] for t in sent}, timeout=30, interval=0.2,
                 what="every envelope delivered or its loss detected")


def test_the_stream_is_r3_on_a_cluster_unless_told(cluster):
    default, single = new_options(), new_options(num_replicas=1)
    for options in (default, single):
        pub = make_pub(cluster, options)
        pub.publish("a", "t", "k", "update", 1, {"v": 1})
        pub.close()
    assert _replicas(cluster, default["stream"]) == 3
    assert _replicas(cluster, single["stream"]) == 1


@pytest.mark.parametrize("victim", ["stream_leader", "consumer_leader"])
def test_a_leader_killed_mid_stream_loses_nothing_undetected(cluster, victim):
    options = new_options()
    pub = make_pub(cluster, options)
    live = Sink(cluster, options, ["a", "b"])
    live.sub.start()
    with publishing_forever(pub):
        wait_for(lambda: len(live.keys()) >= 2000, timeout=30, what="traffic before the kill")
        if victim == "stream_leader":
            wait_for(lambda: cluster.stream_leader(options["stream"]) is not None, what="a stream leader")
            dead = cluster.stream_leader(options["stream"])
        else:
            wait_for(lambda: cluster.consumer_leaders(options["stream"]), what="a consumer leader")
            dead = cluster.consumer_leaders(options["stream"])[0]
        dead.kill()
        mark = len(live.keys())
        wait_for(lambda: len(live.keys()) >= mark + 2000, timeout=30, what="traffic after the kill")
        dead.start(timeout=120)  # it catches up with the stream before it says it is healthy
        mark = len(live.keys())
        wait_for(lambda: len(live.keys()) >= mark + 1000, timeout=30, what="traffic after the restart")
    pub.close()
    _every_loss_accounted(pub, [live])
    live.close()


def test_forced_step_downs_of_stream_and_consumer_leaders_lose_nothing_undetected(cluster):
    options = new_options()
    stream = options["stream"]
    pub = make_pub(cluster, options)
    live = Sink(cluster, options, ["a", "b"])
    live.sub.start()
    with publishing_forever(pub):
        wait_for(lambda: len(live.keys()) >= 2000, timeout=30, what="traffic before the step-downs")
        for _ in range(3):
            assert _api(cluster, f"$JS.API.STREAM.LEADER.STEPDOWN.{stream}").get("success")
            consumers = _api(cluster, f"$JS.API.CONSUMER.NAMES.{stream}")["consumers"]
            for name in consumers:
                _api(cluster, f"$JS.API.CONSUMER.LEADER.STEPDOWN.{stream}.{name}")
            mark = len(live.keys())
            wait_for(lambda: len(live.keys()) >= mark + 1000, timeout=30, what="traffic after a step-down")
    pub.close()
    _every_loss_accounted(pub, [live])
    live.close()


def test_two_of_three_servers_down_is_unavailable_not_wrong(cluster):
    options = new_options(timeout=2.0, ack_timeout=0.5)
    pub = make_pub(cluster, options)
    live = Sink(cluster, options, ["a", "b"])
    live.sub.start()
    with publishing_forever(pub):
        wait_for(lambda: len(live.keys()) >= 1000, timeout=30, what="traffic before the outage")
        down = cluster.servers[:2]
        for server in down:
            server.kill()
        # Without a quorum nothing is stored: publishes go unacknowledged and are counted.
        wait_for(lambda: pub.stats.get("drops", "unacknowledged") + pub.stats.get("send_errors") >= 5, timeout=30,
                 what="the publisher to find the stream unavailable")
        for server in down:
            server.start(timeout=120)
        mark = len(live.keys())
        wait_for(lambda: len(live.keys()) >= mark + 2000, timeout=60, what="traffic once a quorum is back")
    pub.close()
    _every_loss_accounted(pub, [live])
    live.close()


def test_the_endpoint_publishes_through_a_leader_change(cluster):
    async def _stream():
        nc = await nats.connect(cluster.url.split(","))
        try:
            await nc.jetstream().add_stream(name="NOTIFY", subjects=["notify.>"], num_replicas=3)
        finally:
            await nc.close()

    asyncio.run(_stream())

    def batch(n, topic):
        return [make_notification(topic, "s3:ObjectCreated:Put", "create", "media", f"k{i}", 100 + i, {"i": i})
                for i in range(n)]

    async def scenario():
        async with open_endpoint(f"{cluster.url}/notify.{{topic}}", options={"timeout": "3"}) as ep:
            first = batch(50, "a")
            await ep.send(first)
            leader = cluster.stream_leader("NOTIFY")
            await asyncio.to_thread(leader.kill)
            for _ in range(100):  # the delivery's retries: the same ids, stored once
                try:
                    await ep.send(first + batch(10, "b"))
                    break
                except EndpointError:
                    await asyncio.sleep(0.1)
            nc = await nats.connect([f"nats://{s.host}:{s.port}" for s in cluster.servers if s is not leader])
            try:
                info = await nc.jetstream().stream_info("NOTIFY")
            finally:
                await nc.close()
            assert info.state.messages == 60  # the resent 50 deduplicated by their Nats-Msg-Id

    asyncio.run(scenario())


def test_a_url_naming_one_server_of_a_cluster_still_makes_the_stream_r3(cluster):
    options = new_options()
    one = SimpleNamespace(url=f"nats://{cluster.servers[0].host}:{cluster.servers[0].port}")
    pub = make_pub(one, options)
    pub.publish("a", "t", "k", "update", 1, {"v": 1})
    pub.close()
    assert _replicas(cluster, options["stream"]) == 3  # the cluster told the client of the other two
