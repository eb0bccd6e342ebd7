"""The change-feed part of df-demo: controllers register themselves and see each other.

A feed publisher (what ``df-feed`` runs) follows the store's change feed. Two
controllers taking ``chassis`` each write their own chassis row with a plain
store call: no NbApi, no publisher of their own. Each sees the other's row
arrive as an event (Dragonflow's controller-to-controller publishing): every
committed write is published, whoever wrote it.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

from dfpubsub.controller import Controller
from dfpubsub.events import VersionedObject
from dfpubsub.feed_publisher import FeedPublisher
from dfpubsub.metrics import Stats
from dfpubsub.plugins import load_driver
from dfpubsub.publisher import Publisher, PublisherOptions
from dfpubsub.store import Store
from dfpubsub.subscriber import SubscriberOptions

__all__ = ["run_registration"]


class _Chassis:
    """Says which chassis rows a controller was told about."""

    def __init__(self, name: str, say: Callable[[str, str], None]):
        self.name, self.say = name, say

    def on_create(self, obj: VersionedObject) -> None:
        self.say(self.name, f"sees chassis {obj.key!r} (v{obj.version}): {obj.value}")

    def on_update(self, obj: VersionedObject, previous: VersionedObject) -> None:
        self.on_create(obj)

    def on_delete(self, previous: VersionedObject) -> None:
        self.say(self.name, f"chassis {previous.key!r} is gone")


def run_registration(store: Store, say: Callable[[str, str], None], wait: Callable[..., bool]) -> bool:
    """True if each controller's chassis row reached the other one through the feed alone."""
    # The feed publisher's start-up warning (no saved position: subscribers resync) is expected here.
    logging.getLogger("dfpubsub.feed_publisher").setLevel(logging.ERROR)
    stats = Stats("publisher", "df-feed")
    transport = load_driver("zmq+tcp://127.0.0.1:*").publisher(stats)
    feed = FeedPublisher(store, Publisher(transport, "df-feed", PublisherOptions(batch_linger=0), stats),
                         compact_interval=0)
    stop = threading.Event()
    thread = threading.Thread(target=feed.run, args=(stop,), daemon=True)
    thread.start()
    say("df-feed", f"follows the store's change feed from revision {feed.position}, publishes on {transport.uri}")
    ctrls = []
    for name in ("controller-C", "controller-D"):
        ctrl = Controller(store, load_driver("zmq").subscriber(Stats("subscriber", name)), ["chassis"],
                          {"chassis": _Chassis(name, say)}, SubscriberOptions(message_delay_window=0.3), name)
        ctrl.connect(transport.uri)
        ctrl.start()
        ctrl.synced.wait(10)
        ctrls.append(ctrl)
    wait(lambda: stats.get("subscribers_joined") >= 2)
    for i, ctrl in enumerate(ctrls, 1):
        host = ctrl.name.replace("controller", "host")
        say(ctrl.name, f"registers itself: store.create('chassis', {host!r}) with no publisher")
        store.create("chassis", host, {"ip": f"10.0.0.{i}", "controller": ctrl.name})
    ok = wait(lambda: all(len(c.cache) == 2 for c in ctrls))
    say("df-feed", f"published {stats.get('feed_published')} changes; each controller knows "
                   f"{[len(c.cache) for c in ctrls]} chassis")
    for ctrl in ctrls:
        ctrl.stop()
    stop.set()
    thread.join(5)
    feed.close()
    feed.publisher.close()
    return ok
