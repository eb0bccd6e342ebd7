"""zmq_e2e: end-to-end throughput and latency of dfpubsub over ZeroMQ, against raw pyzmq.

Each phase runs one publisher and one subscriber process (forkserver) on loopback
TCP, with ~200-byte events round-robin on four topics:

* baseline: raw pyzmq PUB/SUB, one msgpack message per event; received/s.
* phase 1, throughput: the full stack (``load_driver("zmq+tcp://...")``, Publisher,
  Subscriber) publishing flat out; delivered/s = events handled / (last - first).
  Baseline and phase 1 alternate for ``--rounds`` rounds; the best of each counts.
* phase 2, latency: the full stack at half the phase-1 rate, paced in 1 ms bursts;
  p50/p99 of ``time.time() - event.timestamp`` taken in the handler.

After each full-stack phase the publisher flushes, closes (bye) and reports its
final sequences; the subscriber waits until every (topic, seq) sent was delivered
or lies in the ``missing`` range of a ResyncRequest. The rest is ``lost_undetected``
(must be 0). The last line of stdout is one JSON object with the headline figures.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import sys
import time
from collections import Counter, defaultdict
from collections.abc import Callable
from multiprocessing.connection import Connection, wait
from multiprocessing.context import ForkServerContext
from multiprocessing.process import BaseProcess
from multiprocessing.synchronize import Event as MpEvent
from typing import Any

import msgpack
import zmq

from dfpubsub.codec import pack_event
from dfpubsub.events import Event
from dfpubsub.metrics import Stats
from dfpubsub.publisher import Publisher, PublisherOptions
from dfpubsub.registry import load_driver
from dfpubsub.subscriber import Subscriber, SubscriberOptions
from dfpubsub.tracker import ResyncRequest

TOPICS = ("port", "network", "subnet", "router")
TABLE, WARM_TABLE = "bench", "warmup"
KEYS = [f"port-{i:06d}" for i in range(1024)]
EVENT_BYTES = 200
HWM = 100_000
DRIVER_OPTIONS = {"sndhwm": HWM, "rcvhwm": HWM}
CONNECT_TIMEOUT = 10.0
STALL_TIMEOUT = 5.0  # stop accounting when nothing more was delivered for this long
SAMPLE = 8  # the handler reads the clock (latency, window end) on one event in 8

VALUE: dict[str, Any] = {"name": "port-000001", "mac": "fa:16:3e:12:34:56", "fixed_ips": ["10.0.0.17"],
                         "status": "ACTIVE", "admin_state_up": True, "mtu": 1500, "description": ""}
while len(pack_event(TABLE, KEYS[0], "update", 123_456, VALUE, time.time())) < EVENT_BYTES:
    VALUE["description"] += "x"  # a port-like object padded so that one packed event is EVENT_BYTES long


def _send_loop(burst: Callable[[int, int], None], seconds: float, rate: float) -> dict[str, Any]:
    """Call ``burst(i, n)`` (send events i..i+n-1) flat out (rate <= 0) or at ``rate``/s in 1 ms
    bursts; return the count, the wall time and the CPU used (in cores)."""
    clock, i, cpu0 = time.perf_counter, 0, time.process_time()
    start = next_tick = clock()
    end = start + seconds
    while (now := clock()) < end:
        if rate <= 0:
            burst(i, 64)
            i += 64
            continue
        due = int((now - start) * rate)
        if due > i:
            burst(i, due - i)
            i = due
        next_tick += 0.001
        time.sleep(max(0.0, next_tick - clock()))
    elapsed = clock() - start
    return {"sent": i, "elapsed": elapsed, "cpu": (time.process_time() - cpu0) / elapsed}


def _recv(conn: Connection, procs: list[BaseProcess], timeout: float) -> Any:
    """Receive from a child; fail fast if a child died or nothing came in time."""
    ready = wait([conn, *(p.sentinel for p in procs)], timeout)
    if conn in ready or conn.poll():
        return conn.recv()
    dead = [f"{p.name} (exit code {p.exitcode})" for p in procs if p.sentinel in ready]
    raise RuntimeError(f"child died: {', '.join(dead)}" if dead else f"no answer within {timeout:.0f}s")


def _run_pair(ctx: ForkServerContext, label: str, pub: Callable[..., None], sub: Callable[..., None],
              seconds: float, rate: float) -> tuple[dict[str, Any], dict[str, Any]]:
    """Start a publisher and a subscriber process, relay the endpoint and the publisher's report."""
    (pub_conn, pub_child), (sub_conn, sub_child), warm = ctx.Pipe(), ctx.Pipe(), ctx.Event()
    procs: list[BaseProcess] = [
        ctx.Process(target=sub, args=(sub_child, warm), name=f"{label}-sub"),
        ctx.Process(target=pub, args=(pub_child, warm, seconds, rate), name=f"{label}-pub"),
    ]
    for p in procs:
        p.start()
    try:
        sub_conn.send(_recv(pub_conn, procs, CONNECT_TIMEOUT))  # the endpoint
        pub_res = _recv(pub_conn, procs, seconds + 2 * CONNECT_TIMEOUT)
        sub_conn.send(pub_res)
        sub_res = _recv(sub_conn, procs, 60.0)
        pub_conn.send("exit")
    finally:
        for p in procs:
            p.join(5)
            if p.is_alive():
                p.terminate()
    return pub_res, sub_res


