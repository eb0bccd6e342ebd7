import random

from dfpubsub.resync import ResyncScheduler


def test_requests_coalesce_and_first_run_is_immediate():
    s = ResyncScheduler(0.1, 5.0, random.Random(1))
    s.request(["a"])
    s.request(["a", "b"])
    assert s.due() == float("-inf")
    assert s.take(0.0) == {"a", "b"}
    assert s.take(0.0) == set() and s.due() is None


def test_back_to_back_runs_back_off_with_jitter_up_to_the_cap():
    s = ResyncScheduler(0.1, 2.0, random.Random(2))
    now = 0.0
    spacing = []
    for _ in range(8):
        s.request(["a"])
        topics = s.take(now)
        assert topics == {"a"}
        s.request(["a"])  # the storm goes on
        s.done(topics, True, now)
        due = s.due()
        spacing.append(due - now)
        now = due
    assert spacing[0] < spacing[3]
    assert all(0 < x <= 2.0 for x in spacing) and spacing[-1] >= 1.0


def test_failed_run_keeps_topics_and_backs_off():
    s = ResyncScheduler(0.1, 5.0, random.Random(3))
    s.request(["a"])
    topics = s.take(0.0)
    s.done(topics, False, 0.0)
    assert s.pending() == {"a"}
    assert s.take(0.01) == set()
    assert s.take(s.due()) == {"a"}


def test_quiet_period_resets_the_interval():
    s = ResyncScheduler(0.1, 1.0, random.Random(4))
    now = 0.0
    for _ in range(5):
        s.request(["a"])
        s.request(["a"])
        t = s.take(now)
        s.done(t, False, now)
        now = s.due()
    s.take(now)
    s.done({"a"}, True, now)
    s.request(["a"])
    later = now + 10
    assert s.take(later) == {"a"}
    s.done({"a"}, True, later)
    assert s.due() is None
    s.request(["b"])
    assert s.due() - later <= 0.1
