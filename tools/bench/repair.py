"""repair: what a controller's repair costs the store, by replaying the change feed against relisting.

For each store (SQLite file, a private Redis, a private etcd, servers on free
loopback ports in a temp dir) and each table size (``--sizes``, default
20,000 and 200,000 port-like objects of ~190 bytes; the store is loaded
once to the small size, then topped up to the large one; load time is
printed, not counted), ``--controllers`` controllers (4) run **in this
process** on ZeroMQ (tcp loopback), each with a store handle of its own, and
one publisher writes through the store and publishes (``NbApi``). Per
repair:

* **lost envelope**: ``--writes`` updates (5), one envelope each, the third
  dropped by :class:`~dfpubsub.testing.LossyTransport`. The frames are held
  back until the writes committed and the store's counters were read, then
  released: every controller finds the gap, waits the delay window
  (``--window``) and repairs. Latency: from the first controller's
  ``gap_expired`` request (the window's close) to the last controller's
  repair ending with the lost write in its cache (``on_reconciled``), p50/p99
  over ``--trials`` (with 30 trials p99 is the slowest but one).
* **dead publisher**: a second publisher (``max_idle_time`` ``--idle``) writes
  ``--writes`` updates; once every cache holds them its transport is cut
  (every frame dropped, no bye: to the controllers the process died) and the
  controllers declare it dead after 3 x ``--idle`` and repair. Nothing was
  lost: a replay should read feed entries only, zero objects.
* the same two repairs **by relisting**, in the same run and on the same
  controllers, as the baseline: the runtime's ``replay`` is swapped for one
  that refuses (TooFarBehind), so each repair takes the relist path it falls
  back to (``relists{reason=too_far_behind}``: versions of the whole topic,
  then the values that differ), as before replay existed.
  ``ControllerOptions(replay_max_ratio=1e-9)`` cannot force it: the limit is
  at least 1000 entries.
* **foreign head** (``--foreign-trials``): a lost envelope whose store
  server's last write is another store's (another prefix, the same server).
  On etcd the head a replay reads up to is the server's revision, which no
  entry of this store reaches.
* **busy** (``--busy``, the smallest size only): a lost envelope after N
  writes delivered without loss since the last repair (1,000, and the most
  entries a replay may read): a replay reads every entry since the last
  repair, not only what was missed.

A repair that ends (``on_reconciled``) with a controller still missing the
lost write ``--settle`` seconds later is reported (``!!``, ``unrepaired``);
the bench then relists that controller, so that later trials start in sync.

What the store served for the repairs (measured by ``storemeter.py``, which the fleet benchmark
shares), read around them with nothing else
talking to the store (the writes committed before the first read; the
controllers' checkpoint timer is off):

* Redis: ``INFO stats`` ``total_net_output_bytes`` and ``INFO commandstats``
  deltas on the private server, read over a raw socket so that the INFO
  replies' own bytes (known exactly) are taken out; commands exclude INFO
  and include those the store's scripts run (as ``total_commands_processed``
  counts them: one HMGET per object of a listing's script).
* etcd: its Prometheus ``/metrics`` on the client URL:
  ``etcd_network_client_grpc_sent_bytes_total`` and the RPCs started
  (``grpc_server_started_total``, by method); the scrape is HTTP, not gRPC.
* SQLite has no server: rows and bytes read **at the store API**, by
  wrapping the real store handles' ``get_many``, ``list_at``, ``list_packed_at``,
  ``list_versions_at``, ``_read_feed`` and ``feed_head`` for the run (a
  measuring wrapper around the real calls, not a mock). Bytes are the
  decoded fields re-measured: strings' UTF-8 length, 8 per integer, the
  value re-encoded with msgpack. The same wrapper runs on Redis and etcd too
  (``api rows``, ``api bytes``; on etcd the feed reader's reads) as a
  cross-check.

Also per repair, summed over the controllers: the feed entries and objects
they report reading (``replay_entries``, ``replay_objects``,
``relist_objects``).

In-process: the controllers share one interpreter (and its GIL), so a
relist's wall time is about the four relists' CPU one after the other; the
store figures are not affected. Replay latencies on SQLite and Redis are a
few ms either way.

Headline, per store at the largest size: bytes of a lost-envelope repair by
relist / by replay (target >= 100), and replay bytes at the largest size /
at the smallest (target <= 1.2); lost-envelope p99 (target <= 50 ms); objects
read by the dead-publisher replay (target 0).

Last line: ``{"bench": "repair", "ratio": R, "<store>_ratio": R, "<store>_dead_ratio": R,
"<store>_growth": G, "<store>_p50_ms": X, "<store>_p99_ms": X, "<store>_dead_objects": N,
"<store>_foreign_p50_ms": X, "<store>_after_<N>_bytes": B, "<store>_unrepaired": N, ...,
"unrepaired": N}`` where ``ratio`` is the least ``<store>_ratio`` (relist bytes / replay bytes
at the largest size) and ``unrepaired`` counts controller repairs that ended without the lost write.
"""

