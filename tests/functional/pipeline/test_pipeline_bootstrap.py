"""A controller bootstrapped from the compacted snapshot ends with the cache of a full sync."""

import itertools
import json
import os
import shutil
import subprocess
import sys

import msgpack
import pytest

pytest.importorskip("pyspark")
pytest.importorskip("pyarrow")

from dfpubsub import Publisher, PublisherOptions, Subscriber, load_driver  # noqa: E402
from dfpubsub.archive import SegmentWriter  # noqa: E402
from dfpubsub.controller import Controller
from dfpubsub.events import VersionedObject  # noqa: E402
from dfpubsub.metrics import Stats  # noqa: E402
from dfpubsub.nbapi import NbApi  # noqa: E402
from dfpubsub.pipeline import compact  # noqa: E402
from dfpubsub.pipeline.bootstrap import SnapshotBootstrap, load_snapshot  # noqa: E402
from dfpubsub.store import open_store  # noqa: E402
from tests.conftest import wait_for
from tests.functional.store_helpers import backend_store  # noqa: E402

TABLES = ["port", "network"]
TOPICS = ["port", "tenant-a"]
_prefix = itertools.count()


@pytest.fixture(params=["sqlite", "etcd", "redis"])
def store(request, tmp_path):
    s = backend_store(request, tmp_path, TABLES, "boot")
    yield s
    s.close()


def archive_history(store, bus, log):
    """Writes through NbApi, archived by a subscriber as df-archiver does; returns the publisher."""
    pub = Publisher(load_driver(bus).publisher(Stats("p", "boot")), "api", PublisherOptions(batch_linger=0))
    writer = SegmentWriter(str(log), max_bytes=4096, fsync=False)
    archiver = Subscriber(load_driver(bus).subscriber(Stats("s", "boot")), TOPICS, writer.append_event)
    archiver.start()
    api = NbApi(store, pub)
    for i in range(40):
        api.create("port", f"p{i}", {"i": i})
    for i in range(0, 40, 4):
        api.update("port", f"p{i}", {"i": i, "again": True})
    for i in range(0, 40, 10):
        api.delete("port", f"p{i}")
    for i in range(5):
        api.create("network", f"n{i}", [i], topic="tenant-a")
    api.create("network", "elsewhere", 0)  # a topic the controllers do not take
    wait_for(lambda: archiver.stats.get("events_in") == 40 + 10 + 4 + 5, what="the archiver to get every event")
    archiver.close()
    writer.close()
    return pub


def change_after_the_snapshot(store, pub):
    api = NbApi(store, pub)
    api.update("port", "p1", "changed")
    api.update("port", "p2", "changed")
    api.delete("port", "p3")
    api.delete("port", "p5")
    api.delete("port", "p4")
    api.create("port", "p4", "re-created")
    api.create("port", "p100", "new")
    api.delete("network", "n0")
    NbApi(store).update("port", "p6", "never published")  # the archiver never saw this one


def test_bootstrap_yields_the_same_cache_as_a_full_sync(spark, store, tmp_path):
    bus, log, snap = f"memory://boot-{tmp_path.name}", tmp_path / "log", tmp_path / "snap"
    pub = archive_history(store, bus, log)
    compact(spark, str(log), str(snap))
    manifest, objects = load_snapshot(str(snap), TOPICS)
    assert len(objects) == 36 + 5 and manifest.generation == 1
    change_after_the_snapshot(store, pub)

    boot = SnapshotBootstrap(str(snap))
    controllers = [Controller(store, load_driver(bus).subscriber(Stats("s", name)), TOPICS, name=name, bootstrap=b)
                   for name, b in (("full", None), ("bootstrapped", boot))]
    try:
        for c in controllers:
            c.start()
            assert c.synced.wait(10)
        full, bootstrapped = (sorted(c.cache.items()) for c in controllers)
        assert bootstrapped == full == sorted(store.list_topics(TOPICS))
        # p1, p2, p4 (re-created), p6 (unpublished) changed and p100 is new; p3, p5 and n0 are gone.
        assert (boot.last.from_snapshot, boot.last.fetched, boot.last.deleted) == (41 - 7, 5, 3)
        # Later resyncs list the store as before, and events keep flowing.
        NbApi(store, pub).update("port", "p7", "after start")
        wait_for(lambda: controllers[1].cache.get("port", "p7").value == "after start", what="the event")
    finally:
        for c in controllers:
            c.stop()
        pub.close()


def test_snapshot_topics_with_any_characters_load_back(spark, tmp_path):
    log, snap = tmp_path / "log", tmp_path / "snap"
    odd = "tenant/a=b c%d:é"
    writer = SegmentWriter(str(log), fsync=False)
    for topic, key in ((odd, "k1"), ("port", "k2")):
        writer.append((topic, "port", key, "create", 7, msgpack.packb({"k": key}), 1.0, "p", 1, 1.0, 1.0))
    writer.close()
    compact(spark, str(log), str(snap))
    _, objects = load_snapshot(str(snap), [odd])
    assert objects == [VersionedObject(odd, "port", "k1", 7, {"k": "k1"})]


def test_no_snapshot_falls_back_to_listing_the_store(tmp_path):
    store = open_store(f"sqlite:///{tmp_path}/nb.sqlite", TABLES)
    store.create("port", "p", 1)
    boot = SnapshotBootstrap(str(tmp_path / "nothing-here"))
    ctl = Controller(store, load_driver(f"memory://none-{tmp_path.name}").subscriber(Stats("s", "n")), ["port"],
                     bootstrap=boot)
    try:
        ctl.start()
        assert ctl.synced.wait(10) and ctl.cache.get("port", "p").value == 1 and boot.last is None
    finally:
        ctl.stop()
        store.close()


def test_df_pipeline_compacts_and_verifies_a_bootstrap(tmp_path):
    db = f"sqlite:///{tmp_path}/nb.sqlite"
    log, snap = tmp_path / "log", tmp_path / "snap"
    store = open_store(db, TABLES)
    pub = archive_history(store, f"memory://cli-{tmp_path.name}", log)
    change_after_the_snapshot(store, pub)
    pub.close()
    store.close()
    exe = shutil.which("df-pipeline", path=os.path.dirname(sys.executable))
    env = {**os.environ, "SPARK_LOCAL_IP": "127.0.0.1"}
    done = subprocess.run(
        [exe, "--conf", "spark.sql.shuffle.partitions=2", "--conf", "spark.ui.enabled=false", "bootstrap",
         "--log", str(log), "--snapshot", str(snap), "--verify", "--store.url", db, "--store.tables", "port,network",
         "--topics", ",".join(TOPICS)],
        capture_output=True, text=True, timeout=300, env=env)
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert result["verified"] is True and result["compact"]["events"] == 59
    # The snapshot came before the changes here too: the same catch-up as in the test above.
    assert (result["from_snapshot"], result["fetched"], result["deleted"]) == (34, 5, 3)
