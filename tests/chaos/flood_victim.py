"""The publisher a subscription flood attacks: a plain Publisher on the zmq driver (issue 31).

Usage: python flood_victim.py
Binds tcp on a free loopback port, prints "uri URI id PUBLISHER_ID", then publishes event k1, k2, ... on
topic "port" (one every 2 ms) and every 50 ms prints "rss MB published N cut K". "stop" on
stdin closes it, after which it prints "published N" and exits.
"""

import sys
import threading
import time

from dfpubsub import Publisher, PublisherOptions, load_driver
from dfpubsub.metrics import Stats


def rss_mb() -> float:
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("VmRSS")) / 1024


def main() -> None:
    stats = Stats("publisher", "victim")
    pub = Publisher(load_driver("zmq+tcp://127.0.0.1:*").publisher(stats), "victim",
                    PublisherOptions(max_idle_time=0.5), stats)
    print(f"uri {pub.transport.uri} id {pub.id}", flush=True)
    stop = threading.Event()

    def wait_stop() -> None:
        sys.stdin.readline()
        stop.set()

    threading.Thread(target=wait_stop, daemon=True).start()
    n, last = 0, 0.0
    while not stop.is_set():
        n += 1
        pub.publish("port", "port", f"k{n}", "create", n, {"n": n})
        now = time.monotonic()
        if now - last >= 0.05:
            last = now
            print(f"rss {rss_mb():.1f} published {n} cut {stats.get('peers_cut', 'flood')}", flush=True)
        time.sleep(0.002)
    pub.close()
    print(f"published {n}", flush=True)


if __name__ == "__main__":
    main()
