"""The Kafka endpoint against librdkafka's mock cluster (real wire protocol on loopback, with
injected request errors, brokers down and leader changes; not a real Kafka cluster)."""

from __future__ import annotations

import asyncio
import json
import threading
import time
import uuid
from collections import defaultdict

import pytest

pytest.importorskip("confluent_kafka")

from confluent_kafka import Consumer, Producer  # noqa: E402

from dfpubsub.endpoints import kafka as kafka_endpoint  # noqa: E402
from dfpubsub.endpoints import open_endpoint  # noqa: E402
from dfpubsub.errors import EndpointConfigError, EndpointError  # noqa: E402
from dfpubsub.notify import NotificationRegistry, Topic, event_name  # noqa: E402
from dfpubsub.notify.delivery import DeliveryOptions, DeliveryThread, DeliveryWorker  # noqa: E402
from dfpubsub.notify.notification import encode, make_notification  # noqa: E402
from dfpubsub.queues import open_queues, shard_for  # noqa: E402
from dfpubsub.testing.kafka_mock import ApiKey, KafkaErr, MockKafkaCluster  # noqa: E402
from tests.conftest import wait_for  # noqa: E402

pytestmark = pytest.mark.timeout(120)

KEYS = 20


@pytest.fixture
def cluster():
    with MockKafkaCluster(3) as c:
        yield c


@pytest.fixture
def unplaced(monkeypatch):
    """(key, version) of every message the producer reported delivered without an offset.

    librdkafka acks such a message implicitly: a later batch of its partition succeeded, and a
    broker accepts a batch only after every earlier sequence of the same producer (KIP-98), so
    the earlier one must be in the log (``rd_kafka_dr_implicit_ack``). The mock checks sequences
    only for transactional producers (``rd_kafka_mock_validate_records``): a batch it failed by
    injection stays out while the next one goes in, and the implicit ack reports a message it
    never wrote. That is the mock's gap, not the endpoint's: the checks below hold every message
    the cluster placed to exactly once, and allow missing only messages acked this way. A test
    may set ``kafka_endpoint.Producer.pause`` to space the messages out, so that a partition has
    several batches in flight (as when a loaded machine is slow to produce)."""
    found: set[tuple[str, int]] = set()

    class RecordingProducer(Producer):
        pause = 0.0

        def produce(self, *args, on_delivery=None, **kwargs):
            if self.pause:
                time.sleep(self.pause)

            def report(err, msg):
                if err is None and msg.offset() is None:
                    found.add((msg.key().decode(), version_of(msg)))
                on_delivery(err, msg)
            return super().produce(*args, on_delivery=report, **kwargs)

    monkeypatch.setattr(kafka_endpoint, "Producer", RecordingProducer)
    return found


def notifications(n, topic="images", keys=KEYS, start=0):
    """``n`` changes round-robin over ``keys`` objects; versions count up per object."""
    return [make_notification(topic, "s3:ObjectCreated:Put", "update", "media", f"obj-{i % keys}", 1 + i, {"i": i})
            for i in range(start, start + n)]


def consume(cluster, topic, want, timeout=20.0):
    """Every message of ``topic`` from the start: (key, version, headers, value) in partition order."""
    c = Consumer({"bootstrap.servers": cluster.bootstrap_servers, "group.id": uuid.uuid4().hex,
                  "auto.offset.reset": "earliest", "enable.auto.commit": False, "log_level": 3})
    c.subscribe([topic])
    out, deadline = [], time.monotonic() + timeout
    try:
        while len(out) < want and time.monotonic() < deadline:
            for m in c.consume(1000, 0.5):
                if m.error() is None:
                    out.append(m)
        while time.monotonic() < deadline:  # anything beyond ``want`` (duplicates) shows here
            more = [m for m in c.consume(1000, 0.5) if m.error() is None]
            if not more:
                break
            out.extend(more)
    finally:
        c.close()
    return out


def version_of(message):
    return int(json.loads(message.value())["Records"][0]["s3"]["object"]["versionId"])


def check_exactly_once_in_key_order(messages, sent, unplaced=frozenset()):
    """Zero lost, zero duplicated, and each object's versions in the order sent; a message in
    ``unplaced`` (acked without an offset, see the fixture) may be missing. A failure says which
    versions are missing or doubled, and where the consumed offsets of each partition jump (a
    hole in the offsets read: the consumer skipped records the log has, or the log lacks them)."""
    by_key = defaultdict(list)
    offsets = defaultdict(list)
    for m in messages:
        by_key[m.key().decode()].append(version_of(m))
        offsets[m.partition()].append(m.offset())
    expected = defaultdict(list)
    for n in sent:
        if (key := f"{n.bucket}/{n.key}", n.version) not in unplaced or n.version in by_key.get(key, ()):
            expected[key].append(n.version)
    got, want = dict(by_key), dict(expected)
    assert got == want, _difference(got, want, offsets)


