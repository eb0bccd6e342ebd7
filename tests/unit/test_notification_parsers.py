"""Notification records validate with the parsers their consumers use.

AWS's parser models (aws-lambda-powertools ``S3Model``) for S3 event records,
and the CloudEvents SDK (its spec-following ``core`` bindings, and the older
``v1`` API many consumers still call) for CloudEvents in structured, batched
and binary mode. Every event kind is rendered from a sample notification and
parsed back; what the parser reads must be what was sent.
"""

from __future__ import annotations

import json
from datetime import datetime
from ipaddress import ip_network
from urllib.parse import unquote_plus

import pytest
from aws_lambda_powertools.utilities.parser.models import S3Model
from cloudevents.core.bindings import http as ce_http
from cloudevents.core.formats.json import JSONFormat
from cloudevents.v1.http import from_http as v1_from_http

from dfpubsub.notify import records
from dfpubsub.notify.notification import Notification, make_notification
from dfpubsub.notify.topics import S3_EVENT_NAMES

KEYS = ["photos/red flower+1.jpg", "plain", "naïve/ü €%20.txt"]
VALUES = [{"mac": "fa:16:3e:00:00:01", "n": 3, "blob": b"\x00\xff"}, None]


def samples() -> list[Notification]:
    """A notification of every action (so every event name), with and without a value and region."""
    out = []
    for action, event_name in S3_EVENT_NAMES.items():
        for i, key in enumerate(KEYS):
            out.append(make_notification(
                "images", event_name, action, "media", key, 40 + i, VALUES[i % 2],
                event_time=1714564800.1234 + i, opaque_data="me@example.com", publisher="api-1",
                include_value=i % 2 == 0,
            ))
    return out


SAMPLES = samples()
IDS = [f"{n.action}-{n.key}" for n in SAMPLES]


@pytest.mark.parametrize("region", ["", "zone1"])
def test_every_s3_record_validates_with_powertools_s3model(region):
    message = json.loads(records.to_json(records.s3_message(SAMPLES, region=region)))
    model = S3Model.model_validate(message)
    assert len(model.Records) == len(SAMPLES)
    for n, rec in zip(SAMPLES, model.Records):
        assert rec.eventSource == "aws:s3"
        assert rec.eventName == records.s3_event_name(n.event_name)
        assert rec.requestParameters.sourceIPAddress == ip_network("0.0.0.0")
        assert rec.awsRegion == region
        assert rec.eventTime.timestamp() == pytest.approx(n.event_time, abs=1e-3)
        assert unquote_plus(rec.s3.object.key) == n.key
        assert rec.s3.object.versionId == str(n.version)
        assert rec.s3.object.sequencer == n.sequencer
        assert rec.s3.bucket.name == n.bucket
        if n.action == "delete":
            assert rec.s3.object.size is None and rec.s3.object.eTag is None
        else:
            assert (rec.s3.object.size, rec.s3.object.eTag) == (n.size, n.etag)
    assert set(S3_EVENT_NAMES) == {n.action for n in SAMPLES}


def _attributes(event) -> dict:
    attrs = dict(event.get_attributes())
    attrs["time"] = attrs["time"].isoformat() if not isinstance(attrs["time"], str) else attrs["time"]
    return attrs


def _expected(n: Notification, region: str) -> dict:
    ce = records.cloudevent(n, region=region)
    return {k: v for k, v in ce.items() if k != "data"}


def _same_time(got: str, sent: str) -> None:
    assert datetime.fromisoformat(got) == datetime.fromisoformat(sent.replace("Z", "+00:00"))


@pytest.mark.parametrize("n", SAMPLES, ids=IDS)
@pytest.mark.parametrize("region", ["", "zone 1/ü"])
def test_structured_cloudevent_parses_with_the_sdk(n, region):
    body = records.to_json(records.cloudevent(n, region=region))
    sent = _expected(n, region)
    event = ce_http.from_http(ce_http.HTTPMessage({"Content-Type": records.CE_JSON}, body), JSONFormat())
    got = _attributes(event)
    _same_time(got.pop("time"), sent.pop("time"))
    assert got == sent
    assert event.get_data() == json.loads(records.to_json(records.cloudevent(n, region=region)))["data"]
    legacy = v1_from_http({"Content-Type": records.CE_JSON}, body)
    assert legacy["id"] == n.id and legacy["subject"] == n.key and legacy["source"] == sent["source"]
    assert legacy.data == event.get_data()


@pytest.mark.parametrize("n", SAMPLES, ids=IDS)
@pytest.mark.parametrize("region", ["", "zone 1/ü"])
def test_binary_cloudevent_parses_with_the_sdk(n, region):
    headers, body = records.cloudevent_binary(n, region=region)
    sent = _expected(n, region)
    event = ce_http.from_http(ce_http.HTTPMessage(headers, body), JSONFormat())
    got = _attributes(event)
    # The HTTP binding percent-decodes header values; the core bindings follow it.
    _same_time(got.pop("time"), sent.pop("time"))
    assert got == sent
    assert event.get_data() == json.loads(body)
    # The older API validates the same message but does not percent-decode headers.
    legacy = v1_from_http(headers, body)
    assert legacy["specversion"] == "1.0" and legacy["type"] == sent["type"]
    assert legacy.data == event.get_data()


def test_batched_cloudevents_parse_one_by_one():
    batch = json.loads(records.to_json(records.cloudevent_batch(SAMPLES, region="zone1")))
    assert len(batch) == len(SAMPLES)
    for n, raw in zip(SAMPLES, batch):
        event = JSONFormat().read(None, json.dumps(raw).encode())
        assert event.get_id() == n.id and event.get_extension("sequence") == n.sequencer
