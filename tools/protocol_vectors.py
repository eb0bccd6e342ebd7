"""Write docs/protocol-vectors.json: conformance vectors of the wire protocol (docs/protocol.md).

Every frame is assembled here byte by byte (or from the worked examples of the
document) and its expected outcome is written by hand from the specification,
never computed by the reference decoder: tests/unit/test_protocol_vectors.py
then checks the reference against the file, and that the file is what this
script writes. Another implementation runs the same file (format in the
file's ``format`` member and in docs/protocol.md §11).

    python -m dfpubsub.tools.protocol_vectors [PATH]
"""

from __future__ import annotations

import json
import math
import struct
import sys
from pathlib import Path
from typing import Any

import msgpack

__all__ = ["vectors", "scenarios", "document", "main"]

PID = "0123456789abcdef0123456789abcdef"
PID2 = "fedcba9876543210fedcba9876543210"
PID3 = "00000000000000000000000000000003"
MAX_SEQ = (1 << 63) - 1
LIMIT = 1 << 20


class Raw(bytes):
    """Bytes that go into a frame as they are (an odd but valid encoding, or a defect)."""


def pk(x: Any) -> bytes:
    return bytes(x) if isinstance(x, Raw) else msgpack.packb(x)


def fmap(*pairs: tuple[Any, Any]) -> Raw:
    n = len(pairs)
    head = bytes((0x80 | n,)) if n < 16 else b"\xde" + struct.pack(">H", n)
    return Raw(head + b"".join(pk(k) + pk(v) for k, v in pairs))


def farr(*items: Any) -> Raw:
    n = len(items)
    head = bytes((0x90 | n,)) if n < 16 else b"\xdc" + struct.pack(">H", n)
    return Raw(head + b"".join(pk(i) for i in items))


def ev(table: Any = "port", key: Any = "p1", action: Any = "create", version: Any = 3, value: Any = None,
       ts: Any = 1700000000.25, *extra: Any) -> Raw:
    return farr(table, key, action, version, value, ts, *extra)


def f64(x: float) -> Raw:
    return Raw(b"\xcb" + struct.pack(">d", x))


def event_frame(*, v: Any = 1, kind: Any = "event", pub: Any = PID, name: Any = "api-0", topic: Any = "port",
                seq: Any = 7, sent_at: Any = 1700000000.75, events: Any = None, extra: tuple[tuple[Any, Any], ...] = (),
                drop: tuple[str, ...] = ()) -> Raw:
    fields = [("v", v), ("kind", kind), ("pub", pub), ("name", name), ("topic", topic), ("seq", seq),
              ("sent_at", f64(sent_at) if type(sent_at) is float else sent_at),
              ("events", farr(ev()) if events is None else events)]
    return fmap(*[(k, x) for k, x in fields if k not in drop], *extra)


def hello_frame(*, seqs: Any = None, reason: Any = "welcome", max_idle: Any = 5.0, host: Any = "node-1",
                pub: Any = PID, extra: tuple[tuple[Any, Any], ...] = (), drop: tuple[str, ...] = (),
                kind: str = "hello", v: Any = 1) -> Raw:
    sent_at = 1700000002.0 if kind == "bye" else 1700000001.0
    fields = [("v", v), ("kind", kind), ("pub", pub), ("name", "api-0"), ("sent_at", f64(sent_at)),
              ("seqs", fmap(("port", 8)) if seqs is None else seqs), ("reason", reason),
              ("max_idle", f64(max_idle) if type(max_idle) is float else max_idle), ("host", host)]
    if kind == "bye":
        fields = fields[:6]
    return fmap(*[(k, x) for k, x in fields if k not in drop], *extra)


def event_json(table: str = "port", key: str = "p1", action: str = "create", version: int = 3, value: Any = None,
               timestamp: float = 1700000000.25) -> dict[str, Any]:
    return {"table": table, "key": key, "action": action, "version": version, "value": value,
            "timestamp": timestamp}


def batch_json(*, pub: str = PID, name: str = "api-0", topic: str = "port", seq: int = 7,
               sent_at: float = 1700000000.75, events: list[Any] | None = None) -> dict[str, Any]:
    return {"kind": "event", "pub": pub, "name": name, "sent_at": sent_at, "topic": topic, "seq": seq,
            "events": [event_json()] if events is None else events}


def hello_json(*, seqs: dict[str, Any] | None = None, reason: str = "welcome", max_idle: float = 5.0, host: str = "node-1",
               more: bool = False, pub: str = PID, rev: int | None = None) -> dict[str, Any]:
    return {"kind": "hello", "pub": pub, "name": "api-0", "sent_at": 1700000001.0,
            "seqs": {"port": 8} if seqs is None else seqs, "reason": reason, "max_idle": max_idle,
            "host": host, "more": more, **({} if rev is None else {"rev": rev})}


def bye_json(seqs: dict[str, Any] | None = None) -> dict[str, Any]:
    return {"kind": "bye", "pub": PID, "name": "api-0", "sent_at": 1700000002.0,
            "seqs": {"port": 8} if seqs is None else seqs}


def packed(value: bytes) -> bytes:
    """A value as schema 2 carries it: its msgpack bytes in a bin (plain bytes pack as bin)."""
    return bytes(value)


def nested(depth: int) -> Raw:
    """A value of ``depth`` arrays, one in the other, around nil."""
    return Raw(b"\x91" * depth + b"\xc0")


def nested_json(depth: int) -> Any:
    return {"$arrays": depth}


# The events of the worked example of docs/protocol.md §5.1.
E1 = ev(value=fmap(("mac", "fa:16:3e:00:00:01"), ("up", True)))
E2 = ev(key="p0", action="delete", version=9, value=None, ts=1700000000.5)


def ok(name: str, frame: bytes, envelope: dict[str, Any], note: str = "", **kw: Any) -> dict[str, Any]:
    return {"name": name, "note": note, "hex": frame.hex(), "expect": {"envelope": envelope}, **kw}


def bad(name: str, frame: bytes, reason: str, stage: str, note: str = "", **kw: Any) -> dict[str, Any]:
    return {"name": name, "note": note, "hex": frame.hex(), "expect": {"error": reason, "stage": stage}, **kw}


