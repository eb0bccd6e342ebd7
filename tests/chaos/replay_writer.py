"""An API worker the replay chaos tests kill with SIGKILL or cut off by a partition.

Usage: python replay_writer.py STORE_URL STORE_OPTIONS_JSON DRIVER_URL

Opens the store and a publisher bound at DRIVER_URL (max_idle_time 0.3 s), prints its URI, then for
each line on stdin ``FIRST COUNT RATE`` updates the objects ``port/k{FIRST}..`` through NbApi
(written and published), at most RATE a second (0: at once), flushes, and prints
``done VERSION`` (the last write's). Between commands it idles, saying hello, until stdin closes
or it is killed.
"""

import json
import sys
import time

from dfpubsub import Publisher, PublisherOptions, load_driver
from dfpubsub.metrics import Stats
from dfpubsub.nbapi import NbApi
from dfpubsub.store import open_store

PAD = "x" * 64


def main() -> None:
    url, options, driver = sys.argv[1], json.loads(sys.argv[2]), sys.argv[3]
    stats = Stats("publisher", "worker")
    transport = load_driver(driver).publisher(stats)
    publisher = Publisher(transport, "worker", PublisherOptions(batch_linger=0.001, max_idle_time=0.3), stats)
    api = NbApi(open_store(url, ["port", "network"], **options), publisher)
    print(transport.uri, flush=True)
    for line in sys.stdin:
        first, count, rate = int(line.split()[0]), int(line.split()[1]), float(line.split()[2])
        start, version = time.monotonic(), 0
        for n, i in enumerate(range(first, first + count)):
            version = api.update("port", f"k{i}", {"i": -i, "pad": PAD}).version
            if rate:
                time.sleep(max(0.0, start + (n + 1) / rate - time.monotonic()))
        publisher.flush()
        print(f"done {version}", flush=True)
    api.close()


if __name__ == "__main__":
    main()
