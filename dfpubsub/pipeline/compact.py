"""``compact``: the latest row of every (table, key), as a new snapshot generation.

Incremental: a run reads the previous generation (live objects and recent
tombstones) and only the segments its manifest has not consumed, and writes
the next generation; with no new segment it writes nothing. Deletes take part
in choosing the latest row like any other action (a delete newer than an
update hides it, a re-create newer than the delete wins) and only then are
they set apart: live rows go to ``state=live``, delete rows younger than
``tombstone_retention`` to ``state=deleted``, so that an older event arriving
in a later run (a recovered journal, a second archiver) cannot resurrect the
object. Older tombstones are dropped.

Ties are broken by a total order over the whole row, so the result never
depends on how Spark split the input: the greatest ``version`` wins; among
equal versions ``delete`` beats ``update`` beats ``create`` (a conflict is
settled the way that cannot resurrect anything); then the later
``timestamp``, ``sent_at`` and ``received_at``; then the greater
``publisher_id``, ``seq``, ``topic`` and ``value`` (bytes). Rows equal in all
of these are identical, and either one is the result.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING

from ..archive.layout import parse_partition
from ..archive.schema import COLUMNS, OBJECT_ACTIONS
from .fs import HadoopFs
from .logread import list_segments, log_schema, read_segments
from .snapshot import MANIFEST, Manifest, generation_dir, generations, latest_manifest

if TYPE_CHECKING:
    from pyspark.sql import Column, DataFrame, SparkSession

__all__ = ["ACTION_RANK", "TIE_BREAK", "CompactResult", "compact", "latest_per_key", "read_generation"]

log = logging.getLogger(__name__)

#: Among equal versions the higher rank wins.
ACTION_RANK = {"delete": 2, "update": 1, "create": 0}
#: The order (all descending) that picks the latest row of a key; ``action_rank`` is ACTION_RANK.
TIE_BREAK = ("version", "action_rank", "timestamp", "sent_at", "received_at", "publisher_id", "seq", "topic", "value")
#: Partition column of a generation: ``live`` objects or ``deleted`` tombstones.
STATE = "state"


@dataclass
class CompactResult:
    """What a run did: ``manifest`` of the generation now current, whether this run ``created`` it."""

    manifest: Manifest
    created: bool
    new_segments: int
    seconds: float


def _rank(col: Column) -> Column:
    from pyspark.sql import functions as F

    expr = F.lit(-1)
    for action, rank in ACTION_RANK.items():
        expr = F.when(col == action, rank).otherwise(expr)
    return expr


def latest_per_key(rows: DataFrame) -> DataFrame:
    """The winning row of each (table, key) of ``rows`` (log columns), by :data:`TIE_BREAK`."""
    from pyspark.sql import Window
    from pyspark.sql import functions as F

    ranked = rows.withColumn("action_rank", _rank(F.col("action")))
    # The hash leads the partition columns only to speed up the sort: Spark compares rows by an
    # 8-byte prefix of the first column, and the table names alone (a few, all alike) tell nothing.
    window = (Window.partitionBy(F.xxhash64("table", "key"), "table", "key")
              .orderBy(*[F.col(c).desc() for c in TIE_BREAK]))
    return (ranked.withColumn("_n", F.row_number().over(window)).where(F.col("_n") == 1)
            .select(*[name for name, _ in COLUMNS]))


def read_generation(spark: SparkSession, root: str, generation: int) -> DataFrame:
    """Every row (live and tombstones) of a generation, in the log's columns."""
    from pyspark.sql import types as T

    folder = generation_dir(root, generation)
    schema = T.StructType([*log_schema().fields, T.StructField(STATE, T.StringType())])
    df = spark.read.schema(schema).option("basePath", folder).parquet(folder)
    return df.select(*[name for name, _ in COLUMNS])


def compact(
    spark: SparkSession,
    log_root: str,
    snapshot_root: str,
    tombstone_retention: float = 7 * 86400.0,
    keep: int = 2,
    now: float | None = None,
) -> CompactResult:
    """Fold the segments of ``log_root`` not yet compacted into a new generation under ``snapshot_root``.

    ``keep`` committed generations are kept (older ones and unfinished ones
    are deleted after the commit); ``now`` (Unix seconds) dates the retention.
    """
    from pyspark.sql import Observation
    from pyspark.sql import functions as F

    started = time.monotonic()
    now = time.time() if now is None else now
    snap_fs, log_fs = HadoopFs(spark, snapshot_root), HadoopFs(spark, log_root)
    previous = latest_manifest(snap_fs, snapshot_root)
    segments = list_segments(log_fs, log_root)
    consumed = previous.consumed() if previous is not None else set()
    new = [s for s in segments if s not in consumed]
    if previous is not None and not new:
        return CompactResult(previous, False, 0, time.monotonic() - started)

    # The events read come from the segments' footers (a job that opens no column); what is written
    # is counted as a side effect of the job that writes it. An Observation on the read itself would
    # stand between the scan and the sort of every event, breaking their generated code in two:
    # about 6% of the run at 10M events (tools/bench/pipeline.py).
    rows = read_segments(spark, log_root, new)
    events = rows.count()
    rows = rows.where(F.col("action").isin(*OBJECT_ACTIONS))  # not the archiver's markers
    written = Observation("compact-written")
    if previous is not None:
        rows = rows.unionByName(read_generation(spark, snapshot_root, previous.generation))
    latest = latest_per_key(rows)
    deleted = F.col("action") == "delete"
    kept = latest.where(~deleted | (F.col("received_at") >= F.lit(now - tombstone_retention))).observe(
        written, F.count(F.when(~deleted, 1)).alias("live"), F.count(F.when(deleted, 1)).alias("deleted"),
        F.max("version").alias("max_version"))
    # A crashed run may have left this generation half-written: it was never committed, overwrite it.
    generation = (previous.generation if previous is not None else 0) + 1
    folder = generation_dir(snapshot_root, generation)
    (kept.withColumn(STATE, F.when(deleted, "deleted").otherwise("live"))
     .write.mode("overwrite").partitionBy(STATE, "topic").parquet(folder))

    counts = written.get
    manifest = Manifest(
        generation=generation,
        created_at=now,
        segments=_segment_map(segments, consumed | set(new)),
        objects=int(counts["live"]),
        tombstones=int(counts["deleted"]),
        max_version=int(counts["max_version"] or 0),
        events=events,
        previous=previous.generation if previous is not None else None,
    )
    snap_fs.write_bytes(f"{folder}/{MANIFEST}", manifest.to_json())
    for old in generations(snap_fs, snapshot_root):
        old_dir = generation_dir(snapshot_root, old)
        if old < generation and (old <= generation - max(1, keep) or MANIFEST not in snap_fs.listdir(old_dir)):
            snap_fs.delete(old_dir)
    seconds = time.monotonic() - started
    log.info("compacted", extra={"generation": generation, "segments": len(new), "events": manifest.events,
                                 "objects": manifest.objects, "tombstones": manifest.tombstones,
                                 "seconds": round(seconds, 3)})
    return CompactResult(manifest, True, len(new), seconds)


def _segment_map(listed: list[str], consumed: set[str]) -> dict[str, list[str]]:
    """The consumed segments that still exist, by partition (a manifest stays as big as the log)."""
    out: dict[str, list[str]] = {}
    for rel in listed:
        if rel in consumed:
            part, _, name = rel.rpartition("/")
            if parse_partition(part) is not None:
                out.setdefault(part, []).append(name)
    return out