def pub_worker(conn: Connection, warm: MpEvent, seconds: float, rate: float) -> None:
    """Publisher process: bind, wait until the subscriber is in, publish, close, report sequences."""
    stats = Stats("publisher", "bench-pub")
    driver = load_driver("zmq+tcp://127.0.0.1:*", DRIVER_OPTIONS)  # ZeroMQ picks a free loopback port
    pub = Publisher(driver.publisher(stats), "bench-pub", PublisherOptions(), stats)
    conn.send(pub.transport.uri)
    deadline = time.monotonic() + CONNECT_TIMEOUT
    while stats.get("hellos_out", "welcome") < 1:  # its control subscription arrived
        if time.monotonic() > deadline:
            raise TimeoutError("the subscriber never connected")
        time.sleep(0.005)
    while not warm.is_set():  # ... and its topic filters: one warm-up event per topic got through
        for topic in TOPICS:
            pub.publish(topic, WARM_TABLE, "warm", "update", 1, VALUE, timestamp=time.time())
        if not warm.wait(0.05) and time.monotonic() > deadline:
            raise TimeoutError("no warm-up event reached the subscriber")
    publish, now, n_topics = pub.publish, time.time, len(TOPICS)

    def burst(i: int, n: int) -> None:
        for j in range(i, i + n):
            publish(TOPICS[j % n_topics], TABLE, KEYS[j & 1023], "update", j + 1, VALUE, timestamp=now())

    report = _send_loop(burst, seconds, rate)
    pub.flush()
    pub.close()
    conn.send({**report, "id": pub.id, "seqs": pub.sequences(), "stats": stats.snapshot()})
    conn.recv()  # stay alive (ZeroMQ linger) until the subscriber has accounted for everything


class Recorder:
    """The subscriber's callbacks: count, sample latency, remember what was delivered and resynced."""

    def __init__(self, warm: MpEvent):
        self.warm = warm
        self.warm_topics: set[str] = set()
        self.count = self.warm_count = self.last_count = 0
        self.first = self.last = 0.0  # clock at the first and at the last sampled event
        self.latencies: list[float] = []
        self.delivered: defaultdict[tuple[str, str], list[int]] = defaultdict(list)
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


