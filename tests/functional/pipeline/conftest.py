"""The pipeline tests' local Spark."""

import os

import pytest

# pyspark.testing imports pandas-on-Spark, which warns unless this is set before Spark starts.
os.environ.setdefault("PYARROW_IGNORE_TIMEZONE", "1")


@pytest.hookimpl(tryfirst=True)  # before pytest-xdist reads the marks
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """The tests on Spark run on one pytest-xdist worker: each worker would start a JVM of its own."""
    for item in items:
        if "spark" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.xdist_group("spark"))


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
