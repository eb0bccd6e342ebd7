import msgpack
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dfpubsub.codec import (
    MAX_SEQ,
    BatchHeader,
    decode,
    encode_batch,
    encode_bye,
    encode_hello,
    pack_event,
    topic_frame,
)
from dfpubsub.errors import DecodeError, InvalidEvent
from dfpubsub.events import Action, Bye, EventBatch, Hello


def batch_bytes(seq=7, events=None, topic="port"):
    events = events or [("port", "p1", "create", 3, {"name": "a", "tags": [1, 2.5, None, True]}, 1700.5)]
    header = BatchHeader("pid-1", "api-0", topic)
    return encode_batch(header, seq, 1234.25, [pack_event(*e) for e in events])


def test_event_batch_round_trip_keeps_every_field():
    events = [
        ("port", "p1", "create", 3, {"name": "a", "tags": [1, 2.5, None, True], "b": b"\x00\xff"}, 1700.5),
        ("port", "p1", "update", 4, {"name": "b"}, 1701),
        ("port", "p1", "delete", 5, None, 1702.0),
    ]
    env = decode(batch_bytes(seq=7, events=events))
    assert isinstance(env, EventBatch)
    assert (env.publisher_id, env.publisher_name, env.topic, env.seq, env.sent_at) == ("pid-1", "api-0", "port", 7, 1234.25)
    assert env.last_seq == 9
    for i, (ev, raw) in enumerate(zip(env.events, events)):
        assert (ev.table, ev.key, ev.action.value, ev.version, ev.value, ev.timestamp) == raw
        assert ev.topic == "port" and ev.publisher_id == "pid-1" and ev.seq == 7 + i
    assert env.events[2].action is Action.DELETE


def test_batch_header_with_many_events_uses_wide_array_headers():
    events = [("t", f"k{i}", "update", i + 1, i, 0.0) for i in range(70000)]
    env = decode(batch_bytes(events=events), max_bytes=1 << 24)
    assert len(env.events) == 70000 and env.events[-1].key == "k69999"


def test_hello_and_bye_round_trip():
    hello = Hello("pid", "name", 5.5, {"a": 3, "b": 0}, "welcome", 2.0, "host1")
    assert decode(encode_hello(hello)) == hello
    bye = Bye("pid", "name", 6.0, {"a": 4})
    assert decode(encode_bye(bye)) == bye


def test_topic_frame_is_nul_terminated():
    assert topic_frame("port") == b"port\x00"
    assert not topic_frame("portbinding").startswith(topic_frame("port"))


def envelope(**over):
    base = {"v": 1, "kind": "event", "pub": "p", "name": "n", "topic": "t", "seq": 1,
            "sent_at": 1.0, "events": [["t", "k", "create", 1, None, 0.0]]}
    base.update(over)
    return msgpack.packb({k: v for k, v in base.items() if v is not ...})


@pytest.mark.parametrize(
    "data,reason",
    [
        (envelope(v=3), "schema_version"),
        (envelope(v=...), "malformed"),
        (envelope(kind="nope"), "malformed"),
        (envelope(seq=0), "malformed"),
        (envelope(seq="1"), "malformed"),
        (envelope(events=[]), "malformed"),
        (envelope(events=[["t", "k", "explode", 1, None, 0.0]]), "malformed"),
        (envelope(events=[["t", "k", "create", -1, None, 0.0]]), "malformed"),
        (envelope(events=[["t", 1, "create", 1, None, 0.0]]), "malformed"),
        (envelope(events=[["t", "k", "create"]]), "malformed"),
        (envelope(pub=""), "malformed"),
        (envelope()[:-3], "truncated"),
        (envelope() + b"\x00", "malformed"),
        (msgpack.packb([1, 2, 3]), "malformed"),
        (b"\xc1garbage", "not_msgpack"),
        (msgpack.packb({"v": 1, "kind": "hello", "pub": "p", "name": "n", "sent_at": 1.0,
                        "seqs": {"t": -4}, "reason": "idle", "max_idle": 1.0, "host": ""}), "malformed"),
        (envelope(v=1.0), "malformed"),
        (envelope(v=True), "malformed"),
        (envelope(events=[["", "k", "create", 1, None, 0.0]]), "malformed"),
        (msgpack.packb({"v": 1, "kind": "hello", "pub": "p", "name": "n", "sent_at": 1.0,
                        "seqs": {b"t": 4}, "reason": "idle", "max_idle": 1.0, "host": ""}), "malformed"),
        (msgpack.packb({"v": 1, "kind": "event", "pub": "p", "name": "n", "topic": "t", "seq": 1, "sent_at": 1.0,
                        "events": [["t", "k", "create", 1, {(1, 2): 3}, 0.0]]}), "not_msgpack"),
    ],
)
def test_bad_frames_raise_typed_errors(data, reason):
    with pytest.raises(DecodeError) as err:
        decode(data)
    assert err.value.reason == reason


