"""The notification record (msgpack, schema-versioned) and its S3 / CloudEvents renderings."""

from __future__ import annotations

import json
import re
from urllib.parse import unquote, unquote_plus

import msgpack
import pytest

from dfpubsub.endpoints.api import Options, open_endpoint, safe_url
from dfpubsub.errors import (
    DecodeError,
    EndpointConfigError,
    EndpointRejected,
    InvalidEvent,
    NotificationDecodeError,
)
from dfpubsub.notify import records
from dfpubsub.notify.notification import (
    NOTIFICATION_SCHEMA_VERSION,
    PREVIOUS_SCHEMA_VERSION,
    Notification,
    decode,
    encode,
    encode_change,
    make_notification,
    sequencer,
    value_digest,
)
from dfpubsub.store.outbox import versioned

ISO_MS = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z$")


def sample(key: str = "photos/red flower+1.jpg", action: str = "create", version: int = 42, **kw) -> Notification:
    event = {"create": "s3:ObjectCreated:Put", "update": "s3:ObjectCreated:Put", "delete": "s3:ObjectRemoved:Delete"}
    return make_notification(
        "images", event[action], action, "media", key, version, {"mac": "fa:16:3e:00:00:01", "n": 3},
        event_time=1714564800.1234, opaque_data="me@example.com", publisher="api-1", **kw,
    )


# --- the record and its msgpack form -------------------------------------------------------------


def test_round_trip_keeps_every_field():
    n = sample(include_value=True)
    assert n.value == {"mac": "fa:16:3e:00:00:01", "n": 3}
    assert decode(encode(n)) == n
    d = sample(action="delete")
    assert (d.size, d.etag, d.value) == (0, "", None)
    assert decode(encode(d)) == d


def test_id_is_deterministic_and_value_left_out_unless_asked():
    assert sample().id == sample().id == "images:media:photos/red flower+1.jpg:42"
    assert sample().value is None


def test_size_and_etag_are_stable_across_map_order():
    a = value_digest({"a": 1, "b": [1, {"y": 2, "x": 1}]})
    b = value_digest({"b": [1, {"x": 1, "y": 2}], "a": 1})
    assert a == b and len(a[1]) == 32 and a[0] == len(msgpack.packb({"a": 1, "b": [1, {"x": 1, "y": 2}]}))
    assert value_digest({"a": 2})[1] != value_digest({"a": 1})[1]
    with pytest.raises(InvalidEvent):
        value_digest(object())


def test_unknown_action_is_refused():
    with pytest.raises(InvalidEvent):
        make_notification("t", "s3:ObjectCreated:Put", "rename", "b", "k", 1)


def test_the_entry_can_carry_the_value_encoding_and_delivery_derives_size_and_etag():
    value = {"mac": "fa:16:3e:00:00:01", "n": 3}
    n = sample()
    compact = encode(n, msgpack.packb(value))
    assert decode(compact) == n
    # The same etag whatever the order the writer's map was built in (it is the canonical digest).
    assert decode(encode(n, msgpack.packb({"n": 3, "mac": "fa:16:3e:00:00:01"}))).etag == n.etag
    assert len(compact) < len(_previous(n)), "schema 2 is smaller than the map it replaces"


def test_an_entry_the_store_versions_takes_its_version_and_id_from_the_prefix():
    n = sample()
    body = encode_change(n.topic, n.event_name, n.action, n.bucket, n.key, None, n.event_time, n.opaque_data,
                         n.publisher, n.config_id, None, msgpack.packb({"mac": "fa:16:3e:00:00:01", "n": 3}))
    assert decode(versioned(42, body)) == n
    with pytest.raises(NotificationDecodeError) as info:
        decode(body)  # no version anywhere
    assert info.value.reason == "malformed"


def _previous(n: Notification) -> bytes:
    """Schema 1, the map the previous release wrote: still read."""
    return msgpack.packb({
        "v": PREVIOUS_SCHEMA_VERSION, "id": n.id, "topic": n.topic, "event_name": n.event_name, "action": n.action,
        "bucket": n.bucket, "key": n.key, "version": n.version, "size": n.size, "etag": n.etag,
        "event_time": float(n.event_time), "value": n.value, "opaque_data": n.opaque_data, "publisher": n.publisher,
        "config_id": n.config_id,
    })


