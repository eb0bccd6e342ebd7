"""Table handlers run as reconcilers: the current state becomes the one call that brings the handler there."""

import pytest

from dfpubsub.controller import HandlerReconciler, ObjectKey
from dfpubsub.events import VersionedObject

KEY = ObjectKey("port", "p1")


def obj(version, value=None):
    return VersionedObject("port", "port", "p1", version, value)


class Recorder:
    def __init__(self):
        self.calls = []
        self.fail = 0

    def _record(self, *call):
        self.calls.append(call)
        if self.fail:
            self.fail -= 1
            raise RuntimeError("handler failed")

    def on_create(self, o):
        self._record("create", o.version)

    def on_update(self, o, previous):
        self._record("update", o.version, previous.version)

    def on_delete(self, previous):
        self._record("delete", previous.version)


def test_states_become_create_update_delete_and_repeats_call_nothing():
    h = Recorder()
    r = HandlerReconciler(h)
    r.reconcile(KEY, obj(1))
    r.reconcile(KEY, obj(1))  # a periodic re-delivery
    r.reconcile(KEY, obj(5))  # versions 2..4 collapsed
    r.reconcile(KEY, None)
    r.reconcile(KEY, None)
    assert h.calls == [("create", 1), ("update", 5, 1), ("delete", 5)]


def test_a_handler_that_raises_is_brought_from_what_it_last_took_to_the_current_state():
    h = Recorder()
    r = HandlerReconciler(h)
    r.reconcile(KEY, obj(1))
    h.fail = 1
    with pytest.raises(RuntimeError):
        r.reconcile(KEY, obj(2))
    r.reconcile(KEY, obj(3))  # the retry sees the newest state, from what the handler has
    h.fail = 2
    for _ in range(2):
        with pytest.raises(RuntimeError):
            r.reconcile(KEY, None)
    r.reconcile(KEY, None)
    assert h.calls == [("create", 1), ("update", 2, 1), ("update", 3, 1), ("delete", 3), ("delete", 3), ("delete", 3)]
    assert r.seen == {}


def test_an_object_deleted_before_the_handler_took_it_calls_nothing():
    h = Recorder()
    h.fail = 1
    r = HandlerReconciler(h)
    with pytest.raises(RuntimeError):
        r.reconcile(KEY, obj(1))
    r.reconcile(KEY, None)
    assert h.calls == [("create", 1)]
