"""drivers_e2e: the full stack end to end on the Redis Streams, etcd watch and NATS JetStream drivers.

For each driver a private server is started on a free loopback port; one
publisher process and one subscriber process run the full dfpubsub stack
(see e2e.py) flat out (events/s delivered) and at half
that rate (p50/p99 latency), and account for every event (``lost_undetected``).
The baseline, in the same run, is the raw client writing the same ~200-byte
events, one msgpack message per event: pipelined ``XADD`` (1000 per round trip)
for Redis, transactions of 128 puts for etcd, and for NATS nats-py's own
JetStream publishing, one message per event, pipelined (``publish_async``, up to
4000 unacknowledged) into a stream of the same limits.

Last line: ``{"bench": "drivers_e2e", "redis_events_per_s": N, "redis_ratio": R,
"redis_p99_ms": X, "etcd_events_per_s": N, "etcd_ratio": R, "etcd_p99_ms": X,
"nats_events_per_s": N, "nats_ratio": R, "nats_p99_ms": X, "lost_undetected": 0}``.
With ``--schema 2`` (or ``both``) the full stack also runs in wire schema 2 (the value's bytes,
handed on packed: e2e.DriverSpec.schema) at the same half rate, as ``<driver>_schema2_*``.
Targets (2 cores): Redis >= 50k events/s, etcd >= 20k, both >= 0.8 of their raw
baseline; NATS >= 3x nats-py's one message per event (dfpubsub batches events
into envelopes); zero undetected loss.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing as mp
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import msgpack
from e2e import KEYS, TABLE, TOPICS, VALUE, DriverSpec, run_phase

from dfpubsub.testing.servers import EtcdServer, NatsServer, RedisServer

SERVERS = {"redis": RedisServer, "etcd": EtcdServer, "nats": NatsServer}


def _events(n: int) -> list[bytes]:
    now = time.time()
    return [msgpack.packb({"table": TABLE, "key": KEYS[j & 1023], "action": "update", "version": j + 1,
                           "value": VALUE, "timestamp": now}) for j in range(n)]


def raw_redis(url: str, seconds: float) -> float:
    """Events/s written by pipelined XADD, one event per entry."""
    import redis

    client = redis.Redis.from_url(url)
    batch = _events(1000)
    sent, start = 0, time.perf_counter()
    while time.perf_counter() - start < seconds:
        pipe = client.pipeline(transaction=False)
        for j, data in enumerate(batch):
            pipe.xadd(f"raw:{TOPICS[j % len(TOPICS)]}", {"e": data}, maxlen=100_000, approximate=True)
        pipe.execute()
        sent += len(batch)
    rate = sent / (time.perf_counter() - start)
    client.close()
    return rate


def raw_etcd(url: str, seconds: float) -> float:
    """Events/s written as etcd transactions of 128 puts, one event per key."""
    import aetcd

    host, port = url.split("://", 1)[1].split(":")
    batch = _events(128)

    async def run() -> float:
        async with aetcd.Client(host, int(port)) as client:
            sent, n, start = 0, 0, time.perf_counter()
            while time.perf_counter() - start < seconds:
                ops = []
                for data in batch:
                    n += 1
                    ops.append(client.transactions.put(f"/raw/ps/{TOPICS[n % len(TOPICS)]}/{n}".encode(), data))
                await client.transaction(compare=[], success=ops, failure=[])
                sent += len(batch)
            return sent / (time.perf_counter() - start)

    return asyncio.run(run())


def raw_nats(url: str, seconds: float) -> float:
    """Events/s acknowledged by JetStream, one message per event, published by nats-py pipelined."""
    import nats

    batch = _events(1000)

    async def run() -> float:
        nc = await nats.connect(url)
        js = nc.jetstream(publish_async_max_pending=4000)
        await js.add_stream(name="RAW", subjects=["raw.>"], max_msgs=1_000_000, max_bytes=1 << 30)
        sent, start = 0, time.perf_counter()
        while time.perf_counter() - start < seconds:
            for j, data in enumerate(batch):
                await js.publish_async(f"raw.{TOPICS[j % len(TOPICS)]}", data)
            sent += len(batch)
        await js.publish_async_completed()
        rate = sent / (time.perf_counter() - start)
        await nc.close()
        return rate

    return asyncio.run(run())


RAW = {"redis": raw_redis, "etcd": raw_etcd, "nats": raw_nats}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seconds", type=float, default=4.0, help="seconds per phase (default 4)")
    parser.add_argument("--drivers", default="redis,etcd,nats")
    parser.add_argument("--schema", choices=("1", "2", "both"), default="1",
                        help="wire schema of the full stack; both: schema 1, then 2 (default 1)")
    args = parser.parse_args(argv)
    schemas = (1, 2) if args.schema == "both" else (int(args.schema),)
    ctx = mp.get_context("forkserver")
    ctx.set_forkserver_preload(["msgpack", "e2e"])
    result: dict[str, Any] = {"bench": "drivers_e2e"}
    lost = 0
    with tempfile.TemporaryDirectory(prefix="bench-drivers-") as tmp:
        for name in args.drivers.split(","):
            server = SERVERS[name](Path(tmp) / name).start()
            try:
                raw = RAW[name](server.url, args.seconds)
                print(f"[{name}] raw client: {raw:,.0f} events/s written", flush=True)
                half = 0.0
                for schema in schemas:
                    spec = DriverSpec(server.url, server.url, {"prefix": f"bench{schema}"}, schema=schema)
                    flat = run_phase(ctx, f"{name} throughput schema {schema}", args.seconds, 0, spec)
                    half = half or flat["rate"] / 2  # the first schema's half rate for both
                    paced = run_phase(ctx, f"{name} latency schema {schema}", args.seconds, half, spec)
                    lost += flat["lost_undetected"] + paced["lost_undetected"]
                    tag = name if schema == schemas[0] else f"{name}_schema{schema}"
                    result.update({
                        f"{tag}_events_per_s": round(flat["rate"]), f"{name}_raw_events_per_s": round(raw),
                        f"{tag}_ratio": round(flat["rate"] / raw, 2) if raw else 0.0,
                        f"{tag}_p50_ms": round(paced["p50_ms"], 3), f"{tag}_p99_ms": round(paced["p99_ms"], 3),
                    })
            finally:
                server.kill()
    result["lost_undetected"] = lost
    print(json.dumps(result), flush=True)
    return 0 if lost == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
