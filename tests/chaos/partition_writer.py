"""A writer on the far side of a network partition (run inside a network namespace).

Usage: python partition_writer.py STORE_URL DRIVER_URL [OPTIONS_JSON]. Opens a publisher of
DRIVER_URL (a zmq one binds there; with ``multiproc_socket`` in the options, an API worker's
publisher into the df-publisher-service serving DRIVER_URL on that socket), prints its URI, then for each line on stdin ``PREFIX N``
creates N objects ``PREFIX0..`` through NbApi (written and published directly) and prints
``done``; ``exit`` closes the publisher and exits.
"""

import json
import sys

from dfpubsub import Publisher, PublisherOptions, load_driver
from dfpubsub.config import load_settings
from dfpubsub.factory import create_publisher
from dfpubsub.metrics import Stats
from dfpubsub.multiproc import WorkerPublisher
from dfpubsub.nbapi import NbApi
from dfpubsub.store import open_store


def main() -> None:
    url, driver = sys.argv[1:3]
    options = json.loads(sys.argv[3]) if len(sys.argv) > 3 else {}
    socket_path = options.pop("multiproc_socket", None)
    publisher: Publisher | WorkerPublisher
    if socket_path:  # an API worker publishing through the host's df-publisher-service
        publisher = create_publisher(load_settings(None, {"pubsub": {
            "driver": driver, "multiproc": True, "multiproc_socket": socket_path, "max_idle_time": 0.3,
            "multiproc_batch_linger": 0.001}}), "far")
        uri = driver.split("+", 1)[1]
    else:
        stats = Stats("publisher", "far")
        transport = load_driver(driver, options).publisher(stats)
        publisher = Publisher(transport, "far", PublisherOptions(batch_linger=0.001, max_idle_time=0.3), stats)
        uri = transport.uri
    api = NbApi(open_store(url, ["port", "network"]), publisher)
    print(uri, flush=True)
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
