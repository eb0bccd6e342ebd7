"""fleet: N controllers against one store and one df-feed, and what each fleet-wide event costs the store.

``--controllers`` real :class:`~dfpubsub.Controller` s (a store client, a
subscriber transport, a discovery handle and a :class:`DiscoveryConnector` each,
as df-controller wires them) run in ``--workers`` worker processes (this file
with ``--worker``), so that a thousand fit a small machine. The coordinator
(this process) starts a private store server (``--store``: redis, etcd or
sqlite; storemeter.py), loads ``--objects`` port-like objects, and runs a
df-feed: a :class:`~dfpubsub.feed_publisher.FeedPublisher` on ``--driver``
announced in discovery with role ``feed`` (on the store's own server), so
that every controller trusts its bookmarks through discovery
(``Controller(feeds=...)`` filled by ``DiscoveryConnector(feeds=...)``). The
writer writes through the store only, at ``--rate`` writes/s; df-feed
publishes them.

Scenarios (``--scenarios``, in this order):

* ``cold``: every controller starts at once with an empty cache;
* ``idle``: ``--idle-s`` seconds with no write: the fleet's background (discovery
  polls, hellos) and the unrelated writer's idle latency (a probe write a 10th of a second);
* ``lost``: one envelope of df-feed dropped (every controller misses it);
* ``dead``: an API worker that publishes its own writes (a second process,
  announced in discovery) writes 5 updates and is killed -9 once they arrived;
  every controller declares it dead after 3 x ``--idle`` and repairs (nothing
  was lost: df-feed published the same writes);
* ``steady``: ``--duration`` seconds of writes, nothing lost, bookmarks trusted;
  then ``baseline``: the same for ``--baseline-duration`` with every
  controller ignoring bookmarks (the same controllers: their feed test is
  turned off), so that each checkpoint (``--checkpoint`` s) replays what was
  written since the last one: the cost before bookmarks, in the same run;
* ``partition``: a tenth of the worker processes (at least one) SIGSTOPped for
  ``--partition-s`` while writes go on, then resumed;
* ``restart``: every controller stopped and started again, one at a time per
  worker process (the workers in parallel); with ``--warm`` each keeps a
  ``state_dir``, writes its snapshot as it stops and resumes from it;
* ``history``: the feed's history gone for every controller: df-feed stops,
  ``--history-writes`` writes are made while the store keeps only the last
  ``--history-keep`` entries, and a new df-feed starts from the head: every
  controller's replay finds its position below the history and relists,
  all at once, while the writer goes on and its latency is measured.

Each scenario reports what the store server sent and the commands it ran
(its own counters: Redis ``INFO``, etcd ``/metrics``; none for SQLite), its CPU
seconds and peak RSS (``/proc``), the controllers' repairs (replays,
relists, feed entries and objects read), the time from the scenario's end
of writes until every cache equals the store (polled on the count and the
objects written since the last full check; then checked object by object
against what the writer wrote, every key's version and the count), and the
controllers' CPU per event (all worker processes' CPU / (writes x
controllers)).

Last line: ``{"bench": "fleet", "ratio": R, ...}`` where ``ratio`` is, in
steady writes, what the controllers read from the store (feed entries and
objects) per write and controller with bookmarks over the same without them
(the baseline): the share of the position's steady cost that is left
(target <= 0.01). ``steady_read_share`` is the same with bookmarks over
(writes x controllers) (target <= 1%), ``<scenario>_*`` the figures of
each, ``unequal`` the scenarios that ended with a cache unlike the store.
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import os
import random
import resource
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import IO, Any, TypeVar

from storemeter import (
    PREFIX,
    TABLE,
    ServerMeter,
    key_of,
    load,
    open_bench_store,
    pct,
    port_value,
    private_store,
    wait_for,
)

from dfpubsub import Controller, ControllerOptions, NbApi, Publisher, PublisherOptions, SubscriberOptions
from dfpubsub.admission import open_slots
from dfpubsub.controller import FeedIds, RelistAdmission
from dfpubsub.discovery import DiscoveryConnector, PublisherAnnouncer, open_discovery
from dfpubsub.errors import StoreUnavailable, WriteOutcomeUnknown
from dfpubsub.feed_publisher import FeedPublisher
from dfpubsub.metrics import Stats
from dfpubsub.plugins import load_driver
from dfpubsub.store import Store, open_store
from dfpubsub.store.feed import FeedRetention
from dfpubsub.testing import LossyTransport

DISCOVERY_PREFIX = "fleet"
T = TypeVar("T")

# -- worker processes: many controllers each ----------------------------------------------------


class Trust:
    """A controller's feed test: the ids its discovery connector names as feeds, unless turned off
    (the baseline: positions then move by checkpoint replays only)."""

    def __init__(self) -> None:
        self.ids = FeedIds()
        self.on = True

    def __call__(self, publisher_id: str) -> bool:
        return self.on and self.ids(publisher_id)


def retried(make: Callable[[], T], pause: float = 1.0, most: int = 100) -> tuple[T, int]:
    """``make()``, tried again after ``pause`` while the store is unavailable (as a supervisor
    restarts a daemon whose start failed); with how many tries failed."""
    failures = 0
    while True:
        try:
            return make(), failures
        except StoreUnavailable:
            failures += 1
            if failures > most:
                raise
            time.sleep(pause)


class Member:
    """One controller as df-controller wires it: its own store client, subscriber transport,
    discovery handle and connector."""

    def __init__(self, name: str, cfg: dict[str, Any], trust: Trust):
        self.store = open_bench_store(cfg["url"])
        transport = load_driver(cfg["sub_driver"]).subscriber(Stats("subscriber", name))
        # As df-controller takes its turns ([relist]): slots in the store itself; 0 slots: unbounded,
        # every listing in one piece, as before relist admission.
        self.admission = (RelistAdmission(open_slots(cfg["url"], "relist", 5.0, "dfpubsub"), cfg["slots"],
                                          jitter=cfg["jitter"], page_size=cfg["page_size"], identity=name)
                          if cfg["slots"] else None)
        self.ctl = Controller(
            self.store, transport, [TABLE], name=name,
            options=SubscriberOptions(message_delay_window=cfg["window"], max_idle_time=cfg["idle"]),
            runtime=ControllerOptions(workers=1, checkpoint_interval=cfg["checkpoint"], snapshot_interval=0),
            feeds=trust, admission=self.admission,
            state_dir=os.path.join(cfg["state_root"], name) if cfg["state_root"] else None)
        self.discovery = open_discovery(cfg["discovery_url"], 3 * cfg["renew"], cfg["renew"], DISCOVERY_PREFIX)
        #: Discovery's first listing timed out (the store busy with other controllers' listings)
        #: and was tried again, as a supervisor would restart df-controller.
        self.connector, self.failures = retried(
            lambda: DiscoveryConnector(self.discovery, self.ctl.subscriber, feeds=trust.ids))

    def close(self) -> None:
        self.ctl.stop(timeout=3.0)
        self.connector.close(disconnect=False)
        self.discovery.close()
        if self.admission is not None:
            self.admission.close()
        self.store.close()


def counters_of(m: Member) -> dict[str, int]:
    return {**m.ctl.stats.snapshot(), "discovery_failures": m.failures}


class Worker:
    """A process hosting ``count`` controllers, driven by JSON lines on stdin (one reply each)."""

    def __init__(self, cfg: dict[str, Any]):
        self.cfg = cfg
        self.trust = Trust()
        self.members: list[Member] = []
        self.expected: dict[str, int] = {}
        self.dirty: set[str] = set()  # written since the last full check that passed
        #: The counters of controllers stopped by a restart (their successors count afresh).
        self.retired: Counter[str] = Counter()

    def _names(self) -> list[str]:
        return [f"ctl{self.cfg['first'] + i}" for i in range(self.cfg["count"])]

    def start(self) -> dict[str, Any]:
        t0 = time.monotonic()
        self.members = [Member(n, self.cfg, self.trust) for n in self._names()]
        for m in self.members:
            m.ctl.start()
        for m in self.members:
            if not m.ctl.synced.wait(3600):
                raise SystemExit(f"{m.ctl.name} did not sync")
        return {"synced_s": time.monotonic() - t0}

    def restart(self) -> dict[str, Any]:
        """Every controller stopped and started again, one after the other."""
        took = []
        for i, m in enumerate(self.members):
            t0 = time.monotonic()
            m.close()
            self.retired.update(counters_of(m))
            self.members[i] = m = Member(m.ctl.name, self.cfg, self.trust)
            m.ctl.start()
            if not m.ctl.synced.wait(3600):
                raise SystemExit(f"{m.ctl.name} did not sync again")
            took.append(time.monotonic() - t0)
        return {"restart_s": took}

    def check(self, full: bool) -> dict[str, Any]:
        """How many caches equal the expected store: ``full`` checks every object and the count;
        otherwise (a cheap poll) the count and the objects written since the last full check that
        passed (the others did not change), the first mismatch of a cache ending its check."""
        keys = self.expected if full else self.dirty
        equal = 0
        mismatch: dict[str, Any] | None = None
        for m in self.members:
            cache = m.ctl.cache
            ok = len(cache) == len(self.expected)
            bad = next((k for k in keys if cache.version(TABLE, k) != self.expected[k]), None) if ok else None
            ok = ok and bad is None
            equal += ok
            if full and not ok and mismatch is None:
                # Which of the three disagrees (the cache, the bench's bookkeeping or the store),
                # so that a run that does not converge says why.
                got = m.store.get(TABLE, bad) if bad is not None else None
                mismatch = {"controller": m.ctl.name, "key": bad, "objects": len(cache),
                            "expected_objects": len(self.expected),
                            "cached": cache.version(TABLE, bad) if bad is not None else None,
                            "expected": self.expected.get(bad) if bad is not None else None,
                            "store": got.version if got is not None else None,
                            "positions": dict(m.ctl.positions)}
        if full and equal == len(self.members):
            self.dirty = set()
        return {"equal": equal, "full": full, "mismatch": mismatch}

    def stats(self) -> dict[str, Any]:
        total = Counter(self.retired)
        for m in self.members:
            total.update(counters_of(m))
        ru = resource.getrusage(resource.RUSAGE_SELF)
        with open("/proc/self/status", encoding="ascii") as fh:
            rss = next(int(line.split()[1]) * 1024 for line in fh if line.startswith("VmRSS:"))
        return {"counters": dict(total), "cpu_s": ru.ru_utime + ru.ru_stime, "rss": rss,
                "threads": threading.active_count()}

    def handle(self, msg: dict[str, Any]) -> dict[str, Any]:
        op = msg["op"]
        if op == "start":
            return self.start()
        if op == "expect":
            if "file" in msg:
                with open(msg["file"], encoding="ascii") as fh:
                    self.expected = json.load(fh)
            self.expected.update(msg.get("delta", {}))
            self.dirty.update(msg.get("delta", {}))
            return {}
        if op == "check":
            return self.check(msg.get("full", False))
        if op == "stats":
            return self.stats()
        if op == "peers":  # how many controllers know this publisher (alive)
            return {"count": sum(msg["id"] in m.ctl.subscriber.tracker.peers for m in self.members)}
        if op == "trust":
            self.trust.on = msg["on"]
            return {}
        if op == "restart":
            return self.restart()
        if op == "stop":
            for m in self.members:
                m.close()
            return {}
        raise ValueError(f"unknown op {op!r}")


def api_writer_main(cfg: dict[str, Any]) -> int:
    """An API worker (``--api-writer``): writes through NbApi and publishes itself (announced in
    discovery, role none), ``N`` updates per line read on stdin, replying with the versions written;
    the coordinator kills it -9."""
    logging.basicConfig(level=logging.ERROR, stream=sys.stderr)
    store = open_bench_store(cfg["url"])
    stats = Stats("publisher", "api-worker")
    publisher = Publisher(load_driver(cfg["pub_driver"]).publisher(stats), "api-worker",
                          PublisherOptions(max_idle_time=cfg["idle"]), stats)
    discovery = open_discovery(cfg["discovery_url"], 3 * cfg["renew"], cfg["renew"], DISCOVERY_PREFIX)
    PublisherAnnouncer(discovery, publisher)
    api = NbApi(store, publisher)
    rng = random.Random(7)
    print(json.dumps({"id": publisher.id}), flush=True)
    for line in sys.stdin:
        written = {}
        for _ in range(int(line)):
            i = rng.randrange(cfg["objects"])
            written[key_of(i)] = api.update(TABLE, key_of(i), port_value(i, rng.randrange(1 << 30))).version
        publisher.flush()
        print(json.dumps(written), flush=True)
    return 0


def worker_main(cfg: dict[str, Any]) -> int:
    logging.basicConfig(level=logging.ERROR, stream=sys.stderr)
    worker = Worker(cfg)
    out = sys.stdout
    for line in sys.stdin:
        msg = json.loads(line)
        try:
            reply = worker.handle(msg)
        except Exception as exc:  # the coordinator prints it and stops the run
            reply = {"error": f"{type(exc).__name__}: {exc}"}
        out.write(json.dumps(reply) + "\n")
        out.flush()
        if msg["op"] == "stop":
            return 0
    os._exit(0)  # the coordinator is gone: no goodbyes (its controllers' threads would keep this alive)


# -- the coordinator ----------------------------------------------------------------------------


def pin(args: argparse.Namespace, meter: ServerMeter | None) -> set[int] | None:
    """With ``--pin-fleet``: this process (df-feed, the writers) and the store server onto the first
    CPU; the CPUs left for the controllers' processes (None without it)."""
    if not args.pin_fleet:
        return None
    cpus = sorted(os.sched_getaffinity(0))
    if len(cpus) < 2:
        raise SystemExit("--pin-fleet needs two CPUs at least")
    os.sched_setaffinity(0, {cpus[0]})
    if meter is not None and meter.process is not None:
        os.sched_setaffinity(meter.process.pid, {cpus[0]})
    return set(cpus[1:])


