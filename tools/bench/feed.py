"""feed: what the change feed costs a write, and how fast a committed write reaches a handler through it.

1. Write rate, feed on vs off, per backend, in the same run (interleaved, best
   of three): one writer updates ``--keys`` objects round-robin with plain store
   calls. "Off" is the same store with the feed's append taken out of the write
   path: SQLite with triggers that store the revision only, Redis with the write
   scripts not wrapped in the feed's piece. etcd's feed is its own revision
   history, so nothing is taken out there: both runs are the same writes and
   the ratio says how noisy the machine is.
2. Latency, SQLite + ZeroMQ: a writer process updates objects at half the
   feed-on rate measured above, each value holding the time just before its
   write; a feed publisher process (what df-feed runs) follows the feed and
   publishes; a subscriber process takes the events and records handler time
   minus that time: commit -> handler, including the feed publisher's wake-up
   (its 1 ms poll of other processes' commits), its get_many and the wire.
   The same again at a low rate (``--low-rate``, 500/s).
3. df-feed's CPU per published entry, per backend, wire schema 1 against 2 (interleaved, best of
   three): ``--cpu-keys`` objects are updated once each, then a feed publisher (in this process,
   on ZeroMQ with nobody subscribed, so the wire costs the least it can) publishes them from the
   feed; CPU time of the process while it does, per entry. Schema 1 decodes each value from the
   store and packs it into its event; schema 2 sends the store's bytes (docs/feed.md).

Last line: ``{"bench": "feed", "<backend>_write_ratio": R, ..., "p50_ms": X, "p99_ms": Y, "low_p99_ms": Z,
"<backend>_cpu_us_per_entry": {"1": A, "2": B}, "<backend>_cpu_ratio_2_vs_1": B/A}``.
Targets: write ratio >= 0.9 on Redis and etcd, >= 0.7 on SQLite; p99 <= 5 ms; schema 2's CPU per
entry <= 0.5 x schema 1's.
"""

from __future__ import annotations

import argparse
import gc
import json
import multiprocessing as mp
import sqlite3
import sys
import tempfile
import time
from multiprocessing.connection import Connection
from typing import Any

from backends import bench_store

from dfpubsub.backends.sqlite import sqlite_path
from dfpubsub.feed_publisher import FeedPublisher
from dfpubsub.metrics import Stats
from dfpubsub.plugins import load_driver
from dfpubsub.publisher import Publisher, PublisherOptions
from dfpubsub.store import Store, open_store
from dfpubsub.subscriber import Subscriber

TABLES = ["port"]
VALUE = {"name": "port-000001", "mac": "fa:16:3e:12:34:56", "fixed_ips": ["10.0.0.17"], "status": "ACTIVE",
         "admin_state_up": True, "mtu": 1500, "description": "x" * 80}


def write_rate(store: Store, writes: int, keys: int) -> float:
    t0 = time.perf_counter()
    for i in range(writes):
        store.update("port", f"port-{i % keys:04d}", {**VALUE, "i": i})
    return writes / (time.perf_counter() - t0)


def feed_off(store: Store, url: str) -> Store:
    """A second handle on the same data whose writes append nothing to the feed (see the docstring)."""
    if store.backend == "sqlite":
        path = sqlite_path(url)
        off = open_store(url, TABLES)
        raw = sqlite3.connect(path, isolation_level=None)  # the schema is applied at open: swap the triggers after
        raw.executescript(_REVISION_ONLY)
        raw.close()
        return off
    off = open_store(url, TABLES, prefix="bench")
    if store.backend == "redis":
        from dfpubsub.store import redis as redis_store

        plain = redis_store._Client  # noqa: SLF001 - the bench takes the feed's piece out on purpose

        def unwrapped() -> Any:
            c = off._new_client()  # type: ignore[attr-defined]  # noqa: SLF001
            s = c.scripts
            return plain(c.r, s, s.register(redis_store._CREATE), s.register(redis_store._UPDATE),  # noqa: SLF001
                         s.register(redis_store._DELETE), c.fetch, c.versions, c.feed, c.since)  # noqa: SLF001

        off._client._factory = unwrapped  # type: ignore[attr-defined]  # noqa: SLF001
        off._client.close()  # type: ignore[attr-defined]  # noqa: SLF001 - the next call builds an unwrapped one
    return off


