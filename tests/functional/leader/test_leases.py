"""The lease backends against real servers (a private etcd and Redis, a SQLite file): one holder at
a time, tokens that only grow across releases and expiries, renewals refused once the lease
passed, foreign records refused; and the elector's act path saying no at the deadline while its
thread is stuck in a renewal that does not return."""

from __future__ import annotations

import sqlite3
import time

import pytest

from dfpubsub.config import load_settings
from dfpubsub.errors import ConfigError, ForeignRecord, NotLeader
from dfpubsub.leader import LeaderElector, open_lease
from tests.conftest import wait_for

pytestmark = pytest.mark.alone  # leases and takeovers within bounds of time


@pytest.fixture(params=["sqlite", "redis", "etcd"])
def url(request, tmp_path):
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path}/leases.sqlite"
    return request.getfixturevalue(f"{request.param}_server").url


def test_one_holder_at_a_time_and_tokens_only_grow(url):
    a, b = open_lease(url, "t", 2.0), open_lease(url, "t", 2.0)
    try:
        t1 = a.acquire("a", 3.0)
        assert t1 is not None and b.acquire("b", 3.0) is None and a.acquire("a", 3.0) is None
        assert a.renew("a", t1, 3.0) and not b.renew("b", t1, 3.0)
        assert b.holder().identity == "a" and b.holder().token == t1
        a.release("a", t1)
        t2 = b.acquire("b", 3.0)
        assert t2 is not None and t2 > t1 and not a.renew("a", t1, 3.0)
        a.release("a", t1)  # a stale release leaves b's lease alone
        assert b.renew("b", t2, 3.0) and a.holder().identity == "b"
        # b dies without releasing: the lease passes once it expires, with a larger token again.
        wait_for(lambda: a.acquire("a", 3.0) is not None, timeout=10, what="b's lease expiring")
        assert a.holder().token > t2 and not b.renew("b", t2, 3.0)
    finally:
        a.close()
        b.close()


def test_a_foreign_lease_row_is_refused_by_name_not_outbid(tmp_path):
    url = f"sqlite:///{tmp_path}/leases.sqlite"
    lease = open_lease(url, "t", 2.0)
    with sqlite3.connect(tmp_path / "leases.sqlite") as raw:
        raw.execute("INSERT INTO leader_leases VALUES ('t', 'x', 'not a number', 0)")
    with pytest.raises(ForeignRecord, match="leader_leases row 't'"):
        lease.acquire("a", 3.0)
    lease.close()


def test_a_foreign_redis_lease_value_is_refused_by_name(redis_server):
    import redis

    lease = open_lease(redis_server.url, "t", 2.0, prefix="p")
    redis.Redis.from_url(redis_server.url).set("p:leader:t", b"\xff garbage")
    assert lease.acquire("a", 3.0) is None  # held by whatever is there: nobody outbids it
    with pytest.raises(ForeignRecord, match="p:leader:t"):
        lease.holder()
    lease.close()


def test_the_act_path_says_no_at_the_deadline_while_a_renewal_hangs(tmp_path):
    """The elector's thread blocks in a renewal (the SQLite file locked by another writer, the
    busy timeout longer than the lease): the act path must still stop at the deadline."""
    path = tmp_path / "leases.sqlite"
    elector = LeaderElector(open_lease(f"sqlite:///{path}", "t", timeout=8.0), "t", "a",
                            lease_duration=3.0, renew_deadline=1.5, retry_period=0.3, clock_skew=1.0).start()
    try:
        assert elector.wait_leading(10) == 1 and elector.check() == 1
        locker = sqlite3.connect(path, isolation_level=None)
        locker.execute("BEGIN EXCLUSIVE")
        locked = time.monotonic()
        # Well before the busy timeout lets the renewal fail: the thread cannot step down until then.
        wait_for(lambda: elector.token() is None, timeout=5, what="the act path saying no")
        assert time.monotonic() - locked < 8.0
        assert elector.stats.get("leader_transitions", "expired") == 0  # its thread is still stuck
        assert elector.stats.level("leader") == 0
        with pytest.raises(NotLeader):
            elector.check()
        locker.execute("ROLLBACK")
        wait_for(lambda: elector.stats.get("leader_transitions", "expired") == 1, timeout=10, what="stepping down")
        assert elector.wait_leading(10) == 2  # its own lease expired or was released: a new term
    finally:
        elector.close()


def test_leader_settings_are_checked_once_in_config():
    with pytest.raises(ConfigError, match="renew_deadline"):
        load_settings(overrides={"leader": {"lease_duration": 5, "renew_deadline": 4.5, "clock_skew": 1}})
    with pytest.raises(ConfigError, match="retry_period"):
        load_settings(overrides={"leader": {"lease_duration": 15, "renew_deadline": 3, "retry_period": 2}})
    assert load_settings().leader.enabled is False
