"""Shared machinery of the end-to-end benchmarks (zmq_e2e, drivers_e2e).

One publisher process and one subscriber process run the full dfpubsub stack on
the driver a :class:`DriverSpec` names, with ~200-byte events round-robin on
four topics: flat out (throughput) or paced (latency). After each phase the
publisher flushes, closes (bye) and reports its final sequences; the subscriber
waits until every (topic, seq) sent was delivered or lies in the ``missing``
range of a ResyncRequest. The rest is ``lost_undetected`` (must be 0).
"""

from __future__ import annotations

import gc
import time
from array import array
from collections import Counter, defaultdict
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from multiprocessing.connection import Connection, wait
from multiprocessing.context import ForkServerContext
from multiprocessing.process import BaseProcess
from multiprocessing.synchronize import Event as MpEvent
from typing import Any

import msgpack
from latency_parts import GcPauses, Stamps, describe, instrument, p50_p99, parts_ms

from dfpubsub.codec import pack_event
from dfpubsub.events import Event
from dfpubsub.metrics import Stats
from dfpubsub.plugins import load_driver
from dfpubsub.publisher import Publisher, PublisherOptions
from dfpubsub.subscriber import Subscriber, SubscriberOptions
from dfpubsub.tracker import ResyncRequest

TOPICS = ("port", "network", "subnet", "router")
TABLE, WARM_TABLE = "bench", "warmup"
KEYS = [f"port-{i:06d}" for i in range(1024)]
EVENT_BYTES = 200
HWM = 100_000
CONNECT_TIMEOUT = 10.0
STALL_TIMEOUT = 5.0  # stop accounting when nothing more was delivered for this long
SAMPLE = 8  # the handler reads the clock (latency, window end) on one event in 8

VALUE: dict[str, Any] = {"name": "port-000001", "mac": "fa:16:3e:12:34:56", "fixed_ips": ["10.0.0.17"],
                         "status": "ACTIVE", "admin_state_up": True, "mtu": 1500, "description": ""}
while len(pack_event(TABLE, KEYS[0], "update", 123_456, VALUE, time.time())) < EVENT_BYTES:
    VALUE["description"] += "x"  # a port-like object padded so that one packed event is EVENT_BYTES long


def send_loop(burst: Callable[[int, int], None], seconds: float, rate: float) -> dict[str, Any]:
    """Call ``burst(i, n)`` (send events i..i+n-1) flat out (rate <= 0) or at ``rate``/s in 1 ms
    bursts; return the count, the wall time, the CPU used (in cores) and, paced, the harness's own
    tail: how much later than asked each sleep between ticks ended (``late``), and the burst sizes
    (``bursts``; a late tick sends a bigger one, which can switch batching on)."""
    clock, i, cpu0 = time.perf_counter, 0, time.process_time()
    start = next_tick = clock()
    end = start + seconds
    late: list[float] = []
    bursts: list[float] = []
    while (now := clock()) < end:
        if rate <= 0:
            burst(i, 64)
            i += 64
            continue
        due = int((now - start) * rate)
        if due > i:
            burst(i, due - i)
            bursts.append(due - i)
            i = due
        next_tick += 0.001
        wait = next_tick - clock()
        if wait > 0:
            time.sleep(wait)
            late.append(clock() - next_tick)
    elapsed = clock() - start
    return {"sent": i, "elapsed": elapsed, "cpu": (time.process_time() - cpu0) / elapsed,
            "late": p50_p99(late, 1e3), "bursts": p50_p99(bursts)}


def warm_up(publish: Callable[..., int], warm: MpEvent,
            flush: Callable[[], None] | None = None, packed: bytes | None = None) -> Callable[[int, int], None]:
    """Publish warm-up events until the subscriber says one per topic got through (its
    subscription is live); return the ``burst`` that publishes the measured events, and ends
    with ``flush()`` if one is given. ``packed``: the value's bytes, handed over as a store's
    are (wire schema 2)."""
    deadline = time.monotonic() + CONNECT_TIMEOUT
    while not warm.is_set():
        for topic in TOPICS:
            publish(topic, WARM_TABLE, "warm", "update", 1, VALUE, time.time(), packed)
        if not warm.wait(0.05) and time.monotonic() > deadline:
            raise TimeoutError("no warm-up event reached the subscriber")
    now, n_topics = time.time, len(TOPICS)

    def burst(i: int, n: int) -> None:
        for j in range(i, i + n):
            publish(TOPICS[j % n_topics], TABLE, KEYS[j & 1023], "update", j + 1, VALUE, now(), packed)
        if flush is not None:
            flush()

    return burst


def recv_from(conn: Connection, procs: list[BaseProcess], timeout: float) -> Any:
    """Receive from a child; fail fast if a child died or nothing came in time."""
    ready = wait([conn, *(p.sentinel for p in procs)], timeout)
    if conn in ready or conn.poll():
        return conn.recv()
    dead = [f"{p.name} (exit code {p.exitcode})" for p in procs if p.sentinel in ready]
    raise RuntimeError(f"child died: {', '.join(dead)}" if dead else f"no answer within {timeout:.0f}s")


