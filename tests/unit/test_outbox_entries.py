"""An outbox entry's data: the store-assigned version in front of the notifier's body."""

from __future__ import annotations

import msgpack
import pytest

from dfpubsub.errors import InvalidValue, NotificationDecodeError
from dfpubsub.notify.notification import decode, encode_change, encode_head
from dfpubsub.store.outbox import MAX_PREFIX_BYTES, MAX_TAIL_HEADER_BYTES, split_versioned, value_tail, versioned


@pytest.mark.parametrize("version", [0, 7, 123456789, (1 << 64) - 1])
def test_the_version_prefix_round_trips_and_is_a_msgpack_string(version):
    data = versioned(version, b"\x80")
    assert split_versioned(data) == (version, b"\x80")
    unpacker = msgpack.Unpacker(raw=False)
    unpacker.feed(data)
    assert list(unpacker) == [str(version), {}]
    assert len(data) - 1 <= MAX_PREFIX_BYTES


def test_data_without_a_prefix_is_returned_as_it_is():
    body = _body()
    assert split_versioned(body) == (None, body)
    assert split_versioned(b"") == (None, b"")


@pytest.mark.parametrize("data", [b"\xa2x1\x80", b"\xa5123", b"\xa0\x80", b"\xa3-12\x80"])
def test_a_prefix_that_is_not_a_version_is_refused(data):
    with pytest.raises(InvalidValue):
        split_versioned(data)
    with pytest.raises(NotificationDecodeError) as info:
        decode(data)
    assert info.value.reason == "malformed"


def _body() -> bytes:
    # What a notifier encodes for the outbox: the version (and so the id) left to the store.
    return encode_change("orders", "s3:ObjectCreated:Put", "create", "port", "k1", None, 1.5, "", "", "", None, (12, "e" * 32))


def test_decode_puts_the_stored_version_and_its_id_in():
    n = decode(versioned(9001, _body()))
    assert (n.version, n.id, n.key, n.size) == (9001, "orders:port:k1:9001", "k1", 12)


def test_a_body_without_its_version_prefix_is_refused_for_its_missing_version():
    with pytest.raises(NotificationDecodeError) as info:
        decode(_body())
    assert info.value.reason == "malformed"


@pytest.mark.parametrize("size", [0, 200, 255, 256, 65535, 65536, 300_000])
def test_a_head_completed_by_the_value_tail_packs_what_encode_change_packs(size):
    """An outbox built with the value appends the store's blob to the notifier's head: the entry
    is the one a notifier packing the value's encoding itself would have written."""
    blob = msgpack.packb({"pad": "x" * size})
    head = encode_head("orders", "s3:ObjectCreated:Put", "update", "port", "k1", 1.5, "o", "w", "c", None)
    assert head + value_tail(blob) == encode_change("orders", "s3:ObjectCreated:Put", "update", "port", "k1", None,
                                                    1.5, "o", "w", "c", None, blob)
    assert value_tail(blob) == msgpack.packb(blob)
    assert len(value_tail(blob)) - len(blob) <= MAX_TAIL_HEADER_BYTES
    n = decode(versioned(42, head + value_tail(blob)))
    assert (n.version, n.key, n.size) == (42, "k1", len(msgpack.packb({"pad": "x" * size})))
