"""zmq_e2e: end-to-end throughput and latency of dfpubsub over ZeroMQ, against raw pyzmq.

Each phase runs one publisher and one subscriber process (forkserver) on loopback
TCP, with ~200-byte events round-robin on four topics:

* baseline: raw pyzmq PUB/SUB, one msgpack message per event; received/s.
* phase 1, throughput: the full stack (``load_driver("zmq+tcp://...")``, Publisher,
  Subscriber) publishing flat out; delivered/s = events handled / (last - first).
  Baseline and phase 1 alternate for ``--rounds`` rounds; the best of each counts.
* phase 2, latency: the full stack at half the phase-1 rate, paced in 1 ms bursts;
  p50/p99 of ``time.time() - event.timestamp`` taken in the handler.
* phase 2b, flushed bursts: phase 2 again, with the publisher calling ``flush()`` at the end of
  each burst, as df-feed does after each page of its feed: what a producer that knows where its
  bursts end sees, against phase 2's producer that leaves its partial batches to ``batch_linger``.
* phase 3, low rate: raw pyzmq, then the full stack, each at a steady ``LOW_RATE``
  (10k events/s, paced alike); p50/p99 latency as in phase 2 (the raw subscriber
  reads the clock on the same events). This is the latency of light traffic, the
  one controllers mostly see.

Paced phases also print where the latency goes (latency_parts.py): batching,
transport and dispatch parts, the subscriber's GC pauses, and the harness's own
pacing lateness, reported apart.

With ``--schema 2`` (or ``both``, the default) the full-stack phases also run in wire schema 2:
the publisher hands over the value's bytes (as df-feed hands over the store's) and the
subscriber hands them on packed (as a controller's does, for its cache). Schema 2's throughput
rounds interleave with schema 1's and the baseline's; its paced phases run at the same rate as
schema 1's (half of schema 1's best), so that their latencies compare at one load.

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
from array import array
from dataclasses import replace
from multiprocessing.connection import Connection
from multiprocessing.synchronize import Event as MpEvent
from typing import Any

import msgpack
import zmq
from e2e import (
    CONNECT_TIMEOUT,
    EVENT_BYTES,
    HWM,
    KEYS,
    SAMPLE,
    TABLE,
    TOPICS,
    VALUE,
    DriverSpec,
    percentiles_ms,
    run_pair,
    run_phase,
    send_loop,
)
from fanout_raw import zmq_sub_socket

LOW_RATE = 10_000  # events/s of phase 3

SPEC = DriverSpec("zmq+tcp://127.0.0.1:*", "zmq", {"sndhwm": HWM, "rcvhwm": HWM}, connect=True)


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

    conn.send(send_loop(burst, seconds, rate))
    conn.recv()
    sock.close()


def base_sub_worker(conn: Connection, warm: MpEvent) -> None:
    """Raw SUB socket: recv_multipart + unpackb per message, until the publisher is done and idle."""
    sock: zmq.Socket[bytes] = zmq_sub_socket(conn.recv(), 100)
    recv, unpackb, now = sock.recv_multipart, msgpack.unpackb, time.time
    count = last_count = size = 0
    first = last = 0.0
    latencies = array("d")  # as the full stack's Recorder: out of the GC's walks
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
        event = unpackb(data)
        count += 1
        if count % SAMPLE == 1:  # the clock is read as in the full-stack handler
            last, last_count, size = now(), count, len(data)
            first = first or last
            latencies.append(last - event["timestamp"])
    window = last - first
    conn.send({"received": count, "rate": (last_count - 1) / window if window > 0 else 0.0, "size": size,
               **percentiles_ms(latencies)})
    sock.close()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seconds", type=float, default=10.0, help="approximate total run time (default 10)")
    parser.add_argument("--rounds", type=int, default=2, help="interleaved baseline/throughput rounds; best counts")
    parser.add_argument("--schema", choices=("1", "2", "both"), default="both",
                        help="wire schema of the full-stack phases; both: schema 1's, then schema 2's (default)")
    args = parser.parse_args(argv)
    total, rounds = args.seconds, max(1, args.rounds)
    schemas = (1, 2) if args.schema == "both" else (int(args.schema),)
    specs = {s: replace(SPEC, schema=s) for s in schemas}
    ctx = mp.get_context("forkserver")
    ctx.set_forkserver_preload(["zmq", "msgpack", "e2e", "dfpubsub.drivers.zeromq"])
    print(f"zmq_e2e: {EVENT_BYTES}-byte events on {len(TOPICS)} topics, about {total:g}s", flush=True)
    base_rate = 0.0
    flat_rate = dict.fromkeys(schemas, 0.0)
    lost = 0
    for _ in range(rounds):  # interleaved so that a noisy neighbour hits every side alike
        pub, base = run_pair(ctx, "baseline", base_pub_worker, base_sub_worker, 0.24 * total / rounds, 0)
        sent = pub["sent"]
        print(f"[baseline] raw pyzmq: sent {sent} ({sent / pub['elapsed']:,.0f}/s, {pub['cpu']:.2f} cores), "
              f"received {base['received']} at {base['rate']:,.0f}/s, dropped {sent - base['received']}, "
              f"{base['size']} bytes/message", flush=True)
        base_rate = max(base_rate, base["rate"])
        for schema, spec in specs.items():
            flat = run_phase(ctx, f"throughput-schema{schema}", 0.32 * total / rounds, 0, spec)
            flat_rate[schema], lost = max(flat_rate[schema], flat["rate"]), lost + flat["lost_undetected"]
    half = flat_rate[schemas[0]] / 2  # one load for every schema's paced phases
    _, base_low = run_pair(ctx, "baseline-low-rate", base_pub_worker, base_sub_worker, 0.16 * total, LOW_RATE)
    print(f"[baseline-low-rate] raw pyzmq at {LOW_RATE}/s: latency p50 {base_low['p50_ms']:.3f} ms, "
          f"p99 {base_low['p99_ms']:.3f} ms", flush=True)
    figures: dict[int, dict[str, Any]] = {}
    for schema, spec in specs.items():
        paced = run_phase(ctx, f"latency-schema{schema}", 0.24 * total, half, spec)
        flushed = run_phase(ctx, f"latency-flushed-schema{schema}", 0.16 * total, half, replace(spec, flush_bursts=True))
        low = run_phase(ctx, f"low-rate-schema{schema}", 0.16 * total, LOW_RATE, spec)
        lost += paced["lost_undetected"] + flushed["lost_undetected"] + low["lost_undetected"]
        figures[schema] = {
            "events_per_s": round(flat_rate[schema]),
            "ratio": round(flat_rate[schema] / base_rate, 2) if base_rate else 0.0,
            "p50_ms": round(paced["p50_ms"], 3), "p99_ms": round(paced["p99_ms"], 3),
            "low_rate_p50_ms": round(low["p50_ms"], 3), "low_rate_p99_ms": round(low["p99_ms"], 3),
            "p99_parts_ms": {k: round(v["p99"], 3) for k, v in paced["parts"].items()},
            "flushed_p50_ms": round(flushed["p50_ms"], 3), "flushed_p99_ms": round(flushed["p99_ms"], 3),
            "flushed_p99_parts_ms": {k: round(v["p99"], 3) for k, v in flushed["parts"].items()},
            "low_rate_p99_parts_ms": {k: round(v["p99"], 3) for k, v in low["parts"].items()},
            "low_rate_gc_max_ms": round(low["gc"]["gc_max_ms"], 3),
        }
    first = figures[schemas[0]]
    line: dict[str, Any] = {
        "bench": "zmq_e2e", "schema": schemas[0], **first, "baseline_events_per_s": round(base_rate),
        "paced_events_per_s": round(half), "baseline_low_rate_p50_ms": round(base_low["p50_ms"], 3),
        "baseline_low_rate_p99_ms": round(base_low["p99_ms"], 3), "lost_undetected": lost,
    }
    if len(schemas) == 2:
        line["schema2"] = figures[2]
        line["schema2_vs_1"] = round(flat_rate[2] / flat_rate[1], 2) if flat_rate[1] else 0.0
    print(json.dumps(line), flush=True)
    return 0 if lost == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
