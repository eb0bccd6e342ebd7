"""The snapshot file (dfpubsub.controller.snapfile): read back whole and sealed, or refused with its reason;
cut at every length, a file never reads as good."""

from __future__ import annotations

import os

import pytest

from dfpubsub.controller import snapfile
from dfpubsub.controller.snapfile import FILE, SnapshotRejected

IDENTITY = b"0123456789abcdef"
HEADER = {"positions": {"port": 7}, "topics": ["port"]}
CHUNKS = [["o", "port", "port", ["a", "b"], [3, 7], [b"\x01", b"\x02"]], ["t", "port", ["c"], [5]]]


def _written(tmp_path):
    size = snapfile.write_file(str(tmp_path), HEADER, iter(CHUNKS), IDENTITY)
    assert size == os.path.getsize(tmp_path / FILE)
    return (tmp_path / FILE).read_bytes()


def test_a_snapshot_reads_back_as_written_and_sealed_by_its_store(tmp_path):
    _written(tmp_path)
    snapshot = snapfile.read_file(str(tmp_path))
    assert snapshot.header == HEADER and list(snapshot.chunks()) == CHUNKS
    snapfile.check_seal(snapshot, IDENTITY)
    with pytest.raises(SnapshotRejected) as other:
        snapfile.check_seal(snapshot, b"another store...")
    assert other.value.reason == "bad_seal"
    assert snapfile.store_name(IDENTITY) != snapfile.store_name(b"another store...") and IDENTITY.hex() not in snapfile.store_name(IDENTITY)


def test_a_snapshot_cut_at_any_length_or_with_any_byte_changed_is_refused(tmp_path):
    data = _written(tmp_path)
    path = tmp_path / FILE
    for length in range(len(data)):
        path.write_bytes(data[:length])
        with pytest.raises(SnapshotRejected) as cut:
            snapfile.read_file(str(tmp_path))
        assert cut.value.reason in ("truncated", "other_format", "bad_checksum"), length
    for offset in range(len(data) - 64):  # the seal is checked against the store: below
        path.write_bytes(data[:offset] + bytes([data[offset] ^ 0x01]) + data[offset + 1:])
        with pytest.raises(SnapshotRejected) as flipped:
            snapfile.read_file(str(tmp_path))
        assert flipped.value.reason in ("truncated", "other_format", "bad_checksum"), offset
    path.write_bytes(data[:-64] + bytes(32) + data[-32:])
    with pytest.raises(SnapshotRejected) as unsealed:
        snapfile.check_seal(snapfile.read_file(str(tmp_path)), IDENTITY)
    assert unsealed.value.reason == "bad_seal"


def test_no_snapshot_and_leftovers_of_writes_that_never_finished(tmp_path):
    with pytest.raises(SnapshotRejected) as none:
        snapfile.read_file(str(tmp_path))
    assert none.value.reason == "no_snapshot"
    (tmp_path / f"{snapfile.TEMP_PREFIX}abc").write_bytes(b"half a snapshot")
    (tmp_path / "other").write_bytes(b"kept")
    assert snapfile.remove_temporaries(str(tmp_path)) == 1
    assert sorted(os.listdir(tmp_path)) == ["other"]


def test_a_write_that_fails_leaves_the_last_good_snapshot_and_no_temporary(tmp_path):
    data = _written(tmp_path)

    def failing():
        yield CHUNKS[0]
        raise OSError(28, "No space left on device")

    with pytest.raises(OSError):
        snapfile.write_file(str(tmp_path), {"positions": {"port": 9}}, failing(), IDENTITY)
    assert (tmp_path / FILE).read_bytes() == data
    assert os.listdir(tmp_path) == [FILE]