def test_the_previous_schema_is_still_read():
    for n in (sample(include_value=True), sample(action="delete")):
        assert decode(_previous(n)) == n
    n = sample()
    n.id, n.version = "", 0  # what the previous release's outbox wrote: the store's prefix fills both in
    assert decode(versioned(42, _previous(n))) == sample()


def test_unknown_fields_are_ignored():
    obj = msgpack.unpackb(_previous(sample()))
    obj["added_later"] = [1, 2]
    assert decode(msgpack.packb(obj)) == sample()
    assert decode(msgpack.packb([*msgpack.unpackb(encode(sample())), "added later"])) == sample()


def _compact(**changes) -> bytes:
    """Schema 2 of sample() with fields replaced by position name."""
    fields = ["v", "topic", "event_name", "action", "bucket", "key", "version", "event_time", "opaque_data",
              "publisher", "config_id", "value", "digest"]
    row = msgpack.unpackb(encode(sample()))
    for name, value in changes.items():
        row[fields.index(name)] = value
    return msgpack.packb(row)


@pytest.mark.parametrize(
    "data, reason",
    [
        (b"\xc1", "not_msgpack"),
        (encode(sample())[:-3], "truncated"),
        (encode(sample()) + b"\x00", "malformed"),
        (msgpack.packb([1, 2, 3]), "schema_version"),
        (msgpack.packb([]), "malformed"),
        (msgpack.packb(["2"]), "malformed"),
        (msgpack.packb([NOTIFICATION_SCHEMA_VERSION, "images"]), "malformed"),
        (_compact(v=NOTIFICATION_SCHEMA_VERSION + 1), "schema_version"),
        (_compact(version="42"), "malformed"),
        (_compact(version=True), "malformed"),
        (_compact(action="explode"), "malformed"),
        (_compact(topic=""), "malformed"),
        (_compact(digest=[1]), "malformed"),
        (_compact(digest=["12", "etag"]), "malformed"),
        (_compact(digest="not bytes"), "malformed"),
        (_compact(digest=b"\xc1"), "not_msgpack"),
        (_compact(digest=b"\x92\x01"), "truncated"),
        (msgpack.packb({"id": "x"}), "malformed"),
        (msgpack.packb({**msgpack.unpackb(_previous(sample())), "v": NOTIFICATION_SCHEMA_VERSION + 1}),
         "schema_version"),
        (msgpack.packb({**msgpack.unpackb(_previous(sample())), "v": "1"}), "malformed"),
        (msgpack.packb({**msgpack.unpackb(_previous(sample())), "version": "42"}), "malformed"),
        (msgpack.packb({**msgpack.unpackb(_previous(sample())), "version": True}), "malformed"),
        (msgpack.packb({**msgpack.unpackb(_previous(sample())), "action": "explode"}), "malformed"),
        (msgpack.packb({**msgpack.unpackb(_previous(sample())), "topic": ""}), "malformed"),
        (msgpack.packb("a string"), "malformed"),
        (b"\x00" * 100, "malformed"),
    ],
)
def test_bad_bytes_raise_a_typed_error(data, reason):
    with pytest.raises(NotificationDecodeError) as info:
        decode(data)
    assert info.value.reason == reason
    assert isinstance(info.value, DecodeError)


def test_oversize_and_non_bytes_are_refused():
    with pytest.raises(NotificationDecodeError) as info:
        decode(encode(sample()), max_bytes=10)
    assert info.value.reason == "oversize"
    with pytest.raises(NotificationDecodeError):
        decode("not bytes")  # type: ignore[arg-type]


def test_sequencer_is_fixed_width_hex_that_sorts_like_the_version():
    versions = [0, 1, 9, 10, 15, 16, 255, 256, 4095, 10**6, 2**40, 2**63 - 1]
    seqs = [sequencer(v) for v in versions]
    assert all(len(s) == 16 and re.fullmatch(r"[0-9A-F]{16}", s) for s in seqs)
    assert sorted(seqs) == seqs
    assert [int(s, 16) for s in seqs] == versions
    assert sample(version=255).sequencer == "00000000000000FF"


