"""A feed publisher running in a thread of the test, on ZeroMQ."""

import threading

from dfpubsub import Publisher, PublisherOptions, load_driver
from dfpubsub.feed_publisher import FeedPublisher, FileCursor
from dfpubsub.metrics import Stats


class FeedThread:
    """A :class:`FeedPublisher` of ``store`` on ``driver`` (a fresh tcp port by default), run until
    :meth:`close`."""

    def __init__(self, store, cursor_path=None, name="feed", driver="zmq+tcp://127.0.0.1:*", options=None,
                 schema=1):
        self.stats = Stats("feed", name)
        transport = load_driver(driver, options).publisher(self.stats)
        self.publisher = Publisher(transport, name, PublisherOptions(batch_linger=0.001, max_idle_time=0.3,
                                                                     schema=schema), self.stats)
        self.endpoint = transport.uri
        self.feed = FeedPublisher(store, self.publisher, FileCursor(cursor_path) if cursor_path else None,
                                  compact_interval=0)
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self.feed.run, args=(self.stop,), daemon=True)
        self.thread.start()

    def close(self):
        self.stop.set()
        self.thread.join(10)
        self.feed.close()
        self.publisher.close()
