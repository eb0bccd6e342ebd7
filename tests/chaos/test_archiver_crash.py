"""df-archiver killed with SIGKILL mid-segment: only whole segments, and a restart loses nothing."""

import os
import random
import signal
import threading
from pathlib import Path

import pytest

pytest.importorskip("pyarrow")

from dfpubsub import Publisher, PublisherOptions, load_driver  # noqa: E402
from dfpubsub.archive import JOURNAL_DIR, read_journal  # noqa: E402
from dfpubsub.metrics import Stats  # noqa: E402
from tests.conftest import free_port, wait_for  # noqa: E402
from tests.functional.pipeline.archiver_helpers import ArchiverProcess, journal_files, journaled, published_rows  # noqa: E402

# What is on disk after a kill, not when: it runs beside other tests.
pytestmark = pytest.mark.beside


def on_disk(log):
    """(publisher id, seq) of every row a reader or a recovery can find: segments and journals."""
    seen = {(r["publisher_id"], r["seq"]) for r in published_rows(log)}
    for path in journal_files(log):
        seen |= {(row[7], row[8]) for row in read_journal(path)}
    return seen


def assert_only_whole_segments(log):
    for folder, _, names in os.walk(log):
        if JOURNAL_DIR in Path(folder).relative_to(log).parts:
            continue
        for name in names:
            # Readers skip hidden names (temporary files); every other file is a published segment.
            assert name.startswith(".") or name.endswith(".parquet"), name
    published_rows(log)  # every segment opens and reads to its end


@pytest.fixture
def publisher():
    url = f"zmq+tcp://127.0.0.1:{free_port()}"
    stats = Stats("p", "chaos-arch")
    pub = Publisher(load_driver(url).publisher(stats), "api", PublisherOptions(batch_linger=0.001), stats)
    yield url, pub
    pub.close()


def publish(pub, first, n):
    for i in range(first, first + n):
        pub.publish("port", "port", f"p{i % 50}", "update", i, {"i": i, "pad": "x" * 64})


def test_kill_mid_segment_then_restart_loses_nothing(publisher, tmp_path):
    url, pub = publisher
    log = tmp_path / "log"
    args = ("--archive.segment-max-bytes", "8192", "--archive.segment-max-age", "600")
    first = ArchiverProcess(log, url, "port", *args)
    try:
        wait_for(lambda: pub.stats.get("subscribers_joined") >= 1, what="the archiver to subscribe")
        n = 500
        publish(pub, 1, n)
        wait_for(lambda: len(on_disk(log)) == n, what="the first events to be archived")
        while not journaled(log):  # the last event filled a segment exactly: start the next one
            n += 1
            publish(pub, n, 1)
            wait_for(lambda: len(on_disk(log)) == n, what="one more event to be archived")
        assert published_rows(log)  # some segments out, one being filled
    finally:
        first.proc.kill()
        first.wait()
    assert_only_whole_segments(log)
    second = ArchiverProcess(log, url, "port", *args)
    try:
        wait_for(lambda: second.logged("archiver started"), what="the restarted archiver")
        assert second.logged("recovered events from journals")["events"] > 0
        wait_for(lambda: pub.stats.get("subscribers_joined") >= 2, what="the restarted archiver to subscribe")
        publish(pub, n + 1, 300)
        wait_for(lambda: len(on_disk(log)) == n + 300, what="the next 300 events to be archived")
        second.proc.send_signal(signal.SIGTERM)
        assert second.wait() == 0
    finally:
        second.proc.kill()
    rows = published_rows(log)
    assert sorted(r["seq"] for r in rows) == list(range(1, n + 301))  # nothing lost, nothing twice
    assert journaled(log) == 0


def test_kills_at_random_moments_leave_whole_segments_and_lose_nothing_archived(publisher, tmp_path):
    url, pub = publisher
    log = tmp_path / "log"
    args = ("--archive.segment-max-bytes", "2048", "--archive.segment-max-age", "0.2")
    rng = random.Random(8)
    stop = threading.Event()
    sent = [0]

    def keep_publishing():
        while not stop.wait(0.001):
            sent[0] += 1
            publish(pub, sent[0], 1)

    feeder = threading.Thread(target=keep_publishing, daemon=True)
    feeder.start()
    survived: set = set()
    try:
        for round_ in range(3):
            arch = ArchiverProcess(log, url, "port", *args)
            try:
                wait_for(lambda: pub.stats.get("subscribers_joined") >= round_ + 1, what="the archiver to subscribe")
                stop.wait(rng.uniform(0.3, 0.8))
            finally:
                arch.proc.kill()
                arch.wait()
            assert_only_whole_segments(log)
            survived |= on_disk(log)
        final = ArchiverProcess(log, url, "port")
        wait_for(lambda: final.logged("archiver started"), what="the last archiver")
        final.proc.send_signal(signal.SIGTERM)
        assert final.wait() == 0
    finally:
        stop.set()
        feeder.join()
    rows = published_rows(log)
    keys = [(r["publisher_id"], r["seq"]) for r in rows]
    assert len(keys) == len(set(keys))  # no row twice
    assert survived <= set(keys)  # whatever reached the disk before a kill is in the log
    assert len(survived) > 100 and journaled(log) == 0
