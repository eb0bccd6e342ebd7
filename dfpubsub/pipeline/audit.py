"""``audit``: what the event log says about delivery, as Parquet tables plus a readable summary and a plot.

Tables written under the output directory:

- ``streams``: per (publisher_id, topic), the first and last sequence seen,
  distinct sequences and events (copies included);
- ``gaps``: per stream, each run of sequences missing between the first and
  the last seen (``first_missing``, ``last_missing``, ``missing``), with the
  versions of the events around it (``prev_version``, ``next_version``) and
  its ``cause``: ``filled`` when the archiver read the missing writes from the
  store's change feed (the run lies below the log's reach: every write up to
  it is in the log, as a row of its own), ``history_gone`` when it lies in a
  stretch the feed no longer held when the archiver looked, else ``""``
  (unexplained). Before the first sequence seen nothing counts as missing:
  the archiver may have started late;
- ``duplicates``: sequences archived more than once (``copies``);
- ``order_violations``: events whose version is not above every version of
  the same (table, key) received before them (by ``received_at``, then
  ``publisher_id`` and ``seq``), duplicates excluded;
- ``latency``: per topic, percentiles (p50, p90, p99) and the maximum of the
  delivery latency (``received_at - sent_at``) and of the end-to-end latency
  (``received_at - timestamp``, from the write to the archive), in seconds;
- ``rates``: per topic and time bucket, events, events per second and the p50
  and p99 delivery latency;
- ``writes``: per write (topic, table, key, version) archived more than once,
  its ``copies`` (two publishers of one write, NbApi and df-feed, make two);
- ``history_gone``: the archiver's markers of history it could not check
  (``topic``, ``after``, ``horizon``, ``received_at``).

Streams, gaps, duplicates, order and latency are about what was received:
rows read from the feed (``publisher_id`` ``store-feed``, late by design) and
markers are left out of them.

``summary.json``, ``summary.txt`` and ``audit.png`` (rates and latencies over
time; needs matplotlib) sit beside them.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ..archive.schema import FEED_PUBLISHER, HISTORY_GONE, OBJECT_ACTIONS, REACH
from .fs import HadoopFs
from .logread import list_segments, read_segments
from .report import plot_png, render_text

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, Row, SparkSession

__all__ = ["AuditResult", "PERCENTILES", "audit"]

PERCENTILES = (0.5, 0.9, 0.99)
_TABLES = ("streams", "gaps", "duplicates", "order_violations", "latency", "rates", "writes", "history_gone")


@dataclass
class AuditResult:
    """The summary (also written as summary.json) and where the tables are."""

    summary: dict[str, Any]
    out: str
    seconds: float


def _stream_tables(rows: DataFrame, marks: DataFrame) -> dict[str, DataFrame]:
    from pyspark.sql import Window
    from pyspark.sql import functions as F

    per_seq = rows.groupBy("publisher_id", "topic", "seq").agg(F.count(F.lit(1)).alias("copies"),
                                                               F.max("version").alias("version"))
    by_seq = Window.partitionBy("publisher_id", "topic").orderBy("seq")
    gaps = (per_seq.select("publisher_id", "topic", "seq", "version", F.lag("seq").over(by_seq).alias("prev"),
                           F.lag("version").over(by_seq).alias("prev_version"))
            .where(F.col("seq") - F.col("prev") > 1)
            .select("publisher_id", "topic", (F.col("prev") + 1).alias("first_missing"),
                    (F.col("seq") - 1).alias("last_missing"), (F.col("seq") - F.col("prev") - 1).alias("missing"),
                    "prev_version", F.col("version").alias("next_version")))
    streams = per_seq.groupBy("publisher_id", "topic").agg(
        F.min("seq").alias("first_seq"), F.max("seq").alias("last_seq"),
        F.count(F.lit(1)).alias("distinct_events"), F.sum("copies").alias("events"))
    return {"streams": streams, "gaps": _causes(gaps, marks), "duplicates": per_seq.where(F.col("copies") > 1).drop("version")}


def _causes(gaps: DataFrame, marks: DataFrame) -> DataFrame:
    """``gaps`` with their ``cause``, from the archiver's markers of their topic (see the module's doc).

    The writes a gap misses were published between the events around it: from a publisher in
    revision order (df-feed) their revisions lie between those events' versions, and a gap below
    the reach (``next_version`` at most the newest reach marker) has them in the log.
    """
    from pyspark.sql import functions as F

    reach = marks.where(F.col("action") == REACH).groupBy("topic").agg(F.max("version").alias("reach"))
    gone = (marks.where(F.col("action") == HISTORY_GONE)
            .select("topic", F.col("seq").alias("after"), F.col("version").alias("horizon")))
    in_gone = (gaps.join(gone, "topic")
               .where((F.col("next_version") > F.col("after")) & (F.col("prev_version") <= F.col("horizon")))
               .select("publisher_id", "topic", "first_missing").distinct().withColumn("gone", F.lit(True)))
    keys = ["publisher_id", "topic", "first_missing"]
    return (gaps.join(reach, "topic", "left").join(in_gone, keys, "left")
            .withColumn("cause", F.when(F.col("gone"), "history_gone")
                        .when(F.col("next_version") <= F.col("reach"), "filled").otherwise(""))
            .select("publisher_id", "topic", "first_missing", "last_missing", "missing", "prev_version",
                    "next_version", "cause"))


def _writes(objects: DataFrame) -> DataFrame:
    from pyspark.sql import functions as F

    return (objects.groupBy("topic", "table", "key", "version")
            .agg(F.count(F.lit(1)).alias("copies"),
                 F.sum(F.when(F.col("publisher_id") == FEED_PUBLISHER, 1).otherwise(0)).alias("from_feed"))
            .where(F.col("copies") > 1))


def _order_violations(rows: DataFrame) -> DataFrame:
    from pyspark.sql import Window
    from pyspark.sql import functions as F

    before = (Window.partitionBy("table", "key").orderBy("received_at", "publisher_id", "seq")
              .rowsBetween(Window.unboundedPreceding, -1))
    firsts = rows.dropDuplicates(["publisher_id", "topic", "seq"])
    return (firsts.withColumn("max_version_before", F.max("version").over(before))
            .where(F.col("version") <= F.col("max_version_before"))
            .select("table", "key", "topic", "action", "version", "max_version_before", "publisher_id", "seq",
                    "received_at"))


def _latency_tables(rows: DataFrame, bucket: float) -> dict[str, DataFrame]:
    from pyspark.sql import functions as F

    lat = rows.select(
        "topic", "received_at",
        F.when(F.col("sent_at") > 0, F.col("received_at") - F.col("sent_at")).alias("delivery"),
        F.when(F.col("timestamp") > 0, F.col("received_at") - F.col("timestamp")).alias("end_to_end"))
    aggs = [F.count(F.lit(1)).alias("events")]
    for name in ("delivery", "end_to_end"):
        quantiles = F.percentile_approx(name, list(PERCENTILES))
        aggs += [quantiles[i].alias(f"{name}_p{round(p * 100)}") for i, p in enumerate(PERCENTILES)]
        aggs.append(F.max(name).alias(f"{name}_max"))
    latency = lat.groupBy("topic").agg(*aggs)
    quantiles = F.percentile_approx("delivery", [0.5, 0.99])
    rates = (lat.withColumn("bucket_start", F.floor(F.col("received_at") / bucket) * bucket)
             .groupBy("topic", "bucket_start")
             .agg(F.count(F.lit(1)).alias("events"), quantiles[0].alias("delivery_p50"),
                  quantiles[1].alias("delivery_p99"))
             .withColumn("events_per_s", F.col("events") / F.lit(bucket)))
    return {"latency": latency, "rates": rates}


def audit(
    spark: SparkSession,
    log_root: str,
    out: str,
    topics: Iterable[str] | None = None,
    since: str | None = None,
    until: str | None = None,
    bucket: float = 60.0,
    top: int = 20,
) -> AuditResult:
    """Audit the log under ``log_root`` (pruned to ``topics`` and dates [since, until]) into ``out``."""
    from pyspark import StorageLevel

    started = time.monotonic()
    segments = list_segments(HadoopFs(spark, log_root), log_root, topics, since, until)
    from pyspark.sql import functions as F

    everything = read_segments(spark, log_root, segments).persist(StorageLevel.DISK_ONLY)
    objects = everything.where(F.col("action").isin(*OBJECT_ACTIONS))
    rows = objects.where(F.col("publisher_id") != FEED_PUBLISHER)  # what was received
    marks = everything.where(~F.col("action").isin(*OBJECT_ACTIONS) & (F.col("publisher_id") == FEED_PUBLISHER))
    tables = {**_stream_tables(rows, marks), "order_violations": _order_violations(rows),
              **_latency_tables(rows, bucket), "writes": _writes(objects),
              "history_gone": marks.where(F.col("action") == HISTORY_GONE).select(
                  "topic", F.col("seq").alias("after"), F.col("version").alias("horizon"), "received_at")}
    base = out.rstrip("/")
    for name in _TABLES:
        tables[name].coalesce(1).write.mode("overwrite").parquet(f"{base}/{name}")
    is_write = F.col("action").isin(*OBJECT_ACTIONS)
    counts = _one(everything.agg(  # one job
        F.sum(F.when(is_write, 1).otherwise(0)).alias("rows"),
        F.countDistinct(F.when(is_write, F.struct("table", "key", "version"))).alias("distinct"),
        F.sum(F.when(is_write & (F.col("publisher_id") == FEED_PUBLISHER), 1).otherwise(0)).alias("from_feed"),
        F.max(F.when(F.col("action") == REACH, F.col("version"))).alias("reach")))
    everything.unpersist()
    written = {name: spark.read.parquet(f"{base}/{name}") for name in _TABLES}
    summary = _summarise(written, len(segments), bucket, top)
    summary["writes"] = {"distinct": int(counts["distinct"] or 0), "rows": int(counts["rows"] or 0),
                         "from_feed": int(counts["from_feed"] or 0),
                         "repeated": written["writes"].count(),
                         "reach": None if counts["reach"] is None else int(counts["reach"]),
                         "history_gone": [r.asDict() for r in written["history_gone"].orderBy("received_at", "topic")
                                          .limit(top).collect()]}
    rates = [r.asDict() for r in written["rates"].orderBy("bucket_start").collect()]
    fs = HadoopFs(spark, base)
    fs.write_bytes(f"{base}/summary.json", json.dumps(summary, indent=1, sort_keys=True).encode())
    fs.write_bytes(f"{base}/summary.txt", render_text(summary).encode())
    png = plot_png(rates, summary["latency"], bucket)
    if png is not None:
        fs.write_bytes(f"{base}/audit.png", png)
    return AuditResult(summary, base, time.monotonic() - started)


def _one(df: DataFrame) -> Row:
    """The row of an aggregate over a whole frame: there is exactly one, even over no rows."""
    row = df.first()
    assert row is not None
    return row


def _summarise(t: dict[str, DataFrame], segments: int, bucket: float, top: int) -> dict[str, Any]:
    from pyspark.sql import functions as F

    streams = _one(t["streams"].agg(F.count(F.lit(1)).alias("streams"), F.countDistinct("publisher_id").alias("publishers"),
                               F.sum("events").alias("events"), F.sum("distinct_events").alias("distinct")))
    gaps = _one(t["gaps"].agg(
        F.count(F.lit(1)).alias("n"), F.sum("missing").alias("missing"),
        *[F.sum(F.when(F.col("cause") == cause, 1).otherwise(0)).alias(name)
          for name, cause in (("unexplained", ""), ("filled", "filled"), ("history_gone", "history_gone"))]))
    dups = _one(t["duplicates"].agg(F.count(F.lit(1)).alias("n"), F.sum(F.col("copies") - 1).alias("extra")))
    peak = _one(t["rates"].agg(F.max("events_per_s").alias("peak")))

    def rows(df: DataFrame, order: list[Any]) -> list[dict[str, Any]]:
        return [r.asDict() for r in df.orderBy(*order).limit(top).collect()]

    return {
        "segments": segments,
        "events": int(streams["events"] or 0),
        "distinct_events": int(streams["distinct"] or 0),
        "publishers": int(streams["publishers"] or 0),
        "streams": int(streams["streams"] or 0),
        "gaps": {"count": int(gaps["n"] or 0), "missing_events": int(gaps["missing"] or 0),
                 "unexplained": int(gaps["unexplained"] or 0), "filled": int(gaps["filled"] or 0),
                 "history_gone": int(gaps["history_gone"] or 0),
                 "largest": rows(t["gaps"], [F.desc("missing"), "publisher_id", "topic", "first_missing"])},
        "duplicates": {"sequences": int(dups["n"] or 0), "extra_copies": int(dups["extra"] or 0),
                       "most_copied": rows(t["duplicates"], [F.desc("copies"), "publisher_id", "topic", "seq"])},
        "order_violations": {"count": t["order_violations"].count(),
                             "first": rows(t["order_violations"], ["received_at", "table", "key"])},
        "latency": {r["topic"]: {k: v for k, v in r.asDict().items() if k != "topic"}
                    for r in t["latency"].orderBy("topic").collect()},
        "rates": {"bucket_seconds": bucket, "peak_events_per_s": float(peak["peak"] or 0.0)},
    }
