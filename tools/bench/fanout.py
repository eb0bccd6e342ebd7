"""fanout: one publisher, 1, 4 and 16 subscriber processes, per driver, against the raw client.

For each driver (ZeroMQ, Redis Streams, etcd watch, NATS JetStream; Redis, etcd
and NATS as private servers on free loopback ports) and each number of subscriber processes, two
cells run back to back: the raw client of the backend doing the same fan-out
(fanout_raw.py: one msgpack message per event), then the full dfpubsub stack
(Publisher and Subscribers as a user configures them, defaults throughout).
One publisher process publishes ~200-byte events on four topics flat out for
``--seconds``; every subscriber handles what it receives. Per cell:

* events/s per subscriber (each subscriber's handled events over the time from
  its first to its last one; the median and the slowest subscriber);
* subscriber CPU per event (median over the subscribers), the publisher's CPU per
  event sent, and the server's CPU per event sent (Redis, etcd, NATS; read from /proc);
* the envelope size distribution (dfpubsub: events per envelope as subscriber 0
  saw them, the shares of events that travelled in envelopes of 1, 2-7, 8-31,
  32-127 and 128+ events);
* dfpubsub's undetected loss (events neither delivered nor reported as a gap;
  must be 0) and what it dropped and told (ZeroMQ's high-water marks).

``--schema both`` runs each dfpubsub cell in wire schema 1 and again in schema 2 (the value's
bytes, handed on packed), as ``<driver>_schema2_*``.

Last line: one JSON object; ``<driver>_ratio_<n>`` is dfpubsub's median rate per
subscriber over the raw client's, same run. Targets at 16 subscribers: ratio >=
1.5 on every driver, and ZeroMQ >= 27k, Redis >= 23k, etcd >= 23k events/s per
subscriber on the 2-core development machine (NATS: no figure from before to hold).
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import statistics
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable
from multiprocessing.connection import Connection
from multiprocessing.context import ForkServerContext
from multiprocessing.process import BaseProcess
from multiprocessing.synchronize import Event as MpEvent
from pathlib import Path
from typing import Any

import msgpack
from drivers_e2e import SERVERS
from e2e import CONNECT_TIMEOUT, HWM, TOPICS, VALUE, DriverSpec, Recorder, recv_from, send_loop, stop_all, warm_up
from fanout_raw import CLIENTS

from dfpubsub.events import Event
from dfpubsub.metrics import Stats
from dfpubsub.plugins import load_driver
from dfpubsub.publisher import Publisher, PublisherOptions
from dfpubsub.subscriber import Subscriber, SubscriberOptions
from dfpubsub.testing.servers import ServerProcess

STALL = 2.0  # a subscriber stops waiting for the rest when nothing came for this long
BUCKETS = ((1, "1"), (7, "2-7"), (31, "8-31"), (127, "32-127"), (1 << 62, "128+"))


class _AllSet:
    """Every subscriber's readiness as one event (what e2e.warm_up waits on)."""

    def __init__(self, events: list[MpEvent]):
        self.events = events

    def is_set(self) -> bool:
        return all(e.is_set() for e in self.events)

    def wait(self, timeout: float) -> bool:
        deadline = time.monotonic() + timeout
        for e in self.events:
            if not e.wait(max(0.0, deadline - time.monotonic())):
                return False
        return True


class _Fanned(Recorder):
    """Recorder that also reads the CPU clock with the wall clock, and (subscriber 0) the envelope sizes:
    the events of one envelope arrive together and share its ``sent_at``."""

    def __init__(self, warm: MpEvent, sizes: bool):
        super().__init__(warm)
        self.cpu0 = self.cpu = 0.0
        self.sizes: Counter[int] | None = Counter() if sizes else None
        self._run: tuple[str, float] = ("", 0.0)
        self._run_len = 0

    def on_event(self, event: Event) -> None:
        count = self.count
        super().on_event(event)
        if self.count != count and self.count % 8 == 1:  # Recorder sampled this one: CPU from first to last
            self.cpu = time.process_time() - self.cpu0
            if self.count == 1:
                self.cpu0, self.cpu = self.cpu, 0.0
        if self.sizes is not None and event.table != "warmup":
            run = (event.topic, event.sent_at)
            if run != self._run:
                if self._run_len:
                    self.sizes[self._run_len] += 1
                self._run, self._run_len = run, 0
            self._run_len += 1

    def size_counts(self) -> dict[int, int]:
        if self.sizes is None:
            return {}
        if self._run_len:
            self.sizes[self._run_len] += 1
            self._run_len = 0
        return dict(self.sizes)


