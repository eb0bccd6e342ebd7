"""df-pipeline on a real Spark standalone cluster: a master and a worker started from the pyspark
package itself (its spark-class), on 127.0.0.1, free ports, temp dirs. compact and audit with
``--master spark://...`` give what they give on ``local[2]``."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest

pyspark = pytest.importorskip("pyspark")
pytest.importorskip("pyarrow")

from dfpubsub.pipeline import compact  # noqa: E402
from dfpubsub.pipeline.bootstrap import load_snapshot  # noqa: E402
from tests.conftest import free_port, wait_for  # noqa: E402
from tests.functional.pipeline.test_pipeline_audit import write_log  # noqa: E402
from tests.functional.pipeline.test_pipeline_compact import RUN1, RUN2  # noqa: E402

SPARK_HOME = Path(pyspark.__file__).parent
SPARK_CLASS = SPARK_HOME / "bin" / "spark-class"
PIPELINE = shutil.which("df-pipeline", path=os.path.dirname(sys.executable))
# Small and few: two JVMs of the cluster, the driver's and an executor's share two cores.
# Every job starts a driver's JVM and an executor's, besides the cluster's two: on a machine shared
# with other work, minutes each.
pytestmark = pytest.mark.timeout(1800)
JOB_CONF = ["--conf", "spark.ui.enabled=false", "--conf", "spark.sql.shuffle.partitions=2",
            "--conf", "spark.driver.host=127.0.0.1", "--conf", "spark.driver.bindAddress=127.0.0.1",
            "--conf", "spark.executor.memory=512m", "--conf", "spark.cores.max=2"]


class SparkDaemon:
    """One of spark-class's daemons (the master or a worker) in the foreground, its log in ``workdir``."""

    def __init__(self, workdir: Path, name: str, *argv: str):
        self.log = workdir / f"{name}.log"
        env = {**os.environ, "SPARK_HOME": str(SPARK_HOME), "SPARK_LOCAL_IP": "127.0.0.1",
               "SPARK_LOG_DIR": str(workdir), "SPARK_WORKER_DIR": str(workdir / "work"),
               "PYSPARK_PYTHON": sys.executable}
        with open(self.log, "wb") as out:
            self.proc = subprocess.Popen([str(SPARK_CLASS), *argv], stdout=out, stderr=subprocess.STDOUT,
                                         cwd=workdir, env=env, start_new_session=True)

    def logged(self, text: str) -> bool:
        assert self.proc.poll() is None, self.log.read_text()[-3000:]
        return text in self.log.read_text(errors="replace")

    def stop(self) -> None:
        """SIGTERM to its process group (a worker's executors too), SIGKILL if it lingers."""
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(20)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    """``spark://127.0.0.1:port`` of a standalone master with one worker of 2 cores."""
    if not os.access(SPARK_CLASS, os.X_OK):
        pytest.skip(f"{SPARK_CLASS} is not in this pyspark package")
    workdir = tmp_path_factory.mktemp("spark-cluster")
    port = free_port()
    url = f"spark://127.0.0.1:{port}"
    master = SparkDaemon(workdir, "master", "org.apache.spark.deploy.master.Master", "--host", "127.0.0.1",
                         "--port", str(port), "--webui-port", str(free_port()))
    worker = None
    try:
        wait_for(lambda: master.logged("I have been elected leader"), timeout=120, interval=0.2, what="the master")
        worker = SparkDaemon(workdir, "worker", "org.apache.spark.deploy.worker.Worker", "--host", "127.0.0.1",
                             "--port", str(free_port()), "--webui-port", str(free_port()), "--cores", "2",
                             "--memory", "1g", "--work-dir", str(workdir / "work"), url)
        wait_for(lambda: worker.logged("Successfully registered with master"), timeout=120, interval=0.2,
                 what="the worker registering")
        yield url
    finally:
        if worker is not None:
            worker.stop()
        master.stop()


def pipeline(master: str, *args: str) -> dict:
    done = subprocess.run([PIPELINE, "--master", master, *JOB_CONF, *args], capture_output=True, text=True,
                          timeout=600, env={**os.environ, "SPARK_LOCAL_IP": "127.0.0.1"})
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    result.pop("seconds")
    return result


def snapshot_of(root: Path) -> tuple[int, list[tuple]]:
    loaded = load_snapshot(str(root), ["port", "net"])
    assert loaded is not None
    manifest, objects = loaded
    return manifest.generation, sorted((o.topic, o.table, o.key, o.version, o.value) for o in objects)


def local_compaction(spark, log: Path, snapshot: Path) -> dict:
    """What ``df-pipeline compact`` prints, from the same job on the tests' local[2] session."""
    r = compact(spark, str(log), str(snapshot))
    m = r.manifest
    return {"command": "compact", "created": r.created, "generation": m.generation, "new_segments": r.new_segments,
            "events": m.events if r.created else 0, "objects": m.objects, "tombstones": m.tombstones,
            "max_version": m.max_version}


def test_compact_on_a_standalone_cluster_gives_what_local_gives(spark, cluster, tmp_path):
    log, local, remote = tmp_path / "log", tmp_path / "local", tmp_path / "cluster"
    write_log(log, RUN1)
    write_log(log, RUN2)  # late and stale events, a re-create after a delete: in later segments
    result = pipeline(cluster, "compact", "--log", str(log), "--snapshot", str(remote))
    assert result == local_compaction(spark, log, local)
    assert result["created"] and result["events"] == len(RUN1) + len(RUN2) and result["new_segments"] > 2
    assert snapshot_of(remote) == snapshot_of(local)


def test_audit_on_a_standalone_cluster_gives_what_local_gives(seeded_audit, cluster, tmp_path):
    log, local = seeded_audit.log, seeded_audit.result.summary  # the same log, audited on local[2]
    remote = pipeline(cluster, "audit", "--log", str(log), "--out", str(tmp_path / "cluster"))
    assert remote["out"] == str(tmp_path / "cluster")
    assert json.loads((tmp_path / "cluster" / "summary.json").read_text()) == local
    assert (remote["events"], remote["gaps"], remote["duplicates"]) == (
        local["events"], local["gaps"]["count"], local["duplicates"]["extra_copies"])
    assert remote["gaps"] == 2
