"""Reconcilers behind the work queue, on real ZeroMQ and a real SQLite store: retries that lose
nothing, collapsed updates, deletes with their last known state, workers that do not wait on each
other, the failed set, indexes."""

import json
import threading
import time

import msgpack
import pytest

from dfpubsub import DONE, NbApi, Publisher, PublisherOptions, Result, SubscriberOptions, load_driver, open_store
from dfpubsub.controller import Controller, ControllerOptions, StatusWriter
from dfpubsub.metrics import Stats
from tests.conftest import wait_for
from tests.functional.controller_helpers import TABLES, Mirror, Seen
from tests.functional.df_db_helpers import base_env, df_db
from tests.functional.zmq_helpers import subscribed


@pytest.fixture
def env(tmp_path):
    store = open_store(f"sqlite:///{tmp_path}/nb.sqlite", TABLES)
    stats = Stats("p", "p")
    pub = Publisher(load_driver("zmq+tcp://127.0.0.1:*").publisher(stats), "api",
                    PublisherOptions(batch_linger=0.001, max_idle_time=0.3), stats)
    made = []

    def controller(**kw):
        runtime = kw.pop("runtime", ControllerOptions(workers=2, retry_base_delay=0.05))
        ctrl = Controller(store, load_driver("zmq").subscriber(Stats("s", "s")), TABLES, kw.pop("handlers", None),
                          SubscriberOptions(message_delay_window=0.2, max_idle_time=0.5), runtime=runtime, **kw)
        ctrl.connect(pub.transport.uri)
        ctrl.start()
        made.append(ctrl)
        assert ctrl.synced.wait(10)
        for table in TABLES:
            subscribed(pub, table, len(made))
        return ctrl

    yield store, NbApi(store, pub), controller
    for ctrl in made:
        ctrl.stop()
    pub.close()
    store.close()


def test_a_key_failing_three_times_converges_to_its_latest_version_while_others_proceed(env):
    store, api, controller = env
    entered, release = threading.Event(), threading.Event()
    done_at = {}

    class Flaky(Seen):
        failures = 0

        def act(self, key, obj):
            if key.key == "p1" and self.failures < 3:
                self.failures += 1
                if self.failures == 1:
                    entered.set()
                    assert release.wait(10)
                raise RuntimeError(f"programming p1 failed ({self.failures})")
            done_at.setdefault(key.key, time.monotonic())

    seen = Flaky()
    versions = []
    seen_reconcile = seen.reconcile

    def recording(key, obj):
        if key.key == "p1":
            versions.append(obj.version)
        return seen_reconcile(key, obj)

    seen.reconcile = recording
    ctrl = controller(reconcilers={"port": seen})
    api.create("port", "p1", {"rev": 0})
    assert entered.wait(10)
    # While p1's first reconcile is failing: five updates of p1, and other keys that must not wait for it.
    for rev in range(1, 6):
        api.update("port", "p1", {"rev": rev})
    for i in range(2, 6):
        api.create("port", f"p{i}", {"rev": 0})
    latest = store.get("port", "p1").version
    wait_for(lambda: all(k in done_at for k in ("p2", "p3", "p4", "p5")), what="the other keys to be reconciled")
    wait_for(lambda: ctrl.cache.version("port", "p1") == latest, what="the updates to reach the cache")
    release.set()
    wait_for(lambda: seen.objects.get("p1") is not None, what="p1 to converge")
    assert seen.objects["p1"].version == latest and seen.objects["p1"].value == {"rev": 5}
    # The first attempt saw version 1; the five updates collapsed: every later attempt saw the latest.
    assert versions[0] < latest and versions[1:] == [latest] * 3
    assert max(done_at[k] for k in ("p2", "p3", "p4", "p5")) < done_at["p1"]
    assert ctrl.stats.get("reconciles", "error") == 3 and ctrl.stats.get("workqueue_retries") >= 3
    assert seen.overlaps == 0 and ctrl.failed() == []