class Fleet:
    """The worker processes, asked together."""

    def __init__(self, args: argparse.Namespace, url: str, discovery_url: str, sub_driver: str):
        per = math.ceil(args.controllers / args.workers)
        self.procs: list[subprocess.Popen[str]] = []
        self.sizes: list[int] = []
        first = 0
        while first < args.controllers:
            count = min(per, args.controllers - first)
            cfg = {"url": url, "discovery_url": discovery_url, "sub_driver": sub_driver, "first": first,
                   "count": count, "window": args.window, "idle": args.idle, "checkpoint": args.checkpoint,
                   "renew": args.renew, "slots": args.relist_slots, "jitter": args.relist_jitter,
                   "page_size": args.page_size, "state_root": args.state_root}
            self.procs.append(subprocess.Popen([sys.executable, __file__, "--worker", json.dumps(cfg)],
                                               stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True))
            if args.fleet_cpus:
                os.sched_setaffinity(self.procs[-1].pid, args.fleet_cpus)
            self.sizes.append(count)
            first += count
        self.n = args.controllers

    def ask(self, msg: dict[str, Any], procs: list[subprocess.Popen[str]] | None = None) -> list[dict[str, Any]]:
        procs = self.procs if procs is None else procs
        line = json.dumps(msg) + "\n"
        for p in procs:
            assert p.stdin is not None
            p.stdin.write(line)
            p.stdin.flush()
        replies = []
        for p in procs:
            out: IO[str] | None = p.stdout
            assert out is not None
            text = out.readline()
            if not text:
                raise SystemExit(f"worker {p.pid} exited ({p.poll()}) on {msg['op']}")
            reply = json.loads(text)
            if "error" in reply:
                raise SystemExit(f"worker {p.pid}: {reply['error']}")
            replies.append(reply)
        return replies

    def equal(self, full: bool = False) -> int:
        replies = self.ask({"op": "check", "full": full})
        for r in replies:
            if r.get("mismatch"):
                print(f"[fleet] not equal: {r['mismatch']}", file=sys.stderr, flush=True)
        return sum(r["equal"] for r in replies)

    def stats(self) -> dict[str, Any]:
        replies = self.ask({"op": "stats"})
        counters: Counter[str] = Counter()
        for r in replies:
            counters.update(r["counters"])
        return {"counters": counters, "cpu_s": sum(r["cpu_s"] for r in replies),
                "rss": sum(r["rss"] for r in replies), "threads": sum(r["threads"] for r in replies)}

    def close(self) -> None:
        try:
            self.ask({"op": "stop"})
        finally:
            for p in self.procs:
                try:
                    p.wait(30)
                except subprocess.TimeoutExpired:
                    p.kill()


