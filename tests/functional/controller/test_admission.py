"""Relist admission against real servers (a private etcd and Redis, a SQLite file): with two slots a
third relist waits, then completes; a controller killed -9 while holding a slot frees it within the
lease; garbage that raw clients write into the slots is skipped, counted and taken over, never
fatal."""

from __future__ import annotations

import itertools
import os
import signal
import sqlite3
import subprocess
import sys
import threading
import time

import pytest

from dfpubsub import SubscriberOptions, load_driver
from dfpubsub.admission import open_slots
from dfpubsub.backends.foreign import SKIPPED
from dfpubsub.controller import Controller, RelistAdmission
from dfpubsub.metrics import Stats
from dfpubsub.store import open_store
from tests.conftest import wait_for

pytestmark = pytest.mark.alone  # leases within bounds of time

TABLES = ["port", "network"]
_prefix = itertools.count()


@pytest.fixture(params=["sqlite", "redis", "etcd"])
def where(request, tmp_path):
    """(url, prefix) of a store of this test's own on each backend."""
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path}/nb.sqlite", "dfpubsub"
    return request.getfixturevalue(f"shared_{request.param}").url, f"adm{next(_prefix)}-{tmp_path.name}"


def store_at(url, prefix):
    return open_store(url, TABLES, **({} if url.startswith("sqlite") else {"prefix": prefix}))


def admission(url, prefix, bound, lease=5.0):
    return RelistAdmission(open_slots(url, "relist", 2.0, prefix), bound, lease=lease, jitter=0.0,
                           retry_base=0.05, retry_max=0.2)


def controller(store, adm, name):
    transport = load_driver("zmq").subscriber(Stats("s", name))
    return Controller(store, transport, TABLES, None, SubscriberOptions(), name, admission=adm).start()


def test_with_two_slots_a_third_relist_waits_then_completes(where):
    url, prefix = where
    store = store_at(url, prefix)
    for i in range(50):
        store.create("port", f"p{i}", {"i": i})
    holders = [admission(url, prefix, 2) for _ in range(2)]
    stats, stop = Stats("t", "holders"), threading.Event()
    turns = [h.turn(stats, stop) for h in holders]
    assert sorted(t.__enter__() for t in turns) == [0, 1]  # two relists under way
    ctrl = controller(store, admission(url, prefix, 2), "third")
    try:
        wait_for(lambda: ctrl.stats.get("relist_refusals") >= 3, timeout=20, what="the third relist to be refused")
        assert ctrl.stats.get("relist_waits") == 1 and not ctrl.stats.get("relist_admitted")
        assert not ctrl.subscriber.synced.is_set() and len(ctrl.cache) == 0
        store.delete("port", "p0")  # written while it waits: the listing it takes later shows it
        turns[0].__exit__(None, None, None)
        assert ctrl.synced.wait(20)
        assert ctrl.stats.get("relist_admitted") == 1
        assert {(o.table, o.key, o.version) for o in ctrl.cache.items()} == \
            {(o.table, o.key, o.version) for o in store.list()}
        # Its slot went back: two turns fit again beside the one still held.
        wait_for(lambda: len(holders[0].slots.holders(2)) == 1, what="the third relist's slot to be released")
    finally:
        ctrl.stop()
        turns[1].__exit__(None, None, None)
        for h in holders:
            h.close()
        ctrl.admission.close()
        store.close()


_HOLDER = """
import sys, threading
from dfpubsub.admission import open_slots
from dfpubsub.controller import RelistAdmission
from dfpubsub.metrics import Stats
url, prefix = sys.argv[1:3]
adm = RelistAdmission(open_slots(url, "relist", 2.0, prefix), 1, lease=2.0, jitter=0.0)
with adm.turn(Stats("c", "child"), threading.Event()) as slot:
    print(slot, flush=True)
    threading.Event().wait()
"""


