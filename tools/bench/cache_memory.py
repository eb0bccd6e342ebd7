"""cache_memory: a controller cache's memory per object, against a plain dict of key -> packed bytes.

A SQLite store is filled with ``--sizes`` (100,000 and 1,000,000) port-like
objects of ~200 bytes packed (UUID keys, half of them with a second fixed IP),
then each variant runs **in its own process** (a fresh heap: nothing one left
behind counts for another), reads the store and keeps what it read; its RSS
growth from before the read to after it (and a full collection), divided by
the objects, is its bytes per object:

* ``dict``: the baseline, a plain dict of key -> the value's msgpack bytes,
  read with the sqlite3 module (``SELECT key, value``);
* ``cache``: :class:`~dfpubsub.controller.VersionedCache` after a controller's
  first sync (:func:`~dfpubsub.controller.relist.relist` with ``values=False``,
  what a controller without indexes nor ``on_reconciled`` runs);
* ``cache_values``: the same, the changes carrying their decoded values (a
  controller with indexes): the listing holds every value decoded for a moment;
* ``decoded``: the layout before packed storage, in the same run: a dict of
  (table, key) -> :class:`~dfpubsub.events.VersionedObject` with the decoded
  value, built from the store's listing as that cache's first sync built it
  (its ``Change`` list included). Its time is "today's" first sync.

``first_sync_s`` (and ``first_sync_cpu_s``, the process's CPU time) is each
variant's time from before the listing to a cache holding it (garbage
collector paused, as relist does). A cache process also
times reading values as a reconciler does, in CPU time per key (``--reads`` random keys),
alternating with the same reads from a dict of those keys' decoded objects
(the layout before, a dict lookup): ``read_us`` of a cached key not written
lately (decoded from its bytes), ``read_after_change_us`` of a key just
changed by an event (the last ones written are kept decoded); ``_extra_us``
is the median difference of the pairs.

Last line: ``{"bench": "cache_memory", "ratio": R, ...}``: ``ratio`` is the
cache's bytes per object over the dict's at the largest size, with
``ratio_<size>`` per size, ``bytes_per_object_<variant>_<size>``,
``first_sync_ratio_<size>`` and ``first_sync_cpu_ratio_<size>`` (cache over
decoded, the median of each round's pair; ``_values`` for cache_values) and ``read_extra_us_<size>`` / ``read_after_change_extra_us_<size>``. Targets: ratio
<= 1.5 at both sizes, flat from 100k to 1M; first sync no slower than
``decoded``; a read no more than 1 us slower per key.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import random
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Any

import msgpack

TABLES = ["port"]
VARIANTS = ("dict", "cache", "cache_values", "decoded")


def value_of(i: int) -> dict[str, Any]:
    """A port-like value of ~200 bytes packed, distinct per ``i``."""
    ips = [f"10.{i >> 16 & 255}.{i >> 8 & 255}.{i & 255}"] + ([f"10.200.{i >> 8 & 255}.{i & 255}"] if i % 2 else [])
    return {"name": f"port-{i:07d}", "network_id": f"{i % 97:08x}-5a8e-4a1c-9d1e-4f3c2b1a0e9d",
            "mac_address": f"fa:16:3e:{i >> 16 & 255:02x}:{i >> 8 & 255:02x}:{i & 255:02x}", "fixed_ips": ips,
            "status": "ACTIVE", "admin_state_up": True, "mtu": 1450, "device_owner": "compute:nova",
            "security_groups": [f"sg-{i % 13}"]}


def key_of(i: int) -> str:
    return f"{i:08x}-0000-4000-8000-{i * 2654435761 % (1 << 48):012x}"


def fill(path: str, n: int) -> float:
    """A SQLite store of ``n`` ports at ``path``; the mean packed value size."""
    from dfpubsub.store import open_store

    open_store(f"sqlite:///{path}", TABLES).close()  # the schema
    conn = sqlite3.connect(path)
    total = 0
    for start in range(0, n, 100_000):
        rows = []
        for i in range(start, min(n, start + 100_000)):
            blob = msgpack.packb(value_of(i))
            total += len(blob)
            rows.append(("port", key_of(i), "port", i + 1, blob))
        conn.executemany("INSERT INTO nb_objects VALUES (?, ?, ?, ?, ?)", rows)
    conn.execute("UPDATE nb_meta SET value = ? WHERE name = 'revision'", (n,))
    conn.commit()
    conn.close()
    return total / n


def rss() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def peak() -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    return 0


def child(variant: str, path: str, reads: int) -> dict[str, Any]:
    """Run one variant in this process; what it measured."""
    from dfpubsub.controller import Change, VersionedCache
    from dfpubsub.controller.relist import relist
    from dfpubsub.events import Action
    from dfpubsub.store import open_store

    store = open_store(f"sqlite:///{path}", TABLES)
    conn = sqlite3.connect(path)
    n = conn.execute("SELECT count(*) FROM nb_objects").fetchone()[0]  # Store.count lists every object
    conn.close()
    held: Any = None
    gc.collect()
    before = rss()
    gc.disable()  # as relist does: what is measured is the layout, not the collector
    t0, c0 = time.perf_counter(), time.process_time()
    if variant == "dict":
        conn = sqlite3.connect(path)
        held = dict(conn.execute("SELECT key, value FROM nb_objects WHERE tbl = 'port'"))
        conn.close()
    elif variant in ("cache", "cache_values"):
        held = VersionedCache()
        relist(store, held, set(TABLES), values=variant == "cache_values")
    else:  # the cache's first sync before packed storage (its reconcile and relist, inlined)
        truth, _ = store.list_at(set(TABLES))
        held = {}
        held.update({(obj[1], obj[2]): obj for obj in truth})
        changes = [tuple.__new__(Change, (Action.CREATE, *obj, None)) for obj in truth]
        del truth, changes
    elapsed, cpu = time.perf_counter() - t0, time.process_time() - c0
    store.close()  # its connection's page cache (2 MB) is not the cache's: the dict's is closed too
    gc.freeze()
    gc.unfreeze()
    gc.enable()
    gc.collect()
    grown = rss() - before
    out: dict[str, Any] = {"variant": variant, "objects": n, "first_sync_s": elapsed, "first_sync_cpu_s": cpu,
                           "bytes_per_object": grown / n, "peak_bytes": peak()}
    if variant == "cache" and reads:
        out.update(read_costs(held, n, reads))
    return out


def read_costs(cache: Any, n: int, reads: int) -> dict[str, float]:
    """CPU microseconds per key of a reconciler's read of the value, from ``cache`` and from the
    layout before packed storage (a dict of (table, key) -> decoded object, here of the keys
    read), alternately in this process, so that both see the same machine: a key not written
    lately, and a key read soon after an event changed it (the worker's usual read)."""
    from dfpubsub.events import Action, Event, VersionedObject

    rng = random.Random(7)
    idents = [("port", key_of(rng.randrange(n))) for _ in range(reads)]
    decoded = {ident: cache.get(*ident) for ident in idents}
    lookup = cache.lookup()

    def timed(read: Any, keys: list[tuple[str, str]]) -> float:
        # CPU time of this thread: on a shared machine the wall clock mostly measures the others.
        t = time.thread_time()
        for ident in keys:
            read(ident)[4]  # noqa: B018 - the value, as a reconciler reads it
        return (time.thread_time() - t) / len(keys) * 1e6

    cold = [(timed(lookup, idents), timed(decoded.get, idents)) for _ in range(7)]
    # Keys changed by events, then read, a chunk at a time (fewer than the cache keeps decoded);
    # the events' values are the stored ones, so that only the read differs.
    version, after = n + 1, []
    for at in range(0, len(idents), 1000):
        chunk = idents[at:at + 1000]
        for ident in chunk:
            version += 1
            value = decoded[ident].value
            cache.apply(Event("port", "port", ident[1], Action.UPDATE, version, value))
            decoded[ident] = VersionedObject("port", "port", ident[1], version, value)
        after.append((timed(lookup, chunk), timed(decoded.get, chunk)))
    return {"read_us": statistics.median(c for c, _ in cold), "read_decoded_us": statistics.median(d for _, d in cold),
            "read_extra_us": statistics.median(c - d for c, d in cold),
            "read_after_change_us": statistics.median(c for c, _ in after),
            "read_after_change_decoded_us": statistics.median(d for _, d in after),
            "read_after_change_extra_us": statistics.median(c - d for c, d in after)}


def run_child(variant: str, path: str, reads: int) -> dict[str, Any]:
    proc = subprocess.run([sys.executable, __file__, "--child", variant, "--db", path, "--reads", str(reads)],
                          capture_output=True, text=True, check=False)
    if proc.returncode:
        raise SystemExit(f"{variant} failed:\n{proc.stderr}")
    result: dict[str, Any] = json.loads(proc.stdout.strip().splitlines()[-1])
    return result


def label(n: int) -> str:
    return f"{n // 1_000_000}m" if n % 1_000_000 == 0 else f"{n // 1000}k"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--sizes", default="100000,1000000")
    p.add_argument("--rounds", type=int, default=3, help="processes per variant and size (medians are reported)")
    p.add_argument("--reads", type=int, default=20_000)
    p.add_argument("--child", choices=VARIANTS, help=argparse.SUPPRESS)
    p.add_argument("--db", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.child:
        print(json.dumps(child(args.child, args.db, args.reads)))
        return 0
    out: dict[str, Any] = {"bench": "cache_memory"}
    sizes = [int(s) for s in args.sizes.split(",") if s]
    with tempfile.TemporaryDirectory(prefix="bench-cache-memory-") as tmp:
        for n in sizes:
            path = f"{tmp}/nb-{n}.sqlite"
            t0 = time.perf_counter()
            mean = fill(path, n)
            print(f"[{label(n)}] filled {n:,} objects of {mean:.0f} bytes packed in {time.perf_counter() - t0:.1f}s",
                  flush=True)
            runs: dict[str, list[dict[str, Any]]] = {v: [] for v in VARIANTS}
            for r in range(args.rounds):  # alternating: the machine's speed moves between runs
                for variant in VARIANTS:
                    res = run_child(variant, path, args.reads)
                    runs[variant].append(res)
                    print(f"[{label(n)}] round {r + 1} {variant}: {res['bytes_per_object']:,.0f} bytes/object, "
                          f"first sync {res['first_sync_s']:.3f}s ({res['first_sync_cpu_s']:.3f} CPU-s), "
                          f"peak RSS {res['peak_bytes'] / 1e6:,.0f} MB"
                          + (f"; read {res['read_us']:.2f} us (decoded layout {res['read_decoded_us']:.2f}), "
                             f"after a change {res['read_after_change_us']:.2f} us "
                             f"(decoded layout {res['read_after_change_decoded_us']:.2f})" if "read_us" in res else ""),
                          flush=True)
            os.unlink(path)
            med = {v: {k: statistics.median(r[k] for r in rs) for k in rs[0] if k != "variant"}
                   for v, rs in runs.items()}
            tag = label(n)
            for v in VARIANTS:
                out[f"bytes_per_object_{v}_{tag}"] = round(med[v]["bytes_per_object"])
                out[f"first_sync_s_{v}_{tag}"] = round(med[v]["first_sync_s"], 3)
                out[f"first_sync_cpu_s_{v}_{tag}"] = round(med[v]["first_sync_cpu_s"], 3)
                out[f"peak_mb_{v}_{tag}"] = round(med[v]["peak_bytes"] / 1e6)
            out[f"ratio_{tag}"] = round(med["cache"]["bytes_per_object"] / med["dict"]["bytes_per_object"], 3)
            out[f"ratio_values_{tag}"] = round(med["cache_values"]["bytes_per_object"]
                                               / med["dict"]["bytes_per_object"], 3)
            out[f"decoded_ratio_{tag}"] = round(med["decoded"]["bytes_per_object"] / med["dict"]["bytes_per_object"], 3)
            # Per round, the pair run back to back: steadier than the ratio of two medians; in CPU
            # time too, which a shared machine moves less than the wall clock.
            for k, label_ in (("first_sync_s", "first_sync_ratio"), ("first_sync_cpu_s", "first_sync_cpu_ratio")):
                out[f"{label_}_{tag}"] = round(statistics.median(
                    c[k] / d[k] for c, d in zip(runs["cache"], runs["decoded"])), 3)
                out[f"{label_}_values_{tag}"] = round(statistics.median(
                    c[k] / d[k] for c, d in zip(runs["cache_values"], runs["decoded"])), 3)
            for k in ("read_us", "read_decoded_us", "read_extra_us", "read_after_change_us",
                      "read_after_change_decoded_us", "read_after_change_extra_us"):
                out[f"{k}_{tag}"] = round(med["cache"][k], 3)
    largest = label(max(sizes))
    out["ratio"] = out[f"ratio_{largest}"]
    if len(sizes) > 1:
        out["flatness"] = round(out[f"ratio_{largest}"] / out[f"ratio_{label(min(sizes))}"], 3)
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
