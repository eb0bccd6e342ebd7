"""Warm restarts (issue 43): a controller with a state_dir resumes from its snapshot and reads only what
changed while it was down; a snapshot it cannot trust is relisted over, counted with its reason, and
whatever a snapshot held, the cache equals the store after the first repair.

On a private SQLite file, redis-server and etcd each (tests/conftest.py): what a start read is counted
by a wrapper around the controller's own store handle (the objects its reads returned).
"""

from __future__ import annotations

import json
import os
import shutil
import sqlite3
import sys

import pytest

from dfpubsub import Publisher, PublisherOptions, SubscriberOptions, load_driver
from dfpubsub.controller import Controller, ControllerOptions
from dfpubsub.controller.snapfile import FILE, store_name
from dfpubsub.metrics import Stats
from dfpubsub.nbapi import NbApi
from dfpubsub.store import open_store
from tests.conftest import wait_for
from tests.functional.controller_helpers import TABLES
from tests.functional.df_db_helpers import base_env, df_db, ok
from tests.functional.replay_helpers import Backend
from tests.functional.warm_helpers import Run, cache_state, populated, relisted_over, rewrite, starts, store_state

N = 2000


@pytest.fixture(params=["sqlite", "redis", "etcd"])
def backend(request, tmp_path):
    return Backend.of(request, tmp_path)


@pytest.fixture
def store(backend):
    with populated(backend, N) as s:
        yield s


def _first_run(store, state_dir, name):
    run = Run(store, state_dir, name)
    assert run.start.result == "relisted" and run.start.reason == "no_snapshot"
    assert run.seen.objects.keys() == {o.key for o in store.list()}
    run.stop()
    assert os.path.getsize(os.path.join(state_dir, FILE)) > 0
    return run


def test_a_restart_resumes_and_reads_only_what_changed_while_down(backend, store, tmp_path, request):
    name = f"resume-{request.node.callspec.id}"
    _first_run(store, tmp_path / "state", name)
    # While it is down: updates, deletes, creates, and re-creates (a delete, then a create).
    changed = set()
    for i in range(10):
        store.update("port", f"k{i}", {"i": -i})
        changed.add(f"k{i}")
    for i in range(10, 15):
        store.delete("port", f"k{i}")
        changed.add(f"k{i}")
    for i in range(5):
        store.create("port", f"new{i}", {"new": i})
        changed.add(f"new{i}")
    for i in range(20, 22):
        store.delete("port", f"k{i}")
        store.create("port", f"k{i}", {"again": i})
        changed.add(f"k{i}")
    run = Run(store, tmp_path / "state", name)
    rows, calls = dict(run.reads.rows), dict(run.reads.calls)  # before this test's own reads
    try:
        assert (run.start.result, run.start.reason) == ("resumed", "replay"), run.start
        assert run.start.snapshot_objects == N + 20
        assert cache_state(run.ctrl) == store_state(store)
        # The replay read the changed objects, not the table: no listing at all.
        assert rows.get("get_many", 0) <= len(changed), rows
        assert not any(n for m, n in calls.items() if m.startswith("list")), calls
        assert run.start.objects <= len(changed) and run.start.entries <= 2 * len(changed), run.start
        assert run.ctrl.stats.get("relists") == 0 and run.ctrl.stats.get("replays", "first_sync") == 1
        # Level-triggered: every key once after the start, the deleted ones as deletes.
        live = {o.key for o in store.list()}
        assert set(run.seen.calls) >= live | {f"k{i}" for i in range(10, 15)}
        assert run.seen.objects.keys() == live
        assert starts(name, "resumed", "replay") == 1
    finally:
        run.stop()