def test_a_handler_raising_on_delete_gets_the_delete_retried_with_the_last_known_state(env):
    store, api, controller = env
    deletes = []

    class Stubborn(Mirror):
        def on_delete(self, previous):
            deletes.append(previous)
            if len(deletes) < 3:
                raise RuntimeError("cannot unplug the port yet")
            super().on_delete(previous)

    mirror = Stubborn()
    ctrl = controller(handlers={"port": mirror})
    api.create("port", "p1", {"rev": 0})
    last = api.update("port", "p1", {"rev": 1})
    wait_for(lambda: "p1" in mirror.objects and mirror.objects["p1"].version == last.version)
    api.delete("port", "p1")
    wait_for(lambda: "p1" not in mirror.objects, what="the delete to succeed on its third attempt")
    assert len(deletes) == 3 and all(d.version == last.version and d.value == {"rev": 1} for d in deletes)
    assert ctrl.cache.get("port", "p1") is None and ctrl.lister("port").last_known("p1") is None


def test_a_reconciler_finds_the_final_state_of_a_deleted_object_until_the_delete_is_reconciled(env):
    store, api, controller = env
    found = []

    class Cleaner(Seen):
        def act(self, key, obj):
            if obj is None:
                found.append(ctrl.lister("port").last_known(key.key))
                if len(found) == 1:
                    raise RuntimeError("cleanup failed once")

    ctrl = None
    cleaner = Cleaner()
    ctrl = controller(reconcilers={"port": cleaner})
    final = api.create("port", "p1", {"mac": "fa:16:3e:00:00:01"})
    wait_for(lambda: "p1" in cleaner.objects)
    api.delete("port", "p1")
    wait_for(lambda: len(found) == 2 and "p1" not in cleaner.objects, what="the delete to be reconciled twice")
    assert [(o.key, o.version, o.value) for o in found] == [("p1", final.version, {"mac": "fa:16:3e:00:00:01"})] * 2
    assert ctrl.lister("port").last_known("p1") is None  # dropped once the delete was reconciled


def test_an_envelope_failing_midway_still_queues_what_it_applied_and_resyncs_the_rest(env):
    store, api, controller = env
    seen = Seen()
    ctrl = controller(reconcilers={"port": seen})
    # Its own publisher, whose burst below is one envelope: it lingers, pauses and says hello
    # (which flushes) only long after the burst, which the test's flush() sends.
    stats = Stats("p2", "p2")
    pub = Publisher(load_driver("zmq+tcp://127.0.0.1:*").publisher(stats), "api2",
                    PublisherOptions(batch_linger=5.0, batch_pause=5.0, max_idle_time=5.0), stats)
    try:
        ctrl.connect(pub.transport.uri)
        subscribed(pub, "port")
        apply, handle, envelopes, failed = ctrl.cache.apply, ctrl.subscriber.on_events, [], []

        def failing_once_on_the_last(event):
            if event.key == "p39" and not failed:
                failed.append(event.key)
                raise RuntimeError("a bug while applying p39")
            return apply(event)

        def recording(events):
            envelopes.append([e.key for e in events])
            return handle(events)

        ctrl.cache.apply, ctrl.subscriber.on_events = failing_once_on_the_last, recording
        written = [store.create("port", f"p{i}", {"rev": 0}) for i in range(40)]
        with pub._lock:  # as if the last rate window had been busy: the burst is batched, however
            pub._busy, pub._window_end = True, float("inf")  # slowly a loaded machine publishes it
        for obj in written:
            pub.publish(obj.topic, obj.table, obj.key, "create", obj.version, obj.value)
        pub.flush()
        # The keys before p39 in its envelope were in the cache when it failed, so the resync finds
        # nothing to change for them: they reach the reconciler only if they were queued anyway.
        wait_for(lambda: all(seen.objects.get(o.key) == o for o in written), what="every key to be reconciled")
        last = next(keys for keys in envelopes if "p39" in keys)
        assert len(last) > 1, f"p39 came alone ({envelopes}): nothing was applied before the failure"
        assert failed and ctrl.stats.get("handler_errors") == 1 and ctrl.stats.get("resync_requests", "handler_error")
    finally:
        pub.close()


