"""dfpubsub.retry: the one backoff formula, its per-loop state, and its jitter."""

from __future__ import annotations

import random

import pytest

from dfpubsub.retry import Backoff, backoff_delay, equal_jitter


def test_delay_doubles_from_the_base_to_the_cap_without_overflowing():
    assert [backoff_delay(0.05, 1.0, n) for n in range(7)] == [0.05, 0.1, 0.2, 0.4, 0.8, 1.0, 1.0]
    assert backoff_delay(1.0, 1000.0, 10**6) == 1000.0
    assert backoff_delay(1e300, 1e301, 2000) == 1e301  # a float that overflows to inf is capped too


def test_backoff_counts_failures_tells_when_to_retry_and_resets_on_success():
    b = Backoff(0.1, 5.0)
    assert [b.failed(now=10.0) for _ in range(8)] == [0.1, 0.2, 0.4, 0.8, 1.6, 3.2, 5.0, 5.0]
    assert b.failures == 8 and b.pause == 5.0 and b.until == 15.0
    b.reset()
    assert b.failures == 0 and b.pause == 0.0 and b.until == 0.0
    assert b.failed(now=1.0) == 0.1 and b.until == pytest.approx(1.1)


def test_jitter_draws_in_the_upper_half_of_each_pause():
    b = Backoff(1.0, 8.0, jitter=True, rng=random.Random(7))
    for delay in (1.0, 2.0, 4.0, 8.0, 8.0):
        assert delay / 2 <= b.failed() <= delay
    rng, same = random.Random(3), random.Random(3)
    assert equal_jitter(2.0, rng) == 1.0 + same.uniform(0, 1.0)


@pytest.mark.parametrize("base, cap", [(0.0, 1.0), (-1.0, 1.0), (2.0, 1.0)])
def test_backoff_refuses_a_base_it_cannot_double_to_its_cap(base, cap):
    with pytest.raises(ValueError):
        Backoff(base, cap)