@pytest.mark.parametrize("backend", ["sqlite"], indirect=True)
@pytest.mark.parametrize("damage, reason", [
    (lambda p: open(p, "r+b").truncate(os.path.getsize(p) // 2), "truncated"),
    (lambda p: open(p, "wb").close(), "truncated"),
    (lambda p: _flip(p, os.path.getsize(p) // 2), "bad_checksum"),
    (lambda p: _flip(p, 0), "other_format"),
    (os.unlink, "no_snapshot"),
])
def test_a_damaged_snapshot_is_relisted_over_with_its_reason(backend, store, tmp_path, damage, reason, request):
    name = f"damaged-{request.node.callspec.id}"
    _first_run(store, tmp_path / "state", name)
    store.update("port", "k1", {"after": 1})
    damage(str(tmp_path / "state" / FILE))
    relisted_over(store, tmp_path / "state", name, reason)
    assert starts(name, "relisted", reason) == 1 + (reason == "no_snapshot")


def _flip(path, offset):
    with open(path, "r+b") as f:
        f.seek(offset)
        byte = f.read(1)
        f.seek(offset)
        f.write(bytes([byte[0] ^ 0xFF]))


def test_a_snapshot_of_other_topics_or_transforms_is_relisted_over(backend, store, tmp_path, request):
    name = f"other-{request.node.callspec.id}"
    _first_run(store, tmp_path / "state", name)
    shutil.copy(tmp_path / "state" / FILE, tmp_path / "first")
    run = Run(store, tmp_path / "state", name, topics=["port"])
    assert (run.start.result, run.start.reason) == ("relisted", "other_topics")
    run.stop()
    shutil.copy(tmp_path / "first", tmp_path / "state" / FILE)  # its stop wrote one for its own topic
    run = Run(store, tmp_path / "state", name, transforms={"port": lambda v: {"i": v.get("i")}})
    try:
        assert (run.start.result, run.start.reason) == ("relisted", "other_transforms")
        assert cache_state(run.ctrl) == {(o.table, o.key, o.version, repr({"i": o.value.get("i")} if o.table == "port"
                                                                         else o.value)) for o in store.list()}
    finally:
        run.stop()
    # And the same transforms again: resumed, the values not transformed twice.
    run = Run(store, tmp_path / "state", name, transforms={"port": lambda v: {"i": v.get("i")}})
    try:
        assert run.start.result == "resumed", run.start
        assert run.ctrl.cache.get("port", "k3").value == {"i": 3}
    finally:
        run.stop()


def test_a_snapshot_of_another_store_is_relisted_over(backend, store, tmp_path, request):
    """The same URL, a store made again (its identity renewed, as ``df-db init --new-identity`` does
    after a restore): objects at the same keys and versions may hold other values."""
    name = f"another-{request.node.callspec.id}"
    _first_run(store, tmp_path / "state", name)
    store.identity(renew=True)
    relisted_over(store, tmp_path / "state", name, "other_store")


def test_an_edited_snapshot_cannot_make_the_cache_wrong(backend, store, tmp_path, request):
    """Edited with its checksum made again: a forged object, a version from the future, an object
    since deleted. Without the store's key the seal fails (relisted); sealed with it (a store reader's
    forgery), the future version and the deleted object are still read back by the first repair."""
    name = f"edited-{request.node.callspec.id}"
    state_dir = tmp_path / "state"
    _first_run(store, state_dir, name)
    position = store.feed_head()
    store.delete("port", "k7")  # deleted since the snapshot

    def forge(header, chunks):
        obj = next(c for c in chunks if c[0] == "o" and c[1] == "port" and "k5" in c[3])
        keys, versions, blobs = obj[3], obj[4], obj[5]
        i = keys.index("k5")
        versions[i] = position + 1000  # a version from the future
        blobs[i] = b"\x81\xa6forged\xc3"
        keys.append("forged")  # an object the store never had
        versions.append(position + 5)
        blobs.append(b"\x81\xa6forged\xc3")

    rewrite(state_dir, forge)
    relisted_over(store, state_dir, name, "bad_seal")
    rewrite(state_dir, forge, identity=store.identity())
    store.delete("port", "k8")
    run = Run(store, state_dir, name)
    try:
        assert run.start.result == "resumed", run.start
        assert cache_state(run.ctrl) == store_state(store)
        assert run.ctrl.cache.get("port", "k5").value == {"i": 5, "pad": "x" * 64}
        assert run.seen.objects.get("k5").value["i"] == 5 and "forged" not in run.seen.objects
    finally:
        run.stop()


def test_a_snapshot_older_than_the_feeds_history_is_relisted_over(backend, store, tmp_path, request):
    name = f"old-{request.node.callspec.id}"
    _first_run(store, tmp_path / "state", name)
    trimmed = backend.open(feed_retention=__import__("dfpubsub.store", fromlist=["x"]).FeedRetention(
        max_entries=5))
    try:
        for i in range(50):
            trimmed.update("port", f"k{i}", {"moved": i})
        backend.compact_history(trimmed)
    finally:
        trimmed.close()
    relisted_over(store, tmp_path / "state", name, "history_gone")


@pytest.mark.parametrize("backend", ["sqlite"], indirect=True)
def test_a_store_restored_from_an_older_backup_is_relisted_over(backend, store, tmp_path, request):
    """The same file, the same identity, an older state, then other writes past the snapshot's
    position: the feed's entries at the position are not the ones the snapshot saw."""
    name = f"restored-{request.node.callspec.id}"
    path = backend.url.removeprefix("sqlite:///")
    store.identity()  # df-db init made it: backups hold it
    _sqlite_copy(path, tmp_path / "backup.sqlite")
    for i in range(30):
        store.update("port", f"k{i}", {"before-restore": i})
    _first_run(store, tmp_path / "state", name)
    store.close()
    _sqlite_copy(tmp_path / "backup.sqlite", path)
    restored = open_store(backend.url, TABLES)
    try:
        for i in range(40):  # past the snapshot's position, other writes
            restored.update("port", f"k{100 + i}", {"after-restore": i})
        relisted_over(restored, tmp_path / "state", name, "history_rewound")
    finally:
        restored.close()


def _sqlite_copy(source, target):
    """A consistent copy of a live SQLite file (its WAL included), as a backup tool makes one."""
    with sqlite3.connect(source) as src, sqlite3.connect(target) as dst:
        src.backup(dst)


def test_the_store_identity_is_kept_across_handles_and_drop_all_and_renewed_on_demand(backend, store):
    first = store.identity()
    other = backend.open()
    try:
        assert other.identity() == first and len(first) == 16
        store.drop_all()
        assert other.identity() == first
        renewed = other.identity(renew=True)
        assert renewed != first and store.identity() == renewed
    finally:
        other.close()


@pytest.mark.parametrize("backend", ["sqlite"], indirect=True)
def test_df_db_init_shows_the_identity_and_controller_state_whether_a_start_would_resume(backend, store, tmp_path,
                                                                                         request):
    env = base_env(DFPUBSUB_STORE__URL=backend.url, DFPUBSUB_STORE__TABLES=",".join(TABLES))
    made = ok(env, "init")
    assert made["identity"] == store_name(store.identity())
    name = f"state-{request.node.callspec.id}"
    _first_run(store, tmp_path / "state", name)
    doc = ok(env, "controller-state", str(tmp_path / "state"))
    assert doc["would_resume"] is True and doc["objects"] == N + 20 and doc["store"] == made["identity"]
    assert set(doc["positions"]) == set(TABLES)
    renewed = ok(env, "init", "--new-identity")
    assert renewed["identity"] != made["identity"]
    out = df_db(env, "-o", "json", "controller-state", str(tmp_path / "state"))
    assert out.returncode == 1 and json.loads(out.stdout)["reason"] == "other_store"
    out = df_db(env, "-o", "json", "controller-state", str(tmp_path / "nowhere"))
    assert out.returncode == 1 and json.loads(out.stdout)["reason"] == "no_snapshot"


@pytest.mark.parametrize("backend", ["redis"], indirect=True)
def test_a_redis_store_restored_from_an_older_backup_is_relisted_over(backend, store, tmp_path, request):
    """The server stopped, its append-only files copied (the backup), more writes, the snapshot; then the
    server restarted on the backup and written past the snapshot's position."""
    name = f"restored-{request.node.callspec.id}"
    server = backend.server
    store.identity()
    server.stop()  # SIGTERM: the append-only file is complete
    shutil.copytree(server.workdir / "appendonlydir", tmp_path / "backup")
    server.start()
    for i in range(30):
        store.update("port", f"k{i}", {"before-restore": i})
    _first_run(store, tmp_path / "state", name)
    server.stop()
    shutil.rmtree(server.workdir / "appendonlydir")
    shutil.copytree(tmp_path / "backup", server.workdir / "appendonlydir")
    server.start()
    for i in range(40):  # past the snapshot's position, other writes
        store.update("port", f"k{100 + i}", {"after-restore": i})
    relisted_over(store, tmp_path / "state", name, "history_rewound")


def test_snapshots_copied_a_chunk_at_a_time_under_churn_resume_to_the_store(backend, store, tmp_path, request):
    """A snapshot's copy of the cache is read a few keys at a time while the dispatch thread applies
    events (the stall, issue 43): so it is of no single instant. Snapshots written while an API
    worker creates, updates, deletes and re-creates, with events applied in the middle of their
    copies, each taken as the last one a crash left, must resume to a cache equal to the store
    (docs/reliability.md, "Warm restarts")."""
    name = f"churn-{request.node.callspec.id}"
    stats = Stats("p", name)
    pub = Publisher(load_driver("zmq+tcp://127.0.0.1:*").publisher(stats), "api",
                    PublisherOptions(batch_linger=0.001, max_idle_time=0.3), stats)
    ctrl = Controller(store, load_driver("zmq").subscriber(Stats("s", name)), TABLES, None,
                      SubscriberOptions(message_delay_window=0.2, max_idle_time=0.5), name,
                      runtime=ControllerOptions(snapshot_interval=0.01, checkpoint_interval=0.2),
                      state_dir=str(tmp_path / "state"))  # checkpoints move its positions, and repair beside snapshots
    cache = ctrl.cache
    cache.export_chunk = 1  # thousands of chunks a snapshot: events land between them
    walking, during = [0], [0]
    walk, apply = cache._walk, cache.apply

    def counted_walk(table, chunk):
        walking[0] += 1
        try:
            return walk(table, chunk)
        finally:
            walking[0] -= 1

    def counted_apply(event):
        during[0] += walking[0] > 0
        return apply(event)

    cache._walk, cache.apply = counted_walk, counted_apply
    ctrl.connect(pub.transport.uri)
    ctrl.start()
    api, kept = NbApi(store, pub), []
    switching = sys.getswitchinterval()
    sys.setswitchinterval(1e-5)  # threads take turns within a walk of these few thousand objects, as in one of a million
    try:
        assert ctrl.synced.wait(60)
        for i in range(20_000):
            key = f"k{i % 97}"
            if api.get("port", key) is None:
                api.create("port", key, {"i": i})
            elif i % 7 == 0:
                api.delete("port", key)
            else:
                api.update("port", key, {"i": i})
            if i % 150 == 149:  # the last snapshot so far, as a kill -9 would leave it
                written = ctrl.stats.get("snapshots_written")
                wait_for(lambda: ctrl.stats.get("snapshots_written") > written + 1,
                         what="two more snapshots written under churn")
                kept.append(tmp_path / f"kept{i}")
                os.makedirs(kept[-1])
                shutil.copy(tmp_path / "state" / FILE, kept[-1] / FILE)
                if during[0] >= 30 and len(kept) >= 3:
                    break
        assert during[0] >= 30, f"{during[0]} events applied during a copy in {i + 1} writes"
    finally:
        sys.setswitchinterval(switching)
        ctrl.stop()
        pub.close()
    for i in range(20):  # and more while it is down
        store.update("port", f"k{20 + i}", {"down": i}) if store.get("port", f"k{20 + i}") else None
    for state in kept[-3:]:  # each replays what followed it: no limit on how far
        run = Run(store, state, f"{name}-{state.name}", replay_max_ratio=10.0)
        try:
            assert (run.start.result, run.start.reason) == ("resumed", "replay"), run.start
            assert cache_state(run.ctrl) == store_state(store)
        finally:
            run.stop()
