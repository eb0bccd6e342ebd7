"""nats_stall: a subscriber blocked for 3 s while a small stream and a small buffer overflow, on
dfpubsub's nats driver and on JetStream's own ordered consumer, in the same run.

A private nats-server (JetStream, file store) holds a stream limited to
``--max-msgs`` messages. A publisher sends ``--events`` events on one topic at
``--rate`` per second; the subscriber's handler blocks for ``--stall`` seconds
at the event ``--stall-at``, so the stream drops messages it never read.

- dfpubsub: the full stack (Publisher, Subscriber) on the ``nats`` driver with a
  small inbox (``max_pending_bytes`` 64 KiB, pulls of 64) and a small dispatch
  queue (256 envelopes), twice: the event handler blocks (the core's queue
  overflows), then the receive thread blocks (the driver stops pulling and the
  stream's limit drops what it never read). An event is *covered*
  if it was delivered, lies in a resync request's missing range, or was
  published before a resync of its topic began (the resync reads the store,
  which has it). ``lost_undetected`` counts the rest: it must be 0.
- JetStream: nats-py publishes the same events one message each into a stream
  of the same limit; an ordered push consumer with a small pending buffer
  (``pending_msgs_limit`` 512) reads them, its callback awaiting the stall.
  Nothing tells its application what was lost (the connection's error callback
  hears of slow-consumer drops, not which messages): every loss is undetected.

Last line: ``{"bench": "nats_stall", "dfpubsub_lost": N, "dfpubsub_resyncs": N,
"dfpubsub_recv_stall_lost": N, "dfpubsub_recv_stall_stream_dropped": N, "lost_undetected": 0, "jetstream_lost": N, "jetstream_lost_undetected": N,
"detected_ratio": R}`` where ``detected_ratio`` is the share of lost events
dfpubsub detected divided by the share JetStream's consumer reported (reported
as the share itself when JetStream reported none, as it never does).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from dfpubsub.events import Event
from dfpubsub.metrics import Stats
from dfpubsub.plugins import load_driver
from dfpubsub.publisher import Publisher, PublisherOptions
from dfpubsub.subscriber import Subscriber, SubscriberOptions
from dfpubsub.testing.servers import NatsServer
from dfpubsub.tracker import ResyncRequest

TOPIC = "port"


def _paced(n: int, rate: float, send: Any) -> dict[int, float]:
    """Call ``send(i)`` for i in 0..n-1 at ``rate``/s; return each one's monotonic time."""
    sent: dict[int, float] = {}
    start = time.monotonic()
    for i in range(n):
        due = start + i / rate
        now = time.monotonic()
        if due > now:
            time.sleep(due - now)
        sent[i + 1] = time.monotonic()
        send(i)
    return sent


def run_dfpubsub(url: str, args: argparse.Namespace, where: str) -> dict[str, Any]:
    """``where``: ``handler`` (the event handler blocks: the core's bounded queue overflows) or
    ``receive`` (the receive thread blocks, as a SIGSTOPped process would: the driver's inbox fills,
    it stops pulling and the stream's limit drops what it holds beyond)."""
    options = {"prefix": f"stall{where}", "stream": f"STALL{where.upper()}", "max_msgs": args.max_msgs,
               "count": 64, "max_pending_bytes": 64 << 10}
    pub_stats, sub_stats = Stats("publisher", "stall-pub"), Stats("subscriber", "stall-sub")
    pub = Publisher(load_driver(url, options).publisher(pub_stats), "stall-pub",
                    PublisherOptions(batch_linger=0.001, max_idle_time=0.5), pub_stats)
    delivered: set[int] = set()
    resyncs: list[float] = []
    gaps: list[ResyncRequest] = []
    stalled = threading.Event()

    def on_event(e: Event) -> None:
        if e.publisher_id != pub.id:
            return
        delivered.add(e.seq)
        if e.seq >= args.stall_at and not stalled.is_set():
            stalled.set()
            if where == "handler":
                time.sleep(args.stall)  # the application is stuck: the handler does not return

    def on_resync(topics: set[str]) -> None:
        if TOPIC in topics:
            resyncs.append(time.monotonic())

    transport = load_driver(url, options).subscriber(sub_stats)
    inner_recv, slept = transport.recv, threading.Event()

    def recv(timeout: float) -> list[bytes]:
        if where == "receive" and stalled.is_set() and not slept.is_set():
            slept.set()
            time.sleep(args.stall)  # the receive thread is stuck
        return inner_recv(timeout)

    transport.recv = recv  # type: ignore[method-assign]
    sub = Subscriber(transport, [TOPIC], on_event, on_resync,
                     SubscriberOptions(message_delay_window=0.2, max_idle_time=0.5, queue_size=256), "stall-sub",
                     gaps.append, sub_stats)
    sub.start()
    sub.wait_synced(10)
    deadline = time.monotonic() + 10
    while sub_stats.get("hellos_in") == 0 and time.monotonic() < deadline:
        pub.hello()
        time.sleep(0.05)
    sent = _paced(args.events, args.rate, lambda i: pub.publish(TOPIC, "bench", f"k{i % 1000}", "update", i + 1,
                                                                {"i": i}))
    pub.flush()
    last = pub.sequences()[TOPIC]

    def covered(seq: int) -> bool:
        if seq in delivered:
            return True
        if any(g.missing and g.topic == TOPIC and g.missing[0] <= seq <= g.missing[1] for g in list(gaps)):
            return True
        return any(r >= sent.get(seq, 0.0) for r in resyncs[1:])  # the first one is the initial sync

    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and not all(covered(s) for s in range(1, last + 1)):
        time.sleep(0.2)
    pub.close()
    sub.close()
    lost = last - len(delivered)
    undetected = sum(1 for s in range(1, last + 1) if not covered(s))
    return {"published": last, "delivered": len(delivered), "lost": lost, "undetected": undetected,
            "resyncs": len(resyncs) - 1, "dropped_by_stream": sub_stats.get("drops", "stream_limits"),
            "stats": sub_stats.snapshot()}


