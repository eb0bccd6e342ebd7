"""relist_storm: a fleet relisting at once, with and without relist admission, against one store.

For each store (a private etcd and redis-server on free loopback ports in a
temp dir; SQLite with ``--stores sqlite``), ``--objects`` port-like objects
(~190 bytes) are loaded, then ``--controllers`` real controllers (each its own
store handle and ZeroMQ subscriber, all in this process, cache-only) start at
the same moment: a fleet's cold start, which is also what history gone for
all, or a restored store, costs (every one lists the whole table). Twice:

* **unbounded**: no admission, every listing in one piece (before this change);
* **admitted**: ``RelistAdmission`` with ``--slots`` slots in the store itself,
  ``--jitter`` seconds of start jitter, pages of ``--page-size`` objects.

Meanwhile an unrelated writer (a process of its own) updates one object every
20 ms and times each write; its p99 during the storm is compared with its p99 before it (idle). The
server's RSS (``/proc/<pid>/status`` VmRSS) is sampled every 20 ms: peak
against idle. Also the wall time until every controller's cache holds every
object, and the most listings the store served at once (counted around the
store handles' listing calls, which run on the controllers' own threads).

Last line: ``{"bench": "relist_storm", "ratio": R, "<store>_writer_p99_ratio_unbounded": R,
"<store>_writer_p99_ratio_admitted": R, "<store>_rss_ratio_unbounded": R, "<store>_rss_ratio_admitted": R,
"<store>_sync_s_unbounded": S, "<store>_sync_s_admitted": S, "<store>_concurrent_unbounded": N,
"<store>_concurrent_admitted": N, ...}`` where ``ratio`` is, on the first store, the writer's storm
p99 over its idle p99 unbounded divided by the same admitted (> 1: admission spared the writer).
"""

from __future__ import annotations

import argparse
import json
import logging
import multiprocessing
import statistics
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from dfpubsub import Controller, SubscriberOptions
from dfpubsub.admission import open_slots
from dfpubsub.controller import RelistAdmission
from dfpubsub.metrics import Stats
from dfpubsub.plugins import load_driver
from dfpubsub.store import Store, open_store
from dfpubsub.testing.servers import EtcdServer, RedisServer, ServerProcess

TABLE = "port"
PREFIX = "storm"
LISTINGS = ("list_pages_at", "list_packed_at", "list_packed_tables_at", "list_versions_at")


def value(i: int, gen: int = 0) -> dict[str, Any]:
    return {"name": f"port-{i:07d}", "mac": f"fa:16:3e:{i >> 16 & 255:02x}:{i >> 8 & 255:02x}:{i & 255:02x}",
            "fixed_ips": [{"ip_address": f"10.{i >> 16 & 255}.{i >> 8 & 255}.{i & 255}"}],
            "network_id": "9b2f6c1e-3d4a-4f8b-a0c7-5e6d1f2a3b4c", "status": "ACTIVE", "admin_state_up": True,
            "mtu": 1500, "device_owner": "compute:nova", "gen": gen}


@contextmanager
def private_store(backend: str, workdir: Path) -> Iterator[tuple[str, ServerProcess | None]]:
    if backend == "sqlite":
        yield f"sqlite:///{workdir}/nb.sqlite", None
        return
    server = (EtcdServer if backend == "etcd" else RedisServer)(workdir / backend).start()
    try:
        yield server.url, server
    finally:
        server.kill()


def open_bench_store(url: str) -> Store:
    return open_store(url, [TABLE]) if url.startswith("sqlite") else open_store(url, [TABLE], prefix=PREFIX)


class Concurrency:
    """The listings in flight over every wrapped store handle, and the most at once."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.now = self.peak = 0

    def wrap(self, store: Store) -> None:
        for name in LISTINGS:
            setattr(store, name, self._counted(getattr(store, name)))

    def _counted(self, real: Callable[..., Any]) -> Callable[..., Any]:
        def call(*args: Any, **kwargs: Any) -> Any:
            with self.lock:
                self.now += 1
                self.peak = max(self.peak, self.now)
            try:
                result = real(*args, **kwargs)
                if real.__name__ == "list_pages_at":  # in flight until its last page was read
                    revision, pages = result
                    return revision, self._drained(pages)
                self._done()
                return result
            except BaseException:
                self._done()
                raise
        return call

    def _drained(self, pages: Iterator[Any]) -> Iterator[Any]:
        try:
            yield from pages
        finally:
            self._done()

    def _done(self) -> None:
        with self.lock:
            self.now -= 1


def rss_kb(server: ServerProcess) -> int:
    assert server.proc is not None
    with open(f"/proc/{server.proc.pid}/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("VmRSS:"))


def _write(url: str, ready: Any, stop: Any, results: Any) -> None:
    """The writer's process: updates one object every 20 ms, timing each, until ``stop``."""
    store = open_bench_store(url)
    times: list[float] = []
    gen = 0
    store.update(TABLE, "port-0000000", value(0))  # connected before the clock starts
    ready.set()
    while not stop.wait(0.02):
        gen += 1
        t0 = time.perf_counter()
        store.update(TABLE, "port-0000000", value(0, gen))
        times.append(time.perf_counter() - t0)
    store.close()
    results.put(times)


@contextmanager
def writer(url: str) -> Iterator[list[float]]:
    """An unrelated writer in a process of its own (so that this process's controllers do not
    hold its GIL) for the ``with`` block; the list yielded receives its write times after it."""
    ctx = multiprocessing.get_context("spawn")
    ready, stop, results = ctx.Event(), ctx.Event(), ctx.Queue()
    proc = ctx.Process(target=_write, args=(url, ready, stop, results), daemon=True)
    proc.start()
    if not ready.wait(120):
        raise SystemExit("the writer did not start")
    times: list[float] = []
    try:
        yield times
    finally:
        stop.set()
        times.extend(results.get(timeout=120))
        proc.join(30)