@pytest.mark.alone  # a bound on elapsed time
def test_a_blocked_key_does_not_delay_the_others_and_no_key_runs_twice_at_once(env):
    store, api, controller = env
    slow_started = threading.Event()

    class SlowOne(Seen):
        def act(self, key, obj):
            if key.key == "slow":
                slow_started.set()
                time.sleep(2.0)  # the reconcile's own cost: one worker is taken for 2 s

    seen = SlowOne()
    ctrl = controller(reconcilers={"port": seen}, runtime=ControllerOptions(workers=4))
    api.create("port", "slow", {"rev": 0})
    assert slow_started.wait(10)
    t0 = time.monotonic()
    latest = {}
    for i in range(200):
        key = f"k{i % 20}"
        obj = api.create("port", key, {"rev": i}) if i < 20 else api.update("port", key, {"rev": i})
        latest[key] = obj.version
        if i % 20 == 0:
            api.update("port", "slow", {"rev": i})  # changes of the blocked key: dirty, never a second worker

    def others_converged():
        with seen.lock:
            return all(k in seen.objects and seen.objects[k].version == v for k, v in latest.items())

    wait_for(others_converged, timeout=10, what="the other keys to converge")
    others_s = time.monotonic() - t0
    print(f"200 writes of 20 other keys converged {others_s * 1000:.0f} ms after the slow key blocked")
    assert others_s < 1.5, f"the other keys took {others_s:.2f} s behind a key blocked for 2 s"
    assert seen.active.get("slow") == 1, "the slow key must still be blocked in its first reconcile"
    wait_for(lambda: seen.objects.get("slow") is not None
             and seen.objects["slow"].version == store.get("port", "slow").version, timeout=15,
             what="the blocked key to converge to its latest version")
    assert seen.overlaps == 0 and ctrl.stats.get("drops") == 0  # no overflow behind the slow key either
    assert seen.calls["slow"] == 2  # the first, then all its updates collapsed into one
    assert ctrl.queue.stats.histogram("workqueue_work").count >= 21


@pytest.mark.alone  # a bound on elapsed time
def test_keys_taken_in_one_batch_with_a_blocked_key_are_run_by_the_idle_worker(env):
    store, api, controller = env
    blocking, slow_started = threading.Event(), threading.Event()

    class SlowOne(Seen):
        def act(self, key, obj):
            if key.key == "slow" and blocking.is_set():
                slow_started.set()
                time.sleep(2.0)

    seen = SlowOne()
    ctrl = controller(reconcilers={"port": seen}, runtime=ControllerOptions(workers=2))
    keys = ["slow"] + [f"k{i}" for i in range(100)]
    for key in keys:
        api.create("port", key, {"rev": 0})
    wait_for(lambda: all(seen.calls.get(k) == 1 for k in keys), what="the first reconciles")
    blocking.set()
    t0 = time.monotonic()
    # Every key is queued at once, "slow" first: a worker takes it in a batch with others.
    assert ctrl.redeliver() == len(keys)
    wait_for(lambda: all(seen.calls.get(k) == 2 for k in keys[1:]), timeout=10, what="the other keys' re-runs")
    others_s = time.monotonic() - t0
    assert slow_started.is_set() and seen.active.get("slow") == 1, "the slow key must still be blocked"
    assert others_s < 1.5, f"keys batched with a blocked one waited {others_s:.2f} s for it"
    assert ctrl.queue.stats.get("workqueue_steals") > 0 and seen.overlaps == 0