from __future__ import annotations

import argparse
import json
import logging
import random
import statistics
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from storemeter import (
    TABLE,
    ApiMeter,
    ServerMeter,
    key_of,
    load,
    open_bench_store,
    pct,
    port_value,
    private_store,
    wait_for,
    wait_until,
)

import dfpubsub.controller.runtime as runtime_module
from dfpubsub import Controller, ControllerOptions, NbApi, Publisher, PublisherOptions, SubscriberOptions
from dfpubsub.controller.replay import TooFarBehind
from dfpubsub.metrics import Stats
from dfpubsub.plugins import load_driver
from dfpubsub.store import Store, open_store
from dfpubsub.testing import LossyTransport
from dfpubsub.tracker import ResyncRequest
from dfpubsub.transport import PublisherTransport

# -- transports -------------------------------------------------------------------------------


class Gate(PublisherTransport):
    """Holds frames back while ``holding`` (released, in order, before the next frame sent
    once ``release`` was asked: that send is made under the publisher's lock, as every send of
    its socket must be), and drops every frame once ``cut`` (a publisher gone silent, no bye)."""

    def __init__(self, inner: PublisherTransport):
        self.inner = inner
        self.holding = False
        self.releasing = False
        self.cut = False
        self.held: list[tuple[str, bytes]] = []

    @property
    def uri(self) -> str:
        return self.inner.uri

    def send(self, topic: str, frame: bytes) -> None:
        if self.cut:
            return
        if self.releasing:
            self.releasing = self.holding = False
            held, self.held = self.held, []
            for t, f in held:
                self.inner.send(t, f)
        if self.holding:
            self.held.append((topic, bytes(frame)))
            return
        self.inner.send(topic, frame)

    def release(self, publisher: Publisher) -> None:
        """Send what was held, then a hello (the send that carries them out)."""
        self.releasing = True
        publisher.hello("release")

    def new_subscribers(self) -> int:
        return self.inner.new_subscribers()

    def close(self) -> None:
        self.inner.close()


class DropOne:
    """A LossyTransport rule dropping the envelope numbered ``target`` (1-based per topic)."""

    def __init__(self) -> None:
        self.target = 0
        self.sent: Counter[str] = Counter()

    def __call__(self, topic: str, n: int) -> bool:
        self.sent[topic] = n
        return topic == TABLE and n == self.target


# -- controllers ------------------------------------------------------------------------------


class Probe:
    """One controller, its store handle and what its callbacks saw."""

    def __init__(self, ctl: Controller):
        self.ctl = ctl
        self.gap_at: float | None = None
        self.repaired_at: float | None = None
        self.repairs = 0

    def on_gap(self, req: ResyncRequest) -> None:
        if self.gap_at is None and req.reason in ("gap_expired", "publisher_lost"):
            self.gap_at = time.perf_counter()

    def on_reconciled(self, topics: set[str], changes: list[Any]) -> None:
        self.repaired_at = time.perf_counter()
        self.repairs += 1

    def reset(self) -> None:
        self.gap_at = self.repaired_at = None


