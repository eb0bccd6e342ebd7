"""The Spark session of the pipeline jobs: ``local[*]`` by default, the cluster's under spark-submit.

Run directly (``df-pipeline compact ...``) a job starts its own local Spark
with as many threads as cores. Started by ``spark-submit --master ...`` the
JVM already runs with that master and the job must not override it: the
master is left alone when ``PYSPARK_GATEWAY_PORT`` (set by spark-submit for
the Python driver) or ``MASTER`` is in the environment. The jobs use only
DataFrame expressions, no Python UDFs, so executors need nothing of dfpubsub.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from ..errors import PipelineError

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

__all__ = ["DEFAULT_MASTER", "SPARK_DEFAULTS", "build_session", "require_pyspark"]

DEFAULT_MASTER = "local[*]"
#: The heap of a local Spark's one JVM; ``spark.driver.memory`` overrides it.
LOCAL_HEAP = "1g"
#: What every job sets unless told otherwise.
SPARK_DEFAULTS: dict[str, str] = {
    "spark.sql.session.timeZone": "UTC",
    "spark.ui.showConsoleProgress": "false",
    # Snapshots are rewritten by every compaction: snappy writes ~7% faster end to end than zstd
    # (tools/bench/pipeline.py at 10M events) for somewhat larger files.
    "spark.sql.parquet.compression.codec": "snappy",
    # Segments are many and small: pack them into fewer read tasks.
    "spark.sql.files.maxPartitionBytes": str(256 << 20),
}
#: A local Spark binds loopback only: nothing of it should be reachable from outside. Its one JVM
#: runs batch jobs, where the throughput collector beat G1 by about 15% (tools/bench/pipeline.py).
#: Its memory is fixed rather than grown with the input: a heap of LOCAL_HEAP, allocated and
#: touched whole at start (-Xms, AlwaysPreTouch: no resizing, and the footprint a job starts
#: with is the one it keeps); sorts and aggregations beyond it spill to disk.
_LOCAL_DEFAULTS: dict[str, str] = {
    "spark.driver.host": "127.0.0.1",
    "spark.driver.bindAddress": "127.0.0.1",
    "spark.driver.memory": LOCAL_HEAP,
}
_LOCAL_JAVA_OPTIONS = "-XX:+UseParallelGC -XX:+AlwaysPreTouch -Xms{heap}"


def require_pyspark() -> Any:
    """The pyspark module, or PipelineError saying how to get it."""
    try:
        import pyspark
    except ImportError as exc:
        raise PipelineError("the pipeline jobs need pyspark and Java: pip install 'dfpubsub[spark]'") from exc
    return pyspark


def _master_given() -> bool:
    return "PYSPARK_GATEWAY_PORT" in os.environ or "MASTER" in os.environ


def _local_threads(master: str) -> int:
    """The worker threads of a ``local``, ``local[N]``, ``local[*]`` or ``local[N,F]`` master."""
    inside = master[len("local"):].strip("[]").split(",")[0]
    if inside == "*":
        return os.cpu_count() or 1
    return int(inside) if inside.isdigit() else 1


def _local_parallelism(master: str) -> dict[str, str]:
    """Settings that give each of ``master``'s threads an equal share of every stage.

    Spark's defaults cut the input into splits of at most 256 MiB and the
    shuffle into 200 partitions coalesced to about 64 MiB each: on a few
    threads the last task of a stage then runs alone (10M events on local[2]:
    three read tasks and three reduce tasks for two threads). One split and
    one shuffle partition per thread keeps every thread busy to the end.
    """
    threads = str(_local_threads(master))
    return {"spark.sql.files.maxPartitionBytes": str(1 << 40), "spark.sql.files.minPartitionNum": threads,
            "spark.sql.shuffle.partitions": threads}


def build_session(app_name: str, master: str | None = None, conf: Mapping[str, str] | None = None) -> SparkSession:
    """A SparkSession for ``app_name``: ``master`` if given, else the one spark-submit set, else local[*].

    ``conf`` overrides :data:`SPARK_DEFAULTS`. An existing session of this
    process is reused (its static settings stay as they were).
    """
    require_pyspark()
    from pyspark.sql import SparkSession

    settings = dict(SPARK_DEFAULTS)
    builder = SparkSession.builder.appName(app_name)
    if master is None and not _master_given():
        master = DEFAULT_MASTER
    if master is not None:
        builder = builder.master(master)
        if master.startswith("local"):
            settings.update(_LOCAL_DEFAULTS)
            settings.update(_local_parallelism(master))
    settings.update(conf or {})
    if master is not None and master.startswith("local"):
        settings.setdefault("spark.driver.extraJavaOptions",
                            _LOCAL_JAVA_OPTIONS.format(heap=settings["spark.driver.memory"]))
    for key, value in settings.items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("WARN")
    return spark
