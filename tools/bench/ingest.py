"""ingest: a controller's CPU per event from its transport to its cache and work queue, wire schema 1
against schema 2, in the same run.

Each run preloads ``--events`` events (creates, then updates, of ``--keys`` keys of two tables,
~200-byte values, full envelopes of 128 events) into an in-process (memory driver) subscriber's
inbox, starts a :class:`~dfpubsub.controller.Controller` on an empty SQLite store, and counts the
process's CPU time until every event went through. Schema 1 events carry each value as a msgpack
object (decoded by the subscriber, packed again by the cache); schema 2 events carry its bytes
(kept by the cache as they came, decoded only where something needs the value).

Variants, each with both schemas, rounds interleaved, the least CPU of each counting:

* ``cache``: no reconciler, no index: what every cache-only consumer of the tables pays;
* ``index``: an index on each table (each value decoded once, as applied);
* ``reconcile``: a no-op reconciler on each table, which reads every key it is handed from the
  cache (the workers' decode included: they decode what the dispatch thread did not).

Last line: ``{"bench": "ingest", "<variant>_us_per_event": {"1": A, "2": B},
"<variant>_ratio": B/A, ..., "ratio": cache's B/A}``. Target (issue 46): ratio <= 0.5.
"""

from __future__ import annotations

import argparse
import gc
import itertools
import json
import sys
import tempfile
import threading
import time
from typing import Any

import msgpack

from dfpubsub.controller import Controller, ControllerOptions, ObjectKey
from dfpubsub.events import Action, VersionedObject
from dfpubsub.metrics import Stats
from dfpubsub.plugins import load_driver
from dfpubsub.publisher import Publisher, PublisherOptions
from dfpubsub.store import open_store
from dfpubsub.subscriber import SubscriberOptions

TABLES = ["port", "network"]
VALUE = {"name": "port-000001", "mac": "fa:16:3e:12:34:56", "fixed_ips": ["10.0.0.17"], "status": "ACTIVE",
         "admin_state_up": True, "mtu": 1500, "network": "net-1", "description": "x" * 60}
VARIANTS = ("cache", "index", "reconcile")
_bus = itertools.count()


def preload(events: int, keys: int, schema: int) -> tuple[Any, Publisher]:
    """A subscriber transport on a fresh bus with every event already in its inbox."""
    driver = load_driver(f"memory://ingest-{next(_bus)}", {"queue_size": 1_000_000})
    transport = driver.subscriber(Stats("s", "ingest"))
    for table in TABLES:
        transport.subscribe(table)
    stats = Stats("p", "ingest")
    pub = Publisher(driver.publisher(stats), "ingest",
                    PublisherOptions(batch_linger=0.1, max_idle_time=60.0, schema=schema), stats)
    for i in range(events):
        k = i % keys
        table, value = TABLES[k % 2], {**VALUE, "i": i}
        # Schema 2 publishes the bytes, as df-feed hands over the store's.
        packed = msgpack.packb(value) if schema == 2 else None
        pub.publish(table, table, f"k{k:07d}", Action.CREATE if i < keys else Action.UPDATE, i + 1, value, None,
                    packed)
    pub.flush()
    return transport, pub


def run(store: Any, variant: str, schema: int, events: int, keys: int) -> float:
    """µs of CPU per event for one controller of ``variant`` and ``schema``."""
    transport, pub = preload(events, keys, schema)
    done = threading.Event()
    reconciled = [0]
    last = {}  # each key's last version: what the reconciler must see
    for i in range(events):
        last[f"k{i % keys:07d}"] = i + 1

    class Reader:
        """A no-op reconciler that reads the object it is handed (the cache decodes it if it must)."""

        def reconcile(self, key: ObjectKey, obj: VersionedObject | None) -> None:
            if obj is not None and obj.version == last[key.key]:
                reconciled[0] += 1
                if reconciled[0] == keys:
                    done.set()

    reconcilers = {t: Reader() for t in TABLES} if variant == "reconcile" else None
    indexers = {t: {"by_network": lambda o: [o.value["network"]]} for t in TABLES} if variant == "index" else None
    ctrl = Controller(store, transport, TABLES, options=SubscriberOptions(queue_size=100_000), name="ingest",
                      reconcilers=reconcilers, indexers=indexers,
                      runtime=ControllerOptions(workers=1, resync_period=0, sync_drains_queue=False,
                                                checkpoint_interval=0))
    gc.collect()  # no run pays for the garbage of the runs before it
    c0 = time.process_time()
    ctrl.start()
    deadline = time.monotonic() + 600
    while not (done.is_set() if reconcilers else ctrl.stats.get("events_in") >= events):
        if time.monotonic() > deadline:
            raise SystemExit(f"{variant} schema {schema} did not finish")
        done.wait(0.002)
    cpu = time.process_time() - c0
    assert ctrl.stats.get("bad_values") == 0 and len(ctrl.cache) == keys
    ctrl.stop()
    pub.close()
    return cpu / events * 1e6


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--events", type=int, default=50_000)
    p.add_argument("--keys", type=int, default=10_000)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--variants", default=",".join(VARIANTS))
    args = p.parse_args(argv)
    variants = args.variants.split(",")
    cpu: dict[str, dict[int, list[float]]] = {v: {1: [], 2: []} for v in variants}
    with tempfile.TemporaryDirectory() as tmp:
        store = open_store(f"sqlite:///{tmp}/nb.sqlite", TABLES)  # empty: the first sync lists nothing
        for r in range(args.rounds):
            for variant in variants:
                for schema in ((1, 2) if r % 2 == 0 else (2, 1)):  # alternate which goes first
                    cpu[variant][schema].append(run(store, variant, schema, args.events, args.keys))
                print(f"[round {r + 1}] {variant}: schema 1 {cpu[variant][1][-1]:.2f} µs/event, "
                      f"schema 2 {cpu[variant][2][-1]:.2f} µs/event", flush=True)
        store.close()
    result: dict[str, Any] = {"bench": "ingest", "events": args.events, "keys": args.keys}
    for variant in variants:
        best = {s: min(v) for s, v in cpu[variant].items()}
        result[f"{variant}_us_per_event"] = {str(s): round(v, 2) for s, v in best.items()}
        result[f"{variant}_ratio"] = round(best[2] / best[1], 2)
    result["ratio"] = result.get("cache_ratio", result[f"{variants[0]}_ratio"])
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
