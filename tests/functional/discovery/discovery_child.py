"""A publisher process that registers itself in discovery, so that tests can SIGKILL it.

Usage: python discovery_child.py URL TTL RENEW_INTERVAL PREFIX PUBLISHER_ID
Prints one JSON line ({"pid": ..., "ttl": effective TTL}) once registered, then
keeps the registration alive until it is killed (or stdin closes).
"""

import json
import os
import sys
import time

from dfpubsub.discovery import PublisherRecord, open_discovery


def main() -> None:
    url, ttl, renew, prefix, publisher_id = sys.argv[1:6]
    discovery = open_discovery(url, float(ttl), float(renew), prefix)
    record = PublisherRecord(publisher_id, "child", ["tcp://127.0.0.1:1"], "localhost", os.getpid(), time.time(),
                             ["port"])
    registration = discovery.register(record)
    print(json.dumps({"pid": os.getpid(), "ttl": discovery.effective_ttl}), flush=True)
    sys.stdin.read()  # until the parent closes it (or kills us)
    registration.close()
    discovery.close()


if __name__ == "__main__":
    main()