class Feed:
    """df-feed in this process: a FeedPublisher on ``driver``, announced with role ``feed``;
    ``lose`` set drops its next envelope of the table."""

    def __init__(self, url: str, discovery_url: str, driver: str, renew: float, name: str):
        self.lose = threading.Event()
        self.store = open_bench_store(url)
        self.stats = Stats("feed", name)
        transport = LossyTransport(load_driver(driver).publisher(self.stats), self._drop)
        self.publisher = Publisher(transport, name, PublisherOptions(max_idle_time=1.0), self.stats)
        self.feed = FeedPublisher(self.store, self.publisher, None, compact_interval=0, bookmark_interval=0.2)
        self.discovery = open_discovery(discovery_url, 3 * renew, renew, DISCOVERY_PREFIX)
        #: Registrations that failed (the store too busy to answer within discovery's timeout) and
        #: were retried, as df-feed's start-up retries them.
        self.announcer, self.register_failures = retried(
            lambda: PublisherAnnouncer(self.discovery, self.publisher, role="feed"))
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self.feed.run, args=(self.stop,), name=name, daemon=True)
        self.thread.start()

    def _drop(self, topic: str, n: int) -> bool:
        if topic == TABLE and self.lose.is_set():
            self.lose.clear()
            return True
        return False

    def close(self) -> None:
        self.stop.set()
        self.thread.join(30)
        self.announcer.close()
        self.discovery.close()
        self.feed.close()
        self.publisher.close()
        self.store.close()


