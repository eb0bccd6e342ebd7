"""The Redis backends' Lua scripts, run on a connection each thread keeps (dfpubsub.backends.redis.Scripts),
against a redis-server of each test's own."""

import os
import signal
import threading

import pytest
import redis

from dfpubsub.backends.redis import Scripts, open_client
from tests.conftest import wait_for


@pytest.fixture
def raw(redis_server):
    client = redis.Redis.from_url(redis_server.url)
    yield client
    client.close()


def _others(raw: redis.Redis) -> int:
    """Connections to the server besides ``raw``'s own."""
    return len(raw.client_list()) - 1


def _in_threads(n: int, call) -> None:
    """``n`` threads calling at once, none ending before all have called (one that ended would
    give its connection back for a later one to take)."""
    start, done = threading.Barrier(n), threading.Barrier(n)
    errors: list[BaseException] = []

    def run(i: int) -> None:
        try:
            start.wait()
            for j in range(20):
                assert call(f"{i}.{j}") == f"{i}.{j}".encode()
        except BaseException as exc:  # noqa: BLE001 - reported by the test's thread
            errors.append(exc)
        done.wait()

    threads = [threading.Thread(target=run, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors


def test_each_thread_keeps_one_connection_and_gives_it_back_when_it_ends(redis_server, raw):
    r = open_client(redis_server.url, 5.0, "test")
    echo = Scripts(r).register("return ARGV[1]")
    _in_threads(8, lambda x: echo(args=[x]))
    assert _others(raw) == 8  # one a thread that called, however often it did
    # Ended threads gave theirs back: eight new ones take the same eight, no more.
    _in_threads(8, lambda x: echo(args=[x]))
    assert _others(raw) == 8
    r.close()
    wait_for(lambda: _others(raw) == 0, what="the client's close() to close every thread's connection")


def test_a_script_is_loaded_again_after_the_server_forgot_it(redis_server, raw):
    r = open_client(redis_server.url, 5.0, "test")
    echo = Scripts(r).register("return ARGV[1]")
    assert echo(args=["a"]) == b"a"
    raw.script_flush()
    assert echo(args=["b"]) == b"b"
    assert raw.script_exists(echo.sha) == [True]
    r.close()


def test_an_error_reply_is_raised_and_the_connection_kept(redis_server, raw):
    r = open_client(redis_server.url, 5.0, "test")
    scripts = Scripts(r)
    fail, echo = scripts.register("return redis.error_reply('refused here')"), scripts.register("return ARGV[1]")
    assert echo(args=["a"]) == b"a"
    ids = {c["id"] for c in raw.client_list()}
    with pytest.raises(redis.ResponseError, match="refused here"):
        fail()
    assert echo(args=["b"]) == b"b"
    assert {c["id"] for c in raw.client_list()} == ids  # no reconnection for the server's own answer
    r.close()


def test_a_call_broken_off_before_its_reply_leaves_no_reply_to_the_next(redis_server, monkeypatch):
    """A signal's exception between the command and its reply: the reply stays unread on a kept
    connection, and the next call must not take it for its own."""
    r = open_client(redis_server.url, 5.0, "test")
    scripts = Scripts(r)
    echo = scripts.register("return ARGV[1]")
    assert echo(args=["a"]) == b"a"
    conn = scripts.connection()

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(conn, "read_response", interrupted)
    with pytest.raises(KeyboardInterrupt):
        echo(args=["b"])
    monkeypatch.undo()
    assert echo(args=["c"]) == b"c"
    r.close()


def test_a_call_broken_off_before_its_reply_came_leaves_no_reply_to_the_next(redis_server, monkeypatch):
    """As above, with the reply still on its way when the next call looks at the connection (a
    busy server; a loaded machine made the test above fail so): nothing there to see yet."""
    r = open_client(redis_server.url, 5.0, "test")
    scripts = Scripts(r)
    echo = scripts.register("return ARGV[1]")
    assert echo(args=["a"]) == b"a"
    conn = scripts.connection()
    read = conn.read_response
    pid = redis_server.proc.pid

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    def resuming(*args, **kwargs):  # the call has looked at its connection: the server may answer now
        os.kill(pid, signal.SIGCONT)
        return read(*args, **kwargs)

    os.kill(pid, signal.SIGSTOP)  # no reply comes until the next call has looked
    try:
        monkeypatch.setattr(conn, "read_response", interrupted)
        with pytest.raises(KeyboardInterrupt):
            echo(args=["b"])
        monkeypatch.setattr(conn, "read_response", resuming)
        assert echo(args=["c"]) == b"c"
    finally:
        os.kill(pid, signal.SIGCONT)
        monkeypatch.undo()
        r.close()


def test_a_connection_the_server_closed_is_opened_again_before_the_next_call(redis_server):
    """A thread's kept connection outlives a restart of the server unused: its next call must
    not be refused for it (the pool's checkout would have noticed; the kept connection too)."""
    r = open_client(redis_server.url, 5.0, "test")
    echo = Scripts(r).register("return ARGV[1]")
    assert echo(args=["a"]) == b"a"
    redis_server.kill()
    redis_server.start()
    assert echo(args=["b"]) == b"b"
    r.close()