def run_pair(ctx: ForkServerContext, label: str, pub: Callable[..., None], sub: Callable[..., None],
             seconds: float, rate: float, *extra: Any) -> tuple[dict[str, Any], dict[str, Any]]:
    """Start a publisher and a subscriber process (``extra`` args go to both), relay the
    endpoint and the publisher's report."""
    (pub_conn, pub_child), (sub_conn, sub_child), warm = ctx.Pipe(), ctx.Pipe(), ctx.Event()
    procs: list[BaseProcess] = [
        ctx.Process(target=sub, args=(sub_child, warm, *extra), name=f"{label}-sub"),
        ctx.Process(target=pub, args=(pub_child, warm, seconds, rate, *extra), name=f"{label}-pub"),
    ]
    for p in procs:
        p.start()
    try:
        sub_conn.send(recv_from(pub_conn, procs, CONNECT_TIMEOUT))  # the endpoint
        pub_res = recv_from(pub_conn, procs, seconds + 2 * CONNECT_TIMEOUT)
        sub_conn.send(pub_res)
        sub_res = recv_from(sub_conn, procs, 60.0)
        pub_conn.send("exit")
    finally:
        stop_all(procs)
    return pub_res, sub_res


@dataclass(frozen=True)
class DriverSpec:
    """Which driver the full stack runs on: the publisher's URL, the subscriber's, their options,
    whether the subscriber connects to the endpoint the publisher reports (ZeroMQ), and whether
    the publisher flushes at the end of each burst, as df-feed does after each page of its feed
    (else its batches leave when full or when their linger ends)."""

    pub_url: str
    sub_url: str
    options: dict[str, Any] = field(default_factory=dict)
    connect: bool = False
    flush_bursts: bool = False
    #: Wire schema: 2 publishes the value's bytes (as df-feed hands over the store's) and the
    #: subscriber hands them on packed (as a controller's does, for its cache).
    schema: int = 1


def pub_worker(conn: Connection, warm: MpEvent, seconds: float, rate: float, spec: DriverSpec) -> None:
    """Publisher process: start, wait until the subscriber is in, publish, close, report sequences."""
    stats = Stats("publisher", "bench-pub")
    pub = Publisher(load_driver(spec.pub_url, spec.options).publisher(stats), "bench-pub",
                    PublisherOptions(schema=spec.schema), stats)
    conn.send(pub.transport.uri)
    packed = msgpack.packb(VALUE) if spec.schema == 2 else None
    report = send_loop(warm_up(pub.publish, warm, pub.flush if spec.flush_bursts else None, packed), seconds, rate)
    pub.flush()
    pub.close()
    conn.send({**report, "id": pub.id, "seqs": pub.sequences(), "stats": stats.snapshot()})
    conn.recv()  # stay alive (ZeroMQ linger) until the subscriber has accounted for everything


class Recorder:
    """The subscriber's callbacks: count, sample latency, remember what was delivered and resynced.

    What it records lives in arrays, which the garbage collector does not walk: as lists, the
    million sequence numbers and latencies of a phase cost each full collection of the subscriber
    tens of milliseconds of cache misses, which showed up in the p99 as the pub/sub path's."""

    def __init__(self, warm: MpEvent):
        self.warm = warm
        self.warm_topics: set[str] = set()
        self.count = self.warm_count = self.last_count = 0
        self.first = self.last = 0.0  # clock at the first and at the last sampled event
        self.latencies = array("d")
        #: With ``stamps`` (latency_parts.instrument), each sampled latency's parts, three by three.
        self.stamps: Stamps | None = None
        self.parts = array("d")
        self.delivered: defaultdict[tuple[str, str], array[int]] = defaultdict(lambda: array("q"))
        self.requests: list[ResyncRequest] = []

    def on_event(self, event: Event) -> None:
        self.delivered[(event.publisher_id, event.topic)].append(event.seq)
        if event.table != TABLE:
            self.warm_count += 1
            self.warm_topics.add(event.topic)
            if len(self.warm_topics) == len(TOPICS) and not self.warm.is_set():
                self.warm.set()
            return
        self.count += 1
        if self.count % SAMPLE == 1:
            t = time.time()
            if self.count == 1:
                self.first = t
            self.last, self.last_count = t, self.count
            self.latencies.append(t - event.timestamp)
            if self.stamps is not None:
                queued = self.stamps.current
                self.parts.extend((event.sent_at - event.timestamp, queued - event.sent_at, t - queued))

    def rate(self) -> float:
        """Events handled per second between the first and the last sampled one."""
        window = self.last - self.first
        return (self.last_count - 1) / window if window > 0 else 0.0

    def on_resync(self, topics: set[str]) -> None:
        """No DB to reconcile against: the requests (``on_gap``) are what the bench checks."""

    def unaccounted(self, pid: str, seqs: dict[str, int]) -> tuple[int, int]:
        """(events sent but neither delivered nor in a resync range, events delivered twice)."""
        lost = dups = 0
        for topic, last in seqs.items():
            got_list = list(self.delivered.get((pid, topic), ()))
            got = set(got_list)
            dups += len(got_list) - len(got)
            for req in list(self.requests):
                if req.topic != topic or req.publisher_id != pid:
                    continue
                if req.missing is not None:
                    got.update(range(req.missing[0], req.missing[1] + 1))
                elif req.reason == "publisher_lost":  # the whole topic is resynced after its death
                    got.update(range(1, last + 1))
            lost += last - len(got.intersection(range(1, last + 1)))
        return lost, dups


