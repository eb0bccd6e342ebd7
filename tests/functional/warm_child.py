"""A controller with a state_dir in a process of its own, for tests that kill it or limit its files
(tests/functional/controller/test_warm_crash.py).

``python -m tests.functional.warm_child URL STATE_DIR INTERVAL [FSIZE]``: syncs, prints ``synced``, then
every 0.1 s one line ``written ERRORS`` (snapshots written, snapshot errors) until killed. With FSIZE,
the process may write no file beyond FSIZE bytes (RLIMIT_FSIZE; SIGXFSZ ignored, so a write past it
fails with EFBIG as on a full disk).
"""

from __future__ import annotations

import resource
import signal
import sys
import time
import uuid

from dfpubsub import SubscriberOptions, load_driver
from dfpubsub.controller import Controller, ControllerOptions
from dfpubsub.metrics import Stats
from dfpubsub.store import open_store
from tests.functional.controller_helpers import TABLES


def main() -> None:
    url, state_dir, interval = sys.argv[1], sys.argv[2], float(sys.argv[3])
    if len(sys.argv) > 4:
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        limit = int(sys.argv[4])
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))
    store = open_store(url, TABLES)
    transport = load_driver(f"memory://child-{uuid.uuid4().hex}").subscriber(Stats("s", "child"))
    ctrl = Controller(store, transport, TABLES, None, SubscriberOptions(), "child",
                      runtime=ControllerOptions(snapshot_interval=interval, checkpoint_interval=0),
                      state_dir=state_dir).start()
    if not ctrl.synced.wait(180):
        sys.exit("not synced")
    print("synced", flush=True)
    while True:
        print(ctrl.stats.get("snapshots_written"), ctrl.stats.get("snapshot_errors"), flush=True)
        time.sleep(0.1)


if __name__ == "__main__":
    main()
