"""warm_restart: what a controller's start costs the store, resumed from its snapshot against a full listing.

For each table size (``--sizes``, default 20,000 port-like objects of ~190 bytes)
on a private Redis or etcd (``--store``; a server on a free loopback port in a
temp dir), one controller runs in this process with a ``state_dir``:

* **cold**: its first start (no snapshot: a full listing, as every start was
  before warm restarts); it is stopped cleanly (the snapshot is written), then
  ``--writes`` updates (200) are made while it is down;
* **warm**: it starts again from its snapshot: it replays the feed from its
  positions and reads the objects that changed;
* **relist**, the baseline in the same run: a controller without a state_dir
  starts on the same store (what a restart cost before).

What the store served for each start is read from the server itself (Redis:
``INFO stats`` ``total_net_output_bytes`` and ``INFO commandstats``, the INFO
replies' own bytes taken out; etcd: its ``/metrics``, gRPC bytes sent and calls
started: tools/bench/storemeter.py's meters), from the start to ``synced``. Against it, what those ``--writes`` feed entries cost to
read once (``read_feed``, measured the same way): the issue's target is a warm
start of at most 10x that, the same at every table size.

**Stall** (``--stall-objects``, default 1,000,000; 0: skipped): a controller on
a SQLite store whose cache holds that many objects writes a snapshot while a
thread applies events to the cache, each due at a fixed time (one per 0.2 ms;
latency from when it was due, so that waits for the GIL outside ``apply()``
count): the events' latency (p50/p99/max) during the write against before it,
the time the copy took, and the snapshot's size against the
cache's packed bytes (target <= 1.2); then the time a start takes from a
snapshot of the table as the store holds it, written quietly, against a listing
of the same objects from SQLite (target <= 0.5), and (``start_ratio_after_events``)
from the snapshot written under the timed events, whose start also reads back
every object they touched (their versions are the bench's, which no write of
the store explains).

Ends with one JSON line: ``ratio`` is the relist's bytes over the warm start's
at the largest size.
"""

from __future__ import annotations

import argparse
import gc
import json
import logging
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path
from typing import Any

from storemeter import TABLE, ServerMeter, key_of, load, port_value, private_store

from dfpubsub import SubscriberOptions, load_driver
from dfpubsub.controller import Controller, ControllerOptions
from dfpubsub.controller.snapshot import WarmStart
from dfpubsub.events import Action, Event
from dfpubsub.metrics import Stats
from dfpubsub.store import Store, open_store


def controller(url: str, state_dir: str | None, name: str) -> Controller:
    store = open_store(url, [TABLE], prefix="bench") if not url.startswith("sqlite") else open_store(url, [TABLE])
    transport = load_driver(f"memory://warm-{uuid.uuid4().hex}").subscriber(Stats("subscriber", name))
    return Controller(store, transport, [TABLE], options=SubscriberOptions(), name=name,
                      runtime=ControllerOptions(checkpoint_interval=0, snapshot_interval=0), state_dir=state_dir)


#: What a store without a server (SQLite) says it sent: nothing to ask.
NO_SERVER = ServerMeter()


def timed_start(ctl: Controller, meter: ServerMeter = NO_SERVER) -> dict[str, Any]:
    """Start ``ctl`` and wait for ``synced``: what the server sent meanwhile (None without a server
    to ask: SQLite), and the seconds."""
    before = meter.read()
    t0 = time.perf_counter()
    ctl.start()
    if not ctl.synced.wait(600):
        raise SystemExit(f"{ctl.name} did not sync")
    seconds = time.perf_counter() - t0
    cost = meter.delta(before, meter.read())
    snaps = ctl.snapshots
    start = snaps.warm_start if snaps is not None else None
    return {"bytes": cost.get("bytes"), "commands": cost.get("commands"), "seconds": seconds,
            "start": None if start is None else f"{start.result}:{start.reason}"}


def measure_size(url: str, meter: ServerMeter, store: Store, size: int, args: argparse.Namespace,
                 tmp: Path) -> dict[str, Any]:
    state_dir = str(tmp / f"state-{size}")
    cold_ctl = controller(url, state_dir, f"cold-{size}")
    cold = timed_start(cold_ctl, meter)
    cold_ctl.stop()
    cold_ctl.store.close()
    position = store.feed_head()
    for i in range(args.writes):  # while it is down
        store.update(TABLE, key_of((i * 97) % size), port_value((i * 97) % size, gen=size + i))
    before = meter.read()
    store.read_feed(position, args.writes)
    entries = meter.delta(before, meter.read())["bytes"]
    warm_ctl = controller(url, state_dir, f"warm-{size}")
    warm = timed_start(warm_ctl, meter)
    warm_ctl.stop()
    snapshot_bytes = warm_ctl.snapshots.size if warm_ctl.snapshots is not None else 0
    warm_ctl.store.close()
    relist_ctl = controller(url, None, f"relist-{size}")
    relist = timed_start(relist_ctl, meter)
    relist_ctl.stop()
    relist_ctl.store.close()
    row = {"cold": cold, "warm": warm, "relist": relist, "entries_bytes": entries, "snapshot_bytes": snapshot_bytes}
    print(f"{size:>9,} objects: cold {cold['bytes']:>11,} B {cold['seconds']:.2f}s | warm ({warm['start']}) "
          f"{warm['bytes']:>9,} B {warm['commands']} commands {warm['seconds']:.2f}s | relist {relist['bytes']:>11,} B "
          f"{relist['seconds']:.2f}s | {args.writes} entries {entries:,} B: warm = {warm['bytes'] / max(entries, 1):.1f}x "
          f"(target <= 10)", flush=True)
    return row


