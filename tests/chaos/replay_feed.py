"""df-feed's publisher (FeedPublisher) in a process of its own, optionally SIGKILLed mid-batch.

Usage: python replay_feed.py STORE_URL STORE_OPTIONS_JSON DRIVER_URL CURSOR KILL_PAST

Opens the store and a publisher bound at DRIVER_URL (max_idle_time 0.3 s), starts a FeedPublisher
from the position saved in CURSOR, prints its URI, and waits for a line on stdin before it reads
the feed: what was written meanwhile comes in one batch. With KILL_PAST > 0 the process SIGKILLs
itself when it is to send an envelope (not its first) that would take the events it sent past
KILL_PAST (0.3 s after that envelope's predecessors, so that they have left): in the middle of
publishing that batch, before its position is saved.
"""

import json
import os
import signal
import sys
import threading
import time

from dfpubsub import Publisher, PublisherOptions, load_driver
from dfpubsub.codec import decode
from dfpubsub.events import CONTROL_TOPIC, EventBatch
from dfpubsub.feed_publisher import FeedPublisher, FileCursor
from dfpubsub.metrics import Stats
from dfpubsub.store import open_store
from dfpubsub.transport import PublisherTransport


class KillPastEvents(PublisherTransport):
    """Passes envelopes to ``inner`` and SIGKILLs this process when it is handed an envelope (not
    the first) that would take the events sent past ``events``."""

    def __init__(self, inner: PublisherTransport, events: int):
        self.inner = inner
        self.limit = events
        self.sent = 0

    @property
    def uri(self) -> str:
        return self.inner.uri

    def send(self, topic: str, frame: bytes) -> None:
        if topic != CONTROL_TOPIC:
            batch = decode(frame)
            assert isinstance(batch, EventBatch)  # not the control topic: an envelope of events
            count = batch.count
            if self.sent and self.sent + count > self.limit:
                # What it sent before has left the process (ZeroMQ sends from a thread of its own):
                # the subscribers know this publisher's streams, and lose the rest of the batch.
                time.sleep(0.3)
                os.kill(os.getpid(), signal.SIGKILL)
            self.sent += count
        self.inner.send(topic, frame)

    def new_subscribers(self) -> int:
        return self.inner.new_subscribers()

    def close(self) -> None:
        self.inner.close()


def main() -> None:
    url, options, driver, cursor, kill_past = sys.argv[1], json.loads(sys.argv[2]), sys.argv[3], sys.argv[4], \
        int(sys.argv[5])
    stats = Stats("feed", "feed")
    transport = load_driver(driver).publisher(stats)
    if kill_past:
        transport = KillPastEvents(transport, kill_past)
    publisher = Publisher(transport, "feed", PublisherOptions(batch_linger=0.001, max_idle_time=0.3), stats)
    store = open_store(url, ["port", "network"], **options)
    feed = FeedPublisher(store, publisher, FileCursor(cursor), compact_interval=0)
    print(transport.uri, flush=True)
    sys.stdin.readline()
    stop = threading.Event()
    try:
        feed.run(stop)
    finally:
        feed.close()
        publisher.close()
        store.close()


if __name__ == "__main__":
    main()