def _difference(got, want, offsets):
    """What an exactly-once check found instead: versions missing or doubled, and where the offsets
    read from each partition jump."""
    missing = {k: m for k, v in want.items() if (m := sorted(set(v) - set(got.get(k, ()))))}
    doubled = {k: len(v) - len(set(v)) for k, v in got.items() if len(v) != len(set(v))}
    jumps = {p: j for p, o in offsets.items()
             if (j := [(a, b) for a, b in zip(sorted(o), sorted(o)[1:]) if b != a + 1])}
    return f"missing {missing}; doubled {doubled}; offset jumps {jumps}"


def test_s3_records_keyed_by_object_in_order(cluster):
    cluster.create_topic("images", 4)
    sent = notifications(300)

    async def go():
        async with open_endpoint(f"kafka://{cluster.bootstrap_servers}") as ep:
            assert ep.config["enable.idempotence"] is True and ep.config["acks"] == "all"
            await ep.send(sent)

    asyncio.run(go())
    got = consume(cluster, "images", 300)
    check_exactly_once_in_key_order(got, sent)
    assert dict(got[0].headers()) == {"content-type": b"application/json"}


def test_cloudevents_binary_mode_headers(cluster):
    cluster.create_topic("events", 1)
    sent = notifications(3, topic="images")

    async def go():
        async with open_endpoint(f"kafka://{cluster.bootstrap_servers}/events", format="cloudevents") as ep:
            await ep.send(sent)

    asyncio.run(go())
    got = consume(cluster, "events", 3)
    assert len(got) == 3
    headers = dict(got[0].headers())
    assert headers["content-type"] == b"application/json"
    assert headers["ce_specversion"] == b"1.0" and headers["ce_id"] == sent[0].id.encode()
    assert headers["ce_subject"] == b"obj-0" and headers["ce_type"] == b"dfpubsub.s3.ObjectCreated:Put"
    assert json.loads(got[0].value())["key"] == "obj-0"


def test_injected_request_errors_lose_and_duplicate_nothing(cluster, unplaced):
    cluster.create_topic("images", 4)
    for broker in (1, 2, 3):  # several requests of a partition in flight when one fails
        cluster.set_rtt(broker, 20)
    kafka_endpoint.Producer.pause = 0.0005
    sent = notifications(3000)
    retriable = [KafkaErr.NOT_LEADER_FOR_PARTITION, KafkaErr.REQUEST_TIMED_OUT, KafkaErr.NOT_ENOUGH_REPLICAS,
                 KafkaErr.NOT_ENOUGH_REPLICAS_AFTER_APPEND, KafkaErr.LEADER_NOT_AVAILABLE]

    async def go():
        async with open_endpoint(f"kafka://{cluster.bootstrap_servers}", options={"max_batch": "500"}) as ep:
            for i in range(0, len(sent), 500):
                cluster.push_request_errors(ApiKey.PRODUCE, *retriable)
                await ep.send(sent[i:i + 500])

    asyncio.run(go())
    check_exactly_once_in_key_order(consume(cluster, "images", len(sent) - len(unplaced)), sent, unplaced)


def test_broker_down_and_back_and_leader_changes_lose_and_duplicate_nothing(cluster, unplaced):
    cluster.create_topic("images", 4)
    sent = notifications(4000)
    faults_done = threading.Event()

    def faults():
        for broker in (1, 2, 3):
            time.sleep(0.15)
            cluster.broker_down(broker)
            time.sleep(0.3)
            cluster.broker_up(broker)
        for partition in range(4):
            time.sleep(0.1)
            cluster.set_leader("images", partition, 1 + (partition + 1) % 3)
        faults_done.set()

    async def go():
        async with open_endpoint(f"kafka://{cluster.bootstrap_servers}",
                                 options={"max_batch": "100", "timeout": "30"}) as ep:
            thread = threading.Thread(target=faults, daemon=True)
            thread.start()
            i = 0
            while i < len(sent):
                await ep.send(sent[i:i + 100])
                i += 100
                if i == len(sent) // 2:
                    await asyncio.to_thread(faults_done.wait, 20)  # half of it across the faults
            thread.join()

    asyncio.run(go())
    assert faults_done.is_set()
    check_exactly_once_in_key_order(consume(cluster, "images", len(sent) - len(unplaced)), sent, unplaced)