def sub_worker(conn: Connection, warm: MpEvent) -> None:
    """Subscriber process: connect, deliver, then account for every event the publisher sent."""
    rec = Recorder(warm)
    stats = Stats("subscriber", "bench-sub")
    transport = load_driver("zmq", DRIVER_OPTIONS).subscriber(stats)
    sub = Subscriber(transport, TOPICS, rec.on_event, rec.on_resync, SubscriberOptions(), "bench-sub",
                     rec.requests.append, stats)
    sub.connect(conn.recv())
    sub.start()
    cpu0, wall0 = time.process_time(), time.perf_counter()
    expected: dict[str, Any] = conn.recv()  # the publisher's report: its id and final sequences
    pid, seqs = expected["id"], expected["seqs"]
    want = sum(seqs.values())
    lost, dups, seen, cpu = want, 0, -1, 0.0
    deadline = time.monotonic() + STALL_TIMEOUT
    while time.monotonic() < deadline:
        total = rec.count + rec.warm_count
        if total != seen:
            deadline = time.monotonic() + STALL_TIMEOUT  # still delivering
        if total >= want or total == seen:  # complete, or stalled: count what is missing
            cpu = cpu or (time.process_time() - cpu0) / (time.perf_counter() - wall0)
            lost, dups = rec.unaccounted(pid, seqs)
            if lost == 0:
                break
        seen = total
        time.sleep(0.05)
    sub.close()
    lat = sorted(rec.latencies)
    window = rec.last - rec.first
    conn.send({
        "delivered": rec.count, "rate": (rec.last_count - 1) / window if window > 0 else 0.0,
        "p50_ms": lat[len(lat) // 2] * 1e3 if lat else 0.0, "p99_ms": lat[int(len(lat) * 0.99)] * 1e3 if lat else 0.0,
        "lost_undetected": lost, "duplicates": dups, "cpu": cpu, "stats": stats.snapshot(),
        "requests": dict(Counter(f"{r.reason}{'' if r.missing else ' (no range)'}" for r in rec.requests)),
    })


def run_phase(ctx: ForkServerContext, label: str, seconds: float, rate: float) -> dict[str, Any]:
    pub, res = _run_pair(ctx, label, pub_worker, sub_worker, seconds, rate)
    print(f"[{label}] published {pub['sent']} in {pub['elapsed']:.2f}s ({pub['sent'] / pub['elapsed']:,.0f}/s, "
          f"{pub['cpu']:.2f} cores); delivered {res['delivered']} at {res['rate']:,.0f}/s ({res['cpu']:.2f} cores); "
          f"latency p50 {res['p50_ms']:.2f} ms, p99 {res['p99_ms']:.2f} ms", flush=True)
    print(f"[{label}] lost_undetected {res['lost_undetected']}, duplicates {res['duplicates']}, resync requests "
          f"{res['requests'] or 'none'}\n[{label}] publisher {pub['stats']}\n[{label}] subscriber {res['stats']}",
          flush=True)
    return res


def base_pub_worker(conn: Connection, warm: MpEvent, seconds: float, rate: float) -> None:
    """Raw PUB socket: one msgpack message per event."""
    sock: zmq.Socket[bytes] = zmq.Context.instance().socket(zmq.PUB)
    sock.setsockopt(zmq.SNDHWM, HWM)
    conn.send(f"tcp://127.0.0.1:{sock.bind_to_random_port('tcp://127.0.0.1')}")
    deadline = time.monotonic() + CONNECT_TIMEOUT
    while not warm.is_set():
        sock.send_multipart([b"warm", b""])
        if not warm.wait(0.02) and time.monotonic() > deadline:
            raise TimeoutError("the baseline subscriber never connected")
    send, packb, now = sock.send_multipart, msgpack.packb, time.time
    topics = [t.encode() for t in TOPICS]

    def burst(i: int, n: int) -> None:
        for j in range(i, i + n):
            event = {"table": TABLE, "key": KEYS[j & 1023], "action": "update", "version": j + 1,
                     "value": VALUE, "timestamp": now()}
            send([topics[j % len(topics)], packb(event)])

    conn.send(_send_loop(burst, seconds, rate))
    conn.recv()
    sock.close()


def base_sub_worker(conn: Connection, warm: MpEvent) -> None:
    """Raw SUB socket: recv_multipart + unpackb per message, until the publisher is done and idle."""
    sock: zmq.Socket[bytes] = zmq.Context.instance().socket(zmq.SUB)
    sock.setsockopt(zmq.RCVHWM, HWM)
    sock.setsockopt(zmq.RCVTIMEO, 100)
    for topic in (b"warm", *(t.encode() for t in TOPICS)):
        sock.setsockopt(zmq.SUBSCRIBE, topic)
    sock.connect(conn.recv())
    recv, unpackb, now = sock.recv_multipart, msgpack.unpackb, time.time
    count = last_count = size = 0
    first = last = 0.0
    done: dict[str, Any] | None = None
    while done is None or count < done["sent"]:
        try:
            topic, data = recv()
        except zmq.Again:  # idle for 100 ms
            if done is not None:
                break
            if conn.poll():
                done = conn.recv()
            continue
        if topic == b"warm":
            warm.set()
            continue
        unpackb(data)
        count += 1
        if count % SAMPLE == 1:  # the clock is read as in the full-stack handler
            last, last_count, size = now(), count, len(data)
            first = first or last
    window = last - first
    conn.send({"received": count, "rate": (last_count - 1) / window if window > 0 else 0.0, "size": size})
    sock.close()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seconds", type=float, default=10.0, help="approximate total run time (default 10)")
    parser.add_argument("--rounds", type=int, default=2, help="interleaved baseline/throughput rounds; best counts")
    args = parser.parse_args(argv)
    total, rounds = args.seconds, max(1, args.rounds)
    ctx = mp.get_context("forkserver")
    ctx.set_forkserver_preload(["zmq", "msgpack", "dfpubsub.publisher", "dfpubsub.subscriber",
                                "dfpubsub.drivers.zeromq"])
    print(f"zmq_e2e: {EVENT_BYTES}-byte events on {len(TOPICS)} topics, about {total:g}s", flush=True)
    base_rate = flat_rate = 0.0
    lost = 0
    for _ in range(rounds):  # interleaved so that a noisy neighbour hits both sides alike
        pub, base = _run_pair(ctx, "baseline", base_pub_worker, base_sub_worker, 0.24 * total / rounds, 0)
        sent = pub["sent"]
        print(f"[baseline] raw pyzmq: sent {sent} ({sent / pub['elapsed']:,.0f}/s, {pub['cpu']:.2f} cores), "
              f"received {base['received']} at {base['rate']:,.0f}/s, dropped {sent - base['received']}, "
              f"{base['size']} bytes/message", flush=True)
        base_rate = max(base_rate, base["rate"])
        flat = run_phase(ctx, "throughput", 0.32 * total / rounds, rate=0)
        flat_rate, lost = max(flat_rate, flat["rate"]), lost + flat["lost_undetected"]
    paced = run_phase(ctx, "latency", 0.24 * total, rate=flat_rate / 2)
    lost += paced["lost_undetected"]
    print(json.dumps({
        "bench": "zmq_e2e", "events_per_s": round(flat_rate), "baseline_events_per_s": round(base_rate),
        "ratio": round(flat_rate / base_rate, 2) if base_rate else 0.0,
        "p50_ms": round(paced["p50_ms"], 3), "p99_ms": round(paced["p99_ms"], 3), "lost_undetected": lost,
    }), flush=True)
    return 0 if lost == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