# The triggers of a store without the feed: they store the revision only. Under these names,
# the store's schema replaces them when it is opened again.
_REVISION_ONLY = """
BEGIN;
DROP TRIGGER nb_write_on_insert;
DROP TRIGGER nb_write_on_update;
CREATE TRIGGER nb_revision_on_insert AFTER INSERT ON nb_objects
BEGIN UPDATE nb_meta SET value = NEW.version WHERE name = 'revision'; END;
CREATE TRIGGER nb_revision_on_update AFTER UPDATE OF version ON nb_objects
BEGIN UPDATE nb_meta SET value = NEW.version WHERE name = 'revision'; END;
COMMIT;
"""


def restore_feed(url: str) -> None:
    """Put the SQLite triggers back (reopening the store applies the schema again)."""
    if url.startswith("sqlite"):
        open_store(url, TABLES).close()


def feed_worker(conn: Connection, url: str, stop: Any) -> None:
    """What df-feed runs: follow the feed, publish on ZeroMQ."""
    store = open_store(url, TABLES)
    stats = Stats("publisher", "bench-feed")
    # Lingering never delays here: the feed publisher flushes at the end of each batch it reads.
    publisher = Publisher(load_driver("zmq+tcp://127.0.0.1:*").publisher(stats), "bench-feed",
                          PublisherOptions(), stats)
    feed = FeedPublisher(store, publisher, compact_interval=0)
    conn.send(publisher.transport.uri)
    while not stop.is_set():
        feed.step(0.1)
    conn.send(stats.snapshot())
    feed.close()
    publisher.close()
    store.close()


def sub_worker(conn: Connection, endpoint: str, ready: Any) -> None:
    """Take every event; record handler time minus the write's start time (in the value)."""
    latencies: list[float] = []

    def on_event(event: Any) -> None:
        if event.key == "warm":
            ready.set()
        elif isinstance(event.value, dict) and "t" in event.value:
            latencies.append(time.time() - event.value["t"])

    sub = Subscriber(load_driver("zmq").subscriber(Stats("subscriber", "bench-sub")), TABLES, on_event,
                     lambda topics: None, name="bench-sub")
    sub.connect(endpoint)
    sub.start()
    conn.recv()  # the writer is done
    time.sleep(0.5)  # the last events are in flight
    sub.close()
    conn.send(sorted(latencies))


