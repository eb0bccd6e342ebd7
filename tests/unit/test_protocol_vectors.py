"""The reference against the conformance vectors of docs/protocol-vectors.json.

Frames go through the two stages a subscriber runs (``decode_header`` when
the frame arrives, ``decode_events`` at delivery), through the single-call
``decode``, and through the header decoder's general path (its fast path
patched away); all must give the outcome the file states. Scenarios run a
:class:`SequenceTracker` the way the subscriber's threads do. The file must
be exactly what tools/protocol_vectors.py writes: the expectations are
written there by hand, from docs/protocol.md, not derived from the decoder.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any
from unittest import mock

import msgpack
import pytest
from dfpubsub.tools.protocol_vectors import render

from dfpubsub import Subscriber, SubscriberOptions, codec, load_driver
from dfpubsub.codec import decode, decode_events, decode_header, unpack_value
from dfpubsub.errors import BadValue, DecodeError
from dfpubsub.events import CONTROL_TOPIC, Bye, EventBatch, Hello
from dfpubsub.metrics import Stats
from dfpubsub.tracker import SequenceTracker, TrackerLimits
from tests.conftest import wait_for

PATH = Path(__file__).resolve().parents[2] / "docs" / "protocol-vectors.json"
DOC = json.loads(PATH.read_text(encoding="utf-8"))
#: Long chains of single-element arrays are written {"$arrays": n} (JSON parsers limit depth).
_CHAIN = 32


def test_the_file_is_what_the_generator_writes():
    assert PATH.read_text(encoding="utf-8") == render()


def test_the_worked_examples_of_the_document_are_vectors():
    doc = (PATH.parent / "protocol.md").read_text(encoding="utf-8")
    dumps = re.findall(r"### 5\.\d[^\n]*\n\n```\n(.*?)```", doc, re.S)
    frames = ["".join("".join(line.split()[1:]) for line in d.strip().splitlines()) for d in dumps]
    hexes = {v["name"]: v["hex"] for v in DOC["vectors"]}
    assert frames == [hexes["example_event"], hexes["example_hello"], hexes["example_bye"]]


def test_names_are_unique_and_every_outcome_is_covered():
    names = [v["name"] for v in DOC["vectors"]] + [s["name"] for s in DOC["scenarios"]]
    assert len(names) == len(set(names))
    errors = {v["expect"]["error"] for v in DOC["vectors"] if "error" in v["expect"]}
    assert errors == {"oversize", "truncated", "not_msgpack", "malformed", "schema_version"}
    stages = {v["expect"]["stage"] for v in DOC["vectors"] if "error" in v["expect"]}
    assert stages == {"header", "events", "any"}
    # Every reason of §8.8 a frame can cause ("subscribed" is the application's doing).
    reasons = {r[1] for sc in DOC["scenarios"] for r in sc["resyncs"]}
    assert reasons == {"first_seen", "gap_expired", "hold_overflow", "bad_event", "publisher_lost", "late",
                       "seq_jump", "publisher_silent", "publisher_evicted", "bad_value"}
    # Schema 2: each way a value is refused at receipt, and each a first decode proves.
    schema2 = {v["name"]: v["expect"] for v in DOC["vectors"] if v["name"].startswith("schema2_")}
    assert {e.get("error") for e in schema2.values()} >= {"not_msgpack", "malformed", "oversize"}
    assert sum("$bad_value" in json.dumps(e) for e in schema2.values()) >= 4


def norm(value: Any) -> Any:
    """A decoded value in the JSON form of the vectors."""
    if isinstance(value, list):
        depth, inner = 0, value
        while isinstance(inner, list) and len(inner) == 1:
            depth, inner = depth + 1, inner[0]
        if depth >= _CHAIN and inner is None:
            return {"$arrays": depth}
        return [norm(x) for x in value]
    if isinstance(value, dict):
        if all(type(k) is str for k in value):
            return {k: norm(x) for k, x in value.items()}
        return {"$map": [[norm(k), norm(x)] for k, x in value.items()]}
    if isinstance(value, bytes):
        return {"$bin": value.hex()}
    if isinstance(value, msgpack.Timestamp):
        return {"$timestamp": [value.seconds, value.nanoseconds]}
    if isinstance(value, msgpack.ExtType):
        return {"$ext": [value.code, value.data.hex()]}
    return value


def value_json(event: Any) -> Any:
    """An event's value as the vectors give it: a schema 2 value decoded, or ``$bad_value``."""
    if event.packed is None:
        return norm(event.value)
    assert event.value is None  # decoded only where something needs it
    try:
        return norm(unpack_value(event.packed))
    except BadValue:
        return {"$bad_value": True}


def envelope_json(env: Any, events: list | None = None) -> dict[str, Any]:
    common = {"pub": env.publisher_id, "name": env.publisher_name, "sent_at": env.sent_at}
    if type(env) is EventBatch:
        return {"kind": "event", **common, "topic": env.topic, "seq": env.seq, "events": [
            {"table": e.table, "key": e.key, "action": e.action.value, "version": e.version,
             "value": value_json(e), "timestamp": e.timestamp} for e in (events if events is not None else env.events)
        ]}
    if type(env) is Hello:
        return {"kind": "hello", **common, "seqs": env.seqs, "reason": env.reason, "max_idle": env.max_idle_time,
                "host": env.host, "more": env.more, **({} if env.rev is None else {"rev": env.rev})}
    assert type(env) is Bye
    return {"kind": "bye", **common, "seqs": env.seqs}