def start_controllers(url: str, n: int, window: float, meter: ApiMeter) -> list[Probe]:
    probes: list[Probe] = []
    for i in range(n):
        store = open_bench_store(url)
        meter.wrap(store)
        probe = Probe(None)  # type: ignore[arg-type]
        ctl = Controller(
            store, load_driver("zmq").subscriber(Stats("subscriber", f"ctl{i}")), [TABLE],
            options=SubscriberOptions(message_delay_window=window), name=f"ctl{i}",
            on_gap=probe.on_gap, on_reconciled=probe.on_reconciled,
            # Nothing but the repairs measured may read the store: no checkpoint replays.
            runtime=ControllerOptions(checkpoint_interval=0),
        )
        probe.ctl = ctl
        probes.append(probe)
    return probes


def counters(probes: list[Probe]) -> Counter[str]:
    total: Counter[str] = Counter()
    for p in probes:
        total.update(p.ctl.stats.snapshot())
    return total


@contextmanager
def relisting() -> Iterator[None]:
    """Every repair of the controllers in this process falls back to relist (too_far_behind): the
    runtime's ``replay`` (its module global) refuses."""
    namespace = vars(runtime_module)
    real = namespace["replay"]

    def refuse(*args: Any, **kwargs: Any) -> Any:
        raise TooFarBehind("bench: the relist baseline")

    namespace["replay"] = refuse
    try:
        yield
    finally:
        namespace["replay"] = real


# -- one store, one size ----------------------------------------------------------------------


