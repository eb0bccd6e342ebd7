"""Redis-specific behaviour of RedisStore, each test on a redis-server of its own."""

import multiprocessing
import socket
import threading
import time

import pytest
import redis

from dfpubsub.backends import access
from dfpubsub.errors import NotEnoughReplicas, StoreUnavailable, WriteOutcomeUnknown
from dfpubsub.store.redis import RedisStore
from dfpubsub.testing.servers import RedisServer

TABLES = ["port", "network"]


@pytest.fixture
def raw(redis_server):
    """A plain client on the test's own server, to poke at it behind the store's back."""
    client = redis.Redis.from_url(redis_server.url)
    yield client
    client.close()


@pytest.mark.alone  # a bound on elapsed time
def test_killed_server_is_unavailable_then_the_same_store_recovers(redis_server):
    store = RedisStore(redis_server.url, TABLES, prefix="kill", timeout=2.0)
    before = [store.create("port", f"p{i}", {"i": i}) for i in range(5)]
    redis_server.kill()
    for call in (lambda: store.get("port", "p0"), lambda: store.create("port", "new", 1), store.list):
        started = time.monotonic()
        with pytest.raises(StoreUnavailable, match=f"127.0.0.1:{redis_server.port}"):
            call()
        assert time.monotonic() - started < 1.5  # refused at once, not after retries
    redis_server.start()  # same port and directory: the append-only file is replayed
    assert store.get("port", "p0") == before[0]
    assert sorted(o.key for o in store.list("port")) == [f"p{i}" for i in range(5)]
    after = store.update("port", "p1", "again")
    assert after.version > before[-1].version  # the counter came back with the data
    store.close()


@pytest.mark.alone  # a bound on elapsed time
def test_a_server_that_does_not_answer_times_out_as_unavailable(redis_server, raw):
    store = RedisStore(redis_server.url, TABLES, prefix="slow", timeout=0.3)
    store.create("port", "p", 1)
    raw.execute_command("CLIENT", "PAUSE", "10000", "WRITE")  # writes (and scripts) wait
    try:
        started = time.monotonic()
        with pytest.raises(StoreUnavailable, match="Timeout"):
            store.create("port", "q", 2)
        assert time.monotonic() - started < 2.0
    finally:
        raw.execute_command("CLIENT", "UNPAUSE")
    assert store.update("port", "p", 3).value == 3  # the timed-out connection was replaced
    store.close()


def test_flushed_script_cache_does_not_break_writes_or_listing(redis_server, raw):
    store = RedisStore(redis_server.url, TABLES, prefix="flush")
    a = store.create("port", "a", 1)
    assert len(store.list("port")) == 1
    raw.script_flush()
    b = store.create("port", "b", 2)
    raw.script_flush()
    assert store.update("port", "a", 3, expected_version=a.version).version > b.version
    raw.script_flush()
    assert {o.key: o.value for o in store.list("port")} == {"a": 3, "b": 2}
    raw.script_flush()
    store.delete("port", "b")
    assert store.get("port", "b") is None
    store.close()


def test_drop_all_keeps_the_version_counter_and_only_its_prefix(redis_server, raw):
    wide = RedisStore(redis_server.url, [*TABLES, "extra"], prefix="a*b")
    store = RedisStore(redis_server.url, TABLES, prefix="a*b")
    other = RedisStore(redis_server.url, TABLES, prefix="aXb")  # matched by an unescaped "a*b:nb:*"
    for i in range(1500):  # more than one SCAN/delete chunk
        store.create("network" if i % 2 else "port", f"k{i}", i, topic=f"t{i % 3}")
    last = wide.create("extra", "e", "not in store's schema").version
    kept = other.create("port", "kept", 1)
    assert store.drop_all() == 1501  # every object under the prefix, declared tables or not
    assert store.list() == [] and wide.list() == []
    # The counter stays (versions never go back) and so does the change feed's history, with the
    # server's replication id its first connection noted (dfpubsub.backends.redis.TAKEOVER).
    assert sorted(raw.keys("a\\*b:nb:*")) == [b"a*b:nb:epoch", b"a*b:nb:feed", b"a*b:nb:rev"]
    assert store.create("port", "k0", "back").version > last  # versions never go back
    assert other.get("port", "kept") == kept
    for s in (wide, store, other):
        s.close()