def test_keys_failing_past_max_retries_are_listed_and_retried_by_the_periodic_resync(env, tmp_path):
    store, api, controller = env

    class FailsFourTimes(Seen):
        def __init__(self):
            super().__init__()
            self.outcomes = []  # of "bad"'s reconciles, in turn

        def act(self, key, obj):
            if key.key == "bad":
                self.outcomes.append("failed" if len(self.outcomes) < 4 else "done")
                if self.outcomes[-1] == "failed":
                    raise ValueError(f"attempt {len(self.outcomes)}")

    seen = FailsFourTimes()
    # Re-deliveries 2 s apart: the failed set is read (through a status file and df-db) before the
    # first one, and later ones may reconcile "bad" again before the test looks.
    ctrl = controller(reconcilers={"port": seen}, runtime=ControllerOptions(
        workers=2, max_retries=2, retry_base_delay=0.01, resync_period=2.0))
    api.create("port", "bad", {"rev": 0})
    api.create("port", "good", {"rev": 0})
    wait_for(lambda: ctrl.failed(), what="the key to be given up after 1 + 2 attempts")
    failed = ctrl.failed()
    assert [(f.key.table, f.key.key, f.failures) for f in failed] == [("port", "bad", 3)]
    assert "attempt 3" in failed[0].error and ctrl.stats.level("reconcile_failed_keys") == 1
    assert ctrl.stats.get("reconcile_failed") == 1 and "good" in seen.objects
    # An operator reads the failed set from the controller's status file with df-db.
    status = StatusWriter(ctrl, str(tmp_path / "ctl.status"), 3600.0)
    status.close()
    listed = json.loads(df_db(base_env(), "-o", "json", "controller-status", "--failed",
                              str(tmp_path / "ctl.status")).stdout)
    assert [(k["table"], k["key"], k["failures"]) for k in listed] == [("port", "bad", 3)]
    (tmp_path / "junk.status").write_text("[1, 2]")
    shown = json.loads(df_db(base_env(), "-o", "json", "controller-status", str(tmp_path / "ctl.status"),
                             str(tmp_path / "junk.status")).stdout)
    assert shown[0]["failed_total"] == 1 and shown[0]["synced"] is True and "not a status file" in shown[1]["error"]
    # ... and what its cache holds per table: objects, the bytes of their packed values and keys.
    packed = len(msgpack.packb({"rev": 0}))
    assert shown[0]["cache"]["port"] == {"objects": 2, "bytes": 2 * packed + len("bad") + len("good"), "tombstones": 0}
    assert ctrl.stats.levels_by("cache_objects")["port"] == 2
    # The next re-delivery tries again from a fresh backoff: attempt 4 fails, 5 succeeds.
    wait_for(lambda: "bad" in seen.objects, timeout=10, what="the periodic resync to retry the failed key")
    assert seen.outcomes[:5] == ["failed"] * 4 + ["done"], seen.outcomes
    assert ctrl.failed() == [] and ctrl.stats.get("reconcile_failed") == 1
    # Each re-delivery hands over "bad" and "good" once, failed or not.
    assert ctrl.stats.get("redeliveries") >= 2 and ctrl.stats.get("redeliveries") % 2 == 0


def test_requeue_after_a_delay_reconciles_again_without_a_change(env):
    store, api, controller = env
    times = []

    class Poller:
        def reconcile(self, key, obj):
            times.append(time.monotonic())
            return Result(requeue_after=0.3) if len(times) < 3 else DONE

    ctrl = controller(reconcilers={"network": Poller()})
    api.create("network", "n1", {})
    wait_for(lambda: len(times) == 3, what="two requeues")
    assert all(b - a >= 0.29 for a, b in zip(times, times[1:]))
    assert ctrl.stats.get("reconciles", "requeue") == 2 and ctrl.stats.get("reconciles", "done") >= 1


def test_synced_waits_for_the_initial_state_to_be_reconciled(env):
    store, api, controller = env
    for i in range(20):
        store.create("port", f"p{i}", {"i": i})

    class Slowish(Seen):
        def act(self, key, obj):
            time.sleep(0.02)

    seen = Slowish()
    controller(reconcilers={"port": seen})  # returns once synced
    assert len(seen.objects) == 20


def test_a_cache_only_first_sync_builds_no_changes_and_a_reconciler_still_gets_every_key(env):
    store, api, controller = env
    for i in range(40):
        store.create("port", f"p{i}", {"i": i})
        store.create("network", f"n{i}", {"i": i})
    listed = {(o.table, o.key): o for o in store.list()}
    cache_only, seen = controller(), Seen()
    reconciled = controller(reconcilers={"port": seen})
    for ctrl in (cache_only, reconciled):
        assert {(o.table, o.key): o for o in ctrl.cache.items()} == listed
        assert ctrl.last_repair.changes == 80 and ctrl.stats.get("resync_changes") == 80
    assert sorted(seen.objects) == sorted(f"p{i}" for i in range(40))
    # After it, a cache-only controller keeps following the events.
    made = api.create("network", "later", {"i": -1})
    wait_for(lambda: cache_only.cache.get("network", "later") == made, what="the event in the cache-only cache")