def vectors() -> list[dict[str, Any]]:
    """Single frames and what a receiver makes of them."""
    e1 = event_json(value={"mac": "fa:16:3e:00:00:01", "up": True})
    e2 = event_json(key="p0", action="delete", version=9, value=None, timestamp=1700000000.5)
    example = event_frame(events=farr(E1, E2))
    too_deep_ok = event_frame(events=farr(ev(value=nested(1021))))
    too_deep = event_frame(events=farr(ev(value=nested(1022))))
    example2 = event_frame(v=2, events=farr(ev(value=packed(fmap(("mac", "fa:16:3e:00:00:01"), ("up", True)))), E2))
    v = [
        # --- valid frames -------------------------------------------------------------------------
        ok("example_event", example, batch_json(events=[e1, e2]), "the worked example of §5.1"),
        ok("example_hello", hello_frame(), hello_json(), "the worked example of §5.2"),
        ok("example_bye", hello_frame(kind="bye", seqs=fmap(("port", 8))), bye_json(), "the worked example of §5.3"),
        ok("key_order_is_free",
           fmap(("events", farr(ev())), ("seq", 7), ("topic", "port"), ("sent_at", f64(1700000000.75)),
                ("name", "api-0"), ("pub", PID), ("kind", "event"), ("v", 1)),
           batch_json(), "keys in reverse order"),
        ok("wide_integers",
           event_frame(v=Raw(b"\xd3" + struct.pack(">q", 1)), seq=Raw(b"\xcf" + struct.pack(">Q", 7)),
                       events=Raw(b"\xdd\x00\x00\x00\x01" + ev(version=Raw(b"\xd0\x03")))),
           batch_json(), "v as int64, seq as uint64, events as array32, version as int8: any width"),
        ok("int_and_float32_times",
           event_frame(sent_at=1700000000, events=farr(ev(ts=Raw(b"\xca" + struct.pack(">f", 0.5))))),
           batch_json(sent_at=1700000000, events=[event_json(timestamp=0.5)]),
           "sent_at as an integer, a timestamp as float32"),
        ok("unknown_keys_are_ignored",
           event_frame(extra=(("trace", fmap(("id", "x"))), (1, 2), (Raw(b"\xc4\x01v"), 9), (None, True))),
           batch_json(), "an unknown str key, and keys of other types (int, bin, nil), are ignored"),
        ok("extra_event_items_are_ignored", event_frame(events=farr(ev(), ev(version=4), farr(
            "port", "p1", "create", 5, None, f64(1700000000.25), "future", fmap(("x", 1))))),
           batch_json(events=[event_json(), event_json(version=4), event_json(version=5)]),
           "items after index 5 of an event"),
        ok("delete_value_is_dropped",
           event_frame(events=farr(ev(action="delete", value=fmap(("stale", 1))))),
           batch_json(events=[event_json(action="delete", value=None)]), "a delete delivers nil"),
        ok("empty_name_and_key", event_frame(name="", events=farr(ev(key=""))),
           batch_json(name="", events=[event_json(key="")])),
        ok("duplicate_key_last_wins", event_frame(extra=(("name", "api-1"),)), batch_json(name="api-1"),
           "a repeated key: the last occurrence counts"),
        ok("control_topic_decodes", event_frame(topic="$ctl"), batch_json(topic="$ctl"),
           "decoding only needs a non-empty topic; the subscriber drops it as foreign_topic"),
        ok("value_keys_of_any_scalar_type",
           event_frame(events=farr(ev(value=fmap((7, "a"), (True, "b"), (None, "c"), (1.5, "d"),
                                                 (Raw(b"\xc4\x01k"), "e"), ("s", "f"))))),
           batch_json(events=[event_json(value={"$map": [[7, "a"], [True, "b"], [None, "c"], [1.5, "d"],
                                                         [{"$bin": "6b"}, "e"], ["s", "f"]]})])),
        ok("extension_types_pass_through",
           event_frame(events=farr(ev(value=farr(Raw(b"\xd4\x05\x01"), Raw(b"\xc7\x03\x7f" + b"abc"),
                                                 Raw(b"\xd6\xff" + struct.pack(">I", 1700000000)),
                                                 Raw(b"\xc7\x0c\xff" + struct.pack(">Iq", 5, -1)))))),
           batch_json(events=[event_json(value=[{"$ext": [5, "01"]}, {"$ext": [127, "616263"]},
                                                {"$timestamp": [1700000000, 0]}, {"$timestamp": [-1, 5]}])]),
           "application types 0..127 opaque; type -1 a timestamp (32 and 96 bit forms)"),
        ok("largest_sequences",
           event_frame(seq=MAX_SEQ - 1, events=farr(ev(), ev(key="p2"))),
           batch_json(seq=MAX_SEQ - 1, events=[event_json(), event_json(key="p2")]),
           "seq + n - 1 = 2^63 - 1"),
        ok("extension_in_unknown_key", hello_frame(extra=(("x", Raw(b"\xd4\x05\x01")),)), hello_json()),
        ok("largest_version", event_frame(events=farr(ev(version=2**64 - 1))),
           batch_json(events=[event_json(version=2**64 - 1)])),
        ok("hello_repeated_topic_last_wins", hello_frame(seqs=fmap(("port", 3), ("port", 8))), hello_json()),
        ok("largest_hello_sequence", hello_frame(seqs=fmap(("port", MAX_SEQ), ("new", 0))),
           hello_json(seqs={"port": MAX_SEQ, "new": 0})),
        ok("depth_1024", too_deep_ok, batch_json(events=[event_json(value=nested_json(1021))]),
           "envelope, events, event and 1021 arrays in the value: 1024 containers, the most allowed"),
        ok("hello_part", hello_frame(extra=(("more", True),)), hello_json(more=True),
           "a part of a split hello that is not the last"),
        ok("hello_more_false", hello_frame(extra=(("more", False),)), hello_json()),
        ok("hello_bookmark", hello_frame(reason="bookmark", extra=(("rev", 1234),)),
           hello_json(reason="bookmark", rev=1234), "a feed publisher's bookmark (§7.4)"),
        ok("hello_bookmark_largest", hello_frame(extra=(("rev", Raw(b"\xcf" + b"\xff" * 8)),)),
           hello_json(rev=2**64 - 1), "a uint64 revision"),
        ok("hello_bookmark_zero_as_int64", hello_frame(extra=(("rev", Raw(b"\xd3" + b"\x00" * 8)),)),
           hello_json(rev=0), "any encoding of an integer"),
        ok("hello_max_idle_zero", hello_frame(max_idle=0), hello_json(max_idle=0),
           "an integer 0: no idle hellos, never taken as dead"),
        ok("hello_max_idle_negative", hello_frame(max_idle=-1.0), hello_json(max_idle=-1.0)),
        ok("hello_any_reason", hello_frame(reason="rebalance", seqs=fmap()),
           hello_json(reason="rebalance", seqs={})),
        ok("hello_with_events_key", hello_frame(extra=(("events", 5),)), hello_json(),
           "'events' is an unknown key in a hello, whatever its type"),
        ok("bye_with_events_array", hello_frame(kind="bye", seqs=fmap(("port", 8)), extra=(("events", farr(1)),)),
           bye_json()),
        ok("value_repeated_key_last_wins", event_frame(events=farr(ev(value=fmap(("a", 1), ("b", 2), ("a", 3))))),
           batch_json(events=[event_json(value={"a": 3, "b": 2})]),
           "a key repeated inside a value: the last occurrence counts, as for envelope keys (§4.1)"),
        ok("exactly_the_limit", example, batch_json(events=[e1, e2]), max_message_bytes=len(example)),
        # --- schema 2: values as their msgpack bytes (§4.6) -----------------------------------------
        ok("schema2_example", example2, batch_json(events=[e1, e2]),
           "the worked example of §5.1 in schema 2: the value's map in a bin"),
        ok("schema2_delete_value_is_dropped",
           event_frame(v=2, events=farr(ev(action="delete", value=packed(fmap(("stale", 1)))))),
           batch_json(events=[event_json(action="delete", value=None)]), "a delete delivers nil, bin or not"),
        ok("schema2_value_keys_of_any_scalar_type",
           event_frame(v=2, events=farr(ev(value=packed(fmap((7, "a"), (None, "c"), (Raw(b"\xc4\x01k"), "e")))))),
           batch_json(events=[event_json(value={"$map": [[7, "a"], [None, "c"], [{"$bin": "6b"}, "e"]]})])),
        ok("schema2_value_repeated_key_last_wins",
           event_frame(v=2, events=farr(ev(value=packed(fmap(("a", 1), ("b", 2), ("a", 3)))))),
           batch_json(events=[event_json(value={"a": 3, "b": 2})]),
           "proved at first decode, taken as schema 1 takes it: the last occurrence counts"),
        ok("schema2_value_depth_1021", event_frame(v=2, events=farr(ev(value=packed(b"\x81\xc0" + nested(1020))))),
           batch_json(events=[event_json(value={"$map": [[None, nested_json(1020)]]})]),
           "a map and 1020 arrays in it: 1021 containers, the most a value may nest (as in schema 1)"),
        ok("schema2_bad_utf8_at_first_decode",
           event_frame(v=2, events=farr(ev(value=packed(Raw(b"\x81\xa1a\xa1\xff"))),
                                        ev(key="p2", value=packed(fmap(("n", 1)))))),
           batch_json(events=[event_json(value={"$bad_value": True}), event_json(key="p2", value={"n": 1})]),
           "the structure is sound, the content is not: delivered without it, counted, its key repaired (§6.4)"),
        ok("schema2_array_key_at_first_decode",
           event_frame(v=2, events=farr(ev(value=packed(fmap((farr(1), 1)))))),
           batch_json(events=[event_json(value={"$bad_value": True})]), "a container as a map key (§6.4)"),
        ok("schema2_reserved_extension_at_first_decode",
           event_frame(v=2, events=farr(ev(value=packed(fmap(("x", Raw(b"\xd4\xfe\x01"))))))),
           batch_json(events=[event_json(value={"$bad_value": True})]), "types -128..-2 (§6.4)"),
        ok("schema2_bad_timestamp_at_first_decode",
           event_frame(v=2, events=farr(ev(value=packed(fmap(("t", Raw(b"\xd5\xff\x00\x01"))))))),
           batch_json(events=[event_json(value={"$bad_value": True})]), "a timestamp of 2 bytes (§6.4)"),
        ok("schema2_hello", hello_frame(v=2), hello_json(), "a hello or bye at v 2 means what it does at v 1"),
        ok("schema2_bye", hello_frame(v=2, kind="bye", seqs=fmap(("port", 8))), bye_json()),
        # --- rejected before any state changes (stage "header") -------------------------------------
        bad("oversize", example, "oversize", "header", "one byte over the limit", max_message_bytes=len(example) - 1),
        bad("oversize_before_parsing", Raw(b"\xc1" * 9), "oversize", "header", max_message_bytes=8),
        bad("empty_frame", Raw(b""), "truncated", "header"),
        bad("truncated", example[:-3], "truncated", "header"),
        bad("truncated_inside_events", example[:120], "truncated", "header"),
        bad("reserved_byte", Raw(b"\xc1"), "not_msgpack", "header"),
        bad("reserved_byte_in_events", event_frame(events=farr(ev(value=Raw(b"\xc1")))), "not_msgpack", "header",
            "the structure of the whole frame is checked first"),
        bad("bad_utf8_in_field", event_frame(name=Raw(b"\xa2\xc3\x28")), "not_msgpack", "header"),
        bad("bad_utf8_before_not_a_map", Raw(b"\x91\xa1\xff"), "not_msgpack", "header",
            "msgpack validity is checked before the top-level type"),
        bad("truncated_before_not_a_map", Raw(b"\x92\x01"), "truncated", "header"),
        bad("bad_utf8_then_truncated", Raw(b"\x82\xa1\xff"), "truncated", "header",
            "a str that is not UTF-8, then the frame ends inside the map: the structure decides first (§6.1)"),
        bad("bad_utf8_in_events_then_truncated", event_frame(events=farr(ev(value=Raw(b"\xa1\xff"))))[:-3],
            "truncated", "header"),
        bad("reserved_byte_then_truncated", Raw(b"\x93\xc1"), "not_msgpack", "header",
            "0xc1 is met before the end: the structure is broken there"),
        bad("count_beyond_the_frame", Raw(b"\x93\x01"), "truncated", "header",
            "an array of 3 with 1 item: a count larger than the bytes left is a frame that ends early"),
        bad("map_count_beyond_the_frame", Raw(b"\x89" + event_frame()[1:]), "truncated", "header",
            "the envelope map says 9 entries and holds 8"),
        bad("hello_events_key_bad_utf8", hello_frame(extra=(("events", farr(Raw(b"\xa1\xff"))),)), "not_msgpack",
            "header", "a hello has no stage 2: every str in it is checked in stage 1, an unknown key's too"),
        bad("bye_events_key_reserved_extension",
            hello_frame(kind="bye", seqs=fmap(("port", 8)), extra=(("events", farr(Raw(b"\xd4\xfe\x01"))),)),
            "not_msgpack", "header"),
        bad("top_level_not_a_map", farr("v", 1), "malformed", "header"),
        bad("trailing_bytes", Raw(example + b"\xc0"), "malformed", "header"),
        bad("trailing_before_version", Raw(event_frame(v=3) + b"\x00"), "malformed", "header",
            "trailing bytes are found before the version is read"),
        bad("array_key_in_envelope", event_frame(extra=((farr(1), 1),)), "not_msgpack", "header"),
        bad("reserved_extension_in_unknown_key", hello_frame(extra=(("x", Raw(b"\xd4\xfe\x01")),)), "not_msgpack",
            "header"),
        bad("version_3", event_frame(v=3), "schema_version", "header"),
        bad("version_3_otherwise_empty", fmap(("v", 3)), "schema_version", "header",
            "the version is checked before anything else of the map"),
        bad("schema2_value_beyond_the_limit",
            event_frame(v=2, events=farr(ev(value=packed(fmap(("x", "y" * 200)))))), "oversize", "header",
            "a value travels inside its frame: max_message_bytes bounds it", max_message_bytes=200),
        bad("version_missing", event_frame(drop=("v",)), "malformed", "header"),
        bad("version_bool", event_frame(v=True), "malformed", "header"),
        bad("version_float", event_frame(v=1.0), "malformed", "header"),
        bad("version_str", event_frame(v="1"), "malformed", "header"),
        bad("unknown_kind", event_frame(kind="snapshot"), "malformed", "header"),
        bad("pub_empty", event_frame(pub=""), "malformed", "header"),
        bad("pub_bin", event_frame(pub=PID.encode()), "malformed", "header", "bin is not str"),
        bad("name_missing", event_frame(drop=("name",)), "malformed", "header"),
        bad("sent_at_bool", event_frame(sent_at=True), "malformed", "header"),
        bad("sent_at_nil", event_frame(sent_at=None), "malformed", "header"),
        bad("topic_empty", event_frame(topic=""), "malformed", "header"),
        bad("seq_zero", event_frame(seq=0), "malformed", "header"),
        bad("seq_negative", event_frame(seq=-1), "malformed", "header"),
        bad("seq_above_max", event_frame(seq=MAX_SEQ + 1), "malformed", "header"),
        bad("last_seq_above_max", event_frame(seq=MAX_SEQ, events=farr(ev(), ev())), "malformed", "header",
            "seq + n - 1 = 2^63"),
        bad("events_empty", event_frame(events=farr()), "malformed", "header"),
        bad("events_not_array", event_frame(events=fmap(("0", ev()))), "malformed", "header"),
        bad("events_missing", event_frame(drop=("events",)), "malformed", "header"),
        bad("hello_seq_negative", hello_frame(seqs=fmap(("port", -1))), "malformed", "header"),
        bad("hello_seq_above_max", hello_frame(seqs=fmap(("port", MAX_SEQ + 1))), "malformed", "header"),
        bad("hello_topic_empty", hello_frame(seqs=fmap(("", 1))), "malformed", "header"),
        bad("hello_topic_int", hello_frame(seqs=fmap((1, 1))), "malformed", "header"),
        bad("hello_seqs_array", hello_frame(seqs=farr()), "malformed", "header"),
        bad("hello_reason_missing", hello_frame(drop=("reason",)), "malformed", "header"),
        bad("hello_max_idle_missing", hello_frame(drop=("max_idle",)), "malformed", "header"),
        bad("hello_max_idle_nil", hello_frame(max_idle=None), "malformed", "header"),
        bad("hello_host_missing", hello_frame(drop=("host",)), "malformed", "header"),
        bad("hello_more_not_bool", hello_frame(extra=(("more", 1),)), "malformed", "header"),
        bad("hello_rev_nil", hello_frame(extra=(("rev", None),)), "malformed", "header"),
        bad("hello_rev_negative", hello_frame(extra=(("rev", -1),)), "malformed", "header"),
        bad("hello_rev_float", hello_frame(extra=(("rev", 7.0),)), "malformed", "header"),
        bad("hello_rev_bool", hello_frame(extra=(("rev", True),)), "malformed", "header"),
        bad("bye_seqs_missing", hello_frame(kind="bye", drop=("seqs",)), "malformed", "header"),
        # --- the header is sound, an event is not (stage "events") ---------------------------------
        bad("event_too_short", event_frame(events=farr(farr("port", "p1", "create", 3, None))), "malformed", "events"),
        bad("event_not_array", event_frame(events=farr(fmap(("table", "port")))), "malformed", "events"),
        bad("event_action_case", event_frame(events=farr(ev(action="Create"))), "malformed", "events"),
        bad("event_action_bin", event_frame(events=farr(ev(action=b"create"))), "malformed", "events"),
        bad("event_table_empty", event_frame(events=farr(ev(table=""))), "malformed", "events"),
        bad("event_key_int", event_frame(events=farr(ev(key=1))), "malformed", "events"),
        bad("event_version_negative", event_frame(events=farr(ev(version=-1))), "malformed", "events"),
        bad("event_version_bool", event_frame(events=farr(ev(version=False))), "malformed", "events"),
        bad("event_timestamp_nil", event_frame(events=farr(ev(ts=None))), "malformed", "events"),
        bad("one_bad_event_of_two", event_frame(events=farr(ev(), ev(version="4"))), "malformed", "events",
            "no partial acceptance"),
        bad("bad_utf8_in_value", event_frame(events=farr(ev(value=Raw(b"\xa1\xff")))), "not_msgpack", "events"),
        bad("array_key_in_value", event_frame(events=farr(ev(value=fmap((farr(1), 1))))), "not_msgpack", "events"),
        bad("bad_timestamp_length", event_frame(events=farr(ev(value=Raw(b"\xd5\xff\x00\x01")))),
            "not_msgpack", "events", "type -1 of 2 bytes"),
        bad("bad_timestamp_nanoseconds",
            event_frame(events=farr(ev(value=Raw(b"\xd7\xff" + struct.pack(">Q", 1_000_000_000 << 34))))),
            "not_msgpack", "events", "64-bit form with nanoseconds >= 10^9"),
        bad("reserved_extension_type", event_frame(events=farr(ev(value=Raw(b"\xd4\xfe\x01")))),
            "not_msgpack", "events", "types -128..-2 are reserved by msgpack"),
        bad("depth_1025", too_deep, "not_msgpack", "any", "one container too many; either stage may see it"),
        bad("schema2_value_not_msgpack", event_frame(v=2, events=farr(ev(value=packed(Raw(b"\xc1"))))),
            "not_msgpack", "events", "a value's bytes are checked with the events, not at the header"),
        bad("schema2_value_truncated", event_frame(v=2, events=farr(ev(value=packed(Raw(b"\x82\xa1a\x01"))))),
            "not_msgpack", "events", "a map of 2 that holds 1 entry"),
        bad("schema2_value_trailing_bytes", event_frame(v=2, events=farr(ev(value=packed(Raw(b"\x80\x80"))))),
            "not_msgpack", "events", "two objects: a value is exactly one"),
        bad("schema2_value_empty", event_frame(v=2, events=farr(ev(value=packed(b"")))), "not_msgpack", "events"),
        bad("schema2_value_too_deep", event_frame(v=2, events=farr(ev(value=packed(b"\x81\xc0" + nested(1021))))),
            "not_msgpack", "events", "1022 containers: one more than a value may nest"),
        bad("schema2_value_not_a_map", event_frame(v=2, events=farr(ev(value=packed(farr(1, 2))))), "malformed",
            "events", "schema 2 carries maps"),
        bad("schema2_value_not_a_bin", event_frame(v=2, events=farr(ev(value=fmap(("a", 1))))), "malformed",
            "events", "the map itself where its bytes belong"),
        bad("schema2_create_nil", event_frame(v=2, events=farr(ev(value=None))), "malformed", "events",
            "a create or update carries a value"),
        bad("schema2_not_msgpack_before_malformed",
            event_frame(v=2, events=farr(ev(value=packed(farr(1))), ev(value=packed(Raw(b"\x81"))))),
            "not_msgpack", "events", "the structure of every value is checked before any is found not a map"),
    ]
    return v


