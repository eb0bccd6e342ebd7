"""Rendering notifications as S3 event records and as CloudEvents 1.0 (pure functions, no I/O).

S3: ``{"Records": [...]}`` following the AWS S3 event message structure
(eventVersion 2.2), with Ceph's additions ``eventId`` and ``opaqueData`` and
a ``dfpubsub`` member carrying what S3 has no field for (topic, action,
version, publisher, and the value when the topic carries values). The
fields strict consumers check hold values they accept: ``eventSource`` is
``aws:s3`` and ``requestParameters.sourceIPAddress`` a valid address (the
unspecified ``0.0.0.0``: a change has no client address), as AWS's own parser
models require (aws-lambda-powertools ``S3Model``).

CloudEvents: one event per notification, JSON event format; structured mode
(``application/cloudevents+json``), batched mode (a JSON array,
``application/cloudevents-batch+json``) and the HTTP binary mode (``ce-*``
headers, the body is ``data``).
"""

from __future__ import annotations

import base64
import json
from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Any
from urllib.parse import quote, quote_plus

from ..errors import EndpointRejected
from .notification import Notification

__all__ = [
    "EVENT_VERSION",
    "EVENT_SOURCE",
    "S3_EVENT_SOURCE",
    "SOURCE_IP_PLACEHOLDER",
    "S3_SCHEMA_VERSION",
    "CE_SPECVERSION",
    "JSON",
    "CE_JSON",
    "CE_BATCH_JSON",
    "iso_time",
    "s3_event_name",
    "s3_key",
    "s3_record",
    "s3_message",
    "cloudevent",
    "cloudevent_batch",
    "cloudevent_binary",
    "cloudevent_kafka_binary",
    "ce_header_value",
    "to_json",
]

EVENT_VERSION = "2.2"
#: Prefix of a CloudEvent's ``source``.
EVENT_SOURCE = "dfpubsub:s3"
#: An S3 record's ``eventSource``: consumers of S3 notifications (AWS's parser models
#: among them) accept only this value, whatever S3 implementation sent the record.
S3_EVENT_SOURCE = "aws:s3"
#: ``requestParameters.sourceIPAddress``: a change made through the database has no
#: client address; the unspecified address is a valid one, where ``""`` is not.
SOURCE_IP_PLACEHOLDER = "0.0.0.0"
S3_SCHEMA_VERSION = "1.0"
CE_SPECVERSION = "1.0"
JSON = "application/json"
CE_JSON = "application/cloudevents+json"
CE_BATCH_JSON = "application/cloudevents-batch+json"


def iso_time(ts: float) -> str:
    """Unix seconds as ISO-8601 UTC with milliseconds, e.g. ``2024-05-01T12:00:00.123Z``."""
    return datetime.fromtimestamp(ts, tz=UTC).isoformat(timespec="milliseconds")[:-6] + "Z"


def s3_event_name(event_name: str) -> str:
    """The record's ``eventName``: AWS writes ``ObjectCreated:Put`` for the configured ``s3:ObjectCreated:Put``."""
    return event_name[3:] if event_name.startswith("s3:") else event_name


def s3_key(key: str) -> str:
    """The object key as S3 event records carry it: form-URL-encoded (a space is ``+``,
    ``+`` is ``%2B``), ``/`` kept; ``urllib.parse.unquote_plus`` gives the key back."""
    return quote_plus(key, safe="/")


def _bucket_arn(bucket: str, region: str) -> str:
    return f"arn:aws:s3:{region}::{bucket}"


def _extension(n: Notification) -> dict[str, Any]:
    ext: dict[str, Any] = {"topic": n.topic, "action": n.action, "version": n.version, "publisher": n.publisher}
    if n.value is not None:
        ext["value"] = n.value
    return ext


def s3_record(n: Notification, *, region: str = "") -> dict[str, Any]:
    """One S3 event record (an element of ``Records``).

    ``size`` and ``eTag`` are left out for deletes, as AWS does; ``versionId``
    is the store version and ``sequencer`` its fixed-width hex form.
    """
    obj: dict[str, Any] = {"key": s3_key(n.key)}
    if n.action != "delete":
        obj["size"] = n.size
        obj["eTag"] = n.etag
    obj["versionId"] = str(n.version)
    obj["sequencer"] = n.sequencer
    return {
        "eventVersion": EVENT_VERSION,
        "eventSource": S3_EVENT_SOURCE,
        "awsRegion": region,
        "eventTime": iso_time(n.event_time),
        "eventName": s3_event_name(n.event_name),
        "userIdentity": {"principalId": n.publisher},
        "requestParameters": {"sourceIPAddress": SOURCE_IP_PLACEHOLDER},
        "responseElements": {"x-amz-request-id": n.id, "x-amz-id-2": ""},
        "s3": {
            "s3SchemaVersion": S3_SCHEMA_VERSION,
            "configurationId": n.config_id or n.topic,
            "bucket": {"name": n.bucket, "ownerIdentity": {"principalId": ""}, "arn": _bucket_arn(n.bucket, region)},
            "object": obj,
        },
        "eventId": n.id,
        "opaqueData": n.opaque_data,
        "dfpubsub": _extension(n),
    }