def df_pub(conn: Connection, ready: list[MpEvent], seconds: float, spec: DriverSpec) -> None:
    stats = Stats("publisher", "fanout-pub")
    pub = Publisher(load_driver(spec.pub_url, spec.options).publisher(stats), "fanout-pub",
                    PublisherOptions(schema=spec.schema), stats)
    conn.send(pub.transport.uri)
    packed = msgpack.packb(VALUE) if spec.schema == 2 else None
    burst = warm_up(pub.publish, _AllSet(ready), None, packed)  # type: ignore[arg-type]
    conn.send("go")
    report = send_loop(burst, seconds, 0)
    pub.flush()
    conn.send({**report, "id": pub.id, "seqs": pub.sequences(), "stats": stats.snapshot()})
    conn.recv()
    # Closed only once every subscriber is done: a ZeroMQ socket discards what its slow peers
    # have not taken after its linger (1 s), the bye with it, and such a tail loss is found
    # only when the publisher is declared lost (dead_after_idles x max_idle_time), past the bench.
    pub.close()


def df_sub(conn: Connection, ready: MpEvent, index: int, spec: DriverSpec) -> None:
    rec = _Fanned(ready, sizes=index == 0)
    stats = Stats("subscriber", f"fanout-sub-{index}")
    transport = load_driver(spec.sub_url, spec.options).subscriber(stats)
    sub = Subscriber(transport, TOPICS, rec.on_event, None, SubscriberOptions(packed_values=spec.schema == 2),
                     f"fanout-sub-{index}",
                     rec.requests.append, stats)
    endpoint = conn.recv()
    if spec.connect:
        sub.connect(endpoint)
    sub.start()
    expected: dict[str, Any] = conn.recv()
    want, seen, moved = sum(expected["seqs"].values()), -1, time.monotonic()
    while rec.count + rec.warm_count < want and time.monotonic() - moved < STALL:  # complete, or stalled
        if rec.count != seen:
            seen, moved = rec.count, time.monotonic()
        time.sleep(0.05)
    sub.close()
    lost, dups = rec.unaccounted(expected["id"], expected["seqs"])
    drops = {k: v for k, v in stats.snapshot().items() if "drops" in k}
    conn.send({"delivered": rec.count, "rate": rec.rate(), "cpu_s": rec.cpu, "cpu_events": rec.last_count - 1,
               "sizes": rec.size_counts(),
               "lost_undetected": lost, "gaps": len(rec.requests), "drops": drops})
    conn.recv()


def _server_cpu(server: ServerProcess | None) -> float:
    """CPU seconds the server process used so far (0 without a server)."""
    if server is None or server.proc is None:
        return 0.0
    fields = Path(f"/proc/{server.proc.pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def run_cell(ctx: ForkServerContext, n: int, seconds: float, pub: Callable[..., None], sub: Callable[..., None],
             server: ServerProcess | None, *extra: Any) -> tuple[dict[str, Any], list[dict[str, Any]], float]:
    """One publisher and ``n`` subscribers; return the publisher's report, the subscribers' and the
    server's CPU seconds."""
    pipes = [ctx.Pipe() for _ in range(n)]
    ready = [ctx.Event() for _ in range(n)]
    pub_conn, pub_child = ctx.Pipe()
    procs: list[BaseProcess] = [ctx.Process(target=sub, args=(pipes[i][1], ready[i], i, *extra), name=f"sub{i}")
                                for i in range(n)]
    procs.append(ctx.Process(target=pub, args=(pub_child, ready, seconds, *extra), name="pub"))
    for p in procs:
        p.start()
    try:
        endpoint = recv_from(pub_conn, procs, 3 * CONNECT_TIMEOUT)
        for conn, _ in pipes:
            conn.send(endpoint)
        recv_from(pub_conn, procs, 3 * CONNECT_TIMEOUT)  # "go": every subscriber is in
        cpu0 = _server_cpu(server)
        report = recv_from(pub_conn, procs, seconds + 3 * CONNECT_TIMEOUT)
        for conn, _ in pipes:
            conn.send(report)
        subs = [recv_from(conn, procs, 120.0) for conn, _ in pipes]
        server_cpu = _server_cpu(server) - cpu0
        for conn in (pub_conn, *(c for c, _ in pipes)):
            conn.send("exit")
    finally:
        stop_all(procs)
    return report, subs, server_cpu


