import itertools
import os

import pytest

zmq = pytest.importorskip("zmq")


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


def backend_store(request, tmp_path, tables, label):
    """A store on the backend named by ``request.param`` (sqlite, etcd, redis), with a key prefix
    of its own on the shared servers; for fixtures parametrized over the three backends."""
    from dfpubsub.store import open_store

    if request.param == "sqlite":
        return open_store(f"sqlite:///{tmp_path}/nb.sqlite", tables)
    server = request.getfixturevalue(f"shared_{request.param}")
    return open_store(server.url, tables, prefix=f"{label}{next(_prefix)}-{tmp_path.name}")


_prefix = itertools.count()
