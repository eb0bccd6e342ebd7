"""The pipeline tests' local Spark, and the seeded log's audit two tests share."""

import os
from types import SimpleNamespace

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


@pytest.fixture(scope="session")
def seeded_audit(spark, tmp_path_factory):
    """The seeded log (``test_pipeline_audit.seeded_log``, a segment every six rows) and what audit
    made of it on the local session: the audit test checks it, the cluster test compares its
    own run with it (an audit is ~15 s of Spark; run once)."""
    from dfpubsub.pipeline.audit import audit
    from tests.functional.pipeline.test_pipeline_audit import seeded_log, write_log

    root = tmp_path_factory.mktemp("seeded-audit")
    log, out, rows = root / "log", root / "report", seeded_log()
    write_log(log, rows, every=6)
    return SimpleNamespace(log=log, out=out, rows=rows, result=audit(spark, str(log), str(out), bucket=60.0))
