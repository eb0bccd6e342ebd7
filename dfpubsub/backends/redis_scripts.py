"""The Redis backends' Lua scripts, each run with EVALSHA on a connection the calling thread keeps,
following the master through a Sentinel failover.

Through redis-py's client a script's call costs the writer about half again the CPU of the same
call on a connection held open (docs/performance.md): the pool's checkout and return (a lock,
observability counters, an event), the client's wrappers, the script's own checks. A thread that
keeps one connection of the pool for as long as it lives pays none of that. The connection goes
back to the pool when the thread ends, and the client's ``close()`` closes it with the others.

What a failed call may be sent again, and why (docs/store.md#failover):

- a connection that cannot be opened sent nothing: through Sentinel the call waits for a master
  (up to ``failover_wait`` seconds, asking the sentinels again each time);
- ``READONLY`` (the server was demoted to a replica) and ``NOREPLICAS`` are refusals: nothing
  was written; through Sentinel the connection is dropped and the call goes to the new master;
- a connection that breaks after the command left may have carried a write: a read-only script
  is sent again through Sentinel, a writing one never (the caller gets the error: the outcome
  is unknown);
- ``NOSCRIPT`` (a promoted replica, a restarted or flushed server): loaded and run again.

Through Sentinel each thread also asks, at most every ``recheck`` seconds, where the master is,
and drops a connection to a server that is no longer it: an old master cut off from the
sentinels but still reachable keeps accepting writes, which its demotion throws away.

With ``wait_replicas`` N, a writing script is followed on the same connection (pipelined, no
round trip more) by ``WAIT N timeout``; fewer replicas than N in time is :class:`ReplicasBehind`:
the write was made on the master and a failover may still lose it.
"""

from __future__ import annotations

import hashlib
import threading
import time
from collections.abc import Sequence
from typing import Any

from redis.connection import AbstractConnection, ConnectionPool
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import InvalidResponse, MasterDownError, NoScriptError, ReadOnlyError, RedisError, ResponseError
from redis.exceptions import TimeoutError as RedisTimeoutError

__all__ = ["ReplicasBehind", "Script", "Scripts", "refused"]

#: Seconds between two failed attempts while a failover is under way.
_PAUSE = 0.05


class ReplicasBehind(RedisError):
    """A write was made on the master, but fewer than ``wait_replicas`` replicas acknowledged it
    within ``wait_timeout``: a failover now may lose it."""


def refused(exc: BaseException) -> bool:
    """Whether ``exc`` is a server's refusal to write that changed nothing: ``READONLY`` (a
    replica), ``NOREPLICAS`` (``min-replicas-to-write`` unmet), ``MASTERDOWN``."""
    # redis-py makes READONLY and MASTERDOWN errors of their own, without the code in the message.
    return isinstance(exc, (ReadOnlyError, MasterDownError)) or (
        isinstance(exc, ResponseError) and str(exc).startswith("NOREPLICAS"))


class Scripts:
    """The Lua scripts of one client, each run with EVALSHA on a connection the calling thread keeps.

    ``sentinel``: the client's master is found through Sentinel, so a call follows it (see the
    module's doc). ``wait_replicas``/``wait_timeout``: what each writing script waits for.
    """

    def __init__(self, r: Any, *, sentinel: bool = False, failover_wait: float = 5.0, recheck: float = 1.0,
                 wait_replicas: int = 0, wait_timeout: float = 1.0):
        self._pool: ConnectionPool = r.connection_pool
        self._local = threading.local()
        self.sentinel = sentinel
        self.failover_wait = failover_wait
        self.recheck = recheck
        self.wait = ("WAIT", wait_replicas, max(1, round(wait_timeout * 1000))) if wait_replicas > 0 else None
        #: (when it was asked, the master's address) as the sentinels last told it.
        self._master: tuple[float, Any] = (float("-inf"), None)

    def register(self, text: str, readonly: bool = False) -> Script:
        """A script of ``text``, loaded into the server on its first call (and again after a
        restart). ``readonly``: it never writes, so it may be sent again and never waits."""
        return Script(self, text, readonly)

    def connection(self) -> AbstractConnection:
        """The calling thread's connection, checked as the pool checks one it hands out: one that
        the server closed (it restarted) or that holds a reply nobody read (a call broken off
        between its command and its reply) is opened afresh, before anything is sent on it.
        Through Sentinel, one to a server that is no longer the master is opened afresh too."""
        return self._lane().conn

    def _lane(self) -> _Lane:
        lane: _Lane | None = getattr(self._local, "lane", None)
        if lane is None:
            lane = self._local.lane = _Lane(self._pool)
        conn = lane.conn
        if lane.owed:
            # Its last call was broken off before its reply was read: the reply may still be on
            # its way (a busy server), where can_read() below cannot see it yet.
            conn.disconnect()
            lane.owed = False
        if self.sentinel and conn._sock is not None and self._master_moved(conn):  # noqa: SLF001
            conn.disconnect()
        conn.connect()  # nothing to do while connected; a server that is gone raises here
        try:
            fresh = not conn.can_read()
        except (RedisConnectionError, RedisTimeoutError, OSError):
            fresh = False
        if not fresh:
            conn.disconnect()
            conn.connect()
        return lane

    def _master_moved(self, conn: AbstractConnection) -> bool:
        """Whether the sentinels (asked at most every ``recheck`` s) name another master than
        ``conn``'s server."""
        asked, address = self._master
        now = time.monotonic()
        if now - asked >= self.recheck:
            try:
                address = self._pool.get_master_address()  # type: ignore[attr-defined]
            except (RedisConnectionError, RedisTimeoutError):
                address = None  # no sentinel answers, or none names a master: keep the connection
            self._master = (now, address)
        return address is not None and tuple(address) != (getattr(conn, "host", None), getattr(conn, "port", None))

    def drop(self) -> None:
        """Close the calling thread's connection: the next call opens one to the master."""
        lane: _Lane | None = getattr(self._local, "lane", None)
        if lane is not None:
            lane.conn.disconnect()


