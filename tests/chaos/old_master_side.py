"""A writer and a change-feed reader next to a Redis master, all three cut off together from the
sentinels (run inside a network namespace with that master): what an old master keeps doing
while a replica is promoted elsewhere.

Usage: python old_master_side.py REDIS_URL PREFIX. Prints ``ready``; then a reader follows the
store's feed from its head and prints ``position N`` as it moves, and ``rewound AFTER HORIZON``
(or ``gone ...``) when the feed says its history went back. Each stdin line ``write N`` creates
``N`` objects ``far0..`` one after the other and prints ``acked KEY VERSION`` for each that
returned and ``done`` after the last; ``exit`` exits.
"""

import sys
import threading
import time

from dfpubsub.errors import HistoryGone, StoreUnavailable
from dfpubsub.store import open_store

TABLES = ["port", "network"]
out = threading.Lock()


def say(*words: object) -> None:
    with out:
        print(*words, flush=True)


def follow(url: str, prefix: str) -> None:
    store = open_store(url, TABLES, prefix=prefix, timeout=1.0)
    reader = store.follow_feed(store.feed_head())
    moved = reader.position
    while True:
        try:
            reader.read(1000, 0.2)
        except HistoryGone as exc:
            say("rewound" if exc.reason == "history_rewound" else "gone", exc.after, exc.horizon)
            return
        except StoreUnavailable:
            time.sleep(0.05)
            continue
        if reader.position != moved:
            moved = reader.position
            say("position", moved)


def main() -> None:
    url, prefix = sys.argv[1:3]
    store = open_store(url, TABLES, prefix=prefix, timeout=1.0)
    threading.Thread(target=follow, args=(url, prefix), daemon=True).start()
    say("ready")
    n = 0
    for line in sys.stdin:
        words = line.split()
        if words == ["exit"]:
            return
        for _ in range(int(words[1])):
            key = f"far{n}"
            n += 1
            try:
                say("acked", key, store.create("port", key, n, topic="t").version)
            except StoreUnavailable:
                time.sleep(0.01)
        say("done")


if __name__ == "__main__":
    main()