def two_stage(frame: bytes | memoryview, limit: int) -> tuple[str, Any]:
    """("ok", envelope json) or (stage, reason), as the subscriber decides."""
    try:
        env = decode_header(frame, limit)
    except DecodeError as exc:
        return "header", exc.reason
    if type(env) is not EventBatch:
        return "ok", envelope_json(env)
    try:
        events = decode_events(env, limit)
    except DecodeError as exc:
        return "events", exc.reason
    return "ok", envelope_json(env, events)


def single_call(frame: bytes, limit: int) -> tuple[str, Any]:
    try:
        return "ok", envelope_json(decode(frame, limit))
    except DecodeError as exc:
        return "error", exc.reason


def _check(outcome: tuple[str, Any], expect: dict[str, Any]) -> None:
    stage, result = outcome
    if "envelope" in expect:
        assert stage == "ok", f"rejected ({stage}: {result})"
        assert result == expect["envelope"]
    else:
        assert result == expect["error"], f"{stage}: {result}"
        assert stage != "ok"
        if expect["stage"] != "any":
            assert stage == expect["stage"]


@pytest.mark.parametrize("vec", DOC["vectors"], ids=[v["name"] for v in DOC["vectors"]])
def test_vector(vec):
    frame = bytes.fromhex(vec["hex"])
    limit = vec.get("max_message_bytes", DOC["max_message_bytes"])
    expect = vec["expect"]
    _check(two_stage(frame, limit), expect)
    _check(two_stage(memoryview(frame), limit), expect)
    with mock.patch.object(codec, "_event_header", return_value=None):
        _check(two_stage(frame, limit), expect)
    stage, result = single_call(frame, limit)
    if "envelope" in expect:
        assert (stage, result) == ("ok", expect["envelope"])
    else:
        assert (stage, result) == ("error", expect["error"])


def run_scenario(sc: dict[str, Any]) -> tuple[list, list]:
    """Feed the steps to a tracker as the subscriber's receive and dispatch threads do."""
    sub = DOC["subscriber"] | sc.get("settings", {})
    limit = DOC["max_message_bytes"]
    topics = frozenset(sub["topics"])
    limits = TrackerLimits(sub["max_publishers"], sub["max_held_bytes"], sub["max_seq_jump"], sub["max_hello_idle"],
                           sub["forget_silent_after"])
    tracker = SequenceTracker(topics, sub["message_delay_window"], Stats("subscriber", "vectors"),
                              sub["max_held"], sub["dead_after_idles"], sub["max_idle_time"], limits)
    delivered: list = []
    resyncs: list = []

    def deliver(batches: list[EventBatch]) -> None:
        for batch in batches:
            try:
                events = decode_events(batch, limit)
            except DecodeError:
                resyncs.append([batch.topic, "bad_event", batch.publisher_id, [batch.seq, batch.last_seq]])
                continue
            for e in events:
                if e.packed is not None:  # as the subscriber does before delivery (§6.4)
                    try:
                        unpack_value(e.packed)
                    except BadValue:
                        resyncs.append([e.topic, "bad_value", e.publisher_id, None])
                        continue
                delivered.append([e.publisher_id, e.topic, e.seq])

    for step in sc["steps"]:
        now = step["at"]
        if "hex" in step:
            try:
                env = decode_header(bytes.fromhex(step["hex"]), limit)
            except DecodeError:
                env = None
            if type(env) is EventBatch:
                if env.topic in topics:
                    deliver(tracker.on_batch(env, now))
            elif env is not None:
                tracker.on_hello(env, now)
        deliver(tracker.tick(now))
        resyncs.extend([r.topic, r.reason, r.publisher_id, list(r.missing) if r.missing else None]
                       for r in tracker.pop_requests())
    return delivered, resyncs


@pytest.mark.parametrize("sc", DOC["scenarios"], ids=[s["name"] for s in DOC["scenarios"]])
def test_scenario(sc):
    delivered, resyncs = run_scenario(sc)
    assert delivered == sc["delivered"]
    assert resyncs == sc["resyncs"]


@pytest.mark.parametrize("name", ["bad_event_is_repaired_at_once_without_a_gap", "split_hello_at_first_contact",
                                  "foreign_topic_changes_nothing", "duplicates_and_reorder_within_the_window",
                                  "first_seen_mid_stream", "below_a_first_contact_is_a_duplicate",
                                  "a_forged_first_contact_far_ahead_restarts_at_the_real_stream",
                                  "schema2_bad_value_is_repaired_without_a_gap", "mixed_schemas_in_one_stream"])
def test_the_subscriber_does_what_the_scenario_says(name):
    """The real Subscriber (threads, stage 2 at delivery) on the in-process bus, frames sent as they are."""
    sc = next(s for s in DOC["scenarios"] if s["name"] == name)
    driver = load_driver(f"memory://vectors-{name}")
    delivered: list = []
    requests: list = []
    sub = Subscriber(driver.subscriber(Stats("s", name)), DOC["subscriber"]["topics"],
                     lambda e: delivered.append([e.publisher_id, e.topic, e.seq]),
                     on_gap=requests.append, options=SubscriberOptions(initial_sync=False))
    with sub:
        send = driver.publisher(Stats("p", name)).send
        for step in sc["steps"]:
            if "hex" in step:
                frame = bytes.fromhex(step["hex"])
                env = decode_header(frame)
                send(env.topic if type(env) is EventBatch else CONTROL_TOPIC, frame)
        expected = [r for r in sc["resyncs"] if r[1] != "gap_expired"]
        wait_for(lambda: len(delivered) >= len(sc["delivered"]) and len(requests) >= len(expected), 5)
        # No gap is left open, so no gap can expire later.
        wait_for(lambda: sub.tracker.next_deadline() is None, 5)
    assert delivered == sc["delivered"]
    assert [[r.topic, r.reason, r.publisher_id, list(r.missing) if r.missing else None] for r in requests] == expected
