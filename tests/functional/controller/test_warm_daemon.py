"""df-controller with [controller] state_dir as operators run it: a restart resumes (the log line, the status file,
the metric), and a state_dir it cannot write fails /readyz only with snapshot_required."""

from __future__ import annotations

import json

from dfpubsub.store import open_store
from tests.conftest import wait_for
from tests.functional.daemon_helpers import DaemonProcess, daemon_args


def _ready_controller(tmp_path, url, **extra):
    d = DaemonProcess("df-controller", daemon_args("df-controller", tmp_path, url, controller__snapshot_interval="0.2",
                                                   **extra))
    d.wait_status("/readyz", 200, timeout=120)
    return d


def test_df_controller_restarts_warm_and_says_so(tmp_path):
    url = f"sqlite:///{tmp_path}/nb.sqlite"
    store = open_store(url, ["port", "network"])
    for i in range(50):
        store.create("port", f"p{i}", {"i": i})
    state_dir = str(tmp_path / "state")
    first = _ready_controller(tmp_path, url, controller__state_dir=state_dir)
    try:
        assert first.terminate(timeout=60) == 0
    finally:
        first.kill()
    store.update("port", "p1", {"i": -1})
    second = _ready_controller(tmp_path, url, controller__state_dir=state_dir)
    try:
        start = next(r for r in second.records() if r.get("msg", "").startswith("start "))
        assert start["msg"] == "start resumed (replay)" and start["snapshot_objects"] == 50, start
        assert start["objects_read"] == 1
        assert 'dfpubsub_warm_starts_total{name="' in second.metrics()
        assert 'result="resumed"' in second.metrics()

        def status():
            with open(tmp_path / "ctl.status") as f:
                return json.load(f)

        wait_for(lambda: (status().get("start") or {}).get("result") == "resumed", timeout=120,
                 what="the status file")
        assert second.terminate(timeout=60) == 0
    finally:
        second.kill()
        store.close()


def test_a_state_dir_it_cannot_write_fails_readyz_only_when_required(tmp_path):
    url = f"sqlite:///{tmp_path}/nb.sqlite"
    open_store(url, ["port", "network"]).close()
    (tmp_path / "file").write_text("in the way")
    state_dir = str(tmp_path / "file" / "state")
    relaxed = _ready_controller(tmp_path, url, controller__state_dir=state_dir)
    try:
        wait_for(lambda: 'dfpubsub_snapshot_errors_total{name="' in relaxed.metrics(), timeout=30,
                 what="the failed writes counted")
        # Counted, never a reason to be unready unless required (the first sync may still run).
        wait_for(lambda: relaxed.get("/readyz")[0] == 200, timeout=60, what="the relaxed controller ready")
    finally:
        relaxed.kill()
    strict = DaemonProcess("df-controller", daemon_args("df-controller", tmp_path, url, controller__state_dir=state_dir,
                                                        controller__snapshot_interval="0.2",
                                                        controller__snapshot_required="true"))
    try:
        # Unready first for its first sync, then for its snapshot once synced: wait for the reason.
        def unready_for_the_snapshot() -> bool:
            status, body = strict.get("/readyz")
            return status == 503 and "snapshot" in body

        wait_for(unready_for_the_snapshot, timeout=60, what="readyz to fail for the snapshot")
    finally:
        strict.kill()
