"""A controller whose handlers mirror the store, and the check that it converged."""

import threading

from dfpubsub import SubscriberOptions, load_driver
from dfpubsub.controller import Controller
from dfpubsub.errors import StoreUnavailable
from dfpubsub.metrics import Stats

TABLES = ["port", "network"]


class Mirror:
    """A table handler that rebuilds the table from the callbacks alone."""

    def __init__(self):
        self.objects = {}
        self.lock = threading.Lock()

    def on_create(self, obj):
        with self.lock:
            assert obj.key not in self.objects, f"create of a known object {obj.key}"
            self.objects[obj.key] = obj

    def on_update(self, obj, previous):
        with self.lock:
            assert self.objects[obj.key] == previous and obj.version > previous.version
            self.objects[obj.key] = obj

    def on_delete(self, previous):
        with self.lock:
            del self.objects[previous.key]


def snapshot(objs):
    return {(o.table, o.key): (o.version, o.value) for o in objs}


class Node:
    """A controller on ZeroMQ connected to ``endpoint``; ``gaps`` collects its resync requests."""

    def __init__(self, store, endpoint):
        self.mirrors = {t: Mirror() for t in TABLES}
        self.gaps = []
        self.ctrl = Controller(store, load_driver("zmq").subscriber(Stats("s", "s")), TABLES, self.mirrors,
                               SubscriberOptions(message_delay_window=0.2, max_idle_time=0.5),
                               on_gap=self.gaps.append)
        self.ctrl.connect(endpoint)
        self.ctrl.start()

    def converged(self, store):
        try:
            truth = snapshot(store.list())
        except StoreUnavailable:
            return False
        mirrored = snapshot(o for m in self.mirrors.values() for o in m.objects.values())
        return snapshot(self.ctrl.cache.items()) == truth == mirrored