class Bench:
    def __init__(self, url: str, server: ServerMeter | None, size: int, args: argparse.Namespace):
        self.url, self.server, self.size, self.args = url, server, size, args
        self.rng = random.Random(size)
        self.gen = 0
        self.api_meter = ApiMeter()
        self.writer = open_bench_store(url)
        self.drop = DropOne()
        self.gate = Gate(load_driver("zmq+tcp://127.0.0.1:0").publisher(Stats("publisher", "api")))
        self.pub = Publisher(LossyTransport(self.gate, self.drop), "api")
        self.api = NbApi(self.writer, self.pub)
        self.probes = start_controllers(url, args.controllers, args.window, self.api_meter)

    def start(self) -> float:
        t0 = time.perf_counter()
        for p in self.probes:
            p.ctl.connect(self.pub.transport.uri)
            p.ctl.start()
        for p in self.probes:
            if not p.ctl.synced.wait(600):
                raise SystemExit(f"{p.ctl.name} did not sync")
            if len(p.ctl.cache) != self.size:
                raise SystemExit(f"{p.ctl.name} holds {len(p.ctl.cache)} objects, the store {self.size}")
        elapsed = time.perf_counter() - t0
        self.await_hello(self.pub)
        return elapsed

    def await_hello(self, pub: Publisher) -> None:
        wait_for(lambda: all(pub.id in p.ctl.subscriber.tracker.peers for p in self.probes), 30,
                 f"every controller to hear publisher {pub.name}")

    def close(self) -> None:
        for p in self.probes:
            p.ctl.stop()
            p.ctl.store.close()
        self.pub.close()
        self.writer.close()

    def _keys(self) -> list[int]:
        return self.rng.sample(range(self.size), self.args.writes)

    def _repaired(self, before: list[int]) -> Callable[[], bool]:
        return lambda: all(p.repairs > b for p, b in zip(self.probes, before))

    def _measure(self, trigger: Callable[[], None], done: Callable[[], bool], timeout: float) -> dict[str, Any]:
        """Store counters and controller counters around ``trigger()`` .. ``done()``."""
        c0 = counters(self.probes)
        s0 = self.server.read() if self.server else None
        self.api_meter.start()
        trigger()
        wait_for(done, timeout, "every controller's repair")
        api = self.api_meter.take()
        s1 = self.server.read() if self.server else None
        c1 = counters(self.probes)
        out: dict[str, Any] = dict(api)
        if self.server:
            out.update(self.server.delta(s0, s1))
        else:
            out.update(bytes=api["api_bytes"], commands=api["api_calls"], by_command=api["api_by_call"])
        dc = c1 - c0
        out.update(entries=dc["replay_entries"], objects=dc["replay_objects"], listed=dc["relist_objects"],
                   replays=sum(v for k, v in dc.items() if k.startswith("replays:")),
                   relists=sum(v for k, v in dc.items() if k.startswith("relists:")),
                   causes=sorted(k for k in dc if k.startswith(("replays:", "relists:"))))
        return out

    def background(self, writes: int) -> None:
        """``writes`` updates delivered to every controller (nothing lost), before a trial."""
        last, version = "", 0
        self.gen += 1
        for _ in range(writes):
            i = self.rng.randrange(self.size)
            last, version = key_of(i), self.api.update(TABLE, key_of(i), port_value(i, self.gen)).version
        self.pub.flush()
        wait_for(lambda: all(p.ctl.cache.get(TABLE, last).version == version  # type: ignore[union-attr]
                             for p in self.probes), 60, "the background writes to arrive", 0.01)

    def lost_envelope(self, foreign: Store | None = None) -> dict[str, Any]:
        """One envelope of ``--writes`` lost: the repair's cost and latency. ``foreign``: a store
        beside this one in the same server (another prefix) written last, before the release."""
        keys = self._keys()
        lost = keys[2] if len(keys) >= 3 else keys[-1]
        self.gen += 1
        for p in self.probes:
            p.reset()
        before = [p.repairs for p in self.probes]
        self.gate.holding = True
        self.drop.target = self.drop.sent[TABLE] + min(3, len(keys))
        version = 0
        for i in keys:
            obj = self.api.update(TABLE, key_of(i), port_value(i, self.gen))
            self.pub.flush()  # one envelope per write
            if i == lost:
                version = obj.version
        if foreign is not None:
            foreign.update(TABLE, key_of(0), port_value(0, self.gen))

        def has(p: Probe) -> bool:
            o = p.ctl.cache.get(TABLE, key_of(lost))
            return o is not None and o.version == version

        head = self.writer.feed_head()
        out = self._measure(lambda: self.gate.release(self.pub), self._repaired(before), self.args.timeout)
        closes = [p.gap_at for p in self.probes]
        dones = [p.repaired_at for p in self.probes]
        if None in closes or None in dones:
            raise SystemExit(f"a controller repaired without a gap request: {closes} {dones}")
        out["unrepaired"] = 0
        if not wait_until(lambda: all(has(p) for p in self.probes), self.args.settle):
            # Every controller's repair ended, and one still misses the lost write: say so, then
            # repair it (a manual resync) so that the next trials start from caches in sync.
            missing = [p for p in self.probes if not has(p)]
            out["unrepaired"] = len(missing)
            print(f"  !! {len(missing)} controller(s) missed the lost write {key_of(lost)}@{version} "
                  f"{self.args.settle:.0f}s after their repair ended: "
                  + ", ".join(f"{p.ctl.name} holds @{p.ctl.cache.get(TABLE, key_of(lost)).version} "  # type: ignore[union-attr]
                              f"position {min(p.ctl.positions.values())} < head {head}" for p in missing), flush=True)
            again = [p.repairs for p in missing]
            with relisting():  # a replay might stop short again
                for p in missing:
                    p.ctl.subscriber.request_resync([TABLE], "manual")
                wait_for(lambda: all(p.repairs > b for p, b in zip(missing, again)) and all(has(p) for p in missing),
                         60, "the manual repair of the lost write")
            return out
        out["latency_ms"] = (max(dones) - min(closes)) * 1000  # type: ignore[type-var, operator]
        out["per_controller_ms"] = [(d - c) * 1000 for c, d in zip(closes, dones)]  # type: ignore[operator]
        return out

    def dead_publisher(self) -> dict[str, Any]:
        """A second publisher writes, everything arrives, then it goes silent for good."""
        gate = Gate(load_driver("zmq+tcp://127.0.0.1:0").publisher(Stats("publisher", "api-2")))
        pub = Publisher(gate, "api-2", PublisherOptions(max_idle_time=self.args.idle))
        api = NbApi(self.writer, pub)
        for p in self.probes:
            p.ctl.connect(gate.uri)
        self.await_hello(pub)
        self.gen += 1
        written = {}
        for i in self._keys():
            written[key_of(i)] = api.update(TABLE, key_of(i), port_value(i, self.gen)).version
        pub.flush()
        wait_for(lambda: all(p.ctl.cache.get(TABLE, k).version == v  # type: ignore[union-attr]
                             for p in self.probes for k, v in written.items()), 30, "the writes to arrive")
        for p in self.probes:
            p.reset()
        before = [p.repairs for p in self.probes]
        t0 = time.perf_counter()
        out = self._measure(lambda: setattr(gate, "cut", True), self._repaired(before),
                            max(self.args.timeout, 30 + 10 * self.args.idle))
        out["detected_s"] = max(p.gap_at for p in self.probes) - t0  # type: ignore[type-var, operator]
        out["latency_ms"] = (max(p.repaired_at for p in self.probes)  # type: ignore[type-var, operator]
                             - min(p.gap_at for p in self.probes)) * 1000  # type: ignore[type-var]
        pub.close()  # its bye is dropped too
        for p in self.probes:
            p.ctl.subscriber.disconnect(gate.uri)
        return out

    def run(self, mode: str) -> dict[str, list[dict[str, Any]]]:
        a = self.args
        trials = a.trials if mode == "replay" else a.relist_trials
        lost, dead = [], []
        for _ in range(trials):
            lost.append(self.lost_envelope())
            time.sleep(a.pace)  # pacing: let the resync scheduler's spacing pass
        for _ in range(a.dead_trials):
            dead.append(self.dead_publisher())
            time.sleep(a.pace)
        out = {"lost": lost, "dead": dead}
        if mode == "replay" and a.foreign_trials:
            # Another store's write (another prefix, the same server) is the server's last: on
            # etcd its revision is the head a replay reads up to, and no entry of ours reaches it.
            url = self.url.replace("nb.sqlite", "other.sqlite")
            foreign = open_store(url, [TABLE]) if url.startswith("sqlite") else open_store(url, [TABLE],
                                                                                          prefix="other")
            try:
                if foreign.get(TABLE, key_of(0)) is None:
                    foreign.create(TABLE, key_of(0), port_value(0))
                out["foreign"] = []
                for _ in range(a.foreign_trials):
                    out["foreign"].append(self.lost_envelope(foreign))
                    time.sleep(a.pace)
            finally:
                foreign.close()
        return out

    def busy(self, counts: list[int]) -> dict[str, list[dict[str, Any]]]:
        """A lost envelope after ``count`` writes delivered since the last repair, for each count."""
        out: dict[str, list[dict[str, Any]]] = {}
        for count in dict.fromkeys(counts):
            self.background(count)
            out[f"lost after {count:,} ok"] = [self.lost_envelope()]
            time.sleep(self.args.pace)
        return out


