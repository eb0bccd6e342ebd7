"""A publisher process that tests kill with SIGKILL.

Usage: python pub_child.py URL MAX_IDLE_TIME
Binds URL, prints "id <publisher id>", then publishes one event on topic "t"
every 2 ms until killed.
"""

import sys
import time

from dfpubsub import Publisher, PublisherOptions, load_driver
from dfpubsub.metrics import Stats


def main() -> None:
    url, max_idle = sys.argv[1], float(sys.argv[2])
    stats = Stats("publisher", "child")
    pub = Publisher(load_driver(url).publisher(stats), "child", PublisherOptions(max_idle_time=max_idle), stats)
    print(f"id {pub.id}", flush=True)
    version = int(time.time() * 1000)
    while True:
        version += 1
        pub.publish("t", "tbl", f"k{version % 10}", "update", version, {"v": version})
        time.sleep(0.002)


if __name__ == "__main__":
    main()
