import random
import time

import pytest

from dfpubsub import Subscriber, SubscriberOptions, load_driver
from dfpubsub.metrics import Stats
from dfpubsub.resync import ResyncScheduler


class Clock:
    """A fake monotonic clock the test moves by hand."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def clock() -> Clock:
    return Clock()


def scheduler(clock: Clock, base: float = 0.1, cap: float = 2.0, seed: int = 1) -> ResyncScheduler:
    return ResyncScheduler(base, cap, random.Random(seed), clock=clock)


def run(s: ResyncScheduler, clock: Clock, duration: float = 0.0, ok: bool = True, during: tuple = ()) -> set[str]:
    """One resync run starting at the clock's time, with ``during`` requested while it runs."""
    topics = s.take(clock.now)
    if during:
        s.request(during)
    clock.now += duration
    s.done(topics, ok, clock.now)
    return topics


def test_requests_coalesce_and_first_run_is_immediate(clock):
    s = scheduler(clock)
    s.request(["a"])
    s.request(["a", "b"])
    assert s.due() == float("-inf")
    assert s.take(0.0) == {"a", "b"}
    assert s.take(0.0) == set() and s.due() is None


def test_reasons_coalesce_with_their_topics_and_survive_a_failed_run(clock):
    s = scheduler(clock)
    s.request(["a"], "gap")
    s.request(["a", "b"], "overflow")
    s.request(["b"])  # no reason given: a manual request
    taken = s.take(0.0)
    assert taken == {"a", "b"}
    assert taken.reasons == {"a": {"gap", "overflow"}, "b": {"overflow", "manual"}}
    assert taken.only({"a"}).reasons == {"a": {"gap", "overflow"}}
    s.request(["a"], "periodic")  # while the run fails
    s.done(taken, False, 0.01)
    again = s.take(s.due())
    assert again.reasons == {"a": {"gap", "overflow", "periodic"}, "b": {"overflow", "manual"}}
    s.done(again, True, s.due() or 1.0)
    assert s.pending() == set()


def test_requests_during_runs_double_the_spacing_with_jitter_up_to_the_cap(clock):
    s = scheduler(clock)
    s.request(["a"])
    spacing, intervals = [], []
    for _ in range(8):
        assert run(s, clock, 0.01, during=("a",)) == {"a"}  # the storm goes on while it runs
        due = s.due()
        spacing.append(due - clock.now)
        intervals.append(s.interval)
        clock.now = due
    assert intervals[:5] == pytest.approx([0.2, 0.4, 0.8, 1.6, 2.0])
    assert intervals[5:] == [2.0] * 3
    assert all(i / 2 <= x <= i for x, i in zip(spacing, intervals))
    assert len(set(spacing)) == len(spacing)  # jittered


def test_requests_right_after_a_run_back_off_like_those_during_it(clock):
    # The subscriber hands in-band requests to the scheduler only once the run is over:
    # arriving before the spacing has passed, they are back to back all the same.
    s = scheduler(clock)
    runs = 0
    s.request(["a"])
    while clock.now < 10.0:
        if s.take(clock.now):
            runs += 1
            clock.now += 0.005
            s.done({"a"}, True, clock.now)
        clock.now += 0.001
        s.request(["a"])  # a peer that never stops asking
    assert s.interval == 2.0
    assert runs < 15  # at the base spacing it would be ~100


def test_many_requests_within_one_run_double_only_once(clock):
    s = scheduler(clock)
    s.request(["a"])
    topics = s.take(0.0)
    for t in "abcdef":
        s.request([t])
    s.done(topics, True, 0.0)
    s.request(["g"])
    assert s.interval == pytest.approx(0.2)
    assert s.pending() == set("abcdefg")


def test_failed_run_keeps_topics_and_backs_off(clock):
    s = scheduler(clock, cap=5.0)
    s.request(["a"])
    run(s, clock, ok=False)
    assert s.pending() == {"a"}
    assert s.interval == pytest.approx(0.2)
    assert s.take(0.01) == set()
    assert s.take(s.due()) == {"a"}


def test_a_quiet_spell_resets_the_interval(clock):
    s = scheduler(clock, cap=1.0)
    s.request(["a"])
    for _ in range(5):
        run(s, clock, during=("a",))
        clock.now = s.due()
    assert s.interval == 1.0
    run(s, clock)  # the storm is over
    clock.now += 1.5
    s.request(["b"])
    assert s.interval == pytest.approx(0.1)
    assert s.take(clock.now) == {"b"}
    s.done({"b"}, True, clock.now)
    clock.now += 2
    s.request(["c"])
    assert s.due() <= clock.now and s.take(clock.now) == {"c"}


def test_a_request_after_the_spacing_but_before_the_quiet_spell_keeps_the_interval(clock):
    s = scheduler(clock, cap=2.0)
    s.request(["a"])
    run(s, clock, during=("a",))
    clock.now = s.due()
    run(s, clock)
    assert s.interval == pytest.approx(0.2)
    clock.now += 0.5  # past the spacing, within the quiet spell
    s.request(["a"])
    assert s.interval == pytest.approx(0.2) and s.take(clock.now) == {"a"}


def test_a_subscriber_asked_for_resyncs_without_pause_backs_off():
    # End to end on a real subscriber: requests reach the scheduler only after each run (in band),
    # which is exactly when the old scheduler saw no storm.
    runs = []
    sub = Subscriber(load_driver("memory://resync-storm").subscriber(Stats("s", "s")),
                     ["t"], lambda e: None, lambda topics: runs.append(time.monotonic()),
                     SubscriberOptions(resync_base_interval=0.02, resync_max_interval=0.4))
    sub.start()
    try:
        assert sub.wait_synced(5)
        end = time.monotonic() + 1.5
        while time.monotonic() < end:
            sub.request_resync(["t"], "storm")
            time.sleep(0.002)  # pacing the requests, not waiting for anything
    finally:
        sub.close()
    gaps = [b - a for a, b in zip(runs, runs[1:])]
    assert len(runs) < 15, gaps  # ~60 at the base interval
    assert max(gaps) >= 0.2
