"""df-archiver as operators run it: every event with its envelope's metadata, SIGTERM flushes."""

import signal
import time

import pytest

pytest.importorskip("pyarrow")

from dfpubsub import Publisher, PublisherOptions, load_driver  # noqa: E402
from dfpubsub.metrics import Stats  # noqa: E402
from tests.conftest import free_port, wait_for  # noqa: E402
from tests.functional.pipeline.archiver_helpers import ArchiverProcess, journaled, published_rows, value_of  # noqa: E402


def test_df_archiver_writes_every_event_with_its_envelope_and_flushes_on_sigterm(tmp_path):
    url = f"zmq+tcp://127.0.0.1:{free_port()}"
    stats = Stats("p", "arch")
    pub = Publisher(load_driver(url).publisher(stats), "api", PublisherOptions(batch_linger=0.001), stats)
    log = tmp_path / "log"
    arch = ArchiverProcess(log, url, "port,network", "--archive.segment-max-bytes", "4096",
                           "--archive.name", "arch-test")
    try:
        wait_for(lambda: stats.get("subscribers_joined") >= 1, what="df-archiver to subscribe")
        started = time.time()
        for i in range(150):
            pub.publish("port", "port", f"p{i % 20}", "update" if i >= 20 else "create", i + 1, {"i": i})
        for i in range(50):
            pub.publish("network", "network", f"n{i}", "delete" if i % 5 == 0 else "create", 1000 + i,
                        None if i % 5 == 0 else [i])
        wait_for(lambda: len(published_rows(log)) + journaled(log) == 200, what="every event to be archived")
        assert len(published_rows(log)) > 0  # small segments: some rolled already
        arch.proc.send_signal(signal.SIGTERM)
        assert arch.wait() == 0
    finally:
        arch.proc.kill()
        pub.close()
    rows = published_rows(log)
    assert journaled(log) == 0 and len(rows) == 200
    for topic, n in (("port", 150), ("network", 50)):
        mine = sorted((r for r in rows if r["topic"] == topic), key=lambda r: r["seq"])
        assert [r["seq"] for r in mine] == list(range(1, n + 1))  # seq is per (publisher, topic)
        assert {r["publisher_id"] for r in mine} == {pub.id}
        assert all(started <= r["sent_at"] <= r["received_at"] <= time.time() for r in mine)
    by_version = {r["version"]: r for r in rows}
    assert value_of(by_version[150]) == {"i": 149} and by_version[150]["action"] == "update"
    assert by_version[1000]["action"] == "delete" and by_version[1000]["value"] is None
    assert value_of(by_version[1001]) == [1]
    stopped = arch.logged("archiver stopped")
    assert stopped["events_archived"] == 200 and stopped["archiver"] == "arch-test"
