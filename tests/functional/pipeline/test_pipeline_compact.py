"""df-pipeline compact on a local Spark, against hand-computed snapshots."""

import msgpack
import pytest

pytest.importorskip("pyspark")
pytest.importorskip("pyarrow")

from pyspark.testing import assertDataFrameEqual  # noqa: E402

from dfpubsub.archive import SegmentWriter  # noqa: E402
from dfpubsub.errors import PipelineError  # noqa: E402
from dfpubsub.pipeline import compact  # noqa: E402
from dfpubsub.pipeline.compact import read_generation  # noqa: E402
from dfpubsub.pipeline.logread import log_schema  # noqa: E402

T0 = 1_767_225_600.0  # 2026-01-01T00:00:00Z


def ev(topic, key, action, version, pub="p-a", seq=None, ts=T0, value=None):
    """A log row; the value defaults to something naming the version."""
    blob = None if action == "delete" else msgpack.packb(value if value is not None else {"v": version})
    return (topic, topic, key, action, version, blob, ts, pub, seq if seq is not None else version, ts + 0.5, ts + 1.0)


def write_log(root, *segments):
    """Each argument is the rows of one segment (per partition)."""
    w = SegmentWriter(str(root), fsync=False)
    for rows in segments:
        for r in rows:
            w.append(r)
        w.roll()


def snapshot(spark, root, generation, live=True):
    df = read_generation(spark, str(root), generation)
    return df.where(df.action != "delete") if live else df.where(df.action == "delete")


def frame(spark, rows):
    return spark.createDataFrame(rows, log_schema())


# Run 1: every rule once.
A1, A3, A2_LATE = ev("port", "a", "create", 1), ev("port", "a", "update", 3), ev("port", "a", "update", 2)
B4, B6 = ev("port", "b", "create", 4), ev("port", "b", "delete", 6)
C5, C7, C9 = ev("port", "c", "create", 5), ev("port", "c", "delete", 7), ev("port", "c", "create", 9)
X10_A, X10_B = ev("net", "x", "update", 10, pub="p-a"), ev("net", "x", "update", 10, pub="p-b")  # tie: publisher
Y11_UPD, Y11_DEL = ev("net", "y", "update", 11), ev("net", "y", "delete", 11)  # tie: delete wins
Z12 = ev("net", "z", "create", 12)  # archived twice
W13_EARLY, W13_LATE = ev("net", "w", "update", 13, ts=T0), ev("net", "w", "update", 13, ts=T0 + 5)  # tie: timestamp
RUN1 = [A1, A3, A2_LATE, B4, B6, C5, C7, C9, X10_A, X10_B, Y11_UPD, Y11_DEL, Z12, Z12, W13_EARLY, W13_LATE]
LIVE1 = [A3, C9, X10_B, Z12, W13_LATE]
DELETED1 = [B6, Y11_DEL]

# Run 2: late and stale events, a re-create after a delete, a new object, a delete.
A2_AGAIN, B5_STALE = ev("port", "a", "update", 2, seq=20), ev("port", "b", "update", 5, seq=21)
Y14, D15, C16 = ev("net", "y", "create", 14), ev("port", "d", "create", 15), ev("port", "c", "delete", 16)
RUN2 = [A2_AGAIN, B5_STALE, Y14, D15, C16]
LIVE2 = [A3, X10_B, Z12, W13_LATE, Y14, D15]
DELETED2 = [B6, C16]


def test_compaction_matches_the_hand_computed_snapshot(spark, tmp_path):
    log, snap = tmp_path / "log", tmp_path / "snap"
    write_log(log, RUN1[:7], RUN1[7:])
    r = compact(spark, str(log), str(snap), now=T0 + 60)
    assert r.created and r.manifest.generation == 1 and r.manifest.events == len(RUN1)
    assert (r.manifest.objects, r.manifest.tombstones, r.manifest.max_version) == (5, 2, 13)
    assertDataFrameEqual(snapshot(spark, snap, 1), frame(spark, LIVE1))
    assertDataFrameEqual(snapshot(spark, snap, 1, live=False), frame(spark, DELETED1))


