"""The event log's writer, journal and layout, on a real file system (no Spark)."""

import os
import subprocess
import sys
import textwrap

import msgpack
import pytest

pq = pytest.importorskip("pyarrow.parquet")

from dfpubsub.archive import (  # noqa: E402
    COLUMNS,
    JOURNAL_DIR,
    Journal,
    SegmentWriter,
    arrow_schema,
    event_row,
    parse_partition,
    partition_dir,
    read_journal,
    segment_files,
)
from dfpubsub.errors import ArchiveError  # noqa: E402
from dfpubsub.events import Action, Event  # noqa: E402

DAY = 86400.0
T0 = 1_767_225_600.0  # 2026-01-01T00:00:00Z


def row(seq, topic="port", received_at=T0 + 10, key=None, action="update", version=None):
    value = None if action == "delete" else msgpack.packb({"seq": seq})
    return (topic, "port", key or f"k{seq}", action, version or seq, value, T0, "pub-1", seq, T0 + 1, received_at)


def read_log(root):
    """Every row of the published segments, as tuples, sorted by seq."""
    rows = []
    for rel in segment_files(str(root)):
        table = pq.read_table(root / rel)
        assert table.schema.equals(arrow_schema(), check_metadata=False)
        d = table.to_pydict()
        rows += list(zip(*[d[name] for name, _ in COLUMNS]))
    return sorted(rows, key=lambda r: (r[7], r[8]))


class Clock:
    def __init__(self, now=T0):
        self.now = now

    def __call__(self):
        return self.now


def test_schema_and_event_rows():
    assert [f.name for f in arrow_schema()] == [name for name, _ in COLUMNS]
    ev = Event("port", "port", "p1", Action.UPDATE, 7, {"mac": "aa"}, 1.5, "pid", 3, 2.5)
    blob = msgpack.packb({"mac": "aa"})
    assert event_row(ev, 3.5) == ("port", "port", "p1", "update", 7, blob, 1.5, "pid", 3, 2.5, 3.5)
    gone = Event("port", "port", "p1", Action.DELETE, 8, None, 1.5, "pid", 4, 2.5)
    assert event_row(gone, 3.5)[5] is None


def test_partitions_encode_any_topic():
    rel = partition_dir("tenant/a=b %x", "2026-01-01")
    assert "/" not in rel.split("/", 1)[0] and parse_partition(rel) == ("tenant/a=b %x", "2026-01-01")
    assert parse_partition("_journal") is None and parse_partition("topic=a/nodate") is None


def test_segments_roll_by_size_and_are_partitioned_by_topic_and_date(tmp_path):
    w = SegmentWriter(str(tmp_path), max_bytes=2000, max_age=3600, fsync=True, clock=Clock())
    rows = [row(i, topic="port" if i % 2 else "net/a", received_at=T0 + (DAY if i > 30 else 0) + i)
            for i in range(1, 41)]
    for r in rows:
        w.append(r)
    w.close()
    files = list(segment_files(str(tmp_path)))
    parts = {parse_partition(f.rsplit("/", 1)[0]) for f in files}
    assert parts == {("port", "2026-01-01"), ("port", "2026-01-02"), ("net/a", "2026-01-01"), ("net/a", "2026-01-02")}
    assert len({f.rsplit("/", 1)[1] for f in files}) > 1  # several segments: rolled by size
    assert read_log(tmp_path) == rows
    # Nothing half-written, no journal left behind.
    assert not [n for _, _, names in os.walk(tmp_path) for n in names if n.endswith(".tmp")]
    assert os.listdir(tmp_path / JOURNAL_DIR) == []  # the writer's journal directory went with close()
    assert w.stats.get("events_archived") == 40 and w.stats.get("segments_published") == len(files)


def test_segments_roll_by_age(tmp_path):
    clock = Clock()
    w = SegmentWriter(str(tmp_path), max_bytes=1 << 30, max_age=60, fsync=False, clock=clock)
    w.append(row(1))
    assert not w.maybe_roll() and list(segment_files(str(tmp_path))) == []
    clock.now += 61
    assert w.maybe_roll() and w.buffered == 0
    assert [r[8] for r in read_log(tmp_path)] == [1]
    w.append(row(2))
    clock.now += 61
    w.append(row(3))  # an append past the age rolls too
    assert [r[8] for r in read_log(tmp_path)] == [1, 2, 3]
    assert not w.maybe_roll()  # nothing buffered