def _frame(kind: str, **kw: Any) -> str:
    return (event_frame(**kw) if kind == "event" else hello_frame(kind=kind, **kw)).hex()


def scenarios() -> list[dict[str, Any]]:
    """Sequences of frames through one subscriber of topics ``port`` and ``net`` and what it must do.

    A step is ``{"at": seconds, "hex": frame}`` (receive) or ``{"at": seconds}`` (time passes); the
    expectation lists the (pub, topic, seq) delivered, in order, and the resync requests as
    ``[topic, reason, pub, [first, last] or null]``, in order. Defaults of §7.2 apply.
    """
    def port(seq: int, n: int = 1, v: int = 1, **kw: Any) -> str:
        value = packed(fmap(("n", 1))) if v == 2 else None
        return _frame("event", seq=seq, v=v, events=farr(*[ev(version=seq + i, value=value) for i in range(n)]), **kw)

    bad_event = _frame("event", seq=3, events=farr(ev(), ev(version=-1)))
    held_limit = 2 * len(bytes.fromhex(port(3))) + 10  # room for two held envelopes, not three
    return [
        {"name": "bad_event_is_repaired_at_once_without_a_gap",
         "note": "stage 2 rejects seq 3..4: they are consumed, resynced as bad_event, and 5 follows without a gap",
         "steps": [{"at": 0.0, "hex": port(1, 2)}, {"at": 0.1, "hex": bad_event}, {"at": 0.2, "hex": port(5)},
                   {"at": 2.0}],
         "delivered": [[PID, "port", 1], [PID, "port", 2], [PID, "port", 5]],
         "resyncs": [["port", "bad_event", PID, [3, 4]]]},
        {"name": "schema2_bad_value_is_repaired_without_a_gap",
         "note": "seq 3's value passes the check at receipt and fails its first decode: 3 is consumed, not "
                 "delivered, its topic resynced (bad_value, no range: no sequence was lost); 4 follows",
         "steps": [{"at": 0.0, "hex": port(1, 2, v=2)},
                   {"at": 0.1, "hex": _frame("event", v=2, seq=3, events=farr(
                       ev(value=packed(Raw(b"\x81\xa1a\xa1\xff"))), ev(key="p2", value=packed(fmap(("n", 1))))))},
                   {"at": 0.2, "hex": port(5, v=2)}, {"at": 2.0}],
         "delivered": [[PID, "port", 1], [PID, "port", 2], [PID, "port", 4], [PID, "port", 5]],
         "resyncs": [["port", "bad_value", PID, None]]},
        {"name": "mixed_schemas_in_one_stream",
         "note": "a publisher may change schema between envelopes (a restart keeps no stream): sequences decide",
         "steps": [{"at": 0.0, "hex": port(1)}, {"at": 0.1, "hex": port(2, v=2)}, {"at": 0.2, "hex": port(3)}],
         "delivered": [[PID, "port", 1], [PID, "port", 2], [PID, "port", 3]], "resyncs": []},
        {"name": "bad_header_is_a_gap",
         "note": "stage 1 rejects the frame: nothing changes; seq 5 opens a gap that expires after W",
         "steps": [{"at": 0.0, "hex": port(1, 2)}, {"at": 0.1, "hex": _frame("event", seq=3, v=3)},
                   {"at": 0.2, "hex": port(5)}, {"at": 0.69}, {"at": 0.71}],
         "delivered": [[PID, "port", 1], [PID, "port", 2], [PID, "port", 5]],
         "resyncs": [["port", "gap_expired", PID, [3, 4]]]},
        {"name": "max_idle_zero_never_dies",
         "note": "a publisher advertising max_idle 0 sends no idle hellos: silence is not death",
         "steps": [{"at": 0.0, "hex": _frame("hello", max_idle=0.0, seqs=fmap(("port", 0)))},
                   {"at": 0.1, "hex": port(1)}, {"at": 1000.0}],
         "delivered": [[PID, "port", 1]], "resyncs": []},
        {"name": "assumed_max_idle_before_any_hello",
         "note": "no hello yet: the subscriber's own max_idle_time (5 s) times K (3) applies",
         "steps": [{"at": 0.0, "hex": port(1)}, {"at": 14.9}, {"at": 15.2}],
         "delivered": [[PID, "port", 1]], "resyncs": [["port", "publisher_lost", PID, None]]},
        {"name": "split_hello_at_first_contact",
         "note": "both parts are first contact: no gap, a first_seen resync per topic with its range",
         "steps": [{"at": 0.0, "hex": _frame("hello", seqs=fmap(("port", 4)), extra=(("more", True),))},
                   {"at": 0.01, "hex": _frame("hello", seqs=fmap(("net", 6)))},
                   {"at": 0.02, "hex": port(5)}, {"at": 1.0}],
         "delivered": [[PID, "port", 5]],
         "resyncs": [["port", "first_seen", PID, [1, 4]], ["net", "first_seen", PID, [1, 6]]]},
        {"name": "topic_begun_after_a_complete_hello",
         "note": "a complete hello that did not list net: net's first events start at 1, a lost one is a gap",
         "steps": [{"at": 0.0, "hex": _frame("hello", seqs=fmap(("port", 0)))},
                   {"at": 0.1, "hex": _frame("event", topic="net", seq=2)}, {"at": 0.7}],
         "delivered": [[PID, "net", 2]], "resyncs": [["net", "gap_expired", PID, [1, 1]]]},
        {"name": "hello_reveals_loss",
         "note": "the hello reports 3 while 2 was the last received: a gap, expired after W",
         "steps": [{"at": 0.0, "hex": port(1, 2)}, {"at": 0.1, "hex": _frame("hello", seqs=fmap(("port", 3)))},
                   {"at": 0.7}],
         "delivered": [[PID, "port", 1], [PID, "port", 2]], "resyncs": [["port", "gap_expired", PID, [3, 3]]]},
        {"name": "first_seen_mid_stream",
         "note": "no hello yet: the first envelope starts the stream where it is, and what came before is resynced",
         "steps": [{"at": 0.0, "hex": port(5)}, {"at": 0.1, "hex": port(6)}, {"at": 1.0}],
         "delivered": [[PID, "port", 5], [PID, "port", 6]], "resyncs": [["port", "first_seen", PID, [1, 4]]]},
        {"name": "bye_with_nothing_missing_forgets_quietly",
         "steps": [{"at": 0.0, "hex": port(1)}, {"at": 0.1, "hex": _frame("bye", seqs=fmap(("port", 1)))},
                   {"at": 100.0}],
         "delivered": [[PID, "port", 1]], "resyncs": []},
        {"name": "bye_reveals_loss",
         "note": "the bye reports 3: a gap that expires, then the publisher is forgotten without publisher_lost",
         "steps": [{"at": 0.0, "hex": port(1)}, {"at": 0.1, "hex": _frame("bye", seqs=fmap(("port", 3)))},
                   {"at": 0.7}, {"at": 100.0}],
         "delivered": [[PID, "port", 1]], "resyncs": [["port", "gap_expired", PID, [2, 3]]]},
        {"name": "duplicates_and_reorder_within_the_window",
         "steps": [{"at": 0.0, "hex": port(1)}, {"at": 0.1, "hex": port(3)}, {"at": 0.2, "hex": port(2)},
                   {"at": 0.3, "hex": port(1, 3)}, {"at": 1.0}],
         "delivered": [[PID, "port", 1], [PID, "port", 2], [PID, "port", 3]], "resyncs": []},
        {"name": "foreign_topic_changes_nothing",
         "steps": [{"at": 0.0, "hex": port(1)}, {"at": 0.1, "hex": _frame("event", topic="other", seq=9)},
                   {"at": 0.2, "hex": port(2)}],
         "delivered": [[PID, "port", 1], [PID, "port", 2]], "resyncs": []},
        # --- §8.6: what a stream does below next, far ahead of it, far below it ---------------------
        {"name": "below_a_first_contact_is_a_duplicate",
         "note": "5 was delivered: 3 arriving after it is covered by the first_seen resync, never delivered out "
                 "of order, and 6 follows 5 without a gap",
         "steps": [{"at": 0.0, "hex": port(5)}, {"at": 0.1, "hex": port(3)}, {"at": 0.2, "hex": port(6)},
                   {"at": 1.0}],
         "delivered": [[PID, "port", 5], [PID, "port", 6]], "resyncs": [["port", "first_seen", PID, [1, 4]]]},
        {"name": "late_inside_a_given_up_hole_is_resynced",
         "note": "3 arrives after the gap [2, 4] was given up and 5 delivered: not delivered (it would be out of "
                 "order) but resynced, since it may carry a change made after the gap's resync",
         "steps": [{"at": 0.0, "hex": port(1)}, {"at": 0.1, "hex": port(5)}, {"at": 0.61},
                   {"at": 0.7, "hex": port(3)}, {"at": 0.8, "hex": port(6)}, {"at": 0.9, "hex": port(5)}],
         "delivered": [[PID, "port", 1], [PID, "port", 5], [PID, "port", 6]],
         "resyncs": [["port", "gap_expired", PID, [2, 4]], ["port", "late", PID, [3, 3]]]},
        {"name": "a_run_only_a_hello_claimed_steps_down",
         "note": "the hello's 50000 is never received: after the gap expires, 3 (inside the claimed run, nothing "
                 "delivered above it) steps the stream down and is delivered; its duplicate is not",
         "steps": [{"at": 0.0, "hex": port(1, 2)}, {"at": 0.1, "hex": _frame("hello", seqs=fmap(("port", 50000)))},
                   {"at": 0.7}, {"at": 0.8, "hex": port(3)}, {"at": 0.9, "hex": port(3)},
                   {"at": 1.0, "hex": port(4)}, {"at": 2.0}],
         "delivered": [[PID, "port", 1], [PID, "port", 2], [PID, "port", 3], [PID, "port", 4]],
         "resyncs": [["port", "gap_expired", PID, [3, 50000]]]},
        {"name": "a_first_contact_by_hello_steps_down",
         "note": "first contact by a hello at 9: 4 is inside the run the hello claimed and nothing above was "
                 "delivered, so the stream steps down to the run's start; 1-3 may have been sent after the "
                 "first_seen resync (if the hello was not its publisher's), so they are a gap: 4 and 5 are held, "
                 "4 again is a duplicate, and the gap expires as [1, 3]",
         "steps": [{"at": 0.0, "hex": _frame("hello", seqs=fmap(("port", 9)))}, {"at": 0.1, "hex": port(4)},
                   {"at": 0.2, "hex": port(5)}, {"at": 0.3, "hex": port(4)}, {"at": 1.0}],
         "delivered": [[PID, "port", 4], [PID, "port", 5]],
         "resyncs": [["port", "first_seen", PID, [1, 9]], ["port", "gap_expired", PID, [1, 3]]]},
        {"name": "a_forged_claim_does_not_hide_a_loss_its_publishers_hello_reports",
         "note": "a hello claims 7 after 1; its gap expires ([2, 7], resynced); the publisher's own hello at 2 is "
                 "inside the claimed run: 2, lost and perhaps sent after that resync, is a gap like any other",
         "steps": [{"at": 0.0, "hex": port(1)}, {"at": 0.1, "hex": _frame("hello", seqs=fmap(("port", 7)))},
                   {"at": 0.7}, {"at": 0.8, "hex": _frame("hello", seqs=fmap(("port", 2)))}, {"at": 1.4},
                   {"at": 1.5, "hex": port(3)}],
         "delivered": [[PID, "port", 1], [PID, "port", 3]],
         "resyncs": [["port", "gap_expired", PID, [2, 7]], ["port", "gap_expired", PID, [2, 2]]]},
        {"name": "a_forged_claim_does_not_hide_a_loss_its_publishers_envelope_shows",
         "note": "after the claimed run [2, 7] is given up, envelope 3 steps the stream down to 2, not 3: it is "
                 "held, and the gap [2, 2] expires",
         "steps": [{"at": 0.0, "hex": port(1)}, {"at": 0.1, "hex": _frame("hello", seqs=fmap(("port", 7)))},
                   {"at": 0.7}, {"at": 0.8, "hex": port(3)}, {"at": 1.4}, {"at": 1.5, "hex": port(4)}],
         "delivered": [[PID, "port", 1], [PID, "port", 3], [PID, "port", 4]],
         "resyncs": [["port", "gap_expired", PID, [2, 7]], ["port", "gap_expired", PID, [2, 2]]]},
        {"name": "a_step_down_lowers_high_so_the_next_hello_is_not_stale",
         "note": "after the claimed run [2, 7] is given up and 2 steps the stream down, the claim's 7 is no longer "
                 "the stream's high: a hello at 4 (3 and 4 lost) opens a gap",
         "steps": [{"at": 0.0, "hex": port(1)}, {"at": 0.1, "hex": _frame("hello", seqs=fmap(("port", 7)))},
                   {"at": 0.7}, {"at": 0.8, "hex": port(2)}, {"at": 0.9, "hex": _frame("hello", seqs=fmap(("port", 4)))},
                   {"at": 1.5}],
         "delivered": [[PID, "port", 1], [PID, "port", 2]],
         "resyncs": [["port", "gap_expired", PID, [2, 7]], ["port", "gap_expired", PID, [3, 4]]]},
        {"name": "a_jump_beyond_max_seq_jump_is_held_resynced_and_delivered",
         "note": "100003 is 100001 past next: a gap like any other, its envelope delivered when it expires",
         "steps": [{"at": 0.0, "hex": port(1)}, {"at": 0.1, "hex": port(100003)}, {"at": 0.59}, {"at": 0.61},
                   {"at": 0.7, "hex": port(100004)}],
         "delivered": [[PID, "port", 1], [PID, "port", 100003], [PID, "port", 100004]],
         "resyncs": [["port", "gap_expired", PID, [2, 100002]]]},
        {"name": "far_below_the_stream_restarts_it",
         "note": "a forged envelope at 2^63-1 is held, the real 2 is delivered meanwhile, the gap expires and the "
                 "forged one is delivered; the real 3, more than max_seq_jump below next, restarts the stream there",
         "steps": [{"at": 0.0, "hex": port(1)}, {"at": 0.1, "hex": port(MAX_SEQ)}, {"at": 0.2, "hex": port(2)},
                   {"at": 0.61}, {"at": 0.7, "hex": port(3)}, {"at": 0.8, "hex": port(4)},
                   {"at": 0.9, "hex": port(3)}],
         "delivered": [[PID, "port", 1], [PID, "port", 2], [PID, "port", MAX_SEQ], [PID, "port", 3],
                       [PID, "port", 4]],
         "resyncs": [["port", "gap_expired", PID, [3, MAX_SEQ - 1]], ["port", "seq_jump", PID, None]]},
        {"name": "a_forged_first_contact_far_ahead_restarts_at_the_real_stream",
         "steps": [{"at": 0.0, "hex": port(1 << 62)}, {"at": 0.1, "hex": port(7)}, {"at": 0.2, "hex": port(8)}],
         "delivered": [[PID, "port", 1 << 62], [PID, "port", 7], [PID, "port", 8]],
         "resyncs": [["port", "first_seen", PID, [1, (1 << 62) - 1]], ["port", "seq_jump", PID, None]]},
        {"name": "more_than_max_held_envelopes_give_up_at_once", "settings": {"max_held": 2},
         "steps": [{"at": 0.0, "hex": port(1)}, {"at": 0.1, "hex": port(3)}, {"at": 0.1, "hex": port(4)},
                   {"at": 0.1, "hex": port(5)}, {"at": 0.2, "hex": port(6)}],
         "delivered": [[PID, "port", 1], [PID, "port", 3], [PID, "port", 4], [PID, "port", 5], [PID, "port", 6]],
         "resyncs": [["port", "hold_overflow", PID, [2, 2]]]},
        {"name": "more_than_max_held_bytes_give_up_at_once", "settings": {"max_held_bytes": held_limit},
         "note": "the frames held over all streams: two fit, the third does not",
         "steps": [{"at": 0.0, "hex": port(1)}, {"at": 0.0, "hex": port(1, topic="net")},
                   {"at": 0.1, "hex": port(3)}, {"at": 0.1, "hex": port(3, topic="net")},
                   {"at": 0.1, "hex": port(4)}, {"at": 0.2, "hex": port(2, topic="net")}],
         "delivered": [[PID, "port", 1], [PID, "net", 1], [PID, "port", 3], [PID, "port", 4], [PID, "net", 2],
                       [PID, "net", 3]],
         "resyncs": [["port", "hold_overflow", PID, [2, 2]]]},
        # --- §8.7: hellos that would make a publisher immortal, and too many publishers --------------
        {"name": "max_idle_infinite_or_nan_is_never_dead_but_forgotten_after_silence",
         "note": "+inf and NaN mean no idle hellos (§4.4): never taken as dead, but forgotten after "
                 "forget_silent_after of silence",
         "steps": [{"at": 0.0, "hex": _frame("hello", max_idle=math.inf, seqs=fmap(("port", 0)))},
                   {"at": 0.0, "hex": _frame("hello", max_idle=math.nan, seqs=fmap(("port", 0)), pub=PID2)},
                   {"at": 0.1, "hex": port(1)}, {"at": 0.1, "hex": port(1, pub=PID2)},
                   {"at": 1000.0}, {"at": 3600.05}, {"at": 3600.2}],
         "delivered": [[PID, "port", 1], [PID2, "port", 1]],
         "resyncs": [["port", "publisher_silent", PID, None], ["port", "publisher_silent", PID2, None]]},
        {"name": "max_idle_above_max_hello_idle_is_taken_as_it",
         "note": "10^9 s is believed as 3600 s: dead after K x 3600 s of silence",
         "steps": [{"at": 0.0, "hex": _frame("hello", max_idle=1e9, seqs=fmap(("port", 0)))},
                   {"at": 10800.0}, {"at": 10800.1}],
         "delivered": [], "resyncs": [["port", "publisher_lost", PID, None]]},
        {"name": "publishers_beyond_max_publishers_evict_the_longest_silent", "settings": {"max_publishers": 2},
         "steps": [{"at": 0.0, "hex": _frame("hello", seqs=fmap(("port", 0)))},
                   {"at": 0.1, "hex": _frame("hello", seqs=fmap(("port", 0)), pub=PID2)},
                   {"at": 0.2, "hex": _frame("hello", seqs=fmap(("port", 0)), pub=PID3)},
                   {"at": 0.3, "hex": port(1)}],
         "delivered": [[PID, "port", 1]],
         "resyncs": [["port", "publisher_evicted", PID, None], ["port", "publisher_evicted", PID2, None]]},
    ]


