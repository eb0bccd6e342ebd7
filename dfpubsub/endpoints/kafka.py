"""Kafka: one message per notification from an idempotent producer; the delivery report is the ack
(confluent-kafka, librdkafka).

``kafka://[user:password@]host:port[,host:port...][/topic]?kafka-ack-level=broker``:
the options use Ceph's names where Ceph has one (``kafka-ack-level``,
``use-ssl``, ``verify-ssl``, ``ca-location``, ``mechanism``) and may sit in the
URL query or in ``options`` (which win). The Kafka topic is the URL's path, or
the notification topic's name when the path is empty (as Ceph does).

Each message's key is ``{bucket}/{key}``: one object's changes go to one
partition, where Kafka keeps their order. With ``kafka-ack-level=broker`` (the
default) the producer is idempotent with ``acks=all``, so its own retries (a
lost response, a leader change, a broker down and back) neither lose nor
duplicate nor reorder a message; :meth:`send` returns only when the delivery
report of every message of the batch says the cluster has it, and a
notification leaves its queue only then. With ``none`` (``acks=0``) the report
only says the message was written to a socket. Messages carry the S3 event
message with one record (``content-type: application/json``), or a CloudEvent
in the Kafka binding's binary mode (``ce_*`` headers, the data as the value).
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import Mapping, Sequence
from typing import Any
from urllib.parse import unquote, urlsplit

from confluent_kafka import KafkaError, KafkaException, Producer

from ..errors import EndpointConfigError, EndpointError, EndpointRejected
from ..notify.notification import Notification
from ..notify.records import JSON, cloudevent_kafka_binary, s3_message, to_json
from .api import Endpoint, split_query_options

__all__ = ["KafkaEndpoint"]

log = logging.getLogger(__name__)

Headers = list[tuple[str, str | bytes | None]]

_OPTIONS = frozenset({"kafka-ack-level", "use-ssl", "verify-ssl", "ca-location", "mechanism"})
_MECHANISMS = ("PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512")
#: Delivery errors no retry of the same message will cure.
_PERMANENT = frozenset({
    KafkaError.MSG_SIZE_TOO_LARGE, KafkaError.INVALID_MSG_SIZE,
    KafkaError.TOPIC_AUTHORIZATION_FAILED, KafkaError.TOPIC_EXCEPTION, KafkaError.INVALID_RECORD,
})


class KafkaEndpoint(Endpoint):
    """Produces each notification as one message keyed by its object.

    Options: ``kafka-ack-level`` (``broker``: idempotent, ``acks=all``, the
    default; ``none``: ``acks=0``), ``use-ssl`` (TLS, default false),
    ``verify-ssl`` (check the brokers' certificates, default true),
    ``ca-location`` (PEM CA file), ``mechanism`` (SASL mechanism when the URL
    has a user: PLAIN, SCRAM-SHA-256, SCRAM-SHA-512; default PLAIN), ``timeout``
    (how long a message may take to be delivered, default 10 s), ``max_batch``
    (messages awaiting their reports at once, default 1000).
    """

    OPTIONS = _OPTIONS
    DEFAULT_MAX_BATCH = 1000

    def __init__(self, url: str, format: str = "s3", options: Mapping[str, str] | None = None):
        broker_url, from_query = split_query_options(url, _OPTIONS | Endpoint.COMMON_OPTIONS)
        super().__init__(broker_url, format, {**from_query, **(options or {})})
        parts = urlsplit(broker_url)
        hosts = parts.netloc.rpartition("@")[2]
        if parts.scheme != "kafka" or not hosts or any(not h.strip() for h in hosts.split(",")):
            raise EndpointConfigError(f"not a kafka URL with a broker: {self.safe_url!r}")
        self.kafka_topic = unquote(parts.path.lstrip("/"))
        self.ack_level = self.options.get_choice("kafka-ack-level", ("broker", "none"), "broker")
        self.config = self._config(hosts, parts.username, parts.password)
        self._producer: Producer | None = None
        self._lock = threading.Lock()

    def _config(self, hosts: str, user: str | None, password: str | None) -> dict[str, Any]:
        broker = self.ack_level == "broker"
        config: dict[str, Any] = {
            "bootstrap.servers": hosts,
            "enable.idempotence": broker,
            "acks": "all" if broker else "0",
            # Every message gets its final report within the timeout: none is still in flight when
            # send() gives up, so a later resend of the batch cannot meet a late first copy.
            "message.timeout.ms": int(self.timeout * 1000),
            "socket.connection.setup.timeout.ms": max(1000, int(self.timeout * 1000)),
            "linger.ms": 2,
            "log_level": 3,
        }
        tls = self.options.get_bool("use-ssl", False)
        if user:
            config.update({
                "security.protocol": "SASL_SSL" if tls else "SASL_PLAINTEXT",
                "sasl.mechanism": self.options.get_choice("mechanism", _MECHANISMS, "PLAIN"),
                "sasl.username": unquote(user), "sasl.password": unquote(password or ""),
            })
        elif tls:
            config["security.protocol"] = "SSL"
        if tls:
            config["enable.ssl.certificate.verification"] = self.options.get_bool("verify-ssl", True)
            ca = self.options.get_str("ca-location", "")
            if ca:
                config["ssl.ca.location"] = ca
        return config

    def _message(self, n: Notification) -> tuple[Headers, bytes]:
        if self.format == "s3":
            return [("content-type", JSON.encode())], to_json(s3_message((n,), region=self.region))
        ce_headers, value = cloudevent_kafka_binary(n, region=self.region)
        headers: Headers = list(ce_headers)
        return headers, value

    def _ready(self) -> Producer:
        with self._lock:
            if self._producer is None:
                try:
                    # librdkafka's own warnings go through logging (structured), not to stderr.
                    self._producer = Producer(self.config, logger=log)
                except KafkaException as exc:
                    raise EndpointConfigError(f"endpoint {self.safe_url}: {exc}") from exc
            return self._producer

    async def send(self, batch: Sequence[Notification]) -> None:
        """Produce ``batch`` in order, :attr:`max_batch` at a time; return once every delivery report is in."""
        acked = 0
        for chunk in self.chunks(batch):
            messages = [self._message(n) for n in chunk]
            reports: list[KafkaError | None | bool] = [False] * len(chunk)  # False: no report yet
            producer = self._ready()
            # librdkafka blocks in produce() only when its queue is full, and calls back from flush():
            # both belong on a thread of their own, off the event loop.
            await asyncio.to_thread(self._produce, producer, chunk, messages, reports)
            for i, report in enumerate(reports):
                if report is None:
                    continue
                if report is False:
                    raise EndpointError(f"{self.safe_url}: no delivery report for {chunk[i].id!r} in time", acked + i)
                assert isinstance(report, KafkaError)
                if report.fatal():
                    self._drop()  # an idempotent producer that failed fatally cannot go on
                error = f"{self.safe_url}: message {chunk[i].id!r}: {report.str()}"
                if report.code() in _PERMANENT:
                    raise EndpointRejected(error, acked + i)
                raise EndpointError(error, acked + i)
            acked += len(chunk)

    def _produce(self, producer: Producer, chunk: Sequence[Notification], messages: list[tuple[Headers, bytes]],
                 reports: list[KafkaError | None | bool]) -> None:
        left = [len(chunk)]
        done = threading.Event()
        counting = threading.Lock()

        def report(i: int) -> Any:
            def on_delivery(err: KafkaError | None, _msg: Any) -> None:
                # Called from whichever thread polls: sends of other shards poll the same producer.
                reports[i] = err
                with counting:
                    left[0] -= 1
                    if not left[0]:
                        done.set()
            return on_delivery

        for i, (n, (headers, value)) in enumerate(zip(chunk, messages)):
            while True:
                try:
                    producer.produce(self.kafka_topic or n.topic, value=value, key=f"{n.bucket}/{n.key}".encode(),
                                     headers=headers, on_delivery=report(i))
                    break
                except BufferError:  # the local queue is full: let deliveries drain it
                    producer.poll(0.05)
                except KafkaException as exc:
                    reports[i] = exc.args[0]
                    left[0] -= 1
                    break
        if not left[0]:
            return
        # message.timeout.ms bounds each message: every report is in well before this deadline.
        deadline = time.monotonic() + self.timeout + 5
        while not done.is_set() and time.monotonic() < deadline:
            producer.poll(0.005)

    def _drop(self) -> None:
        with self._lock:
            producer, self._producer = self._producer, None
        if producer is not None:
            producer.flush(0)

    async def close(self) -> None:
        """Wait (up to the timeout) for messages still in flight, then release the producer."""
        with self._lock:
            producer, self._producer = self._producer, None
        if producer is not None:
            await asyncio.to_thread(producer.flush, self.timeout)