class Script:
    """One Lua script of :class:`Scripts`, called like redis-py's: ``script(keys=..., args=...)``."""

    __slots__ = ("_scripts", "text", "sha", "readonly")

    def __init__(self, scripts: Scripts, text: str, readonly: bool = False):
        self._scripts = scripts
        self.text = text
        self.sha = hashlib.sha1(text.encode()).hexdigest()
        self.readonly = readonly

    def __call__(self, keys: Sequence[Any] = (), args: Sequence[Any] = ()) -> Any:
        scripts = self._scripts
        deadline = 0.0
        while True:
            sent = False
            try:
                lane = scripts._lane()  # noqa: SLF001 - the class's own helper
                sent = True
                return self._run(lane, keys, args)
            except (RedisConnectionError, RedisTimeoutError, ResponseError, InvalidResponse) as exc:
                again = not sent or self.readonly or refused(exc)
                if isinstance(exc, ResponseError) and not refused(exc):
                    raise  # the script's own error: the connection is sound
                scripts.drop()  # InvalidResponse: no Redis reply came, nothing more can be read on it
                if not scripts.sentinel or not again:
                    raise
                now = time.monotonic()
                deadline = deadline or now + scripts.failover_wait
                if now >= deadline:
                    raise
                time.sleep(_PAUSE)

    def _run(self, lane: _Lane, keys: Sequence[Any], args: Sequence[Any]) -> Any:
        wait = None if self.readonly else self._scripts.wait
        try:
            reply = lane.ask(wait, "EVALSHA", self.sha, len(keys), *keys, *args)
        except NoScriptError:
            # Not run: the server restarted, was promoted or flushed its scripts. Load it, run it once more.
            lane.ask(None, "SCRIPT", "LOAD", self.text)
            reply = lane.ask(wait, "EVALSHA", self.sha, len(keys), *keys, *args)
        return reply


class _Lane:
    """A connection of ``pool`` that one thread keeps, and gives back when it ends (its
    ``threading.local`` is dropped then)."""

    __slots__ = ("pool", "conn", "owed")

    def __init__(self, pool: ConnectionPool):
        self.pool = pool
        self.conn = pool.get_connection()
        #: A command was sent whose reply was not read (the call was broken off in between).
        self.owed = False

    def ask(self, wait: tuple[str, int, int] | None, *command: Any) -> Any:
        """``command``'s reply; with ``wait``, WAIT sent behind it and its count checked."""
        conn = self.conn
        self.owed = True
        if wait is None:
            conn.send_command(*command)
            try:
                reply = conn.read_response()
            except ResponseError:  # the server's own answer, read whole
                self.owed = False
                raise
            self.owed = False
            return reply
        conn.send_packed_command(conn.pack_commands([command, wait]))
        try:
            reply = conn.read_response()
        except ResponseError:
            conn.read_response()  # WAIT's answer, so that the connection stays in step
            self.owed = False
            raise
        acked = conn.read_response()
        self.owed = False
        if acked < wait[1]:
            raise ReplicasBehind(f"{acked} of {wait[1]} replicas acknowledged the write within {wait[2]} ms")
        return reply

    def __del__(self) -> None:
        try:
            self.pool.release(self.conn)
        except Exception:  # noqa: S110 - at interpreter exit the pool may be gone already
            pass