def latency(url: str, rate: float, seconds: float, keys: int) -> dict[str, Any]:
    ctx = mp.get_context("spawn")
    stop, ready = ctx.Event(), ctx.Event()
    feed_conn, feed_child = ctx.Pipe()
    sub_conn, sub_child = ctx.Pipe()
    feeder = ctx.Process(target=feed_worker, args=(feed_child, url, stop))
    feeder.start()
    endpoint = feed_conn.recv()
    subscriber = ctx.Process(target=sub_worker, args=(sub_child, endpoint, ready))
    subscriber.start()
    store = open_store(url, TABLES)
    store.create("port", "warm", {}) if store.get("port", "warm") is None else None
    deadline = time.monotonic() + 20
    while not ready.wait(0.1):  # ZeroMQ joins in the background: write until an event gets through
        store.update("port", "warm", {})
        if time.monotonic() > deadline:
            raise SystemExit("no event reached the subscriber")
    clock, start, i = time.perf_counter, time.perf_counter(), 0
    while (now := clock()) - start < seconds:
        due = int((now - start) * rate)
        while i < due:
            store.update("port", f"port-{i % keys:04d}", {**VALUE, "i": i, "t": time.time()})
            i += 1
        time.sleep(0.0005)
    sub_conn.send("done")
    lat = sub_conn.recv()
    stop.set()
    feed_stats = feed_conn.recv()
    for p in (feeder, subscriber):
        p.join(10)
    store.close()
    return {"writes": i, "delivered": len(lat), "p50_ms": lat[len(lat) // 2] * 1e3 if lat else float("nan"),
            "p99_ms": lat[int(len(lat) * 0.99)] * 1e3 if lat else float("nan"), "feed": feed_stats}


def feed_cpu(store: Store, keys: int, schema: int) -> float:
    """µs of this process's CPU per entry a feed publisher of ``schema`` publishes (see the docstring)."""
    stats = Stats("publisher", f"bench-feed-cpu-{schema}")
    publisher = Publisher(load_driver("zmq+tcp://127.0.0.1:*").publisher(stats), "bench-feed-cpu",
                          PublisherOptions(schema=schema), stats)
    feed = FeedPublisher(store, publisher, compact_interval=0, bookmark_interval=0)
    try:
        for k in range(keys):
            store.update("port", f"cpu-{k:05d}", {**VALUE, "i": k})
        head = store.feed_head()
        before = stats.get("feed_published")
        cpu = time.process_time()
        while feed.position < head:
            feed.step(0.05)
        spent = time.process_time() - cpu
        published = stats.get("feed_published") - before
    finally:
        feed.close()
        publisher.close()
    return spent / max(published, 1) * 1e6


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--writes", type=int, default=3000)
    parser.add_argument("--keys", type=int, default=100)
    parser.add_argument("--seconds", type=float, default=5.0, help="length of the latency run")
    parser.add_argument("--low-rate", type=float, default=500.0, help="writes/s of the low-load latency run")
    parser.add_argument("--backends", default="sqlite,etcd,redis")
    parser.add_argument("--cpu-keys", type=int, default=5000, help="entries per round of the CPU phase")
    parser.add_argument("--phases", default="write,latency,cpu", help="which phases to run (default: all)")
    args = parser.parse_args(argv)
    phases = set(args.phases.split(","))
    result: dict[str, Any] = {"bench": "feed", "writes": args.writes}
    with tempfile.TemporaryDirectory(prefix="bench-feed-") as tmp:
        for backend in args.backends.split(","):
            with bench_store(backend, tmp, TABLES) as (store, url):
                for k in range(args.keys):
                    store.create("port", f"port-{k:04d}", VALUE)
                if "cpu" in phases:
                    for k in range(args.cpu_keys):
                        store.create("port", f"cpu-{k:05d}", VALUE)
                    gc.freeze()  # as df-feed does once started
                    cpu: dict[int, list[float]] = {1: [], 2: []}
                    for _ in range(3):  # interleaved, best of three
                        for schema in (1, 2):
                            cpu[schema].append(feed_cpu(store, args.cpu_keys, schema))
                    best = {s: min(v) for s, v in cpu.items()}
                    print(f"[{backend}] df-feed CPU per entry: schema 1 {best[1]:.1f} µs, schema 2 {best[2]:.1f} µs "
                          f"(ratio {best[2] / best[1]:.2f}; rounds {cpu})", flush=True)
                    result.update({f"{backend}_cpu_us_per_entry": {str(s): round(v, 2) for s, v in best.items()},
                                   f"{backend}_cpu_ratio_2_vs_1": round(best[2] / best[1], 2)})
                if "write" not in phases:
                    continue
                on, off = [], []
                for _ in range(5):  # interleaved, best of five: the machine is shared and noisy
                    on.append(write_rate(store, args.writes, args.keys))
                    plain = feed_off(store, url)
                    off.append(write_rate(plain, args.writes, args.keys))
                    plain.close()
                    restore_feed(url)
                rate, base = max(on), max(off)
                print(f"[{backend}] feed on {rate:,.0f} writes/s; off {base:,.0f} writes/s; ratio {rate / base:.2f}",
                      flush=True)
                result.update({f"{backend}_writes_per_s": round(rate), f"{backend}_no_feed_writes_per_s": round(base),
                               f"{backend}_write_ratio": round(rate / base, 2)})
                if backend == "sqlite" and "latency" in phases:
                    lat = latency(url, rate / 2, args.seconds, args.keys)
                    print(f"[sqlite+zmq] {lat['writes']} writes at {rate / 2:,.0f}/s, {lat['delivered']} events "
                          f"handled; commit -> handler p50 {lat['p50_ms']:.2f} ms, p99 {lat['p99_ms']:.2f} ms; "
                          f"feed publisher {lat['feed']}", flush=True)
                    result.update({"latency_rate": round(rate / 2), "p50_ms": round(lat["p50_ms"], 2),
                                   "p99_ms": round(lat["p99_ms"], 2), "delivered": lat["delivered"]})
                    low = latency(url, args.low_rate, args.seconds, args.keys)
                    print(f"[sqlite+zmq] at {args.low_rate:,.0f} writes/s: commit -> handler p50 {low['p50_ms']:.2f} ms,"
                          f" p99 {low['p99_ms']:.2f} ms", flush=True)
                    result.update({"low_rate": args.low_rate, "low_p50_ms": round(low["p50_ms"], 2),
                                   "low_p99_ms": round(low["p99_ms"], 2)})
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