# -- reporting --------------------------------------------------------------------------------


def summary(trials: list[dict[str, Any]]) -> dict[str, Any]:
    med = lambda k: statistics.median(t[k] for t in trials)  # noqa: E731
    unrepaired = sum(t.get("unrepaired", 0) for t in trials)
    repaired = [t for t in trials if "latency_ms" in t]
    lat = [t["latency_ms"] for t in repaired] or [float("nan")]
    out = {k: med(k) for k in ("bytes", "commands", "api_rows", "api_bytes", "entries", "objects", "listed",
                               "replays", "relists")}
    out.update(max_bytes=max(t["bytes"] for t in trials), p50_ms=pct(lat, 0.5), p99_ms=pct(lat, 0.99),
               n=len(trials), causes=sorted({c for t in trials for c in t["causes"]}),
               by_command=trials[-1].get("by_command", {}), unrepaired=unrepaired)
    if "unrepaired" in trials[0]:  # lost-envelope trials
        per = [x for t in repaired for x in t["per_controller_ms"]] or [float("nan")]
        out.update(ctl_p50_ms=pct(per, 0.5), ctl_p99_ms=pct(per, 0.99))
    if "detected_s" in trials[0]:
        out["detected_s"] = statistics.median(t["detected_s"] for t in trials)
    return out