# --- S3 event records ----------------------------------------------------------------------------


def test_s3_record_follows_the_aws_event_message_structure():
    n = sample(config_id="imgconf")
    message = json.loads(records.to_json(records.s3_message([n], region="zg1")))
    assert list(message) == ["Records"] and len(message["Records"]) == 1
    r = message["Records"][0]
    assert r["eventVersion"] == "2.2"
    assert r["eventSource"] == "aws:s3"
    assert r["awsRegion"] == "zg1"
    assert r["eventTime"] == "2024-05-01T12:00:00.123Z" and ISO_MS.match(r["eventTime"])
    assert r["eventName"] == "ObjectCreated:Put"  # AWS drops the "s3:" of the configured name
    assert r["userIdentity"] == {"principalId": "api-1"}
    assert r["requestParameters"] == {"sourceIPAddress": "0.0.0.0"}
    assert set(r["responseElements"]) == {"x-amz-request-id", "x-amz-id-2"}
    s3 = r["s3"]
    assert s3["s3SchemaVersion"] == "1.0"
    assert s3["configurationId"] == "imgconf"
    assert s3["bucket"] == {"name": "media", "ownerIdentity": {"principalId": ""}, "arn": "arn:aws:s3:zg1::media"}
    obj = s3["object"]
    assert obj["key"] == "photos/red+flower%2B1.jpg"  # form-encoded as AWS does: space is +, + is %2B
    assert unquote_plus(obj["key"]) == n.key
    assert obj["size"] == n.size and isinstance(obj["size"], int)
    assert obj["eTag"] == n.etag
    assert obj["versionId"] == "42"
    assert obj["sequencer"] == "000000000000002A"
    assert r["eventId"] == n.id and r["opaqueData"] == "me@example.com"
    assert r["dfpubsub"] == {"topic": "images", "action": "create", "version": 42, "publisher": "api-1"}


def test_s3_delete_record_has_no_size_or_etag_and_batches_keep_order():
    batch = [sample(key=f"k{i}", version=i + 1) for i in range(5)] + [sample(key="k0", action="delete", version=9)]
    rs = records.s3_message(batch)["Records"]
    assert [r["s3"]["object"]["key"] for r in rs] == ["k0", "k1", "k2", "k3", "k4", "k0"]
    assert rs[-1]["eventName"] == "ObjectRemoved:Delete"
    assert set(rs[-1]["s3"]["object"]) == {"key", "versionId", "sequencer"}
    assert rs[0]["s3"]["configurationId"] == "images"  # no configuration id: the topic's name


@pytest.mark.parametrize(
    "key, encoded",
    [("a b", "a+b"), ("a+b", "a%2Bb"), ("dir/x=1&y;2", "dir/x%3D1%26y%3B2"), ("été", "%C3%A9t%C3%A9"), ("100%", "100%25")],
)
def test_s3_keys_are_url_encoded(key, encoded):
    assert records.s3_key(key) == encoded
    assert unquote_plus(encoded) == key


def test_values_travel_in_the_extension_with_bytes_as_base64():
    n = make_notification("t", "s3:ObjectCreated:Put", "create", "b", "k", 1, {"blob": b"\x00\x01"}, include_value=True)
    r = json.loads(records.to_json(records.s3_message([n])))["Records"][0]
    assert r["dfpubsub"]["value"] == {"blob": "AAE="}


def test_unrenderable_value_is_a_permanent_rejection():
    n = make_notification("t", "s3:ObjectCreated:Put", "create", "b", "k", 1, {b"bytes-key": 1}, include_value=True)
    with pytest.raises(EndpointRejected):
        records.to_json(records.s3_message([n]))


# --- CloudEvents ---------------------------------------------------------------------------------


