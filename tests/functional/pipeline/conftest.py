"""The pipeline tests' local Spark."""

import os

import pytest

# pyspark.testing imports pandas-on-Spark, which warns unless this is set before Spark starts.
os.environ.setdefault("PYARROW_IGNORE_TIMEZONE", "1")


@pytest.fixture(scope="session")
def spark():
    """One local SparkSession for every pipeline test: starting Spark takes seconds."""
    pytest.importorskip("pyspark")
    from dfpubsub.pipeline import build_session

    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    session = build_session("dfpubsub-tests", "local[2]", {
        "spark.sql.shuffle.partitions": "2",
        "spark.default.parallelism": "2",
        "spark.ui.enabled": "false",
    })
    yield session
    session.stop()