def run_jetstream(url: str, args: argparse.Namespace) -> dict[str, Any]:
    import nats

    got: set[int] = set()
    published = [0]
    slow = [0]

    async def on_error(exc: Exception) -> None:
        slow[0] += 1  # nats-py's slow-consumer notices go to the connection, not to the subscription

    async def subscriber(ready: threading.Event, done: threading.Event) -> None:
        nc = await nats.connect(url, error_cb=on_error)
        js = nc.jetstream()
        await js.add_stream(name="RAWSTALL", subjects=["rawstall.>"], max_msgs=args.max_msgs)
        stalled = False

        async def cb(msg: Any) -> None:
            nonlocal stalled
            seq = int(msg.data)
            got.add(seq)
            if seq >= args.stall_at and not stalled:
                stalled = True
                await asyncio.sleep(args.stall)

        await js.subscribe(f"rawstall.{TOPIC}", cb=cb, ordered_consumer=True, pending_msgs_limit=512)
        ready.set()
        while not done.is_set() or (len(got) < published[0] and not await _idle(got)):
            await asyncio.sleep(0.1)
        await nc.close()

    async def publisher() -> None:
        nc = await nats.connect(url)
        js = nc.jetstream(publish_async_max_pending=4000)
        start = time.monotonic()
        for i in range(args.events):
            due = start + i / args.rate
            now = time.monotonic()
            if due > now:
                await asyncio.sleep(due - now)
            await js.publish_async(f"rawstall.{TOPIC}", str(i + 1).encode())
            published[0] = i + 1
        await js.publish_async_completed()
        await nc.close()

    ready, done = threading.Event(), threading.Event()
    thread = threading.Thread(target=lambda: asyncio.run(subscriber(ready, done)), daemon=True)
    thread.start()
    ready.wait(10)
    asyncio.run(publisher())
    done.set()
    thread.join(40)
    lost = published[0] - len(got)
    return {"published": published[0], "delivered": len(got), "lost": lost, "undetected": lost,
            "connection_errors": slow[0]}


async def _idle(got: set[int], quiet: float = 3.0) -> bool:
    """Whether nothing more arrived for ``quiet`` seconds."""
    before = len(got)
    await asyncio.sleep(quiet)
    return len(got) == before


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--events", type=int, default=30_000)
    parser.add_argument("--rate", type=float, default=5_000.0, help="events per second")
    parser.add_argument("--stall", type=float, default=3.0, help="seconds the handler blocks")
    parser.add_argument("--stall-at", type=int, default=5_000, help="the event it blocks at")
    parser.add_argument("--max-msgs", type=int, default=2_000, help="the streams' message limit")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="bench-nats-stall-") as tmp:
        server = NatsServer(Path(tmp) / "nats").start()
        try:
            ours = run_dfpubsub(server.url, args, "handler")
            recv_stall = run_dfpubsub(server.url, args, "receive")
            theirs = run_jetstream(server.url, args)
        finally:
            server.kill()
    for label, r in (("handler blocked", ours), ("receive thread blocked", recv_stall)):
        print(f"[dfpubsub, {label}] published {r['published']}, delivered {r['delivered']}, lost {r['lost']} "
              f"(the stream dropped {r['dropped_by_stream']} envelopes), resyncs {r['resyncs']}, "
              f"lost undetected {r['undetected']}\n[dfpubsub, {label}] subscriber {r['stats']}", flush=True)
    print(f"[jetstream ordered consumer] published {theirs['published']}, delivered {theirs['delivered']}, "
          f"lost {theirs['lost']}, none of them reported to the subscription (the connection's error callback "
          f"heard {theirs['connection_errors']} slow-consumer notices)", flush=True)
    ours_share = 1 - ours["undetected"] / ours["lost"] if ours["lost"] else 1.0
    theirs_share = 1 - theirs["undetected"] / theirs["lost"] if theirs["lost"] else 1.0
    result = {"bench": "nats_stall", "dfpubsub_lost": ours["lost"], "dfpubsub_resyncs": ours["resyncs"],
              "dfpubsub_recv_stall_lost": recv_stall["lost"],
              "dfpubsub_recv_stall_stream_dropped": recv_stall["dropped_by_stream"],
              "lost_undetected": ours["undetected"] + recv_stall["undetected"], "jetstream_lost": theirs["lost"],
              "jetstream_lost_undetected": theirs["undetected"],
              "detected_ratio": round(ours_share / theirs_share, 2) if theirs_share else round(ours_share, 2)}
    print(json.dumps(result), flush=True)
    return 0 if result["lost_undetected"] == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