def test_a_holder_killed_frees_its_slot_within_the_lease(where):
    url, prefix = where
    store_at(url, prefix).close()
    child = subprocess.Popen([sys.executable, "-c", _HOLDER, url, prefix], stdout=subprocess.PIPE, text=True)
    other = admission(url, prefix, 1, lease=2.0)
    try:
        assert child.stdout.readline().strip() == "0"
        # Alive, the child renews: its slot stays taken over several leases.
        held_until = time.monotonic() + 5.0
        while time.monotonic() < held_until:
            assert other.slots.acquire("0" * 32 + " other", 1, 2.0) is None
            time.sleep(0.2)
        os.kill(child.pid, signal.SIGKILL)
        child.wait(10)
        killed = time.monotonic()
        wait_for(lambda: other.slots.acquire("0" * 32 + " other", 1, 2.0) is not None, timeout=15,
                 what="the killed holder's slot to expire")
        # Within the lease (2 s), and etcd's expiry rounds (0.5 s) and this machine's load on top.
        assert time.monotonic() - killed < 2.0 + 4.0
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
        other.close()


def _garbage(url, prefix, tmp_path):
    """Raw clients write what no slot looks like into the slots' keys; returns how many records."""
    if url.startswith("sqlite"):
        with sqlite3.connect(tmp_path / "nb.sqlite") as raw:
            raw.execute("INSERT INTO relist_slots VALUES ('relist', 0, 'not a ticket', 1e300)")
            raw.execute("INSERT INTO relist_slots VALUES ('relist', 'x', x'ff', 'never')")
            raw.execute("INSERT INTO relist_slots VALUES ('relist', 1, ?, 1e300)", ("a" * 32 + " forever",))
        return 3
    if url.startswith("redis"):
        import redis

        r = redis.Redis.from_url(url)
        r.hset(f"{prefix}:relist:relist:0", "a", "b")  # not a string
        r.set(f"{prefix}:relist:relist:1", "a" * 32 + " no-expiry")  # would never expire
        r.set(f"{prefix}:relist:relist:2", b"\xff\x00", px=10_000)  # not a ticket
        r.close()
        return 3
    from aetcd import rpc

    from dfpubsub.backends.etcd import EtcdConnection

    conn = EtcdConnection(url, 5.0)
    root = f"/{prefix}/relist/relist/"
    for key, value in ((f"{root}0", b"a" * 32 + b" no lease"), (f"{root}1", b"\xff"), (f"{root}zz", b"stray")):
        conn.call(lambda kv, k=key, v=value: kv.Put(rpc.PutRequest(key=k.encode(), value=v), timeout=5.0))
    conn.close()
    return 3


def test_garbage_in_the_slots_is_skipped_counted_and_taken_over(where, tmp_path):
    url, prefix = where
    store = store_at(url, prefix)
    store.create("port", "p", {"i": 1})
    probe = admission(url, prefix, 2)
    probe.slots.holders(2)  # makes the SQLite table
    written = _garbage(url, prefix, tmp_path)
    before = SKIPPED.get("relist_slot", "malformed")
    assert probe.slots.holders(3) == []  # nothing there is a holder
    assert SKIPPED.get("relist_slot", "malformed") - before >= written - 1
    ctrl = controller(store, admission(url, prefix, 2), "amid-garbage")
    try:
        assert ctrl.synced.wait(20) and ctrl.stats.get("relist_admitted") == 1
        assert [(o.key, o.version) for o in ctrl.cache.items()] == [(o.key, o.version) for o in store.list()]
        # The garbage is gone from the slots it sat in: both can be held, by proper tickets.
        stats, stop = Stats("t", "after"), threading.Event()
        turns = [admission(url, prefix, 2).turn(stats, stop) for _ in range(2)]
        assert sorted(t.__enter__() for t in turns) == [0, 1]
        assert len(probe.slots.holders(2)) == 2
        for t in turns:
            t.__exit__(None, None, None)
    finally:
        ctrl.stop()
        ctrl.admission.close()
        probe.close()
        store.close()
