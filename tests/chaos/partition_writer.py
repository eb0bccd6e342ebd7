"""A writer on the far side of a network partition (run inside a network namespace).

Usage: python partition_writer.py STORE_URL BIND_URI. Binds a zmq publisher on BIND_URI, prints
its URI, then for each line on stdin ``PREFIX N`` creates N objects ``PREFIX0..`` through NbApi
(written and published directly) and prints ``done``; ``exit`` closes the publisher and exits.
"""

import sys

from dfpubsub import Publisher, PublisherOptions, load_driver
from dfpubsub.metrics import Stats
from dfpubsub.nbapi import NbApi
from dfpubsub.store import open_store


def main() -> None:
    url, bind = sys.argv[1:3]
    stats = Stats("publisher", "far")
    transport = load_driver(f"zmq+{bind}").publisher(stats)
    api = NbApi(open_store(url, ["port", "network"]),
                Publisher(transport, "far", PublisherOptions(batch_linger=0.001, max_idle_time=0.3), stats))
    print(transport.uri, flush=True)
    for line in sys.stdin:
        if line.strip() == "exit":
            break
        prefix, n = line.split()
        for i in range(int(n)):
            api.create("port", f"{prefix}{i}", {"i": i})
        print("done", flush=True)
    api.close()


if __name__ == "__main__":
    main()
