"""Notification endpoints: where persistent notification topics deliver (see docs/endpoints.md).

``open_endpoint(url, format=..., options=...)`` picks the implementation by
URL scheme through the ``dfpubsub.endpoints`` entry points: ``http``/``https``
(webhooks, aiohttp), ``amqp``/``amqps`` (RabbitMQ with publisher confirms,
aio-pika), ``redis``/``rediss`` (streams), ``kafka`` (idempotent producer,
confluent-kafka), ``nats`` (JetStream, nats-py). Implementations import their
library only when chosen.
"""

from .api import ENTRY_POINT_GROUP, FORMATS, Endpoint, available_endpoints, open_endpoint, safe_url

__all__ = ["ENTRY_POINT_GROUP", "FORMATS", "Endpoint", "available_endpoints", "open_endpoint", "safe_url"]