def test_a_partition_without_leader_past_the_timeout_is_an_error_naming_what_was_acked(cluster):
    cluster.create_topic("images", 1)
    cluster.set_leader("images", 0, -1)

    async def go():
        async with open_endpoint(f"kafka://{cluster.bootstrap_servers}", options={"timeout": "1"}) as ep:
            with pytest.raises(EndpointError) as err:
                await ep.send(notifications(5))
            assert err.value.acked == 0
            cluster.set_leader("images", 0, 2)
            # The same endpoint goes on once there is a leader. The client finds it at its next
            # metadata refresh, which a loaded machine can put past one send's timeout: what a
            # send had not got acked is sent again, as df-notify does.
            pending, deadline = notifications(5, start=5), time.monotonic() + 30
            while True:
                try:
                    await ep.send(pending)
                    break
                except EndpointError as exc:
                    if time.monotonic() > deadline:
                        raise
                    pending = pending[exc.acked:]

    asyncio.run(go())
    assert len(consume(cluster, "images", 5)) == 5


def test_a_queue_entry_leaves_only_after_its_delivery_report(cluster, tmp_path, unplaced):
    cluster.create_topic("images", 4)
    queues = open_queues(f"sqlite:///{tmp_path}/q.sqlite")
    registry = NotificationRegistry(queues)
    topic = registry.create_topic(Topic("images", f"kafka://{cluster.bootstrap_servers}", persistent=True,
                                        max_entries=10_000, max_bytes=1 << 28,
                                        endpoint_options={"timeout": "2"}))
    sent = []
    for broker in (1, 2, 3):
        cluster.broker_down(broker)  # nothing can be delivered
    for i in range(500):
        n = make_notification("images", event_name("update"), "update", "media", f"obj-{i % KEYS}", i + 1, {"i": i})
        sent.append(n)
        shard = shard_for("images", topic.shards or 11, "media", n.key)
        data = encode(n)
        queues.commit(shard, queues.reserve(shard, len(data)), data)
    worker = DeliveryWorker(queues, registry, DeliveryOptions("kafka-test", 0.5, 10.0, 0.01, 100, 64))
    with DeliveryThread(worker):
        wait_for(lambda: worker.topic_stats("images").get("send_failures", "retryable") >= 2, timeout=30,
                 what="sends to fail past the endpoint's timeout")
        assert registry.topic_stats("images").entries == 500  # none left its queue without a report
        for broker in (1, 2, 3):
            cluster.broker_up(broker)
        wait_for(lambda: registry.topic_stats("images").entries == 0, timeout=60, what="the queue to drain")
    queues.close()
    got = consume(cluster, "images", 500 - len(unplaced))
    keys = {m.key().decode() for m in got}
    assert keys == {f"media/obj-{i}" for i in range(KEYS)}
    versions = {version_of(m) for m in got}
    assert versions <= {n.version for n in sent}
    assert {n.version for n in sent} - versions <= {v for _, v in unplaced}  # nothing lost


@pytest.mark.parametrize("url, options, match", [
    ("kafka:///images", {}, "not a kafka URL"),
    ("kafka://h:9092", {"kafka-ack-level": "all"}, "kafka-ack-level"),
    ("kafka://u:p@h:9092", {"mechanism": "GSSAPI"}, "mechanism"),
    ("kafka://h:9092", {"acks": "1"}, "unknown option"),
])
def test_bad_options_are_config_errors(url, options, match):
    with pytest.raises(EndpointConfigError, match=match):
        open_endpoint(url, options=options)


def test_ceph_options_map_to_the_producer():
    ep = open_endpoint("kafka://alice:s%40cret@b1:9093,b2:9093/t?use-ssl=true&ca-location=/ca.pem"
                       "&mechanism=SCRAM-SHA-512&kafka-ack-level=none")
    assert ep.config["security.protocol"] == "SASL_SSL" and ep.config["sasl.mechanism"] == "SCRAM-SHA-512"
    assert ep.config["sasl.username"] == "alice" and ep.config["sasl.password"] == "s@cret"
    assert ep.config["ssl.ca.location"] == "/ca.pem" and ep.config["bootstrap.servers"] == "b1:9093,b2:9093"
    assert ep.config["acks"] == "0" and ep.config["enable.idempotence"] is False
    assert ep.kafka_topic == "t" and "s@cret" not in ep.safe_url