def s3_message(batch: Sequence[Notification], *, region: str = "") -> dict[str, Any]:
    """The S3 event message ``{"Records": [...]}`` for a batch, in order."""
    return {"Records": [s3_record(n, region=region) for n in batch]}


def _ce_attributes(n: Notification, region: str) -> dict[str, str]:
    # "sequence" is the CloudEvents sequence extension: a string whose order is the event order.
    # "source" must be a URI reference: the bucket is percent-encoded.
    bucket = quote(n.bucket, safe="")
    return {
        "specversion": CE_SPECVERSION,
        "id": n.id,
        "source": f"{EVENT_SOURCE}.{quote(region, safe='')}.{bucket}" if region else f"{EVENT_SOURCE}.{bucket}",
        "type": f"dfpubsub.s3.{s3_event_name(n.event_name)}",
        "subject": n.key,
        "time": iso_time(n.event_time),
        "datacontenttype": JSON,
        "sequence": n.sequencer,
    }


def _ce_data(n: Notification) -> dict[str, Any]:
    data: dict[str, Any] = {
        "bucket": n.bucket, "key": n.key, "eventName": n.event_name, "action": n.action,
        "version": n.version, "sequencer": n.sequencer, "topic": n.topic, "opaqueData": n.opaque_data,
        "publisher": n.publisher, "configurationId": n.config_id or n.topic,
    }
    if n.action != "delete":
        data["size"] = n.size
        data["eTag"] = n.etag
    if n.value is not None:
        data["value"] = n.value
    return data


def cloudevent(n: Notification, *, region: str = "") -> dict[str, Any]:
    """One CloudEvent in the JSON event format (structured mode)."""
    event: dict[str, Any] = _ce_attributes(n, region)
    event["data"] = _ce_data(n)
    return event


def cloudevent_batch(batch: Sequence[Notification], *, region: str = "") -> list[dict[str, Any]]:
    """A JSON batch of CloudEvents, in order."""
    return [cloudevent(n, region=region) for n in batch]


def ce_header_value(value: str) -> str:
    """Percent-encode an attribute for an HTTP header as the CloudEvents HTTP binding requires:
    space, ``"``, ``%`` and everything outside printable ASCII."""
    return quote(value, safe="!#$&'()*+,-./:;<=>?@[\\]^_`{|}~")


def cloudevent_binary(n: Notification, *, region: str = "") -> tuple[dict[str, str], bytes]:
    """HTTP binary mode: ``(headers, body)``; ``Content-Type`` carries ``datacontenttype``."""
    attrs = _ce_attributes(n, region)
    headers = {"Content-Type": attrs.pop("datacontenttype")}
    headers.update((f"ce-{name}", ce_header_value(value)) for name, value in attrs.items())
    return headers, to_json(_ce_data(n))


def cloudevent_kafka_binary(n: Notification, *, region: str = "") -> tuple[list[tuple[str, bytes]], bytes]:
    """Kafka binary mode (CloudEvents Kafka protocol binding): ``(headers, value)``; the attributes
    are ``ce_*`` headers in UTF-8 and ``content-type`` carries ``datacontenttype``."""
    attrs = _ce_attributes(n, region)
    headers = [("content-type", attrs.pop("datacontenttype").encode())]
    headers.extend((f"ce_{name}", value.encode()) for name, value in attrs.items())
    return headers, to_json(_ce_data(n))


def _json_default(obj: Any) -> Any:
    # Values are whatever msgpack carries: bytes become base64 text, anything else its str().
    if isinstance(obj, (bytes, bytearray, memoryview)):
        return base64.b64encode(bytes(obj)).decode("ascii")
    return str(obj)


def to_json(obj: Any) -> bytes:
    """Compact UTF-8 JSON; bytes in values become base64 strings.

    Raises :class:`EndpointRejected` for what JSON cannot hold (e.g. a map
    with bytes keys): no endpoint speaking JSON will ever take it.
    """
    try:
        return json.dumps(obj, separators=(",", ":"), ensure_ascii=False, default=_json_default).encode()
    except (TypeError, ValueError) as exc:
        raise EndpointRejected(f"notification cannot be rendered as JSON: {exc}") from exc