def test_values_may_use_any_msgpack_scalar_keys_and_extension_types():
    value = {1: "one", "s": msgpack.ExtType(5, b"xx"), None: [b"\x00"]}
    env = decode(batch_bytes(events=[("t", "k", "create", 1, value, 0.0)]))
    assert env.events[0].value == value


def test_oversize_is_rejected_before_parsing():
    data = batch_bytes(events=[("t", "k", "create", 1, "x" * 5000, 0.0)])
    with pytest.raises(DecodeError) as err:
        decode(data, max_bytes=4096)
    assert err.value.reason == "oversize"


def test_unserialisable_value_is_an_invalid_event():
    with pytest.raises(InvalidEvent):
        pack_event("t", "k", "create", 1, object(), 0.0)


@settings(max_examples=500, deadline=None)
@given(st.binary(max_size=512))
def test_random_bytes_never_escape_as_anything_but_decode_error(data):
    try:
        decode(data)
    except DecodeError as exc:
        assert exc.reason in {"not_msgpack", "truncated", "malformed", "schema_version", "oversize"}


@settings(max_examples=300, deadline=None)
@given(st.data())
def test_mutated_valid_frames_decode_or_fail_cleanly(data):
    raw = bytearray(batch_bytes())
    for _ in range(data.draw(st.integers(1, 4))):
        raw[data.draw(st.integers(0, len(raw) - 1))] = data.draw(st.integers(0, 255))
    cut = data.draw(st.integers(1, len(raw)))
    try:
        decode(bytes(raw[:cut]))
    except DecodeError:
        pass


def test_header_decode_counts_events_and_defers_them():
    from dfpubsub.codec import decode_events, decode_header

    frame = batch_bytes(seq=7, events=[("t", f"k{i}", "update", i + 1, {"i": i}, 0.0) for i in range(5)])
    head = decode_header(frame)
    assert head.events is None and head.count == 5 and head.last_seq == 11 and head.frame == frame
    assert [e.key for e in decode_events(head)] == [f"k{i}" for i in range(5)]
    trimmed = EventBatch(head.publisher_id, head.publisher_name, head.topic, 9, head.sent_at, None, 3, frame)
    assert [e.seq for e in decode_events(trimmed)] == [9, 10, 11]


@settings(max_examples=300, deadline=None)
@given(st.data())
def test_header_decode_agrees_with_full_decode(data):
    from dfpubsub.codec import decode_header

    raw = bytearray(batch_bytes(events=[("t", "k", "create", 1, {"a": [1, 2]}, 0.0)] * 3))
    for _ in range(data.draw(st.integers(0, 3))):
        raw[data.draw(st.integers(0, len(raw) - 1))] = data.draw(st.integers(0, 255))
    frame = bytes(raw[: data.draw(st.integers(1, len(raw)))])
    try:
        full = decode(frame)
    except DecodeError:
        full = None
    try:
        head = decode_header(frame)
    except DecodeError:
        assert full is None, "the header decoder refused a valid frame"
        return
    if full is not None:
        assert (head.publisher_id, head.seq, head.count if hasattr(head, "count") else 0) == (
            full.publisher_id, full.seq, full.count if hasattr(full, "count") else 0)


def _outcome(frame, check_events):
    from dfpubsub.codec import decode_header

    try:
        env = decode_header(frame, check_events=check_events)
    except DecodeError as exc:
        return "error", exc.reason
    # repr: a flipped byte may make sent_at NaN, which equals nothing, not even itself.
    if type(env) is not EventBatch:
        return "ok", repr(env)
    return "ok", (env.publisher_id, env.publisher_name, env.topic, env.seq, repr(env.sent_at), env.count)


