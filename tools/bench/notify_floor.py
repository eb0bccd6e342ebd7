"""notify_floor: the least a durable per-write notification can cost on the raw backends.

What bounds ``tools/bench/notify.py``'s write ratio from above, whatever the
Python around it: the backends' own clients run an object update alone, then
the same update with one more record written in the same atomic step (no
dfpubsub code in the timed loops), best of ``--rounds`` alternating rounds:

- SQLite: the store's update statement autocommitted (what the store runs
  for a write), against ``BEGIN IMMEDIATE``, the same statement, one insert
  of a 300-byte record, ``COMMIT`` (what the outbox runs):
  into a bare append-only table (``sqlite_bare``: no bound, no index, nothing
  to deliver from), and into a bounded queue of the real schema
  (``sqlite_queue``: the outbox's own insert, with the queue's key and counters).
- Redis: the store's update script, against the same script followed by an
  append of the record to a stream (``redis_bare``), and by the append to a
  bounded queue: its bounds read and checked, its counters updated
  (``redis_queue``).

Last line: ``{"bench": "notify_floor", "sqlite_bare_ratio": R, "sqlite_queue_ratio": R,
"redis_bare_ratio": R, "redis_queue_ratio": R, ...}``.
"""

from __future__ import annotations

import argparse
import json
import os
import sqlite3
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import msgpack
from nb_write import VALUE

from dfpubsub.queues.sqlite import _APPEND as APPEND
from dfpubsub.queues.sqlite import _SCHEMA as QUEUE_SCHEMA
from dfpubsub.store.redis import _UPDATE as REDIS_UPDATE
from dfpubsub.store.sqlite import _SCHEMA as STORE_SCHEMA
from dfpubsub.store.sqlite import _UPDATE as STORE_UPDATE
from dfpubsub.testing.servers import RedisServer

__all__ = ["main"]

RECORD = b"n" * 300
KEYS = 100


def _best(fns: dict[str, Callable[[int], None]], writes: int, rounds: int) -> dict[str, float]:
    """Writes/s of each function, best of ``rounds`` alternating rounds."""
    best = dict.fromkeys(fns, 0.0)
    for _ in range(rounds):
        for name, fn in fns.items():
            t0 = time.perf_counter()
            fn(writes)
            best[name] = max(best[name], writes / (time.perf_counter() - t0))
    return best


def sqlite_rates(tmp: str, writes: int, rounds: int) -> dict[str, float]:
    conn = sqlite3.connect(os.path.join(tmp, "floor.sqlite"), isolation_level=None)
    conn.execute("PRAGMA journal_mode=WAL")
    conn.execute("PRAGMA synchronous=NORMAL")
    conn.executescript(STORE_SCHEMA + QUEUE_SCHEMA + "CREATE TABLE bare (data BLOB);")
    # Each insert is a revision of its own (the store's change feed keys its rows by revision).
    conn.executemany("INSERT INTO nb_objects VALUES ('port', ?, 'port', ?, x'')",
                     [(f"k{k}", k + 1) for k in range(KEYS)])
    conn.executemany("INSERT INTO q_queues (name, max_bytes, max_entries, stale_after, created_at) "
                     "VALUES (?, ?, ?, 30, 0)", [(f"q.{s}", 1 << 40, 1 << 40) for s in range(11)])
    update = STORE_UPDATE + " RETURNING version"

    def alone(n: int) -> None:  # the store's own write: one autocommitted statement
        for i in range(n):
            conn.execute(update, (msgpack.packb({**VALUE, "i": i}), "port", f"k{i % KEYS}")).fetchall()

    def with_record(into_queue: bool) -> Callable[[int], None]:
        def run(n: int) -> None:
            for i in range(n):
                conn.execute("BEGIN IMMEDIATE")
                conn.execute(update, (msgpack.packb({**VALUE, "i": i}), "port", f"k{i % KEYS}")).fetchall()
                if into_queue:
                    conn.execute(APPEND, {"name": f"q.{i % 11}", "size": 300, "now": 0.0, "data": RECORD})
                else:
                    conn.execute("INSERT INTO bare VALUES (?)", (RECORD,))
                conn.execute("COMMIT")
        return run

    try:
        return _best({"alone": alone, "bare": with_record(False), "queue": with_record(True)}, writes, rounds)
    finally:
        conn.close()


# The store's own update script, then what the record adds.
_WRAPPED = """
local r = (function()
{update}
end)()
{more}
return r
"""
_BARE = "redis.call('XADD', KEYS[5], '*', 'd', ARGV[4])"
_QUEUE = """
local m = redis.call('HMGET', KEYS[4], 'max_bytes', 'max_entries', 'bytes', 'seq')
local size = string.len(ARGV[4])
if tonumber(m[3]) + size > tonumber(m[1]) or redis.call('XLEN', KEYS[3]) + 1 > tonumber(m[2]) then return -2 end
local seq = tonumber(m[4]) + 1
redis.call('XADD', KEYS[3], string.format('%d', seq) .. '-0', 'd', ARGV[4])
redis.call('HSET', KEYS[4], 'seq', string.format('%d', seq), 'bytes', string.format('%d', tonumber(m[3]) + size))
"""


def redis_rates(tmp: str, writes: int, rounds: int) -> dict[str, float]:
    import redis

    server = RedisServer(Path(tmp) / "redis").start()
    client = redis.Redis.from_url(server.url)
    for q in range(11):
        client.hset(f"m:q.{q}", mapping={"max_bytes": 1 << 40, "max_entries": 1 << 40, "bytes": 0, "seq": 0})
    for k in range(KEYS):
        client.hset(f"o:k{k}", mapping={"topic": "port", "version": 0, "value": b""})
    scripts = {name: client.register_script(_WRAPPED.format(update=REDIS_UPDATE, more=more))
               for name, more in (("alone", ""), ("bare", _BARE), ("queue", _QUEUE))}

    def runner(name: str) -> Callable[[int], None]:
        script = scripts[name]
        alone = name == "alone"  # passes only what the store's script takes

        def run(n: int) -> None:
            for i in range(n):
                keys = [f"o:k{i % KEYS}", "rev"]
                args = ["", msgpack.packb({**VALUE, "i": i}), ""]
                if not alone:
                    keys += [f"e:q.{i % 11}", f"m:q.{i % 11}", f"b:q.{i % 11}"]
                    args.append(RECORD)
                script(keys=keys, args=args)
        return run

    try:
        return _best({name: runner(name) for name in scripts}, writes, rounds)
    finally:
        client.close()
        server.kill()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--writes", type=int, default=3000)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args(argv)
    result: dict[str, Any] = {"bench": "notify_floor", "writes": args.writes}
    with tempfile.TemporaryDirectory(prefix="bench-notify-floor-") as tmp:
        for backend, rates in (("sqlite", sqlite_rates(tmp, args.writes, args.rounds)),
                               ("redis", redis_rates(tmp, args.writes, args.rounds))):
            alone = rates["alone"]
            print(f"[{backend}] update alone {alone:,.0f}/s; with a bare record {rates['bare']:,.0f}/s "
                  f"({rates['bare'] / alone:.2f}); with a bounded queue entry {rates['queue']:,.0f}/s "
                  f"({rates['queue'] / alone:.2f})", flush=True)
            result.update({f"{backend}_alone_per_s": round(alone),
                           f"{backend}_bare_ratio": round(rates["bare"] / alone, 2),
                           f"{backend}_queue_ratio": round(rates["queue"] / alone, 2)})
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
