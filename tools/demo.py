"""df-demo: one publisher, two subscribers on ZeroMQ, a message lost on the wire, and its repair.

What it shows, step by step:
1. A publisher binds a ZeroMQ tcp socket on loopback; two subscribers connect,
   subscribe (A: ``port`` and ``network``; B: ``portbinding``), and full-sync
   their caches from the northbound DB before applying events.
2. API-style writes go to the DB and are published. One envelope on ``port``
   is dropped on the wire (fault injection at the publisher's transport).
3. Subscriber A sees the sequence jump, holds later messages for the delay
   window, then resyncs ``port`` from the DB and recovers the lost change.
   B, which takes only ``portbinding``, sees no false gap and never receives
   ``port`` events even though ZeroMQ's own filter is a byte prefix.
4. Both caches are checked object by object against the DB.
"""

from __future__ import annotations

import argparse
import sys
import threading
import time
from typing import Any

from dfpubsub.cache import CachedObject, VersionedCache
from dfpubsub.events import Event
from dfpubsub.faults import LossyTransport, drop_nth
from dfpubsub.metrics import Stats
from dfpubsub.publisher import Publisher, PublisherOptions
from dfpubsub.registry import load_driver
from dfpubsub.subscriber import Subscriber, SubscriberOptions
from dfpubsub.tracker import ResyncRequest

TOPICS = {"port": "port", "network": "network", "portbinding": "portbinding"}


class DemoDB:
    """The demo's source of truth: versioned rows in memory, one topic per table."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.rows: dict[tuple[str, str], CachedObject] = {}
        self._version = 0

    def write(self, table: str, key: str, value: dict[str, Any]) -> CachedObject:
        with self._lock:
            self._version += 1
            obj = CachedObject(TOPICS[table], table, key, self._version, value)
            self.rows[(table, key)] = obj
            return obj

    def list(self, topics: set[str]) -> list[CachedObject]:
        with self._lock:
            return [o for o in self.rows.values() if o.topic in topics]


def say(who: str, msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {who:<13} {msg}", flush=True)


class DemoController:
    """A subscriber with a versioned cache that reconciles against the DB on resync."""

    def __init__(self, name: str, topics: list[str], endpoint: str, db: DemoDB):
        self.name = name
        self.db = db
        self.cache = VersionedCache()
        self.received: dict[str, int] = {}
        driver = load_driver("zmq")
        stats = Stats("subscriber", name)
        opts = SubscriberOptions(message_delay_window=0.3)
        self.sub = Subscriber(
            driver.subscriber(stats), topics, self.on_event, self.on_resync, opts, name, self.on_gap, stats
        )
        self.sub.connect(endpoint)

    def on_event(self, event: Event) -> None:
        self.received[event.topic] = self.received.get(event.topic, 0) + 1
        self.cache.apply(event)

    def on_gap(self, req: ResyncRequest) -> None:
        if req.reason == "gap_expired":
            lo, hi = req.missing or (0, 0)
            say(self.name, f"GAP on topic {req.topic!r}: seq {lo}..{hi} never arrived within the delay window")

    def on_resync(self, topics: set[str]) -> None:
        changes = self.cache.reconcile(topics, self.db.list(topics))
        what = ", ".join(f"{c.action.value} {c.table}/{c.key} v{c.version}" for c in changes) or "nothing missing"
        say(self.name, f"resync of {sorted(topics)} from the DB: {what}")

    def check(self) -> bool:
        truth = {(o.table, o.key): o for o in self.db.list(set(self.sub.topics))}
        mine = {(o.table, o.key): o for o in self.cache.items()}
        return truth == mine


def run(n_writes: int) -> int:
    db = DemoDB()
    stats = Stats("publisher", "api-worker")
    transport = LossyTransport(load_driver("zmq+tcp://127.0.0.1:*").publisher(stats), drop_nth("port", 5))
    pub = Publisher(transport, "api-worker", PublisherOptions(batch_linger=0, max_idle_time=1.0), stats)
    say("publisher", f"bound {transport.uri}, id {pub.id[:8]}")
    a = DemoController("controller-A", ["port", "network"], transport.uri, db)
    b = DemoController("controller-B", ["portbinding"], transport.uri, db)
    for c in (a, b):
        c.sub.start()
        if not c.sub.wait_synced(5):
            say(c.name, "did not sync")
            return 1
        say(c.name, f"subscribed to {sorted(c.sub.topics)} and synced")
    # ZeroMQ connects asynchronously: wait until both subscribers are heard by the publisher.
    deadline = time.monotonic() + 5
    while pub.stats.get("hellos_out", "welcome") < 1 and time.monotonic() < deadline:
        time.sleep(0.05)
    time.sleep(0.2)

    say("publisher", f"{n_writes} writes: ports, networks and port bindings; the 5th 'port' envelope is lost")
    for i in range(n_writes):
        table = ("port", "network", "portbinding")[i % 3]
        obj = db.write(table, f"{table}-{i % 7}", {"i": i, "name": f"{table} {i}"})
        pub.publish(obj.topic, obj.table, obj.key, "update" if i >= 7 else "create", obj.version, obj.value)
    say("publisher", f"done; envelopes dropped on the wire: {transport.dropped}")

    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and not (a.check() and b.check() and a.sub.stats.get("resyncs") >= 2):
        time.sleep(0.05)
    ok = True
    for c in (a, b):
        equal = c.check()
        ok &= equal
        s = c.sub.stats
        say(c.name, f"received {c.received}, gaps {s.get('gaps')}, resyncs {s.get('resyncs')} "
                    f"(incl. the initial sync), cache == DB: {equal}")
    false_gaps = b.sub.stats.get("gaps")
    leaked = b.received.get("port", 0)
    say("controller-B", f"false gaps: {false_gaps}; 'port' events leaked through the prefix filter: {leaked}")
    ok &= false_gaps == 0 and leaked == 0 and a.sub.stats.get("gaps") >= 1
    pub.close()
    a.sub.close()
    b.sub.close()
    say("demo", "OK: the lost message was detected and repaired by resync" if ok else "FAILED")
    return 0 if ok else 1


def main(argv: list[str] | None = None) -> int:
    """Entry point of ``df-demo``."""
    parser = argparse.ArgumentParser(prog="df-demo", description=__doc__.split("\n")[0])
    parser.add_argument("--writes", type=int, default=30, help="number of DB writes to publish")
    args = parser.parse_args(argv)
    return run(args.writes)


if __name__ == "__main__":
    sys.exit(main())