class Writer:
    """Updates random objects at ``rate`` a second, through the store only (df-feed publishes);
    keeps every version written and each write's latency."""

    def __init__(self, store: Store, objects: int, rate: float, seed: int = 1):
        self.store, self.objects, self.rate = store, objects, rate
        self.rng = random.Random(seed)
        self.gen = 0
        self.delta: dict[str, int] = {}
        self.latencies: list[float] = []
        #: Writes that timed out (WriteOutcomeUnknown), their outcome read back.
        self.unknown = 0
        self.lock = threading.Lock()  # the storm's probe writes from a thread while the fleet is checked

    def write(self, n: int, rate: float | None = None) -> None:
        """``n`` updates at ``rate`` (default: the writer's) a second."""
        period = 1.0 / (rate or self.rate)
        t_next = time.monotonic()
        self.gen += 1
        for _ in range(n):
            i = self.rng.randrange(self.objects)
            t0 = time.perf_counter()
            try:
                version = self.store.update(TABLE, key_of(i), port_value(i, self.gen)).version
            except WriteOutcomeUnknown:  # a timeout under load: the store says what became of it
                self.unknown += 1
                got = self.store.get(TABLE, key_of(i))
                assert got is not None
                version = got.version
            with self.lock:
                self.latencies.append(time.perf_counter() - t0)
                self.delta[key_of(i)] = version
            t_next += period
            time.sleep(max(0.0, t_next - time.monotonic()))

    def for_seconds(self, seconds: float, stop: threading.Event | None = None) -> int:
        n = 0
        t_end = time.monotonic() + seconds
        while time.monotonic() < t_end and not (stop and stop.is_set()):
            self.write(max(1, int(self.rate / 10)))
            n += max(1, int(self.rate / 10))
        return n

    def take(self) -> tuple[dict[str, int], list[float]]:
        """The versions written and the latencies since the last call."""
        with self.lock:
            delta, lat = self.delta, self.latencies
            self.delta, self.latencies = {}, []
        return delta, lat