def p99(values: list[float]) -> float:
    return statistics.quantiles(values, n=100)[98] if len(values) >= 2 else (values[0] if values else 0.0)


def storm(url: str, server: ServerProcess | None, args: argparse.Namespace, admitted: bool) -> dict[str, Any]:
    concurrency = Concurrency()
    stores = [open_bench_store(url) for _ in range(args.controllers)]
    for s in stores:
        concurrency.wrap(s)
    ctrls = []
    for i, s in enumerate(stores):
        admission = RelistAdmission(open_slots(url, "relist", 2.0, PREFIX), args.slots, lease=30.0,
                                    jitter=args.jitter, retry_base=0.05, retry_max=1.0,
                                    page_size=args.page_size, identity=f"c{i}") if admitted else None
        transport = load_driver("zmq").subscriber(Stats("s", f"c{i}"))
        ctrls.append(Controller(s, transport, [TABLE], None, SubscriberOptions(), f"c{i}", admission=admission))
    rss: list[int] = []
    sampling = threading.Event()

    def sample() -> None:
        while server is not None and not sampling.wait(0.02):
            rss.append(rss_kb(server))

    sampler = threading.Thread(target=sample, daemon=True)
    with writer(url) as writes:
        sampler.start()
        t0 = time.perf_counter()
        for c in ctrls:
            c.start()
        for c in ctrls:
            if not c.synced.wait(600):
                raise SystemExit("a controller did not sync within 600 s")
        took = time.perf_counter() - t0
        sampling.set()
        sampler.join()
    assert all(len(c.cache) == args.objects for c in ctrls), "a cache does not hold every object"
    waits = sum(c.stats.get("relist_waits") for c in ctrls)
    pages = sum(c.stats.get("relist_pages") for c in ctrls)
    for c in ctrls:
        c.stop(timeout=2.0)
        if c.admission is not None:
            c.admission.close()
    for s in stores:
        s.close()
    return {"sync_s": took, "writer_p99_ms": p99(writes) * 1000, "writes": len(writes),
            "peak_rss_kb": max(rss, default=0), "concurrent": concurrency.peak, "waits": waits, "pages": pages}


def measure(backend: str, tmp: Path, args: argparse.Namespace) -> dict[str, Any]:
    with private_store(backend, tmp / backend) as (url, server):
        loader = open_bench_store(url)
        t0 = time.perf_counter()
        with ThreadPoolExecutor(16) as pool:
            list(pool.map(lambda part: [loader.create(TABLE, f"port-{i:07d}", value(i)) for i in part],
                          [range(j, args.objects, 16) for j in range(16)]))
        print(f"[{backend}] loaded {args.objects:,} objects in {time.perf_counter() - t0:.1f}s", flush=True)
        loader.close()
        with writer(url) as idle:
            time.sleep(args.idle)
        idle_rss = rss_kb(server) if server is not None else 0
        out: dict[str, Any] = {"idle_writer_p99_ms": p99(idle) * 1000, "idle_rss_kb": idle_rss}
        for mode in ("unbounded", "admitted"):
            r = storm(url, server, args, mode == "admitted")
            out[mode] = r
            print(f"[{backend}] {mode:9}: {args.controllers} controllers synced in {r['sync_s']:.1f}s; writer p99 "
                  f"{r['writer_p99_ms']:.1f} ms over {r['writes']} writes (idle {out['idle_writer_p99_ms']:.1f}); "
                  f"server peak RSS {r['peak_rss_kb'] / 1024:.0f} MB (idle {idle_rss / 1024:.0f}); "
                  f"listings at once {r['concurrent']}; waits {r['waits']}; pages {r['pages']}", flush=True)
        return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--stores", default="etcd,redis")
    parser.add_argument("--objects", type=int, default=20_000)
    parser.add_argument("--controllers", type=int, default=16)
    parser.add_argument("--slots", type=int, default=2)
    parser.add_argument("--page-size", type=int, default=5000)
    parser.add_argument("--jitter", type=float, default=0.5)
    parser.add_argument("--idle", type=float, default=3.0, help="seconds the writer is timed before the storm")
    args = parser.parse_args(argv)
    logging.getLogger("dfpubsub").setLevel(logging.ERROR)
    result: dict[str, Any] = {"bench": "relist_storm", "ratio": 0.0, "objects": args.objects,
                              "controllers": args.controllers, "slots": args.slots, "in_process": True}
    first = True
    with tempfile.TemporaryDirectory(prefix="relist-storm-") as tmp:
        for backend in [s for s in args.stores.split(",") if s]:
            r = measure(backend, Path(tmp), args)
            idle = max(r["idle_writer_p99_ms"], 1e-3)
            for mode in ("unbounded", "admitted"):
                m = r[mode]
                result[f"{backend}_writer_p99_ratio_{mode}"] = round(m["writer_p99_ms"] / idle, 2)
                result[f"{backend}_rss_ratio_{mode}"] = round(m["peak_rss_kb"] / r["idle_rss_kb"], 2) \
                    if r["idle_rss_kb"] else None
                result[f"{backend}_sync_s_{mode}"] = round(m["sync_s"], 2)
                result[f"{backend}_concurrent_{mode}"] = m["concurrent"]
            result[f"{backend}_idle_writer_p99_ms"] = round(r["idle_writer_p99_ms"], 2)
            if first:
                result["ratio"] = round(result[f"{backend}_writer_p99_ratio_unbounded"]
                                        / max(result[f"{backend}_writer_p99_ratio_admitted"], 1e-3), 2)
                first = False
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