#: Seconds between two events applied while a snapshot is written (5,000 a second).
EVENT_PERIOD = 0.0002


def measure_stall(objects: int, tmp: Path) -> dict[str, Any]:
    """A snapshot of ``objects`` written while events are applied; then a start from it and a listing."""
    url = f"sqlite:///{tmp}/stall.sqlite"
    store = open_store(url, [TABLE])
    t0 = time.perf_counter()
    load(store, 0, objects, 1)
    print(f"stall: {objects:,} objects loaded into SQLite in {time.perf_counter() - t0:.1f}s", flush=True)
    head = store.feed_head()
    ctl = synced_like(url, store, head, str(tmp / "stall-state"), "stall")
    snaps = ctl.snapshots
    assert snaps is not None
    packed = sum(u.bytes for u in ctl.cache.usage().values())
    latencies: list[tuple[float, float]] = []  # (when, seconds)
    stop = threading.Event()

    def events(apply: Any) -> None:
        # Open loop, as events reach a dispatch thread: each is due at a fixed time, and its latency
        # is from then to applied. Timing apply() alone would miss every wait for the GIL outside
        # it (a C-level copy holding the GIL stalls the thread before it calls apply).
        i, began = 0, time.perf_counter()
        while not stop.is_set():
            due = began + i * EVENT_PERIOD
            wait = due - time.perf_counter()
            if wait > 0:
                time.sleep(wait)
            apply(Event(TABLE, TABLE, key_of(i % objects), Action.UPDATE, head + 1 + i, port_value(i, gen=1)))
            latencies.append((due, time.perf_counter() - due))
            i += 1

    applier = threading.Thread(target=events, args=(ctl.cache.apply,), daemon=True)
    applier.start()
    time.sleep(1.0)
    began = time.perf_counter()
    export = ctl.cache.export
    held: list[float] = []

    def timed_export() -> Any:
        t = time.perf_counter()
        out = export()
        held.append(time.perf_counter() - t)
        return out

    ctl.cache.export = timed_export  # type: ignore[method-assign]  # the copy's time (a chunk at a time under the lock)
    ok = snaps.write()
    ended = time.perf_counter()
    del ctl.cache.export  # the class's again
    time.sleep(0.5)
    stop.set()
    applier.join()
    during = sorted(s for t, s in latencies if began <= t <= ended)
    idle = sorted(s for t, s in latencies if t < began)

    def pct(xs: list[float], q: float) -> float:
        return 1000 * xs[min(len(xs) - 1, int(q * len(xs)))] if xs else 0.0

    # A start from that snapshot, to synced, against a listing of the same objects (one cache at a time).
    ctl.store.close()
    size = snaps.size
    del ctl, snaps, timed_export
    # The start from that snapshot also reads back every object the timed events touched: their
    # versions are the bench's, above the store's head, which no write of the store explains. The
    # target's start is from a snapshot of the table as the store has it: one written quietly.
    after_events = started_once(url, str(tmp / "stall-state"), "stall-warm")
    quiet = synced_like(url, store, head, str(tmp / "quiet-state"), "quiet")
    assert quiet.snapshots is not None and quiet.snapshots.write()
    quiet.store.close()
    del quiet
    warm = started_once(url, str(tmp / "quiet-state"), "quiet-warm")
    warm_seconds, events_seconds = warm["seconds"], after_events["seconds"]
    cold_seconds = started_once(url, None, "stall-cold")["seconds"]
    store.close()
    row = {"objects": objects, "written": ok, "write_seconds": round(ended - began, 3),
           "copy_ms": round(1000 * max(held, default=0.0), 1), "p50_ms": round(pct(during, 0.5), 3),
           "p99_ms": round(pct(during, 0.99), 2), "max_ms": round(pct(during, 1.0), 2),
           "idle_p99_ms": round(pct(idle, 0.99), 3), "events_during": len(during),
           "snapshot_bytes": size, "packed_bytes": packed, "size_ratio": round(size / max(packed, 1), 3),
           "warm_seconds": round(warm_seconds, 2), "relist_seconds": round(cold_seconds, 2),
           "warm_start": warm["start"], "start_ratio": round(warm_seconds / max(cold_seconds, 1e-9), 3),
           "events_warm_seconds": round(events_seconds, 2), "events_warm_start": after_events["start"],
           "start_ratio_after_events": round(events_seconds / max(cold_seconds, 1e-9), 3)}
    print(f"stall: snapshot of {objects:,} objects written in {row['write_seconds']}s, copied in {row['copy_ms']} ms; "
          f"event latency during it p50 {row['p50_ms']} ms, p99 {row['p99_ms']} ms, max {row['max_ms']} ms "
          f"(before: p99 {row['idle_p99_ms']} ms; target <= 5); size {row['size_ratio']}x the packed bytes "
          f"(target <= 1.2); a start from a snapshot of the table {row['warm_seconds']}s ({row['warm_start']}) vs "
          f"relist {row['relist_seconds']}s: {row['start_ratio']}x (target <= 0.5); from the one written under "
          f"events {row['events_warm_seconds']}s: {row['start_ratio_after_events']}x", flush=True)
    return row


