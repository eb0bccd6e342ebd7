"""A subscriber in its own process, so that tests can SIGSTOP and SIGKILL it or its peer.

Usage: python zmq_child.py ENDPOINT TOPIC[,TOPIC...] [RCVHWM]
Prints "ready" once synced; answers each "report" line on stdin with one JSON
line (delivered seqs per publisher/topic, resync requests, resyncs, counters);
exits when stdin closes.
"""

import json
import sys
import threading

from dfpubsub import Subscriber, SubscriberOptions, load_driver
from dfpubsub.metrics import Stats


def main() -> None:
    endpoint, topics = sys.argv[1], sys.argv[2].split(",")
    rcvhwm = int(sys.argv[3]) if len(sys.argv) > 3 else 10_000
    lock = threading.Lock()
    delivered: dict[str, list[int]] = {}
    gaps: list[dict] = []
    resyncs: list[list[str]] = []

    def on_event(e) -> None:
        with lock:
            delivered.setdefault(f"{e.publisher_id}/{e.topic}", []).append(e.seq)

    def on_gap(r) -> None:
        with lock:
            gaps.append({"topic": r.topic, "reason": r.reason, "pid": r.publisher_id, "missing": r.missing})

    def on_resync(t) -> None:
        with lock:
            resyncs.append(sorted(t))

    stats = Stats("subscriber", "child")
    sub = Subscriber(
        load_driver("zmq", {"rcvhwm": rcvhwm}).subscriber(stats), topics, on_event, on_resync,
        SubscriberOptions(message_delay_window=0.2), "child", on_gap=on_gap, stats=stats,
    )
    sub.connect(endpoint)
    sub.start()
    sub.wait_synced(10)
    print("ready", flush=True)
    for line in sys.stdin:
        if line.strip() == "report":
            with lock:
                report = {"delivered": delivered, "gaps": gaps, "resyncs": resyncs, "stats": stats.snapshot()}
                print(json.dumps(report), flush=True)
    sub.close()


if __name__ == "__main__":
    main()
