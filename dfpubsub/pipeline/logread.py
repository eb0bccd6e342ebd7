"""Reading the event log in Spark: its schema, its segments (pruned by topic and date), its rows."""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING

from ..archive.layout import segment_files
from ..archive.schema import COLUMNS
from ..errors import PipelineError
from .fs import HadoopFs

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession
    from pyspark.sql.types import StructType

__all__ = ["log_schema", "list_segments", "read_segments"]


def log_schema() -> StructType:
    """The Spark schema of the log (the same columns as the archiver's pyarrow schema)."""
    from pyspark.sql import types as T

    kinds = {"string": T.StringType(), "binary": T.BinaryType(), "int64": T.LongType(), "float64": T.DoubleType()}
    return T.StructType([T.StructField(name, kinds[kind], nullable=name == "value") for name, kind in COLUMNS])


def list_segments(
    fs: HadoopFs, root: str, topics: Iterable[str] | None = None, since: str | None = None, until: str | None = None
) -> list[str]:
    """Segments under ``root`` (relative paths), only of ``topics`` and dates in [since, until] if given.

    Dates are ``YYYY-MM-DD`` (UTC, of when the archiver received the events);
    pruning happens on directory names, before any file is opened. A root
    that does not exist is a PipelineError (a mistyped path), an empty one is not.
    """
    if not fs.exists(root):
        raise PipelineError(f"no event log at {root}")
    wanted = None if topics is None else set(topics)

    def accept(topic: str, date: str) -> bool:
        return ((wanted is None or topic in wanted) and (since is None or date >= since)
                and (until is None or date <= until))

    return list(segment_files(root.rstrip("/"), accept, fs.listdir))


def read_segments(spark: SparkSession, root: str, segments: list[str]) -> DataFrame:
    """The rows of ``segments`` (relative to ``root``) with the log's schema; empty for none.

    Files are named one by one, so Spark infers no partition columns: every
    column comes from the files themselves.
    """
    schema = log_schema()
    if not segments:
        return spark.createDataFrame([], schema)
    base = root.rstrip("/")
    return spark.read.schema(schema).parquet(*[f"{base}/{rel}" for rel in segments])