def test_journal_reads_whole_records_only(tmp_path):
    path = str(tmp_path / "j.journal")
    j = Journal(path)
    for i in range(1, 4):
        j.append(row(i))
    j.close()
    size = os.path.getsize(path)
    with open(path, "ab") as fh:
        fh.write(b"\x00\x00\x01\x00garbage")  # a record cut short by a crash
    assert [r[8] for r in read_journal(path)] == [1, 2, 3]
    with open(path, "r+b") as fh:
        fh.truncate(size - 3)
    assert [r[8] for r in read_journal(path)] == [1, 2]
    with open(path, "r+b") as fh:  # a flipped bit in the first payload stops the read there
        fh.seek(12)
        byte = fh.read(1)
        fh.seek(12)
        fh.write(bytes([byte[0] ^ 0xFF]))
    assert list(read_journal(path)) == []


def journals(root):
    """Journal files under the root, per writer directory."""
    return sorted(f"{w}/{n}" for w in os.listdir(root / JOURNAL_DIR) for n in os.listdir(root / JOURNAL_DIR / w)
                  if n.endswith(".journal"))


def crash_after_appending(root, rows):
    """A writer in another process appends ``rows`` and dies without publishing (its lock goes with it)."""
    script = textwrap.dedent(f"""
        import os
        from dfpubsub.archive import SegmentWriter
        w = SegmentWriter({str(root)!r}, max_bytes=1 << 30, fsync=False)
        for r in {rows!r}:
            w.append(r)
        os._exit(0)
    """)
    subprocess.run([sys.executable, "-c", script], check=True, timeout=60)


def test_recover_publishes_a_crashed_writers_journal(tmp_path):
    rows = [row(i, topic="port" if i % 3 else "net") for i in range(1, 11)]
    crash_after_appending(tmp_path, rows)
    assert list(segment_files(str(tmp_path))) == [] and len(journals(tmp_path)) == 1
    successor = SegmentWriter(str(tmp_path), fsync=False)
    assert successor.recover() == 10
    assert read_log(tmp_path) == sorted(rows, key=lambda r: r[8])
    assert journals(tmp_path) == []
    assert successor.stats.get("journals_recovered") == 1
    successor.close()
    assert os.listdir(tmp_path / JOURNAL_DIR) == []


def test_recover_leaves_live_writers_alone(tmp_path):
    live = SegmentWriter(str(tmp_path), fsync=False)
    live.append(row(1))
    crash_after_appending(tmp_path, [row(2)])
    assert SegmentWriter(str(tmp_path), fsync=False).recover() == 1
    assert [r[8] for r in read_log(tmp_path)] == [2] and len(journals(tmp_path)) == 1
    live.append(row(3))
    live.close()
    assert [r[8] for r in read_log(tmp_path)] == [1, 2, 3]
    with pytest.raises(ArchiveError):
        live.append(row(4))


def test_recovering_an_already_published_journal_adds_no_duplicates(tmp_path):
    w = SegmentWriter(str(tmp_path), fsync=False)
    for i in range(1, 6):
        w.append(row(i))
    (name,) = journals(tmp_path)
    saved = (tmp_path / JOURNAL_DIR / name).read_bytes()
    published = w.roll()
    w.close()
    # Crash between the rename and the unlink: the journal is still there, and so is a
    # temporary file of an interrupted write.
    (tmp_path / JOURNAL_DIR / name).parent.mkdir()
    (tmp_path / JOURNAL_DIR / name).write_bytes(saved)
    part = published[0].rsplit("/", 1)[0]
    segment = name.split("/")[1].split(".")[0]
    (tmp_path / part / f".{segment}.parquet.tmp").write_bytes(b"PAR1 half")
    assert SegmentWriter(str(tmp_path), fsync=False).recover() == 5
    assert list(segment_files(str(tmp_path))) == published
    assert [r[8] for r in read_log(tmp_path)] == [1, 2, 3, 4, 5]
    assert not [n for _, _, names in os.walk(tmp_path) for n in names if n.endswith(".tmp")]


def test_an_unwritable_root_is_a_typed_error(tmp_path):
    (tmp_path / "file").write_text("x")
    with pytest.raises(ArchiveError):
        SegmentWriter(str(tmp_path / "file" / "log"))


def test_importing_the_archive_and_pipeline_loads_neither_pyarrow_nor_pyspark():
    code = ("import sys, dfpubsub.archive, dfpubsub.pipeline, dfpubsub.pipeline.bootstrap, dfpubsub.pipeline.audit, "
            "dfpubsub.services.archiver, dfpubsub.services.controller, dfpubsub.tools.pipeline; "
            "print(sorted(m for m in ('pyarrow', 'pyspark', 'matplotlib') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True)
    assert out.stdout.strip() == "[]"