FORMAT = {
    "vectors": "name, note, hex (frame 1, the envelope), optional max_message_bytes (else the top-level one), "
               "expect: {envelope} or {error: reason, stage: header|events|any}",
    "envelope": "event: kind, pub, name, sent_at, topic, seq, events [{table, key, action, version, value, "
                "timestamp}]; hello: kind, pub, name, sent_at, seqs, reason, max_idle, host, more, and rev when the frame has "
                "it; "
                "bye: kind, pub, name, sent_at, seqs",
    "values": "JSON where JSON can say it; a map with a key that is not a str is {\"$map\": [[key, value], ...]}, "
              "bin is {\"$bin\": hex}, an extension {\"$ext\": [type, hex]}, a timestamp "
              "{\"$timestamp\": [seconds, nanoseconds]}, and {\"$arrays\": n} n arrays nested around nil; "
              "integers may exceed 2^53; in schema 2, a value is given decoded, and {\"$bad_value\": true} says that "
              "its bytes pass the check at receipt but fail their first decode (§6.4)",
    "stage": "header: the frame is dropped and changes no state; events: the header is taken (its sequences "
             "are consumed) and the envelope's range resynced with reason bad_event; any: either",
    "scenarios": "subscriber of topics, the settings of 'subscriber' (§8.2) with a scenario's own 'settings' over "
                 "them; steps at local times in seconds: with hex, the frame arrives; without, time passes (gaps "
                 "and dead publishers are checked at each step, after the step's frame). Compare delivered (pub, "
                 "topic, seq) and resyncs [topic, reason, pub, missing] in order; the subscriber decodes every schema 2 "
                 "value before delivery (§6.4)",
}


def document() -> dict[str, Any]:
    return {
        "protocol": "dfpubsub wire protocol, schema versions 1 and 2 (docs/protocol.md)",
        "format": FORMAT,
        "max_message_bytes": LIMIT,
        "subscriber": {"topics": ["port", "net"], "message_delay_window": 0.5, "max_held": 1024,
                       "dead_after_idles": 3, "max_idle_time": 5.0, "max_held_bytes": 64 << 20,
                       "max_seq_jump": 100_000, "max_hello_idle": 3600.0, "forget_silent_after": 3600.0,
                       "max_publishers": 10_000},
        "vectors": vectors(),
        "scenarios": scenarios(),
    }


def render() -> str:
    return json.dumps(document(), indent=1, ensure_ascii=False) + "\n"


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    path = Path(args[0]) if args else Path(__file__).resolve().parent.parent / "docs" / "protocol-vectors.json"
    path.write_text(render(), encoding="utf-8")
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