class Run:
    def __init__(self, args: argparse.Namespace, url: str, meter: ServerMeter | None, fleet: Fleet,
                 discovery_url: str):
        self.args, self.url, self.meter, self.fleet, self.discovery_url = args, url, meter, fleet, discovery_url
        self.writer = Writer(open_bench_store(url), args.objects, args.rate)
        self.feed_n = 0
        self.feed = self.new_feed()
        self.rows: dict[str, dict[str, Any]] = {}

    def new_feed(self) -> Feed:
        self.feed_n += 1
        return Feed(self.url, self.discovery_url, self.args.pub_driver, self.args.renew, f"feed-{self.feed_n}")

    def sync_expected(self) -> None:
        delta, _ = self.writer.take()
        self.fleet.ask({"op": "expect", "delta": delta})

    def all_equal(self, full: bool = False) -> bool:
        """Every cache equals the store as the writer left it so far."""
        delta, lat = self.writer.take()
        with self.writer.lock:
            self.writer.latencies[:0] = lat  # the scenario's own figures read them after
        self.fleet.ask({"op": "expect", "delta": delta})
        return self.fleet.equal(full) == self.fleet.n

    def converge(self, timeout: float) -> tuple[float, bool]:
        """Seconds until every cache equals the store (cheap polls, then the full check)."""
        t0 = time.monotonic()
        deadline = t0 + timeout
        while not self.all_equal() and time.monotonic() < deadline:
            time.sleep(0.05)
        took = time.monotonic() - t0
        return took, self.all_equal(full=True)

    def measure(self, name: str, act: Any, writes_of: Any = None, timeout: float = 600.0) -> dict[str, Any]:
        """Counters around ``act()`` (which returns how many writes it made and when its trigger
        ended) and the convergence after it."""
        s0 = self.meter.read() if self.meter else None
        if self.meter and self.meter.process:
            self.meter.process.start()
        f0 = self.fleet.stats()
        unknown = self.writer.unknown
        t0 = time.monotonic()
        writes = act() or 0
        took, equal = self.converge(timeout)
        wall = time.monotonic() - t0
        f1 = self.fleet.stats()
        row: dict[str, Any] = {"writes": writes, "converge_s": took, "equal": equal, "wall_s": wall,
                               "write_timeouts": self.writer.unknown - unknown}
        if self.meter:
            row.update(self.meter.delta(s0, self.meter.read()))
            if self.meter.process:
                p = self.meter.process.take()
                row.update(store_cpu_s=p["cpu_s"], store_peak_rss=p["peak_rss"], store_rss=p["rss"])
        dc = f1["counters"] - f0["counters"]
        n = self.fleet.n
        row.update(
            ctl_cpu_s=f1["cpu_s"] - f0["cpu_s"], fleet_rss=f1["rss"], threads=f1["threads"],
            entries=dc["replay_entries"], objects=dc["replay_objects"], listed=dc["relist_objects"],
            replays=sum(v for k, v in dc.items() if k.startswith("replays:")),
            relists=sum(v for k, v in dc.items() if k.startswith("relists:")),
            proofs=dc["checkpoint_proofs"], bookmark_moves=dc["bookmark_moves"],
            discovery_failures=dc["discovery_failures"],
            causes=sorted(k for k in dc if k.startswith(("replays:", "relists:"))))
        idle = self.rows.get("idle")
        if idle and "bytes" in row:  # beyond the fleet's background (discovery polls, hellos)
            row["bytes_net"] = row["bytes"] - idle["bytes_per_s"] * wall
        row["cpu_per_event_us"] = row["ctl_cpu_s"] / (writes * n) * 1e6 if writes else None
        row["read_share"] = (row["entries"] + row["objects"] + row["listed"]) / (writes * n) if writes else None
        self.rows[name] = row
        print(f"[{name}] {fmt(row)}", flush=True)
        return row

    # -- scenarios ------------------------------------------------------------------------------

    def fleet_op(self, name: str, op: str) -> None:
        """Every worker does ``op`` (``start``: the cold start; ``restart``: the rolling restart)."""
        def act() -> int:
            self.fleet.ask({"op": op})
            return 0
        self.measure(name, act)

    def idle(self) -> None:
        def act() -> int:
            stop = time.monotonic() + self.args.idle_s
            while time.monotonic() < stop:  # a probe write a 10th of a second: the idle latency
                self.writer.write(1, rate=10)
            return 0
        row = self.measure("idle", act)
        _, lat = self.writer.take()
        row["writer_p99_ms"] = pct(lat, 0.99) * 1000 if lat else None
        row["bytes_per_s"] = row.get("bytes", 0) / max(row["wall_s"], 1e-9)

    def steady(self, name: str, seconds: float, trust: bool) -> None:
        self.fleet.ask({"op": "trust", "on": trust})
        self.measure(name, lambda: self.writer.for_seconds(seconds))
        self.fleet.ask({"op": "trust", "on": True})

    def lost(self) -> None:
        def act() -> int:
            self.feed.lose.set()
            self.writer.write(5)
            return 5
        self.measure("lost", act)

    def relists(self) -> int:
        return sum(v for k, v in self.fleet.stats()["counters"].items() if k.startswith("relists:"))

    def dead(self) -> None:
        """An API worker that publishes its writes itself is killed -9 after they arrived: every
        controller declares it dead (3 x ``--idle``) and repairs; nothing was lost."""
        cfg = {"url": self.url, "discovery_url": self.discovery_url, "pub_driver": self.args.pub_driver,
               "idle": self.args.idle, "renew": self.args.renew, "objects": self.args.objects}
        proc = subprocess.Popen([sys.executable, __file__, "--api-writer", json.dumps(cfg)], stdin=subprocess.PIPE,
                                stdout=subprocess.PIPE, text=True)
        assert proc.stdin is not None and proc.stdout is not None
        pid = json.loads(proc.stdout.readline())["id"]

        def known() -> int:
            return sum(r["count"] for r in self.fleet.ask({"op": "peers", "id": pid}))
        at_kill: dict[str, Any] = {}
        try:
            wait_for(lambda: known() == self.fleet.n, 120, "every controller to hear the API worker", poll=0.2)

            def act() -> int:
                proc.stdin.write("5\n")  # type: ignore[union-attr]
                proc.stdin.flush()  # type: ignore[union-attr]
                with self.writer.lock:
                    self.writer.delta.update(json.loads(proc.stdout.readline()))  # type: ignore[union-attr]
                wait_for(self.all_equal, 60, "the API worker's writes to arrive", poll=0.1)
                # The repair is what the kill costs: a checkpoint while the writes were on their way
                # may have read an object whose newest write had not arrived yet (rightly).
                at_kill.update(self.fleet.stats()["counters"])
                proc.kill()
                wait_for(lambda: known() == 0, 60 + 10 * self.args.idle, "every controller to declare it dead",
                         poll=0.2)
                return 5
            row = self.measure("dead", act)
            after = self.fleet.stats()["counters"]
            row["repair_objects"] = after["replay_objects"] - at_kill.get("replay_objects", 0)
        finally:
            proc.kill()
            proc.wait()

    def partition(self) -> None:
        cut = self.fleet.procs[:max(1, len(self.fleet.procs) // 10)]

        def act() -> int:
            for p in cut:
                os.kill(p.pid, signal.SIGSTOP)
            try:
                return self.writer.for_seconds(self.args.partition_s)
            finally:
                for p in cut:
                    os.kill(p.pid, signal.SIGCONT)
        row = self.measure("partition", act)
        row["cut"] = sum(self.fleet.sizes[: len(cut)])

    def history(self) -> None:
        """df-feed gone, history trimmed past every position, a new df-feed: every controller relists
        (those whose checkpoint came while df-feed was down first). Counted from df-feed's stop."""
        lat: list[float] = []
        before = self.relists()

        def act() -> int:
            self.feed.close()
            trimmer = open_store(self.url, [TABLE], **({} if self.url.startswith("sqlite") else {"prefix": PREFIX}),
                                 feed_retention=FeedRetention(max_entries=self.args.history_keep))
            saved, self.writer.store = self.writer.store, trimmer
            try:
                self.writer.write(self.args.history_writes, rate=1000)
                trimmer.compact_feed()
            finally:
                self.writer.store = saved
                trimmer.close()
            self.sync_expected()
            self.feed = self.new_feed()
            # The unrelated writer goes on during the storm (probe writes, a 10th of a second).
            stop, done = threading.Event(), threading.Event()
            probes = 0

            def probe() -> None:
                nonlocal probes
                while not stop.is_set():
                    self.writer.write(1, rate=10)
                    probes += 1
                done.set()
            threading.Thread(target=probe, daemon=True).start()
            # Every controller relisted (or, if some replayed, every cache holds every write; with
            # a write every 0.1 s that second test rarely holds across a busy fleet: a check is
            # against the writes made before it, the newest of which may still be on their way).
            wait_for(lambda: self.relists() - before >= self.fleet.n or self.all_equal(), self.args.history_timeout,
                     "every controller's relist", poll=0.2)
            stop.set()
            done.wait(10)
            lat.extend(self.writer.latencies)
            return self.args.history_writes + probes
        row = self.measure("history", act)
        row["converge_s"] = row["wall_s"]  # from df-feed's stop: the relists are the repair
        row["feed_register_failures"] = self.feed.register_failures
        row["writer_p99_ms"] = pct(lat, 0.99) * 1000 if lat else None

    def close(self) -> None:
        self.feed.close()
        self.writer.store.close()


def fmt(row: dict[str, Any]) -> str:
    mb = lambda k: f"{row[k] / 1e6:,.1f}" if row.get(k) is not None else "-"  # noqa: E731
    cpe = f"{row['cpu_per_event_us']:.0f}" if row.get("cpu_per_event_us") is not None else "-"
    return (f"store {mb('bytes')} MB in {row.get('commands', 0):,} cmds, cpu {row.get('store_cpu_s', 0):.1f}s, "
            f"peak rss {mb('store_peak_rss')} MB; took {row['wall_s']:.1f}s, caches equal after {row['converge_s']:.2f}s "
            f"({'all equal' if row['equal'] else '!! NOT EQUAL'}); writes {row['writes']}; replays {row['replays']}, "
            f"relists {row['relists']}, entries {row['entries']:,}, objects {row['objects']:,}, "
            f"listed {row['listed']:,}; ctl cpu {row['ctl_cpu_s']:.1f}s ({cpe} us/event/ctl); {row['causes']}"
            + "".join(f"; !! {row[k]} {k.replace('_', ' ')}" for k in ("discovery_failures", "write_timeouts",
                                                                        "feed_register_failures") if row.get(k)))


def print_table(args: argparse.Namespace, rows: dict[str, dict[str, Any]]) -> None:
    print(f"\nfleet: {args.controllers} controllers in {args.workers} processes, {args.objects:,} objects, "
          f"{args.store}, {args.pub_driver}")
    print(f"  {'scenario':<10}{'writes':>7}{'store MB':>10}{'cmds':>9}{'st cpu s':>9}{'peak MB':>9}"
          f"{'equal s':>9}{'replays':>8}{'relists':>8}{'entries':>10}{'objects':>11}{'ctl cpu s':>10}{'us/ev/ctl':>10}")
    for name, r in rows.items():
        cpe = f"{r['cpu_per_event_us']:.0f}" if r.get("cpu_per_event_us") is not None else "-"
        print(f"  {name:<10}{r['writes']:>7}{r.get('bytes', 0) / 1e6:>10.2f}{r.get('commands', 0):>9,}"
              f"{r.get('store_cpu_s', 0):>9.1f}{r.get('store_peak_rss', 0) / 1e6:>9.1f}{r['converge_s']:>9.2f}"
              f"{r['replays']:>8}{r['relists']:>8}{r['entries']:>10,}{r['objects'] + r['listed']:>11,}"
              f"{r['ctl_cpu_s']:>10.1f}{cpe:>10}" + ("" if r["equal"] else "  !! caches unlike the store"))
    sys.stdout.flush()


def discovery_url_of(url: str, tmp: Path) -> str:
    return f"sqlite:///{tmp}/discovery.sqlite" if url.startswith("sqlite") else url


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    parser.add_argument("--api-writer", help=argparse.SUPPRESS)
    parser.add_argument("--store", default="redis", choices=("redis", "etcd", "sqlite"))
    parser.add_argument("--controllers", type=int, default=100)
    parser.add_argument("--workers", type=int, default=10, help="worker processes the controllers share")
    parser.add_argument("--objects", type=int, default=20000)
    parser.add_argument("--rate", type=float, default=100.0, help="writes a second in steady writes")
    parser.add_argument("--duration", type=float, default=120.0, help="seconds of steady writes")
    parser.add_argument("--baseline-duration", type=float, default=0.0,
                        help="seconds of the baseline (bookmarks ignored); default: half of --duration")
    parser.add_argument("--checkpoint", type=float, default=10.0, help="the controllers' checkpoint_interval (s)")
    parser.add_argument("--idle-s", type=float, default=5.0, help="seconds of the idle scenario")
    parser.add_argument("--partition-s", type=float, default=30.0, help="seconds a tenth of the fleet is stopped")
    parser.add_argument("--history-writes", type=int, default=200,
                        help="writes while df-feed is down (fewer than a replay may read: the relists are "
                        "for history gone, not for too much to replay)")
    parser.add_argument("--history-keep", type=int, default=50, help="feed entries the store keeps meanwhile")
    parser.add_argument("--history-timeout", type=float, default=600.0, help="seconds the storm may take")
    parser.add_argument("--window", type=float, default=0.2, help="the controllers' message delay window (s)")
    parser.add_argument("--idle", type=float, default=2.0, help="the controllers' max_idle_time (s)")
    parser.add_argument("--renew", type=float, default=3.0,
                        help="discovery's renew interval (TTL 3x; its calls' timeout too), df-controller's default")
    parser.add_argument("--driver", default="zmq", help="the pub/sub driver: zmq, or a driver URL both sides use")
    parser.add_argument("--scenarios", default="cold,idle,lost,dead,steady,baseline,partition,restart,history")
    parser.add_argument("--load-threads", type=int, default=16)
    parser.add_argument("--relist-slots", type=int, default=8,
                        help="relists the store serves at once over the fleet ([relist] slots; 0: no bound)")
    parser.add_argument("--relist-jitter", type=float, default=2.0, help="[relist] jitter before a relist asks (s)")
    parser.add_argument("--page-size", type=int, default=5000, help="[relist] page_size of a listing of values")
    parser.add_argument("--pin-fleet", action="store_true",
                        help="the controllers' processes on every CPU but the first, the store server, df-feed and "
                        "the writers on the first: what the store does to its other clients, without the "
                        "fleet's own CPU on the same cores (on a real fleet, each controller has its host)")
    parser.add_argument("--warm", action="store_true",
                        help="controllers keep a state_dir (a snapshot written at each stop): restarts resume from it")
    args = parser.parse_args(argv)
    if args.worker:
        return worker_main(json.loads(args.worker))
    if args.api_writer:
        return api_writer_main(json.loads(args.api_writer))
    args.baseline_duration = args.baseline_duration or args.duration / 2
    args.pub_driver, sub_driver = ("zmq+tcp://127.0.0.1:0", "zmq") if args.driver == "zmq" else (args.driver,) * 2
    scenarios = [s for s in args.scenarios.split(",") if s]
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(1))  # stop the workers and the store server on the way out
    logging.basicConfig(level=logging.ERROR)
    t_start = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="bench-fleet-") as tmp, \
            private_store(args.store, Path(tmp) / args.store) as (url, meter):
        loader = open_bench_store(url)
        took = load(loader, 0, args.objects, args.load_threads)
        expected = {o.key: o.version for o in loader.list_versions([TABLE])}
        loader.close()
        print(f"[{args.store}] loaded {args.objects:,} objects in {took:.1f}s (not counted)", flush=True)
        truth = Path(tmp) / "expected.json"
        truth.write_text(json.dumps(expected), encoding="ascii")
        discovery_url = discovery_url_of(url, Path(tmp))
        args.state_root = str(Path(tmp) / "state") if args.warm else None
        args.fleet_cpus = pin(args, meter)
        fleet = Fleet(args, url, discovery_url, sub_driver)
        run = None
        try:
            fleet.ask({"op": "expect", "file": str(truth)})
            run = Run(args, url, meter, fleet, discovery_url)
            steps = {"cold": lambda: run.fleet_op("cold", "start"), "idle": run.idle,
                     "steady": lambda: run.steady("steady", args.duration, True),
                     "baseline": lambda: run.steady("baseline", args.baseline_duration, False),
                     "lost": run.lost, "dead": run.dead, "partition": run.partition,
                     "restart": lambda: run.fleet_op("restart", "restart"), "history": run.history}
            for name in scenarios:
                steps[name]()
            rows = run.rows
        finally:
            if run is not None:
                run.close()
            fleet.close()
    print_table(args, rows)
    result: dict[str, Any] = {"bench": "fleet", "ratio": None, "store": args.store, "controllers": args.controllers,
                              "workers": args.workers, "objects": args.objects, "driver": args.driver,
                              "warm": args.warm, "pinned": bool(args.fleet_cpus),
                              "run_s": round(time.monotonic() - t_start)}
    for name, r in rows.items():
        for k in ("bytes", "bytes_net", "fleet_rss", "threads", "wall_s", "commands", "store_cpu_s", "store_peak_rss", "converge_s", "replays", "relists",
                  "entries", "objects", "listed", "writes", "cpu_per_event_us", "read_share", "writer_p99_ms",
                  "feed_register_failures", "write_timeouts", "discovery_failures", "repair_objects"):
            if r.get(k) is not None:
                result[f"{name}_{k}"] = round(r[k], 4) if isinstance(r[k], float) else r[k]
    if "steady" in rows and "baseline" in rows:
        with_, without = rows["steady"]["read_share"], rows["baseline"]["read_share"]
        result["steady_read_share"] = round(with_, 5)
        result["baseline_read_share"] = round(without, 5)
        result["ratio"] = round(with_ / without, 5) if without else None
        for name in ("steady", "baseline"):  # the store's bytes a write cost, per controller
            r = rows[name]
            if r.get("bytes_net") is not None and r["writes"]:
                result[f"{name}_bytes_per_write_ctl"] = round(r["bytes_net"] / (r["writes"] * args.controllers), 1)
    if "history" in rows and "cold" in rows and "idle" in rows:
        h = rows["history"]
        result["history_listed_per_controller"] = round(h["listed"] / (args.controllers * args.objects), 3)
        if h.get("writer_p99_ms") and rows["idle"].get("writer_p99_ms"):
            result["history_p99_over_idle"] = round(h["writer_p99_ms"] / rows["idle"]["writer_p99_ms"], 2)
        if h.get("store_peak_rss") and rows["idle"].get("store_rss"):
            result["history_peak_rss_over_idle"] = round(h["store_peak_rss"] / rows["idle"]["store_rss"], 2)
    result["unequal"] = [name for name, r in rows.items() if not r["equal"]]
    print(json.dumps(result), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