def test_indexes_follow_the_cache_and_listers_read_them(env):
    store, api, controller = env
    ctrl = controller(reconcilers={"port": Seen()},
                      indexers={"port": {"by_network": lambda o: [o.value["network"]],
                                         "by_tag": lambda o: o.value.get("tags", [])}})
    ports = ctrl.lister("port")
    api.create("port", "p1", {"network": "n1", "tags": ["a", "b"]})
    api.create("port", "p2", {"network": "n1"})
    api.create("port", "p3", {"network": "n2", "tags": ["a"]})
    wait_for(lambda: len(ports.list()) == 3)
    assert [o.key for o in ports.by_index("by_network", "n1")] == ["p1", "p2"]
    assert ports.index_keys("by_tag", "a") == ["p1", "p3"]
    api.update("port", "p1", {"network": "n2"})
    api.delete("port", "p2")
    wait_for(lambda: ports.index_keys("by_network", "n1") == [], what="the index to follow the update and delete")
    assert ports.index_keys("by_network", "n2") == ["p1", "p3"] and ports.index_keys("by_tag", "a") == ["p3"]
    # Behind the pub/sub's back: found by a resync, indexed all the same.
    store.create("port", "p4", {"network": "n1"})
    ctrl.subscriber.request_resync(["port"])
    wait_for(lambda: ports.index_keys("by_network", "n1") == ["p4"], what="the resync's change to be indexed")
    with pytest.raises(KeyError):
        ports.index_keys("no-such-index", "x")


def test_a_transform_strips_values_before_caching_for_the_first_sync_events_and_resyncs(env):
    store, api, controller = env
    for i in range(50):  # listed by the first sync
        api.create("port", f"p{i}", {"mac": f"m{i}", "description": "x" * 150})
    seen = Seen()
    ctrl = controller(reconcilers={"port": seen}, indexers={"port": {"by_mac": lambda o: [o.value["mac"]]}},
                      transforms={"port": lambda v: {"mac": v["mac"]}})
    assert seen.objects["p7"].value == {"mac": "m7"} and ctrl.lister("port").index_keys("by_mac", "m7") == ["p7"]
    api.update("port", "p7", {"mac": "new", "description": "y" * 150})  # an event
    store.create("port", "hidden", {"mac": "h", "description": "z"})  # behind the pub/sub's back: a resync
    ctrl.subscriber.request_resync(["port"])
    wait_for(lambda: seen.objects.get("hidden") is not None and seen.objects["p7"].value == {"mac": "new"},
             what="the event and the resync's change to be reconciled")
    assert seen.objects["hidden"].value == {"mac": "h"} and ctrl.lister("port").get("p7").value == {"mac": "new"}
    # The cache holds the stripped values only: ~10 bytes each, not ~170.
    usage = ctrl.cache.usage()["port"]
    assert usage.objects == 51 and usage.bytes < 51 * 20, usage
    assert ctrl.stats.level("cache_transform_errors") == 0
    # A relist of the unchanged store compares versions: nothing to reconcile again.
    calls = dict(seen.calls)
    ctrl.subscriber.request_resync(["port"], reason="periodic")
    wait_for(lambda: ctrl.stats.get("relists", "periodic") == 1, what="the periodic relist")
    assert ctrl.last_repair.changes == 0 and seen.calls == calls


def test_stop_while_a_worker_is_busy_lets_it_finish_and_reconciles_nothing_more(env):
    store, api, controller = env
    entered, finished = threading.Event(), []

    class Busy(Seen):
        def act(self, key, obj):
            if key.key == "busy":
                entered.set()
                time.sleep(1.0)
                finished.append(key.key)

    seen = Busy()
    ctrl = controller(reconcilers={"port": seen}, runtime=ControllerOptions(workers=1))
    api.create("port", "busy", {})
    assert entered.wait(10)
    for i in range(20):
        api.create("port", f"queued{i}", {})
    wait_for(lambda: len(ctrl.queue) > 0, what="keys to queue up behind the busy one")
    t0 = time.monotonic()
    ctrl.stop()
    assert time.monotonic() - t0 < 5
    assert finished == ["busy"] and not any(t.is_alive() for t in ctrl._threads)
    assert list(seen.calls) == ["busy"]  # the queued keys were dropped with the queue, not reconciled