def test_incremental_runs_read_only_new_segments_and_keep_deletes(spark, tmp_path):
    log, snap = tmp_path / "log", tmp_path / "snap"
    write_log(log, RUN1)
    assert compact(spark, str(log), str(snap), now=T0 + 60).manifest.generation == 1
    write_log(log, RUN2)
    r = compact(spark, str(log), str(snap), now=T0 + 120)
    assert r.created and r.new_segments == 2 and r.manifest.events == len(RUN2) and r.manifest.previous == 1
    assertDataFrameEqual(snapshot(spark, snap, 2), frame(spark, LIVE2))
    assertDataFrameEqual(snapshot(spark, snap, 2, live=False), frame(spark, DELETED2))
    again = compact(spark, str(log), str(snap), now=T0 + 180)  # nothing new: nothing written
    assert not again.created and again.manifest.generation == 2
    # Two generations kept; a third run removes the first.
    write_log(log, [ev("port", "e", "create", 17)])
    assert compact(spark, str(log), str(snap), now=T0 + 240).manifest.generation == 3
    assert sorted(p.name for p in snap.iterdir()) == ["gen-000002", "gen-000003"]


def test_the_result_does_not_depend_on_how_the_log_was_split(spark, tmp_path):
    one, other = tmp_path / "one", tmp_path / "other"
    write_log(one / "log", RUN1 + RUN2)
    rows = list(reversed(RUN1 + RUN2))
    write_log(other / "log", *[rows[i:i + 3] for i in range(0, len(rows), 3)])
    for base in (one, other):
        compact(spark, str(base / "log"), str(base / "snap"), now=T0 + 60)
    assertDataFrameEqual(snapshot(spark, other / "snap", 1), snapshot(spark, one / "snap", 1))
    assertDataFrameEqual(snapshot(spark, one / "snap", 1), frame(spark, LIVE2))


def test_tombstones_expire_after_the_retention(spark, tmp_path):
    log, snap = tmp_path / "log", tmp_path / "snap"
    write_log(log, RUN1)
    r = compact(spark, str(log), str(snap), tombstone_retention=3600, now=T0 + 7200)
    assert (r.manifest.objects, r.manifest.tombstones) == (5, 0)


def test_an_empty_log_makes_an_empty_generation_that_the_next_run_builds_on(spark, tmp_path):
    log, snap = tmp_path / "log", tmp_path / "snap"
    with pytest.raises(PipelineError, match="no event log"):
        compact(spark, str(log), str(snap), now=T0)
    log.mkdir()
    first = compact(spark, str(log), str(snap), now=T0)
    assert first.created and (first.manifest.events, first.manifest.objects, first.manifest.tombstones) == (0, 0, 0)
    assert not compact(spark, str(log), str(snap), now=T0).created
    write_log(log, RUN1)
    assert compact(spark, str(log), str(snap), now=T0 + 60).manifest.objects == len(LIVE1)
    assertDataFrameEqual(snapshot(spark, snap, 2), frame(spark, LIVE1))


def test_an_unfinished_generation_is_ignored_and_replaced(spark, tmp_path):
    log, snap = tmp_path / "log", tmp_path / "snap"
    write_log(log, RUN1)
    compact(spark, str(log), str(snap), now=T0 + 60)
    (snap / "gen-000002" / "state=live").mkdir(parents=True)  # a crashed run: no manifest
    (snap / "gen-000002" / "state=live" / "part-0.parquet").write_bytes(b"not parquet")
    write_log(log, RUN2)
    r = compact(spark, str(log), str(snap), now=T0 + 120)
    assert r.manifest.generation == 2 and r.manifest.previous == 1
    assertDataFrameEqual(snapshot(spark, snap, 2), frame(spark, LIVE2))
