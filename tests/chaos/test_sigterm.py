"""SIGTERM at random moments, many times, to every daemon: each exits within 5 s with status 0.

The moments fall anywhere from the probes' first answer to a few seconds of work: during the first
sync, while df-feed publishes a batch and the controller reconciles what a writer keeps changing,
while df-notify holds shards and retries deliveries to an endpoint that refuses them, while a
store is down (etcd killed before the signals in the last round and a fifth of the others,
restarted after). Several daemons run side by side in each round, each signalled at its own moment:
6 tries per daemon (two rounds of three, the second with etcd down) in a default run, 50 (rounds of
five) under ``--soak``; ``DFPUBSUB_SIGTERM_TRIES`` sets another number."""

from __future__ import annotations

import os
import random
import signal
import threading
import time

import pytest

from dfpubsub import open_store
from dfpubsub.errors import StoreError
from dfpubsub.notify import NotificationRegistry
from dfpubsub.queues import open_queues
from tests.conftest import wait_for
from tests.functional.daemon_helpers import DAEMONS, DaemonProcess, daemon_args, http_get
from tests.functional.notify_helpers import enqueue, make_topic

TRIES, SOAK_TRIES = 6, 50
#: Daemons started and signalled at once, each at its own moment (two rounds in a default run:
#: one with etcd up, one with it down; a fifth of the rounds under ``--soak``).
WIDTH, SOAK_WIDTH = 3, 5
ON_ETCD = ("df-controller", "df-feed", "df-notify")


class Writer:
    """Keeps changing objects in the store (creates, updates, deletes), riding out its outages."""

    def __init__(self, url: str):
        self.store = open_store(url, ["port", "network"], timeout=1.0)
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        rng, i = random.Random(), 0
        while not self.stop.is_set():
            i += 1
            key = f"p{rng.randrange(200)}"
            try:
                if self.store.get("port", key) is None:
                    self.store.create("port", key, {"i": i})
                elif i % 7:
                    self.store.update("port", key, {"i": i})
                else:
                    self.store.delete("port", key)
            except StoreError:
                self.stop.wait(0.1)  # down, or a conflict with nobody: try again

    def close(self) -> None:
        self.stop.set()
        self.thread.join(timeout=10)
        self.store.close()


@pytest.mark.parametrize("name", DAEMONS)
def test_sigterm_at_random_moments_exits_0_within_5_s(tmp_path, etcd_server, name, soak):
    rng = random.Random(os.environ.get("DFPUBSUB_SIGTERM_SEED") or None)
    tries = int(os.environ.get("DFPUBSUB_SIGTERM_TRIES") or (SOAK_TRIES if soak else TRIES))
    sqlite = f"sqlite:///{tmp_path}/nb.sqlite"
    open_store(sqlite, ["port", "network"]).close()
    url = etcd_server.url if name in ON_ETCD else sqlite
    writer = Writer(etcd_server.url)
    if name == "df-notify":
        queues = open_queues(etcd_server.url)
        topic = make_topic(NotificationRegistry(queues), "orders", "http://127.0.0.1:9/refused", shards=4)
        for i in range(200):
            enqueue(queues, topic, "port", f"p{i}", "update", i + 1)
        queues.close()
    outcomes = []
    width = SOAK_WIDTH if soak else WIDTH
    try:
        for first in range(0, tries, width):
            attempts = range(first, min(first + width, tries))
            last = first + width >= tries
            ds = []
            for attempt in attempts:
                work = tmp_path / f"try{attempt}"
                work.mkdir()
                ds.append(DaemonProcess(name, daemon_args(name, work, url)))
            killed = False
            try:
                for d in ds:
                    # Five start at once: at a load average of 50 on 2 cores, over 30 s.
                    wait_for(lambda d=d: http_get(d.port, "/livez", timeout=1)[0] in (200, 503), timeout=120,
                             interval=0.02, what=f"{name} to serve its probes")
                base = time.monotonic()
                if name in ON_ETCD and (last or rng.random() < 0.2):
                    time.sleep(rng.uniform(0, 1.5))
                    etcd_server.kill()
                    killed = True
                signalled = []
                for moment, d in sorted(((rng.uniform(0, 1.5), d) for d in ds), key=lambda m: m[0]):
                    time.sleep(max(0.0, base + moment - time.monotonic()))  # its random moment
                    d.proc.send_signal(signal.SIGTERM)
                    signalled.append((time.monotonic(), d))
                for (started, d), attempt in zip(signalled, attempts):
                    status = d.wait_exit(deadline=started + 5.0)
                    outcomes.append((attempt, killed, round(time.monotonic() - started, 2), status))
                    assert status == 0, f"{name} exited {status} on try {attempt}; stderr:\n" + "".join(d.lines[-20:])
            finally:
                for d in ds:
                    d.kill()
                if killed:
                    etcd_server.restart()
    finally:
        writer.close()
    slowest = max(outcomes, key=lambda o: o[2])
    print(f"{name}: {len(outcomes)} tries, slowest exit {slowest[2]} s (try {slowest[0]}, etcd down: {slowest[1]})")
