"""df-pipeline audit finds the gaps, duplicates and order violations seeded into a log."""

import json

import msgpack
import pytest

pytest.importorskip("pyspark")
pytest.importorskip("pyarrow")

from pyspark.sql import types as T  # noqa: E402
from pyspark.testing import assertDataFrameEqual  # noqa: E402

from dfpubsub.archive import SegmentWriter  # noqa: E402
from dfpubsub.archive.marks import reach_note  # noqa: E402
from dfpubsub.archive.schema import HISTORY_GONE, REACH, feed_row, marker_row  # noqa: E402
from dfpubsub.pipeline.audit import audit  # noqa: E402
from dfpubsub.pipeline.fs import HadoopFs  # noqa: E402
from dfpubsub.pipeline.logread import list_segments  # noqa: E402

T0 = 1_767_225_600.0  # 2026-01-01T00:00:00Z
GAP_SCHEMA = T.StructType(
    [T.StructField(name, T.StringType()) for name in ("publisher_id", "topic")]
    + [T.StructField(name, T.LongType()) for name in ("first_missing", "last_missing", "missing", "prev_version",
                                                       "next_version")]
    + [T.StructField("cause", T.StringType(), False)])


def ev(pub, topic, seq, key, version, at, delivery=0.010, age=0.050):
    """An event received at T0 + at, sent ``delivery`` before that, written ``age`` before that."""
    received = T0 + at
    return (topic, topic, key, "update", version, msgpack.packb(version), received - age, pub, seq,
            received - delivery, received)


def seeded_log():
    rows = []
    # p1/port: seqs 1..10 without 4 and 5 (one gap of two), seq 7 archived three times.
    for seq in [1, 2, 3, 6, 7, 7, 8, 9, 10, 7]:
        rows.append(ev("p1", "port", seq, f"k{seq}", 100 + seq, at=seq))
    # p2/net: first heard at seq 3 (nothing missing before it), then 9 (7 and 8 missing).
    for seq in [3, 4, 5, 6, 9]:
        rows.append(ev("p2", "net", seq, f"n{seq}", 200 + seq, at=seq + 100, delivery=0.020))
    # Per-key order: port/shared gets v50 from p1 then the older v40 from p3 (a violation),
    # then v60; the duplicate of v60 is not a violation.
    rows.append(ev("p1", "port", 11, "shared", 50, at=11))
    rows.append(ev("p3", "port", 1, "shared", 40, at=12))
    rows.append(ev("p3", "port", 2, "shared", 60, at=13))
    rows.append(ev("p3", "port", 2, "shared", 60, at=14))
    return rows


def write_log(root, rows: list[tuple], every: int = 5) -> None:
    """``rows`` archived under ``root``, a segment every ``every`` rows."""
    w = SegmentWriter(str(root), fsync=False)
    for i, r in enumerate(rows):
        w.append(r)
        if i % every == every - 1:
            w.roll()
    w.close()