def summarize(label: str, report: dict[str, Any], subs: list[dict[str, Any]], server_cpu: float) -> dict[str, Any]:
    """Print one cell's figures; return them."""
    sent = report["sent"]
    rates = [s["rate"] for s in subs]
    cpu_per = [s["cpu_s"] / s["cpu_events"] * 1e6 for s in subs if s["cpu_events"] > 0]
    out: dict[str, Any] = {
        "rate": statistics.median(rates), "slowest": min(rates),
        "sub_cpu_us": statistics.median(cpu_per) if cpu_per else 0.0,
        "pub_cpu_us": report["cpu"] * report["elapsed"] / sent * 1e6 if sent else 0.0,
        "server_cpu_us": server_cpu / sent * 1e6 if sent else 0.0,
        "delivered": sum(s["delivered"] for s in subs) / len(subs) / sent if sent else 0.0,
    }
    line = (f"{label}: sent {sent:,} ({sent / report['elapsed']:,.0f}/s); per subscriber {out['rate']:,.0f}/s "
            f"(slowest {out['slowest']:,.0f}), delivered {out['delivered']:.0%}; CPU per event: subscriber "
            f"{out['sub_cpu_us']:.1f} µs, publisher {out['pub_cpu_us']:.1f} µs, server {out['server_cpu_us']:.1f} µs")
    sizes: Counter[int] = Counter()
    for s in subs:
        sizes.update({int(k): v for k, v in s["sizes"].items()})
    if sizes:
        events = sum(k * v for k, v in sizes.items())
        shares, low = [], 0
        for high, name in BUCKETS:
            part = sum(k * v for k, v in sizes.items() if low < k <= high)
            shares.append(f"{name} {part / events:.0%}")
            low = high
        out["events_per_envelope"] = events / sum(sizes.values())
        line += (f"\n{label}: envelopes of {out['events_per_envelope']:.1f} events on average; events in envelopes "
                 f"of {', '.join(shares)}")
    if "lost_undetected" in subs[0]:
        out["lost_undetected"] = sum(s["lost_undetected"] for s in subs)
        gaps = sum(s["gaps"] for s in subs)
        drops: Counter[str] = Counter()
        for s in subs:
            drops.update(s["drops"])
        line += f"\n{label}: lost_undetected {out['lost_undetected']}, gaps told {gaps}, drops {dict(drops) or 'none'}"
    print(line, flush=True)
    return out


def _start(name: str, tmp: str) -> tuple[ServerProcess | None, str]:
    if name == "zmq":
        return None, ""
    server = SERVERS[name](Path(tmp) / name).start()
    return server, server.url


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seconds", type=float, default=2.0, help="seconds of publishing per cell (default 2)")
    parser.add_argument("--subscribers", default="1,4,16", help="numbers of subscriber processes (default 1,4,16)")
    parser.add_argument("--drivers", default="zmq,redis,etcd,nats")
    parser.add_argument("--schema", choices=("1", "2", "both"), default="1",
                        help="wire schema of the dfpubsub cells; both: each cell in schema 1, then 2 (default 1)")
    args = parser.parse_args(argv)
    schemas = (1, 2) if args.schema == "both" else (int(args.schema),)
    ctx = mp.get_context("forkserver")
    ctx.set_forkserver_preload(["zmq", "msgpack", "redis", "grpc", "aetcd", "nats", "e2e", "fanout_raw",
                                "dfpubsub.drivers.zeromq", "dfpubsub.drivers.redis_streams",
                                "dfpubsub.drivers.etcd_watch", "dfpubsub.drivers.nats_jetstream"])
    counts = [int(n) for n in args.subscribers.split(",")]
    print(f"fanout: {args.seconds:g}s of flat-out publishing per cell, {counts} subscriber processes; "
          f"load average {os.getloadavg()[0]:.1f}", flush=True)
    result: dict[str, Any] = {"bench": "fanout"}
    lost = cell = 0
    with tempfile.TemporaryDirectory(prefix="bench-fanout-") as tmp:
        for name in args.drivers.split(","):
            server, url = _start(name, tmp)
            try:
                for n in counts:
                    cell += 1
                    raw = summarize(f"[{name} x{n}] raw", *run_cell(ctx, n, args.seconds, *CLIENTS[name], server,
                                                                     url, f"raw{cell}"))
                    for schema in schemas:
                        tag = name if schema == schemas[0] else f"{name}_schema{schema}"
                        if name == "zmq":
                            spec = DriverSpec("zmq+tcp://127.0.0.1:*", "zmq", {"sndhwm": HWM, "rcvhwm": HWM}, True,
                                              schema=schema)
                        else:
                            # NATS: each prefix needs a stream of its own (one stream holds one prefix's subjects).
                            extra = {"stream": f"FAN{cell}S{schema}"} if name == "nats" else {}
                            spec = DriverSpec(url, url, {"prefix": f"fan{cell}s{schema}", **extra}, schema=schema)
                        full = summarize(f"[{tag} x{n}] dfpubsub", *run_cell(ctx, n, args.seconds, df_pub, df_sub,
                                                                             server, spec))
                        lost += full["lost_undetected"]
                        result.update({f"{tag}_rate_{n}": round(full["rate"]), f"{name}_raw_rate_{n}": round(raw["rate"]),
                                       f"{tag}_ratio_{n}": round(full["rate"] / raw["rate"], 2) if raw["rate"] else 0.0,
                                       f"{tag}_envelope_{n}": round(full.get("events_per_envelope", 0.0), 1)})
                        print(f"[{tag} x{n}] ratio {result[f'{tag}_ratio_{n}']} (load average "
                              f"{os.getloadavg()[0]:.1f})", flush=True)
            finally:
                if server is not None:
                    server.kill()
    result["lost_undetected"] = lost
    print(json.dumps(result), flush=True)
    return 0 if lost == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