def synced_like(url: str, store: Store, head: int, state_dir: str, name: str) -> Controller:
    """A controller (not started) whose cache holds the table of ``store``, as after its first sync at
    ``head``: what writes snapshots."""
    ctl = controller(url, state_dir, name)
    listed, _ = store.list_packed_tables_at([TABLE])
    ctl.cache.fill(listed)
    del listed
    gc.freeze()  # as the controller's relist leaves them: in the oldest generation, which young
    gc.unfreeze()  # collections do not walk (a million young records would cost a full pass)
    ctl.positions[TABLE] = head
    ctl._proven = dict(ctl.positions)
    assert ctl.snapshots is not None
    ctl.snapshots.warm_start = WarmStart("relisted", "bench", 0, 0, 0, None, 0.0)  # as after a first sync
    return ctl


def started_once(url: str, state_dir: str | None, name: str) -> dict[str, Any]:
    """:func:`timed_start` of a controller on ``state_dir``, stopped after it."""
    ctl = controller(url, state_dir, name)
    try:
        return timed_start(ctl)
    finally:
        ctl.stop()
        ctl.store.close()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--sizes", default="20000", help="table sizes, comma-separated (e.g. 20000,200000)")
    parser.add_argument("--writes", type=int, default=200, help="updates made while the controller is down")
    parser.add_argument("--load-threads", type=int, default=16)
    parser.add_argument("--stall-objects", type=int, default=1_000_000, help="0: no stall measure")
    parser.add_argument("--store", choices=("redis", "etcd"), default="redis", help="the store whose starts are measured")
    args = parser.parse_args(argv)
    logging.getLogger("dfpubsub").setLevel(logging.WARNING)
    sizes = sorted(int(x) for x in args.sizes.split(",") if x)
    result: dict[str, Any] = {"bench": "warm_restart", "ratio": 0.0, "store": args.store, "writes": args.writes}
    with tempfile.TemporaryDirectory(prefix="bench-warm-") as tmp:
        rows: dict[int, dict[str, Any]] = {}
        with private_store(args.store, Path(tmp)) as (url, meter):
            assert meter is not None
            store = open_store(url, [TABLE], prefix="bench")
            loaded = 0
            for size in sizes:
                seconds = load(store, loaded, size, args.load_threads)
                print(f"loaded {size - loaded:,} objects in {seconds:.1f}s", flush=True)
                loaded = size
                rows[size] = measure_size(url, meter, store, size, args, Path(tmp))
            store.close()
        for size, row in rows.items():
            result.update({
                f"cold_bytes_{size}": row["cold"]["bytes"], f"warm_bytes_{size}": row["warm"]["bytes"],
                f"relist_bytes_{size}": row["relist"]["bytes"], f"entries_bytes_{size}": row["entries_bytes"],
                f"warm_over_entries_{size}": round(row["warm"]["bytes"] / max(row["entries_bytes"], 1), 2),
                f"warm_seconds_{size}": round(row["warm"]["seconds"], 3),
                f"relist_seconds_{size}": round(row["relist"]["seconds"], 3),
                f"warm_start_{size}": row["warm"]["start"], f"snapshot_bytes_{size}": row["snapshot_bytes"]})
        if len(sizes) > 1:
            result["warm_growth"] = round(rows[sizes[-1]]["warm"]["bytes"] / max(rows[sizes[0]]["warm"]["bytes"], 1), 3)
        largest = rows[sizes[-1]]
        result["ratio"] = round(largest["relist"]["bytes"] / max(largest["warm"]["bytes"], 1), 1)
        if args.stall_objects:
            result["stall"] = measure_stall(args.stall_objects, Path(tmp))
    print(json.dumps(result), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