def print_table(store: str, size: int, rows: dict[str, dict[str, Any]]) -> None:
    print(f"\n[{store}] {size:,} objects, {rows['lost replay']['n']} lost-envelope trials "
          "(figures per repair: all controllers together, median over trials)", flush=True)
    print(f"  {'repair':<22}{'bytes':>13}{'cmds':>7}{'api rows':>10}{'api bytes':>12}{'entries':>9}"
          f"{'objects':>9}{'listed':>9}{'p50 ms':>9}{'p99 ms':>9}  causes")
    for name, s in rows.items():
        print(f"  {name:<22}{s['bytes']:>13,.0f}{s['commands']:>7.0f}{s['api_rows']:>10,.0f}{s['api_bytes']:>12,.0f}"
              f"{s['entries']:>9.0f}{s['objects']:>9.0f}{s['listed']:>9,.0f}{s['p50_ms']:>9.1f}{s['p99_ms']:>9.1f}"
              f"  {','.join(s['causes'])}")
    for name, s in rows.items():
        extra = f"; detected dead after {s['detected_s']:.2f}s" if "detected_s" in s else \
            f"; per controller p50/p99 {s['ctl_p50_ms']:.1f}/{s['ctl_p99_ms']:.1f} ms"
        if s["unrepaired"]:
            extra += f"; !! {s['unrepaired']} controller repair(s) ended without the lost write"
        print(f"    {name}: store calls {s['by_command']}{extra}")
    sys.stdout.flush()


def measure_store(backend: str, tmp: Path, args: argparse.Namespace) -> dict[int, dict[str, dict[str, Any]]]:
    results: dict[int, dict[str, dict[str, Any]]] = {}
    with private_store(backend, tmp / backend) as (url, server):
        loader = open_bench_store(url)
        loaded = 0
        try:
            for size in sorted(args.sizes):
                took = load(loader, loaded, size, args.load_threads)
                print(f"[{backend}] loaded {size - loaded:,} objects ({size:,} in all) in {took:.1f}s "
                      "(not counted)", flush=True)
                loaded = size
                bench = Bench(url, server, size, args)
                try:
                    synced = bench.start()
                    print(f"[{backend}] {args.controllers} controllers synced {size:,} objects in {synced:.1f}s",
                          flush=True)
                    replay = bench.run("replay")
                    with relisting():
                        relist = bench.run("relist")
                    busy = bench.busy(busy_counts(args.busy, size)) if size == min(args.sizes) else {}
                finally:
                    bench.close()
                rows = {"lost replay": summary(replay["lost"]), "lost relist": summary(relist["lost"]),
                        "dead-publisher replay": summary(replay["dead"]),
                        "dead-publisher relist": summary(relist["dead"])}
                if "foreign" in replay:
                    rows["lost replay, foreign"] = summary(replay["foreign"])
                rows.update({name: summary(trials) for name, trials in busy.items()})
                print_table(backend, size, rows)
                results[size] = rows
        finally:
            loader.close()
    return results


