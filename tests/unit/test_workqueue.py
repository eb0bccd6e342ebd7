"""The controller's work queue and its rate limiter, on a fake clock."""

import threading
import time

import pytest

from dfpubsub.controller import ExponentialBackoff, RateLimiter, TokenBucket, WorkQueue
from dfpubsub.metrics import Stats
from tests.conftest import wait_for


class Clock:
    def __init__(self):
        self.now = 100.0

    def __call__(self):
        return self.now


def queue(clock, **kw):
    limiter = RateLimiter(ExponentialBackoff(0.005, 1000.0), TokenBucket(10.0, 100, clock))
    return WorkQueue(limiter, stats=Stats("wq", "test"), clock=clock, **kw)


def test_a_key_added_many_times_while_waiting_is_handed_out_once():
    q = queue(Clock())
    for _ in range(5):
        q.add("a")
    q.add("b")
    q.add("a")
    assert len(q) == 2 and q.stats.get("workqueue_adds") == 2
    assert q.get(0) == "a" and q.get(0) == "b" and q.get(0) is None


def test_a_key_changed_while_processing_is_queued_again_only_after_done():
    q = queue(Clock())
    q.add("a")
    assert q.get(0) == "a"
    q.add("a")
    q.add("a")  # collapses with the one before
    assert q.get(0) is None, "a key must never be with two workers at once"
    q.done("a")
    assert q.get(0) == "a"
    q.done("a")
    assert q.get(0) is None and q.idle()


def test_keys_come_out_in_order_and_the_oldest_age_and_latencies_are_measured():
    clock = Clock()
    q = queue(clock)
    q.add("a")
    clock.now += 2
    q.add("b")
    clock.now += 1
    assert q.oldest_age() == 3.0 and q.stats.level("workqueue_depth") == 2
    assert q.get(0) == "a"
    clock.now += 0.5
    q.done("a")
    assert q.oldest_age() == 1.5  # b waits since 102
    wait, work = q.stats.histogram("workqueue_wait"), q.stats.histogram("workqueue_work")
    assert wait.count == 1 and wait.sum == 3.0 and work.count == 1 and work.sum == 0.5


def test_backoff_doubles_per_failure_up_to_the_cap_and_forget_resets_it():
    b = ExponentialBackoff(0.005, 1.0)
    assert [b.when("k") for _ in range(10)] == [0.005, 0.01, 0.02, 0.04, 0.08, 0.16, 0.32, 0.64, 1.0, 1.0]
    assert b.when("other") == 0.005  # per key
    assert b.failures("k") == 10
    b.forget("k")
    assert b.failures("k") == 0 and b.when("k") == 0.005
    assert ExponentialBackoff(0.005, 1000.0).when("x") == 0.005
    big = ExponentialBackoff(1.0, 1000.0)
    assert [big.when("k") for _ in range(200)][-1] == 1000.0  # no overflow after many failures


def test_token_bucket_grants_a_burst_then_spaces_reservations_at_qps():
    clock = Clock()
    bucket = TokenBucket(qps=10.0, burst=3, clock=clock)
    assert [bucket.reserve() for _ in range(3)] == [0.0, 0.0, 0.0]
    assert bucket.reserve() == pytest.approx(0.1)
    assert bucket.reserve() == pytest.approx(0.2)  # the debt carries over
    clock.now += 0.2
    assert bucket.reserve() == pytest.approx(0.1)
    clock.now += 60
    assert [bucket.reserve() for _ in range(4)] == [0.0, 0.0, 0.0, pytest.approx(0.1)]  # refills to burst only


def test_rate_limited_retry_waits_the_larger_of_backoff_and_bucket():
    clock = Clock()
    q = WorkQueue(RateLimiter(ExponentialBackoff(0.005, 1000.0), TokenBucket(1.0, 1, clock)), clock=clock)
    q.add_rate_limited("a")  # backoff 5 ms, bucket has its one token
    q.add_rate_limited("b")  # backoff 5 ms, bucket 1 s away
    assert q.get(0) is None and q.delayed() == 2
    clock.now += 0.005
    assert q.get(0) == "a" and q.get(0) is None
    clock.now += 1.0
    assert q.get(0) == "b"
    assert q.retries("a") == 1
    q.forget("a")
    assert q.retries("a") == 0 and q.stats.get("workqueue_retries") == 2


def test_a_delayed_key_added_directly_is_handed_out_once_and_the_earlier_due_time_wins():
    clock = Clock()
    q = queue(clock)
    q.add_after("a", 10)
    q.add_after("a", 1)
    q.add_after("a", 5)
    assert q.delayed() == 1
    clock.now += 1
    q.add("a")
    assert q.get(0) == "a"
    q.done("a")
    clock.now += 10
    assert q.get(0) is None  # the superseded entries of the heap are not handed out


def test_a_waiting_worker_wakes_when_a_key_is_added():
    q = WorkQueue()
    got = []
    t = threading.Thread(target=lambda: got.append(q.get(10)))
    t.start()
    wait_for(lambda: q._getters == 1, what="the worker to wait")
    q.add("x")
    t.join(5)
    assert got == ["x"]


def test_add_blocks_while_full_and_resumes_when_a_worker_takes_a_key():
    q = WorkQueue(max_depth=2)
    q.add("a")
    q.add("b")
    q.add("a")  # already queued: never blocks
    added = threading.Event()
    t = threading.Thread(target=lambda: (q.add("c"), added.set()))
    t.start()
    wait_for(lambda: q.stats.get("workqueue_full") == 1, what="the add to wait")
    assert not added.is_set() and len(q) == 2
    assert q.get(0) == "a"
    t.join(5)
    assert added.is_set() and len(q) == 2
    q.add("a")  # being processed: marked dirty without blocking although the queue is full
    q.add_after("d", 0)  # retries never block either
    assert len(q) == 3


