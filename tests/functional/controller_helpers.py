"""A controller whose handlers and reconcilers mirror the store, and the check that it converged."""

import threading

from dfpubsub import SubscriberOptions, load_driver
from dfpubsub.controller import Controller, ControllerOptions
from dfpubsub.errors import StoreUnavailable
from dfpubsub.metrics import Stats
from dfpubsub.tracker import ResyncRequest

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
            assert self.objects[obj.key] == previous and obj != previous  # older only after a forged one
            self.objects[obj.key] = obj

    def on_delete(self, previous):
        with self.lock:
            del self.objects[previous.key]


class Seen:
    """A reconciler that keeps what it last saw per key, and fails the test if a key runs twice at once."""

    def __init__(self):
        self.objects = {}
        self.calls = {}
        self.active = {}
        self.overlaps = 0
        self.lock = threading.Lock()

    def reconcile(self, key, obj):
        with self.lock:
            self.calls[key.key] = self.calls.get(key.key, 0) + 1
            self.active[key.key] = self.active.get(key.key, 0) + 1
            self.overlaps += self.active[key.key] > 1
        try:
            self.act(key, obj)
            with self.lock:
                if obj is None:
                    self.objects.pop(key.key, None)
                else:
                    self.objects[key.key] = obj
        finally:
            with self.lock:
                self.active[key.key] -= 1

    def act(self, key, obj):
        """What the reconcile does besides recording (raise, block...): nothing here."""


def snapshot(objs):
    return {(o.table, o.key): (o.version, o.value) for o in objs}


class Node:
    """A controller on ZeroMQ connected to ``endpoint`` (or on ``transport``, a subscriber of any
    driver); ``gaps`` collects its resync requests."""

    def __init__(self, store, endpoint, transport=None):
        self.mirrors = {"port": Mirror()}  # the handler protocol on one table...
        self.seen = Seen()  # ...a plain reconciler on the other
        self.gaps: list[ResyncRequest] = []
        transport = transport or load_driver("zmq").subscriber(Stats("s", "s"))
        self.ctrl = Controller(store, transport, TABLES, self.mirrors,
                               SubscriberOptions(message_delay_window=0.2, max_idle_time=0.5),
                               on_gap=self.gaps.append, reconcilers={"network": self.seen},
                               runtime=ControllerOptions(workers=4))
        self.ctrl.connect(endpoint)
        self.ctrl.start()

    def converged(self, store):
        try:
            truth = snapshot(store.list())
        except StoreUnavailable:
            return False
        mirrored = snapshot([*self.mirrors["port"].objects.values(), *self.seen.objects.values()])
        assert self.seen.overlaps == 0, "a key was reconciled by two workers at once"
        return snapshot(self.ctrl.cache.items()) == truth == mirrored