def account(rec: Recorder, reports: list[dict[str, Any]],
            started: tuple[float, float] | None = None) -> tuple[int, int, float]:
    """Wait until every event the publishers ``reports`` (id and final sequences) sent was
    delivered or lies in a reported hole, or delivery stalled for STALL_TIMEOUT; return (events
    unaccounted for, duplicates, cores used from ``started`` (process, wall clock) until then)."""
    want = sum(sum(r["seqs"].values()) for r in reports)
    lost, dups, seen, cpu = want, 0, -1, 0.0
    deadline = time.monotonic() + STALL_TIMEOUT
    while time.monotonic() < deadline:
        total = rec.count + rec.warm_count
        if total != seen:
            deadline = time.monotonic() + STALL_TIMEOUT  # still delivering
        if total >= want or total == seen:  # complete, or stalled: count what is missing
            if started is not None and not cpu:
                cpu = (time.process_time() - started[0]) / (time.perf_counter() - started[1])
            counts = [rec.unaccounted(r["id"], r["seqs"]) for r in reports]
            lost, dups = sum(c[0] for c in counts), sum(c[1] for c in counts)
            if lost == 0:
                break
        seen = total
        time.sleep(0.05)
    return lost, dups, cpu


def percentiles_ms(latencies: Iterable[float]) -> dict[str, float]:
    """``p50_ms`` and ``p99_ms`` of latencies given in seconds."""
    found = p50_p99(latencies, 1e3)
    return {"p50_ms": found.get("p50", 0.0), "p99_ms": found.get("p99", 0.0)}


def stop_all(procs: list[BaseProcess]) -> None:
    """Join the children, terminating those that do not exit within 5 s."""
    for p in procs:
        p.join(5)
        if p.is_alive():
            p.terminate()


def sub_worker(conn: Connection, warm: MpEvent, spec: DriverSpec) -> None:
    """Subscriber process: subscribe, deliver, then account for every event the publisher sent."""
    rec = Recorder(warm)
    stats = Stats("subscriber", "bench-sub")
    transport = load_driver(spec.sub_url, spec.options).subscriber(stats)
    options = SubscriberOptions(packed_values=spec.schema == 2)
    sub = Subscriber(transport, TOPICS, rec.on_event, rec.on_resync, options, "bench-sub",
                     rec.requests.append, stats)
    rec.stamps = instrument(sub)
    gc.freeze()  # as df-controller does once started: what start-up made lives as long as the process
    pauses = GcPauses()
    endpoint = conn.recv()
    if spec.connect:
        sub.connect(endpoint)
    sub.start()
    started = time.process_time(), time.perf_counter()
    expected: dict[str, Any] = conn.recv()  # the publisher's report: its id and final sequences
    lost, dups, cpu = account(rec, [expected], started)
    sub.close()
    conn.send({
        "delivered": rec.count, "rate": rec.rate(), **percentiles_ms(rec.latencies),
        "lost_undetected": lost, "duplicates": dups, "cpu": cpu, "stats": stats.snapshot(),
        "parts": parts_ms(rec.parts), "gc": pauses.report(),
        "requests": dict(Counter(f"{r.reason}{'' if r.missing else ' (no range)'}" for r in rec.requests)),
    })


def run_phase(ctx: ForkServerContext, label: str, seconds: float, rate: float, spec: DriverSpec) -> dict[str, Any]:
    """One full-stack phase; prints its figures and returns the subscriber's report."""
    pub, res = run_pair(ctx, label, pub_worker, sub_worker, seconds, rate, spec)
    print(f"[{label}] published {pub['sent']} in {pub['elapsed']:.2f}s ({pub['sent'] / pub['elapsed']:,.0f}/s, "
          f"{pub['cpu']:.2f} cores); delivered {res['delivered']} at {res['rate']:,.0f}/s ({res['cpu']:.2f} cores); "
          f"latency p50 {res['p50_ms']:.2f} ms, p99 {res['p99_ms']:.2f} ms", flush=True)
    print(f"[{label}] lost_undetected {res['lost_undetected']}, duplicates {res['duplicates']}, resync requests "
          f"{res['requests'] or 'none'}\n[{label}] publisher {pub['stats']}\n[{label}] subscriber {res['stats']}",
          flush=True)
    if rate > 0:
        print(describe(label, res["parts"], res["gc"], pub["late"], pub["bursts"]), flush=True)
    return res