def test_structured_cloudevent_has_the_required_attributes():
    n = sample(include_value=True)
    event = json.loads(records.to_json(records.cloudevent(n)))
    assert event["specversion"] == "1.0"
    assert event["id"] == n.id
    assert event["source"] == "dfpubsub:s3.media"
    assert event["type"] == "dfpubsub.s3.ObjectCreated:Put"
    assert event["subject"] == n.key
    assert event["time"] == "2024-05-01T12:00:00.123Z"
    assert event["datacontenttype"] == "application/json"
    assert event["sequence"] == n.sequencer
    data = event["data"]
    assert (data["bucket"], data["key"], data["version"], data["eTag"], data["size"]) == (
        "media", n.key, 42, n.etag, n.size)
    assert data["value"] == n.value and data["opaqueData"] == "me@example.com"
    batch = records.cloudevent_batch([sample(key="a"), sample(key="b")])
    assert [e["subject"] for e in batch] == ["a", "b"] and all(e["specversion"] == "1.0" for e in batch)


def test_binary_cloudevent_puts_attributes_in_percent_encoded_headers():
    n = sample(key='été "quoted" 100%')
    headers, body = records.cloudevent_binary(n)
    assert headers["Content-Type"] == "application/json"
    assert "ce-datacontenttype" not in headers
    assert {"ce-specversion", "ce-id", "ce-source", "ce-type"} <= set(headers)
    assert headers["ce-specversion"] == "1.0"
    assert headers["ce-subject"] == "%C3%A9t%C3%A9%20%22quoted%22%20100%25"
    assert unquote(headers["ce-subject"]) == n.key
    assert headers["ce-time"] == "2024-05-01T12:00:00.123Z"
    assert all(re.fullmatch(r"[\x21-\x7e]*", v) for v in headers.values())
    assert json.loads(body) == json.loads(records.to_json(records.cloudevent(n)))["data"]


def test_ce_header_encoding_example_from_the_http_binding():
    assert records.ce_header_value("Euro \u20ac \U0001F600") == "Euro%20%E2%82%AC%20%F0%9F%98%80"


# --- endpoint URLs and options (no connection is made) -------------------------------------------


def test_safe_url_hides_credentials_and_query_values():
    assert safe_url("amqp://guest:secret@h:5672/%2F?exchange=x") == "amqp://h:5672/%2F?exchange=***"
    assert "s3cr3t" not in safe_url("https://h/hook?token=s3cr3t")


@pytest.mark.parametrize(
    "url, options",
    [
        ("ftp://h/x", {}),
        ("nohost", {}),
        ("http:///x", {}),
        ("http://h/x", {"max_batch": "0"}),
        ("http://h/x", {"timeout": "-1"}),
        ("http://h/x", {"verify_ssl": "perhaps"}),
        ("http://h/x", {"mode": "binary"}),  # binary is a CloudEvents mode
        ("http://h/x", {"no_such_option": "1"}),
        ("amqp://h/%2F?exchange=x", {"bogus": "1"}),  # query keys not ours go to the client library
        ("redis://h:1/0", {"maxlen": "zero"}),
    ],
)
def test_bad_urls_and_options_are_config_errors(url, options):
    with pytest.raises(EndpointConfigError) as info:
        open_endpoint(url, options=options)
    assert isinstance(info.value, EndpointRejected)


def test_unknown_format_and_modes():
    with pytest.raises(EndpointConfigError):
        open_endpoint("http://h/x", format="xml")
    ep = open_endpoint("http://h/x", format="cloudevents", options={"mode": "binary", "max_batch": "50"})
    assert ep.max_batch == 1
    assert open_endpoint("http://h/x", options={"max_batch": "7"}).max_batch == 7


def test_options_from_url_query_and_mapping():
    ep = open_endpoint("amqp://u:p@h:5672/%2F?exchange=x&routing_key=rk&max_batch=5", options={"routing_key": "rk2"})
    assert (ep.exchange_name, ep.routing_key, ep.max_batch) == ("x", "rk2", 5)
    assert "p@" not in repr(ep) and "exchange" not in ep.url
    ep = open_endpoint("redis://h:1/0?stream=s:{topic}&maxlen=1000")
    assert (ep.stream, ep.maxlen) == ("s:{topic}", 1000)


def test_option_parsing():
    opts = Options("http://h", {"a": "yes", "n": "3", "header.X-Token": "t"}, frozenset({"a", "n"}), ("header.",))
    assert opts.get_bool("a", False) is True and opts.get_int("n", 1) == 3 and opts.get_float("f", 2.5) == 2.5
    assert opts.prefixed("header.") == {"X-Token": "t"}