def test_audit_reports_seeded_faults(spark, seeded_audit):
    out, rows, s = seeded_audit.out, seeded_audit.rows, seeded_audit.result.summary

    assertDataFrameEqual(spark.read.parquet(str(out / "gaps")),
                         spark.createDataFrame([("p1", "port", 4, 5, 2, 103, 106, ""),
                                                ("p2", "net", 7, 8, 2, 206, 209, "")], GAP_SCHEMA))
    dup_schema = T.StructType([T.StructField("publisher_id", T.StringType()), T.StructField("topic", T.StringType()),
                               T.StructField("seq", T.LongType()), T.StructField("copies", T.LongType(), False)])
    assertDataFrameEqual(spark.read.parquet(str(out / "duplicates")),
                         spark.createDataFrame([("p1", "port", 7, 3), ("p3", "port", 2, 2)], dup_schema))
    violations = spark.read.parquet(str(out / "order_violations")).collect()
    assert [(v.table, v.key, v.version, v.max_version_before, v.publisher_id, v.seq) for v in violations] == [
        ("port", "shared", 40, 50, "p3", 1)]

    assert (s["events"], s["distinct_events"], s["publishers"], s["streams"]) == (len(rows), len(rows) - 3, 3, 3)
    assert (s["gaps"]["count"], s["gaps"]["missing_events"]) == (2, 4)
    assert (s["duplicates"]["sequences"], s["duplicates"]["extra_copies"]) == (2, 3)
    assert s["order_violations"]["count"] == 1
    port, net = s["latency"]["port"], s["latency"]["net"]
    assert port["delivery_p50"] == pytest.approx(0.010, abs=1e-6)
    assert net["delivery_p99"] == pytest.approx(0.020, abs=1e-6)
    assert port["end_to_end_max"] == pytest.approx(0.050, abs=1e-6)
    rates = {(r.topic, r.bucket_start): r.events for r in spark.read.parquet(str(out / "rates")).collect()}
    assert rates == {("port", T0): 14, ("net", T0 + 60): 5}

    assert json.loads((out / "summary.json").read_text()) == json.loads(json.dumps(s))
    text = (out / "summary.txt").read_text()
    assert "gaps: 2 (4 events missing): 0 filled from the change feed, 0 in history gone, 2 unexplained" in text
    assert "p1 port: seq 4..5 (2)\n" in text
    assert s["writes"] == {"distinct": len(rows) - 3, "rows": len(rows), "from_feed": 0, "repeated": 2,
                           "reach": None, "history_gone": []}
    assert (out / "audit.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_audit_prunes_by_topic(spark, tmp_path):
    log, out = tmp_path / "log", tmp_path / "report"
    w = SegmentWriter(str(log), fsync=False)
    for r in seeded_log():
        w.append(r)
    w.close()
    s = audit(spark, str(log), str(out), topics=["net"], since="2026-01-01", until="2026-01-01").summary
    assert (s["segments"], s["events"], s["gaps"]["count"], s["duplicates"]["sequences"]) == (1, 5, 1, 0)
    fs = HadoopFs(spark, str(log))
    assert list_segments(fs, str(log), since="2026-01-02") == [] and len(list_segments(fs, str(log))) == 2
    assert list_segments(fs, str(log), topics=["port"], until="2025-12-31") == []


def test_audit_tells_gaps_filled_from_the_feed_and_history_gone_from_unexplained_ones(spark, tmp_path):
    log, out = tmp_path / "log", tmp_path / "report"
    w = SegmentWriter(str(log), fsync=False)
    # p1 publishes revisions 101..120 in order (as df-feed does) at seqs 1..20; the archiver
    # received all but 4-5 (read from the feed later), 12-13 (history gone when it looked) and
    # 18-19 (above its reach at the end: unexplained).
    for seq in range(1, 21):
        if seq not in (4, 5, 12, 13, 18, 19):
            w.append(ev("p1", "port", seq, f"k{seq}", 100 + seq, at=seq))
    for seq in (4, 5):
        w.append(feed_row("port", "port", f"k{seq}", "update", 100 + seq, msgpack.packb(seq), T0 + 30))
    w.append(marker_row("port", HISTORY_GONE, 113, 111, msgpack.packb({"after": 111}), T0 + 31))
    w.append(marker_row("port", REACH, 115, 0, reach_note(""), T0 + 32))
    w.close()
    s = audit(spark, str(log), str(out), bucket=60.0).summary
    assertDataFrameEqual(spark.read.parquet(str(out / "gaps")), spark.createDataFrame([
        ("p1", "port", 4, 5, 2, 103, 106, "filled"), ("p1", "port", 12, 13, 2, 111, 114, "history_gone"),
        ("p1", "port", 18, 19, 2, 117, 120, "")], GAP_SCHEMA))
    assert (s["gaps"]["count"], s["gaps"]["filled"], s["gaps"]["history_gone"], s["gaps"]["unexplained"]) == (3, 1, 1, 1)
    assert (s["events"], s["streams"]) == (14, 1)  # what was received: feed rows and markers apart
    assert s["order_violations"]["count"] == 0  # a write read from the feed comes late by design
    assert s["writes"] == {"distinct": 16, "rows": 16, "from_feed": 2, "repeated": 0, "reach": 115,
                           "history_gone": [{"topic": "port", "after": 111, "horizon": 113, "received_at": T0 + 31}]}
    text = (out / "summary.txt").read_text()
    assert "1 filled from the change feed, 1 in history gone, 1 unexplained" in text
    assert "p1 port: seq 12..13 (2) history gone" in text and "history gone in port: revisions 112..113" in text
