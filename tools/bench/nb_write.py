"""nb_write: NbApi write throughput per store backend, against the raw client doing the same writes.

One writer updates ``--keys`` objects round-robin ``--writes`` times through
:class:`~dfpubsub.nbapi.NbApi` (store write with a new version, then publish on
ZeroMQ), and in the same run the backend's own client performs equivalent
writes: the same revision bump and object write, atomically, with the same
msgpack value, without validation, versioned objects or publishing:

- SQLite: ``BEGIN IMMEDIATE``, bump the revision row, ``UPDATE`` the object, ``COMMIT``;
- etcd: one ``put`` through aetcd on its own event loop (etcd's revision is the version);
- Redis: one ``MULTI`` with ``INCR`` of the revision and ``HSET`` of the object.

Last line: ``{"bench": "nb_write", "<backend>_writes_per_s": N, "<backend>_raw_writes_per_s": N,
"<backend>_ratio": R, ...}``. Target: ratio >= 0.85 on every backend.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sqlite3
import sys
import tempfile
import time
from typing import Any

import msgpack
from backends import bench_store

from dfpubsub.backends.sqlite import sqlite_path
from dfpubsub.metrics import Stats
from dfpubsub.nbapi import NbApi
from dfpubsub.notify.producer import Notifier
from dfpubsub.plugins import load_driver
from dfpubsub.publisher import Publisher
from dfpubsub.store import Store

TABLES = ["port"]
VALUE = {"name": "port-000001", "mac": "fa:16:3e:12:34:56", "fixed_ips": ["10.0.0.17"], "status": "ACTIVE",
         "admin_state_up": True, "mtu": 1500, "description": "x" * 80}


def nbapi_rate(store: Store, writes: int, keys: int, notifier: Notifier | None = None) -> float:
    """Updates per second through NbApi (publishing on ZeroMQ, and notifying with ``notifier``)."""
    stats = Stats("publisher", "bench")
    publisher = Publisher(load_driver("zmq+tcp://127.0.0.1:*").publisher(stats), "bench", stats=stats)
    api = NbApi(store, publisher, notifier)
    t0 = time.perf_counter()
    for i in range(writes):
        api.update("port", f"port-{i % keys:04d}", {**VALUE, "i": i})
    elapsed = time.perf_counter() - t0
    publisher.close()
    return writes / elapsed


def raw_sqlite_rate(path: str, writes: int, keys: int) -> float:
    conn = sqlite3.connect(path, isolation_level=None)
    conn.execute("PRAGMA journal_mode=WAL")
    conn.execute("PRAGMA synchronous=NORMAL")
    t0 = time.perf_counter()
    for i in range(writes):
        blob = msgpack.packb({**VALUE, "i": i})
        conn.execute("BEGIN IMMEDIATE")
        (version,) = conn.execute(
            "UPDATE nb_meta SET value = value + 1 WHERE name = 'revision' RETURNING value").fetchone()
        conn.execute("UPDATE nb_objects SET version = ?, value = ? WHERE tbl = 'port' AND key = ?",
                     (version, blob, f"port-{i % keys:04d}"))
        conn.execute("COMMIT")
    elapsed = time.perf_counter() - t0
    conn.close()
    return writes / elapsed


def raw_redis_rate(url: str, writes: int, keys: int) -> float:
    import redis

    client = redis.Redis.from_url(url)
    t0 = time.perf_counter()
    for i in range(writes):
        pipe = client.pipeline(transaction=True)
        pipe.incr("raw:rev")
        pipe.hset(f"raw:o:port:port-{i % keys:04d}", mapping={"topic": "port", "version": i,
                                                              "value": msgpack.packb({**VALUE, "i": i})})
        pipe.execute()
    elapsed = time.perf_counter() - t0
    client.close()
    return writes / elapsed


def raw_etcd_rate(url: str, writes: int, keys: int) -> float:
    import aetcd

    host, port = url.split("://", 1)[1].split(":")

    async def run() -> float:
        async with aetcd.Client(host, int(port)) as client:
            t0 = time.perf_counter()
            for i in range(writes):
                await client.put(f"/raw/nb/port/port-{i % keys:04d}".encode(),
                                 msgpack.packb(["port", msgpack.packb({**VALUE, "i": i})]))
            return writes / (time.perf_counter() - t0)

    return asyncio.run(run())


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--writes", type=int, default=3000)
    parser.add_argument("--keys", type=int, default=100)
    parser.add_argument("--backends", default="sqlite,etcd,redis")
    args = parser.parse_args(argv)
    result: dict[str, Any] = {"bench": "nb_write", "writes": args.writes}
    with tempfile.TemporaryDirectory(prefix="bench-nbwrite-") as tmp:
        for backend in args.backends.split(","):
            with bench_store(backend, tmp, TABLES) as (store, url):
                for k in range(args.keys):
                    store.create("port", f"port-{k:04d}", VALUE)
                ours, raw = [], []
                for _ in range(3):  # interleaved, best of three: the machine is shared and noisy
                    ours.append(nbapi_rate(store, args.writes, args.keys))
                    if backend == "sqlite":
                        raw.append(raw_sqlite_rate(sqlite_path(url), args.writes, args.keys))
                    elif backend == "redis":
                        raw.append(raw_redis_rate(url, args.writes, args.keys))
                    else:
                        raw.append(raw_etcd_rate(url, args.writes, args.keys))
            rate, base = max(ours), max(raw)
            print(f"[{backend}] NbApi {rate:,.0f} writes/s (store + publish); raw client {base:,.0f} writes/s; "
                  f"ratio {rate / base:.2f}", flush=True)
            result.update({f"{backend}_writes_per_s": round(rate), f"{backend}_raw_writes_per_s": round(base),
                           f"{backend}_ratio": round(rate / base, 2)})
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