def test_versions_stay_exact_past_the_doubles_of_lua(redis_server, raw):
    """A script's numbers are doubles, exact up to 2**53: below, a write formats INCR's answer; at
    and past it, reads the counter back. Every version is exact and in the feed either way."""
    store = RedisStore(redis_server.url, TABLES, prefix="wide")
    raw.set("wide:nb:rev", 2**53 - 3)
    made = [store.create("port", "a", 0), store.update("port", "a", 1), store.update("port", "a", 2),
            store.update("port", "a", 3), store.delete("port", "a")]
    assert [o.version for o in made] == [2**53 - 2, 2**53 - 1, 2**53, 2**53 + 1, 2**53 + 2]
    assert [e.revision for e in store.read_feed(2**53 - 3)] == [o.version for o in made]
    store.close()


def _child_writes(store: RedisStore, result: "multiprocessing.Queue[int]") -> None:
    result.put(store.create("port", "from-child", 1).version)
    store.close()


def test_a_forked_child_uses_its_own_connections(redis_server):
    store = RedisStore(redis_server.url, TABLES, prefix="fork")
    parent = store.create("port", "from-parent", 1)  # the pool now holds a connection
    ctx = multiprocessing.get_context("fork")
    result = ctx.Queue()
    child = ctx.Process(target=_child_writes, args=(store, result))
    child.start()
    version = result.get(timeout=30)
    child.join(30)
    assert child.exitcode == 0 and version > parent.version
    assert store.get("port", "from-child").version == version  # the parent's connection still works
    store.close()


def test_threads_share_one_store(redis_server):
    store = RedisStore(redis_server.url, TABLES, prefix="threads")

    def work(n: int) -> None:  # an exception here fails the test (PytestUnhandledThreadExceptionWarning)
        for i in range(50):
            store.create("port", f"{n}-{i}", i)
            store.list("port")

    threads = [threading.Thread(target=work, args=(n,)) for n in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    versions = [o.version for o in store.list("port")]
    assert len(versions) == 200 and len(set(versions)) == 200
    store.close()


def test_a_write_refused_for_want_of_replicas_is_not_made_and_says_so(redis_server, raw):
    store = RedisStore(redis_server.url, TABLES, prefix="norepl")
    store.create("port", "a", 1)
    raw.config_set("min-replicas-to-write", 1)  # and no replica: NOREPLICAS
    try:
        with pytest.raises(NotEnoughReplicas, match="NOREPLICAS"):
            store.update("port", "a", 2)
    finally:
        raw.config_set("min-replicas-to-write", 0)
    assert store.get("port", "a").value == 1  # refused, not made: unlike WriteOutcomeUnknown
    store.close()


def test_a_write_no_replica_acknowledged_in_time_is_outcome_unknown(redis_server, redis_settings):
    access.configure(redis=access.RedisAccess(wait_replicas=1, wait_timeout=0.2))
    store = RedisStore(redis_server.url, TABLES, prefix="wait")
    started = time.monotonic()
    with pytest.raises(WriteOutcomeUnknown, match="0 of 1 replicas"):
        store.create("port", "a", 1)
    assert time.monotonic() - started >= 0.2
    assert store.get("port", "a").value == 1  # made on the master, which a failover could still lose
    store.close()


def test_something_else_answering_on_the_address_is_unavailable_not_a_store_error():
    """A port that answers with no Redis reply (an HTTP server got it): the connection is dropped
    as a broken one, and the store says unavailable, as for a server that is gone."""
    listener = socket.create_server(("127.0.0.1", 0))
    port = listener.getsockname()[1]

    def answer():
        while True:
            try:
                conn, _ = listener.accept()
            except OSError:
                return
            with conn:
                conn.recv(65536)
                conn.sendall(b"HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\n\r\n")

    threading.Thread(target=answer, daemon=True).start()
    store = RedisStore(f"redis://127.0.0.1:{port}/0", TABLES, prefix="http", timeout=1.0)
    try:
        with pytest.raises(StoreUnavailable, match="InvalidResponse"):
            store.get("port", "a")
        with pytest.raises(StoreUnavailable, match="InvalidResponse"):
            store.create("port", "a", 1)
    finally:
        store.close()
        listener.close()


def test_a_user_without_info_works_without_the_takeover_check(tmp_path):
    """The takeover check (dfpubsub.backends.redis.TAKEOVER) reads INFO on each new connection;
    an ACL user denied it still connects and writes (the check then protects nothing)."""
    server = RedisServer(tmp_path / "redis", users=("bob on >pw ~* &* +@all -info",)).start()
    try:
        store = RedisStore(f"redis://bob:pw@127.0.0.1:{server.port}/0", TABLES, prefix="noinfo")
        store.initialize()
        assert store.create("port", "a", 1).version == 1
        assert store.get("port", "a").value == 1
        raw = redis.Redis(port=server.port, username="bob", password="pw")
        assert raw.get("noinfo:nb:epoch") is None  # never checked
        raw.close()
        store.close()
    finally:
        server.kill()