@settings(max_examples=400, deadline=None)
@given(st.data())
def test_header_fast_path_decodes_exactly_what_the_general_decoder_does(data):
    """Frames laid out as encode_batch does take a shortcut; it must accept and reject alike."""
    from unittest import mock

    from dfpubsub import codec

    header = BatchHeader(data.draw(st.text(max_size=40)), data.draw(st.text(max_size=300)),
                         data.draw(st.text(max_size=60)))
    n = data.draw(st.integers(0, 20))
    raw = bytearray(encode_batch(header, data.draw(st.integers(0, 2**64 - 1)),
                                 data.draw(st.floats(allow_nan=False)),
                                 [pack_event("t", f"k{i}", "update", i, {"i": [i]}, 0.0) for i in range(n)]))
    for _ in range(data.draw(st.integers(0, 3))):
        raw[data.draw(st.integers(0, len(raw) - 1))] = data.draw(st.integers(0, 255))
    frame = bytes(raw[: data.draw(st.integers(1, len(raw)))])
    view = data.draw(st.booleans())
    for check_events in (False, True):
        fast = _outcome(memoryview(frame) if view else frame, check_events)
        with mock.patch.object(codec, "_event_header", return_value=None):
            general = _outcome(frame, check_events)
        assert fast == general


def test_header_fast_path_reads_every_integer_width_and_wide_strings():
    from dfpubsub.codec import decode_header

    events = [pack_event("t", "k", "create", 1, None, 0.0)] * 17
    for seq in (1, 127, 128, 255, 256, 65535, 65536, 2**32 - 1, 2**32, MAX_SEQ - 16):
        for name in ("api-0", "n" * 31, "n" * 32, "ü" * 127, "n" * 256):  # fixstr, str8, str16 (general path)
            frame = encode_batch(BatchHeader("p" * 32, name, "port"), seq, 2.5, events)
            env = decode_header(memoryview(frame), check_events=False)
            assert (env.publisher_name, env.seq, env.count, env.sent_at) == (name, seq, 17, 2.5)
            assert decode_header(frame).count == 17
    # The last sequence, seq + n - 1, must fit a signed 64-bit integer too.
    for seq in (MAX_SEQ - 15, MAX_SEQ + 1, 2**64 - 1):
        frame = encode_batch(BatchHeader("p" * 32, "api-0", "port"), seq, 2.5, events)
        for decoder in (decode_header, decode):
            with pytest.raises(DecodeError) as err:
                decoder(frame)
            assert err.value.reason == "malformed"


def test_header_decode_takes_memoryviews_of_every_kind():
    from dfpubsub.codec import decode_header

    hello = Hello("pid", "name", 5.5, {"a": 3}, "welcome", 2.0, "host1")
    assert decode_header(memoryview(encode_hello(hello))) == hello
    bye = Bye("pid", "name", 6.0, {"a": 4})
    assert decode_header(memoryview(encode_bye(bye)), check_events=False) == bye
    with pytest.raises(DecodeError) as err:
        decode_header(memoryview(b"\xc1 junk"), check_events=False)
    assert err.value.reason == "not_msgpack"
    frame = batch_bytes(seq=3)
    with pytest.raises(DecodeError) as err:
        decode_header(memoryview(frame + b"\x00"))
    assert err.value.reason == "malformed"
    with pytest.raises(DecodeError) as err:
        decode_header(memoryview(frame[:-2]))
    assert err.value.reason == "truncated"


def test_a_hello_too_large_is_split_in_parts_marked_more_but_the_last():
    from dfpubsub.codec import hello_parts

    seqs = {f"topic-{i:04d}-" + "x" * 200: i + 1 for i in range(40)}
    hello = Hello("pid", "name", 1.0, seqs, "welcome", 5.0, "host")
    assert hello_parts(hello, 1 << 20) == [hello]
    parts = hello_parts(hello, 4096)
    assert len(parts) > 2
    assert [p.more for p in parts] == [True] * (len(parts) - 1) + [False]
    merged = {}
    for part in parts:
        frame = encode_hello(part)
        assert len(frame) <= 4096
        back = decode(frame)
        assert back == part and not (set(back.seqs) & set(merged))
        assert (back.reason, back.max_idle_time, back.host, back.sent_at) == ("welcome", 5.0, "host", 1.0)
        merged.update(back.seqs)
    assert merged == seqs
    # A whole hello is encoded without the key; a part with it.
    assert b"more" not in encode_hello(parts[-1]) and b"\xa4more\xc3" in encode_hello(parts[0])