def test_shutdown_while_busy_lets_the_busy_worker_finish_and_releases_everyone_else():
    q = WorkQueue(max_depth=1)
    q.add("busy")
    assert q.get(0) == "busy"  # a worker holds it through the shutdown
    q.add("waiting")
    blocked_add = threading.Thread(target=q.add, args=("more",))  # the queue is full: blocks
    blocked_add.start()
    wait_for(lambda: q.stats.get("workqueue_full") == 1, what="the add to block on the full queue")
    q.add("busy")  # changed while processing
    idle = []
    waiter = threading.Thread(target=lambda: idle.append(q.wait_idle(30)))
    waiter.start()
    q.shutdown()
    blocked_add.join(5)
    waiter.join(5)
    assert not blocked_add.is_alive() and not waiter.is_alive() and idle == [False]
    assert q.get(0) is None and q.get(30) is None  # at once, not after the timeout
    q.add("late")
    assert len(q) == 1  # only "waiting": nothing is added after the shutdown
    q.done("busy")  # the busy worker finishes as usual; its dirty key is not handed out again
    assert q.get(0) is None and len(q) == 1


def test_workers_blocked_in_get_return_none_on_shutdown():
    q = WorkQueue()
    got = []
    workers = [threading.Thread(target=lambda: got.append(q.get(30))) for _ in range(3)]
    for w in workers:
        w.start()
    wait_for(lambda: q._getters == 3, what="the workers to wait")
    q.shutdown()
    for w in workers:
        w.join(5)
        assert not w.is_alive()
    assert got == [None, None, None]


def test_wait_idle_counts_processing_but_not_delayed_keys():
    q = WorkQueue()
    q.add("a")
    k = q.get(0)
    q.add_after("later", 60)
    assert not q.wait_idle(0)
    threading.Timer(0.05, q.done, args=(k,)).start()
    assert q.wait_idle(5)


def test_a_pending_retry_is_dropped_when_the_key_is_taken_for_a_newer_change():
    clock = Clock()
    q = queue(clock)
    q.add_rate_limited("a")  # failed: retry in 5 ms
    q.add("a")  # but it changed: queued at once
    assert q.get(0) == "a" and q.delayed() == 0
    q.done("a")
    clock.now += 1
    assert q.get(0) is None  # no second run for the stale retry


def test_done_and_take_hands_back_a_key_changed_meanwhile_after_the_others():
    q = queue(Clock())
    q.add_many(["a", "b", "a"])
    assert q.get(0) == "a"
    q.add("a")
    assert list(q.done_and_take(["a"], most=0)) == ["b"]
    assert list(q.done_and_take(["b"], most=0)) == ["a"]
    q.done("a")
    assert q.get(0) is None and q.idle()


def test_done_and_take_takes_ready_keys_in_batches_and_requeues_a_key_changed_while_held():
    q = queue(Clock())
    q.add_many(["a", "b", "c", "d"])
    assert list(q.done_and_take([], most=2)) == ["a", "b", "c"]  # one, and up to two more ready ones
    q.add("b")  # changed while held: queued again once the batch is done, after the others
    q.add("a")
    assert list(q.done_and_take(["a", "b", "c"], most=0)) == ["d"]
    assert list(q.done_and_take(["d"], most=5)) == ["a", "b"]
    q.shutdown()
    assert not q.done_and_take(["a", "b"], most=5)


def test_done_and_take_returns_nothing_once_shut_down_while_waiting():
    q = queue(Clock())
    got = []
    t = threading.Thread(target=lambda: got.append(q.done_and_take([], most=3)))
    t.start()
    wait_for(lambda: q._getters == 1, what="the worker to wait")
    q.shutdown()
    t.join(5)
    assert [list(b) for b in got] == [[]]


def test_an_idle_worker_takes_the_untouched_tail_of_a_busy_workers_batch():
    q = queue(Clock())
    q.add_many(["a", "b", "c", "d"])
    batch = q.done_and_take([], most=3)  # the owner holds a, b, c, d
    assert batch.popleft() == "a"  # ... and is stuck on a
    stolen = []
    thief = threading.Thread(target=lambda: stolen.extend([q.get(5), q.get(5)]))
    thief.start()
    thief.join(5)
    assert stolen == ["d", "c"]  # from the far end, one key each
    assert batch.popleft() == "b" and not batch  # never handed out twice
    q.add("c")  # changed while the thief holds it: queued again when it is done
    for key in ("a", "b", "d"):
        q.done(key)
    assert q.get(0) is None  # nothing ready but the stolen key's next run, after its done
    q.done("c")
    assert q.get(0) == "c" and q.stats.get("workqueue_steals") == 2


def test_the_queue_lock_excludes_and_a_waiter_gets_it_once_the_holder_lets_go():
    from dfpubsub.controller.workqueue import _YieldingLock

    lock = _YieldingLock()
    assert lock.acquire(False) and not lock.acquire(False) and lock.locked()
    got = threading.Event()
    waiter = threading.Thread(target=lambda: (lock.acquire(), got.set(), lock.release()))
    waiter.start()
    assert not got.wait(0.2), "the waiter took a lock still held"
    lock.release()
    assert got.wait(5)
    waiter.join(5)
    # Mutual exclusion under contention, with the GIL given up inside the section.
    inside, overlaps, count = [0], [0], [0]

    def work():
        for _ in range(500):
            with lock:
                inside[0] += 1
                overlaps[0] += inside[0] > 1
                time.sleep(0)
                count[0] += 1
                inside[0] -= 1

    threads = [threading.Thread(target=work) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert count[0] == 2000 and overlaps[0] == 0
