"""notify: what persistent notifications cost a writer, and (the delivery half) how fast a worker delivers.

Write half: one writer updates ``--keys`` objects round-robin ``--writes``
times through :class:`~dfpubsub.nbapi.NbApi` (store write and ZeroMQ
publish, as tools/bench/nb_write.py does), once with a
:class:`~dfpubsub.notify.producer.Notifier` and one persistent 11-shard topic
that every write matches, once with no notifier; the two alternate for
``--rounds`` rounds in the same run, and the best of each gives the ratio.
The queues live where ``[notify] url = ""`` puts them: in the store's own
backend (the SQLite file, the Redis database, the etcd cluster), so SQLite
and Redis notify in the write itself and etcd reserves and commits around
it (docs/notifications.md). With ``--two-phase``, SQLite and Redis are also
measured with their queues elsewhere (another file, another database), which
reserves and commits around the write: keys ``<backend>_two_phase_*``.
Queues are emptied between rounds, outside the timing.

Kafka: the same worker delivering into librdkafka's mock Kafka cluster (``kafka_delivery_per_s``;
the mock measures the endpoint and the worker, not a real cluster).

Isolation half (tools/bench/notify_isolation.py): a healthy topic's delivery p99 with six hung
endpoints beside it (``isolation_p99_s``) and without them (``isolation_baseline_p99_s``).

After each of SQLite and Redis, the floor of tools/bench/notify_floor.py (the backend's own
client: its update, then the update with a bounded queue's append) runs on the same machine
in the same run (``<backend>_floor_ratio``): what the append costs with no dfpubsub code, which
the write ratio is read against (a noisy machine moves both).

Last line: ``{"bench": "notify", "<backend>_write_ratio": R, "<backend>_writes_per_s": N,
"<backend>_notified_writes_per_s": N, "<backend>_floor_ratio": R, ..., "delivery_per_s": N,
"kafka_delivery_per_s": N, "isolation_p99_s": S,
"isolation_baseline_p99_s": S}``. Targets: write ratio >= 0.85 with 11 shards on SQLite and
Redis; delivery >= 5,000 notifications/s per worker, to a webhook and to Kafka; isolation p99 <= 2x its baseline.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from typing import Any

from backends import bench_store
from nb_write import TABLES, VALUE, nbapi_rate
from notify_delivery import delivery_rate, kafka_delivery_rate
from notify_floor import redis_rates, sqlite_rates
from notify_isolation import isolation_p99

from dfpubsub.notify import NotificationConfig, NotificationRegistry, Topic
from dfpubsub.notify.producer import Notifier
from dfpubsub.queues import QueueStore, open_queues
from dfpubsub.store import Store

__all__ = ["write_ratios", "main"]

SHARDS = 11
#: What the backends' own clients pay for the same append (``<backend>_floor_ratio``): a write
#: ratio is read against the floor measured in the same run, on the same machine.
FLOORS = {"sqlite": sqlite_rates, "redis": redis_rates}


def _empty(registry: NotificationRegistry, topic: Topic) -> None:
    for shard in registry.shard_names(topic):
        registry.queues.remove(shard, "9" * 20)


def _backend_ratio(store: Store, queues: QueueStore, args: argparse.Namespace) -> tuple[float, float]:
    """(best writes/s without notifications, best with), alternating rounds."""
    registry = NotificationRegistry(queues)
    topic = registry.create_topic(Topic("bench", "http://127.0.0.1:9/hook", persistent=True, shards=args.shards,
                                        max_entries=10 * args.writes, max_bytes=1 << 30))
    registry.put_configuration(NotificationConfig("all", TABLES[0], topic.name))
    notifier = Notifier(registry, queues, publisher="bench")
    for k in range(args.keys):
        if store.get(TABLES[0], f"port-{k:04d}") is None:  # the same store serves both modes
            store.create(TABLES[0], f"port-{k:04d}", VALUE)
    plain, notified = [], []
    try:
        for _ in range(args.rounds):  # interleaved, best of each: the machine is shared and noisy
            plain.append(nbapi_rate(store, args.writes, args.keys))
            notified.append(nbapi_rate(store, args.writes, args.keys, notifier))
            assert registry.topic_stats(topic.name).entries == args.writes, "a notification is missing"
            _empty(registry, topic)
    finally:
        notifier.close()
    return max(plain), max(notified)


def _queues_url(backend: str, url: str, tmp: str, two_phase: bool) -> str:
    if not two_phase:
        return url
    return f"sqlite:///{tmp}/queues.sqlite" if backend == "sqlite" else url.rsplit("/", 1)[0] + "/1"


def write_ratios(args: argparse.Namespace) -> dict[str, Any]:
    """Per backend of ``args.backends``: writes/s with and without notifications, and their ratio."""
    result: dict[str, Any] = {}
    with tempfile.TemporaryDirectory(prefix="bench-notify-") as tmp:
        for backend in args.backends.split(","):
            modes = [False, True] if args.two_phase and backend != "etcd" else [False]
            with bench_store(backend, tmp, TABLES) as (store, url):
                for two_phase in modes:
                    queues = open_queues(_queues_url(backend, url, tmp, two_phase),
                                         **({} if backend == "sqlite" else {"prefix": "bench"}))
                    how = "in the write" if queues.shares_store(store) else "reserve/commit around the write"
                    try:
                        base, rate = _backend_ratio(store, queues, args)
                    finally:
                        queues.close()
                    name = f"{backend}_two_phase" if two_phase else backend
                    print(f"[{name}] NbApi {base:,.0f} writes/s; with a persistent {args.shards}-shard topic "
                          f"({how}) {rate:,.0f} writes/s; ratio {rate / base:.2f}", flush=True)
                    result.update({f"{name}_writes_per_s": round(base), f"{name}_notified_writes_per_s": round(rate),
                                   f"{name}_write_ratio": round(rate / base, 2)})
            if backend in FLOORS:
                floor = FLOORS[backend](tmp, args.writes, args.rounds)
                ratio = floor["queue"] / floor["alone"]
                print(f"[{backend}] floor in the same run (tools/bench/notify_floor.py: the raw client's update, "
                      f"then with a bounded queue's append): ratio {ratio:.2f}", flush=True)
                result[f"{backend}_floor_ratio"] = round(ratio, 2)
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--writes", type=int, default=2000, help="writes per round and backend")
    parser.add_argument("--keys", type=int, default=100)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--shards", type=int, default=SHARDS)
    parser.add_argument("--backends", default="sqlite,redis,etcd")
    parser.add_argument("--two-phase", action="store_true",
                        help="also measure SQLite and Redis with their queues elsewhere (reserve/commit)")
    parser.add_argument("--notifications", type=int, default=50_000, help="queued for the delivery half")
    parser.add_argument("--hung", type=int, default=6, help="hung endpoints beside the healthy topic")
    args = parser.parse_args(argv)
    result: dict[str, Any] = {"bench": "notify", "writes": args.writes, "shards": args.shards}
    result.update(write_ratios(args))
    batched, single = delivery_rate(args.notifications), delivery_rate(args.notifications // 10, max_batch=1)
    print(f"[delivery] one worker, local webhook: {batched:,.0f} notifications/s in batches of 100 S3 records, "
          f"{single:,.0f}/s one per request", flush=True)
    result.update(delivery_per_s=round(batched), delivery_one_per_request_per_s=round(single))
    kafka = kafka_delivery_rate(args.notifications)
    print(f"[delivery] one worker into the mock Kafka cluster: {kafka:,.0f} notifications/s", flush=True)
    result["kafka_delivery_per_s"] = round(kafka)
    baseline, isolated = isolation_p99(hung=0), isolation_p99(hung=args.hung)
    print(f"[isolation] healthy topic's delivery p99 {baseline:.3f} s alone, {isolated:.3f} s beside "
          f"{args.hung} hung endpoints ({isolated / baseline:.1f}x)", flush=True)
    result.update(isolation_p99_s=round(isolated, 3), isolation_baseline_p99_s=round(baseline, 3))
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