def busy_counts(spec: str, size: int) -> list[int]:
    """``--busy``: counts of writes, ``limit`` standing for the most entries a replay may read."""
    limit = max(1000, int(ControllerOptions().replay_max_ratio * size))
    return [limit if x == "limit" else int(x) for x in spec.split(",") if x]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--sizes", default="20000,200000", help="table sizes, comma-separated")
    parser.add_argument("--stores", default="sqlite,redis,etcd")
    parser.add_argument("--controllers", type=int, default=4)
    parser.add_argument("--trials", type=int, default=30, help="lost-envelope repairs by replay per store and size")
    parser.add_argument("--relist-trials", type=int, default=3, help="lost-envelope repairs by relist")
    parser.add_argument("--dead-trials", type=int, default=2, help="dead-publisher repairs, each way")
    parser.add_argument("--writes", type=int, default=5, help="writes per trial (the third one's envelope is lost)")
    parser.add_argument("--window", type=float, default=0.2, help="the controllers' message delay window (s)")
    parser.add_argument("--idle", type=float, default=0.3,
                        help="the dying publisher's max_idle_time (s): declared dead after 3x that")
    parser.add_argument("--pace", type=float, default=0.15, help="seconds between trials")
    parser.add_argument("--load-threads", type=int, default=16)
    parser.add_argument("--settle", type=float, default=5.0,
                        help="seconds a cache may take, after its repair ended, to show the lost write")
    parser.add_argument("--timeout", type=float, default=300.0,
                        help="seconds a repair of every controller may take (four relists of the largest size in "
                        "one process, on a machine loaded by others)")
    parser.add_argument("--foreign-trials", type=int, default=3,
                        help="lost-envelope replays whose store server's last write is another store's")
    parser.add_argument("--busy", default="1000,limit",
                        help="at the smallest size, a lost envelope after this many writes delivered since the "
                        "last repair (limit: the most entries a replay may read); empty: none")
    args = parser.parse_args(argv)
    args.sizes = [int(x) for x in args.sizes.split(",") if x]
    logging.getLogger("dfpubsub").setLevel(logging.ERROR)  # a warning per gap, on purpose here
    stores = [s for s in args.stores.split(",") if s]
    large, small = max(args.sizes), min(args.sizes)
    result: dict[str, Any] = {"bench": "repair", "ratio": 0.0, "sizes": args.sizes, "controllers": args.controllers,
                              "in_process": True}
    ratios = []
    t_start = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="bench-repair-") as tmp:
        for backend in stores:
            res = measure_store(backend, Path(tmp), args)
            big, little = res[large], res[small]
            replay_b, relist_b = big["lost replay"]["bytes"], big["lost relist"]["bytes"]
            ratio = relist_b / max(replay_b, 1)
            dead_ratio = big["dead-publisher relist"]["bytes"] / max(big["dead-publisher replay"]["bytes"], 1)
            growth = replay_b / max(little["lost replay"]["bytes"], 1)
            ratios.append(ratio)
            result.update({
                f"{backend}_replay_bytes": round(replay_b), f"{backend}_relist_bytes": round(relist_b),
                f"{backend}_ratio": round(ratio, 1), f"{backend}_dead_ratio": round(dead_ratio, 1),
                f"{backend}_growth": round(growth, 3),
                f"{backend}_p50_ms": round(big["lost replay"]["p50_ms"], 2),
                f"{backend}_p99_ms": round(big["lost replay"]["p99_ms"], 2),
                f"{backend}_small_p99_ms": round(little["lost replay"]["p99_ms"], 2),
                f"{backend}_relist_p99_ms": round(big["lost relist"]["p99_ms"], 2),
                f"{backend}_dead_objects": int(big["dead-publisher replay"]["objects"]
                                               + big["dead-publisher replay"]["listed"]),
                f"{backend}_dead_entries": int(big["dead-publisher replay"]["entries"]),
                f"{backend}_unrepaired": sum(row["unrepaired"] for rows in res.values() for row in rows.values()),
            })
            if "lost replay, foreign" in big:
                result[f"{backend}_foreign_p50_ms"] = round(big["lost replay, foreign"]["p50_ms"], 2)
            for name, row in little.items():
                if name.startswith("lost after "):
                    count = name.split()[2].replace(",", "")
                    result[f"{backend}_after_{count}_bytes"] = round(row["bytes"])
                    result[f"{backend}_after_{count}_how"] = (
                        "relist" if not row["replays"] else "replay" if not row["relists"]
                        else f"{row['relists']:.0f} relist, {row['replays']:.0f} replay")
    print(f"\nheadline (at {large:,} objects; {small:,} for growth):")
    for backend in stores:
        print(f"  {backend:<7} replay {result[f'{backend}_replay_bytes']:>9,} B vs relist "
              f"{result[f'{backend}_relist_bytes']:>12,} B per lost envelope: {result[f'{backend}_ratio']:>9,.1f}x "
              f"fewer (target >= 100); dead publisher {result[f'{backend}_dead_ratio']:,.1f}x, "
              f"{result[f'{backend}_dead_objects']} objects read (target 0); replay cost {small:,} -> {large:,}: "
              f"{result[f'{backend}_growth']:.2f}x (target <= 1.2); p50/p99 {result[f'{backend}_p50_ms']:.1f}/"
              f"{result[f'{backend}_p99_ms']:.1f} ms (target p99 <= 50)"
              + (f"; !! {result[f'{backend}_unrepaired']} repair(s) ended without the lost write"
                 if result[f"{backend}_unrepaired"] else ""))
    print(f"  run took {time.perf_counter() - t_start:.0f}s")
    result["ratio"] = round(min(ratios), 1) if ratios else 0.0
    result["unrepaired"] = sum(result[f"{b}_unrepaired"] for b in stores)
    print(json.dumps(result), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
