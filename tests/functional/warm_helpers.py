"""Controllers with a state_dir on a real store, stopped and started again, and what their starts read
(tests/functional/controller/test_warm_restart.py, tests/chaos/test_warm_restart_kill.py)."""

from __future__ import annotations

import hashlib
import io
import os
import struct
import uuid
from contextlib import contextmanager

import msgpack

from dfpubsub import SubscriberOptions, load_driver
from dfpubsub.controller import Controller, ControllerOptions
from dfpubsub.controller.snapfile import FILE, seal
from dfpubsub.controller.snapshot import WARM_STARTS
from dfpubsub.metrics import Stats
from tests.conftest import wait_for
from tests.functional.controller_helpers import TABLES, Seen
from tests.functional.replay_helpers import Counted, populate


class Run:
    """One run of a controller on ``store`` with ``state_dir``; ``reads`` counts what it read."""

    def __init__(self, store, state_dir, name="warm", *, interval=0.0, transforms=None, topics=TABLES,
                 synced=True, replay_max_ratio=None):
        self.store = store
        self.reads = Counted(store)
        self.seen = Seen()
        self.name = name
        transport = load_driver(f"memory://warm-{uuid.uuid4().hex}").subscriber(Stats("s", name))
        self.ctrl = Controller(
            store, transport, topics, None, SubscriberOptions(message_delay_window=0.2), name,
            reconcilers={t: self.seen for t in topics}, transforms=transforms,
            runtime=ControllerOptions(snapshot_interval=interval, checkpoint_interval=0,
                                      **({} if replay_max_ratio is None else {"replay_max_ratio": replay_max_ratio})),
            state_dir=str(state_dir),
        ).start()
        if synced:
            wait_for(self.ctrl.synced.is_set, timeout=180, what=f"{name} synced")

    @property
    def start(self):
        assert self.ctrl.snapshots is not None
        return self.ctrl.snapshots.warm_start

    def stop(self):
        self.ctrl.stop()


@contextmanager
def populated(backend, n):
    """A handle on ``backend``'s store holding ``n`` objects of "port" and 20 of "network"."""
    store = backend.open()
    try:
        populate(store, n)
        yield store
    finally:
        store.close()


def relisted_over(store, state_dir, name, reason):
    """Start a controller on ``state_dir``: it must relist for ``reason`` and hold what the store holds."""
    run = Run(store, state_dir, name)
    try:
        assert (run.start.result, run.start.reason) == ("relisted", reason), run.start
        assert cache_state(run.ctrl) == store_state(store)
    finally:
        run.stop()
    return run


def cache_state(ctrl):
    return {(o.table, o.key, o.version, repr(o.value)) for o in ctrl.cache.items()}


def store_state(store):
    return {(o.table, o.key, o.version, repr(o.value)) for o in store.list()}


def starts(name, result, reason):
    return WARM_STARTS.get(name, result, reason)


# -- editing a snapshot file as an attacker (or a test) would -------------------------------------


def rewrite(state_dir, edit, identity=None):
    """Decode the snapshot in ``state_dir``, let ``edit(header, chunks)`` change it, and write it back
    with its checksum made again (and its seal too with the store's ``identity``; else the old seal)."""
    path = os.path.join(state_dir, FILE)
    data = open(path, "rb").read()
    prefix, body, old_seal = data[:12], data[12:-72], data[-64:-32]
    items = list(msgpack.Unpacker(io.BytesIO(body), raw=False, strict_map_key=False))
    assert items[-1] is None
    header, chunks = items[0], items[1:-1]
    edit(header, chunks)
    packed = prefix + b"".join(msgpack.packb(x) for x in [header, *chunks, None])
    packed += struct.pack(">Q", len(packed) + 8 + 64)
    checksum = hashlib.sha256(packed).digest()
    with open(path, "wb") as f:
        f.write(packed + (seal(identity, checksum) if identity is not None else old_seal) + checksum)
