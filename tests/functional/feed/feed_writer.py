"""A writer process for the feed tests.

Usage: python feed_writer.py MODE URL PREFIX ARGS...

- ``kill URL PREFIX KEY``: NbApi with a direct publisher that SIGKILLs this process
  when it publishes: the create commits, nothing is published, the process dies.
- ``cas URL PREFIX N_KEYS INCREMENTS``: raw compare-and-set increments of counters in
  the "port" table, no publisher at all; prints the versions it wrote as JSON.
"""

import json
import sys

from dfpubsub import Publisher, PublisherOptions, load_driver
from dfpubsub.errors import AlreadyExists, VersionConflict
from dfpubsub.metrics import Stats
from dfpubsub.nbapi import NbApi
from dfpubsub.store import open_store
from dfpubsub.testing import KillOnSend


def main() -> None:
    mode, url, prefix = sys.argv[1:4]
    store = open_store(url, ["port", "network"], **({} if url.startswith("sqlite") else {"prefix": prefix}))
    if mode == "kill":
        stats = Stats("p", "doomed")
        transport = KillOnSend(load_driver("zmq+tcp://127.0.0.1:*").publisher(stats))
        api = NbApi(store, Publisher(transport, "doomed", PublisherOptions(batch_linger=0), stats))
        api.create("port", sys.argv[4], {"from": "doomed"})
        raise SystemExit("still alive after publishing")
    n_keys, increments = int(sys.argv[4]), int(sys.argv[5])
    written = []
    for i in range(increments):
        key = f"c{i % n_keys}"
        while True:
            obj = store.get("port", key)
            try:
                if obj is None:
                    written.append((key, store.create("port", key, {"n": 1}).version))
                else:
                    written.append((key, store.update("port", key, {"n": obj.value["n"] + 1},
                                                      expected_version=obj.version).version))
                break
            except (VersionConflict, AlreadyExists):  # another process wrote first: read again
                continue
    print(json.dumps(written), flush=True)
    store.close()


if __name__ == "__main__":
    main()
