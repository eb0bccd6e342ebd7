"""df-controller as operators run it: a subprocess, JSON logs, SIGTERM."""

import asyncio
import json
import os
import shutil
import signal
import subprocess
import sys
import threading

from dfpubsub import AsyncNbApi, NbApi, Publisher, PublisherOptions, load_driver, open_store
from dfpubsub.metrics import Stats
from tests.conftest import free_port, wait_for
from tests.functional.zmq_helpers import subscribed


def test_df_controller_logs_changes_and_stops_on_sigterm(tmp_path):
    db = f"sqlite:///{tmp_path}/nb.sqlite"
    port = free_port()
    store = open_store(db, ["port", "network"])
    store.create("port", "existing", {"n": 0})
    stats = Stats("p", "p")
    pub = Publisher(load_driver(f"zmq+tcp://127.0.0.1:{port}").publisher(stats), "api",
                    PublisherOptions(batch_linger=0), stats)
    exe = shutil.which("df-controller", path=os.path.dirname(sys.executable))
    proc = subprocess.Popen(
        [exe, "--store.url", db, "--store.tables", "port,network", "--pubsub.driver", f"zmq+tcp://127.0.0.1:{port}",
         "--log.format", "json", "--controller.name", "ctl-test"],
        stderr=subprocess.PIPE, text=True,
    )
    lines = []
    reader = threading.Thread(target=lambda: lines.extend(proc.stderr), daemon=True)
    reader.start()
    try:
        def logged(msg, key=None):
            for line in list(lines):
                rec = json.loads(line)
                if rec["msg"] == msg and (key is None or rec.get("key") == key):
                    return rec
            return None

        wait_for(lambda: logged("reconcile", "existing"), what="the initial sync to log the existing object")
        wait_for(lambda: pub.stats.get("subscribers_joined") >= 1, what="df-controller to subscribe")
        api = NbApi(store, pub)
        api.create("port", "p1", {"n": 1})
        final = api.update("port", "p1", {"n": 2})
        existing = store.get("port", "existing")
        api.delete("port", "existing")

        def reconciled_to(key, version):
            return any(rec.get("key") == key and rec.get("version") == version and rec["msg"] == "reconcile"
                       for rec in map(json.loads, list(lines)))

        # The create and the update may collapse into one reconcile of the newest state.
        wait_for(lambda: logged("delete", "existing") and reconciled_to("p1", final.version),
                 what="the events to be logged")
        assert logged("delete", "existing")["version"] == existing.version  # its final state, for cleanup
        assert logged("controller starting")["store"] == "sqlite"
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=10) == 0
        reader.join(timeout=5)
        assert logged("controller stopping")
    finally:
        proc.kill()
        pub.close()
        store.close()


def test_bad_config_is_a_clear_error_not_a_traceback(tmp_path):
    exe = shutil.which("df-controller", path=os.path.dirname(sys.executable))
    out = subprocess.run([exe, "--pubsub.max-idle-time", "-3"], capture_output=True, text=True, timeout=30)
    assert out.returncode == 2
    assert "pubsub.max_idle_time" in out.stderr and "Traceback" not in out.stderr


def test_async_nbapi(tmp_path):
    store = open_store(f"sqlite:///{tmp_path}/nb.sqlite", ["port"])

    async def scenario():
        api = AsyncNbApi(NbApi(store))
        a = await api.create("port", "p", {"v": 1})
        b = await api.update("port", "p", {"v": 2}, expected_version=a.version)
        assert (await api.get("port", "p")).value == {"v": 2}
        assert [o.key for o in await api.list("port")] == ["p"]
        d = await api.delete("port", "p")
        assert d.version > b.version > a.version
        await api.close()

    asyncio.run(scenario())


def test_df_controller_finds_publishers_through_discovery(tmp_path):
    from dfpubsub.discovery import PublisherAnnouncer, open_discovery

    db = f"sqlite:///{tmp_path}/nb.sqlite"
    store = open_store(db, ["port"])
    stats = Stats("p", "p")
    pub = Publisher(load_driver("zmq+tcp://127.0.0.1:*").publisher(stats), "api", PublisherOptions(batch_linger=0),
                    stats)
    discovery = open_discovery(db, ttl=3.0, renew_interval=0.5)
    exe = shutil.which("df-controller", path=os.path.dirname(sys.executable))
    proc = subprocess.Popen(
        [exe, "--store.url", db, "--store.tables", "port", "--pubsub.driver", "zmq", "--controller.discover", "true",
         "--discovery.ttl", "3", "--discovery.renew-interval", "0.5", "--log.format", "json"],
        stderr=subprocess.PIPE, text=True,
    )
    lines = []
    threading.Thread(target=lambda: lines.extend(proc.stderr), daemon=True).start()
    announcer = None
    try:
        wait_for(lambda: any(json.loads(line)["msg"] == "controller starting" for line in list(lines)),
                 what="df-controller to start")
        announcer = PublisherAnnouncer(discovery, pub, topics=["port"])
        subscribed(pub, "port")  # connected after it subscribed: a join alone is not enough
        NbApi(store, pub).create("port", "found", {"via": "discovery"})
        wait_for(lambda: any(json.loads(line).get("key") == "found" for line in list(lines)),
                 what="the event from the discovered publisher")
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=10) == 0
    finally:
        proc.kill()
        if announcer is not None:
            announcer.close()
        discovery.close()
        pub.close()
        store.close()
