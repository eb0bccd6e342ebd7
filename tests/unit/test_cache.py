from dfpubsub.controller import VersionedCache
from dfpubsub.events import Action, Event, VersionedObject


def ev(action, version, key="k", value=None, topic="t"):
    return Event(topic, "tbl", key, Action(action), version, value)


class Clock:
    def __init__(self):
        self.now = 0.0

    def __call__(self):
        return self.now


def test_newer_versions_apply_older_are_dropped():
    c = VersionedCache()
    assert c.apply(ev("create", 1, value={"a": 1}))
    assert c.apply(ev("update", 5, value={"a": 5}))
    assert not c.apply(ev("update", 3, value={"a": 3}))
    assert not c.apply(ev("update", 5, value={"a": "dup"}))
    assert c.get("tbl", "k").value == {"a": 5}
    assert c.version("tbl", "k") == 5


def test_versions_may_jump_ahead():
    c = VersionedCache()
    c.apply(ev("create", 1))
    assert c.apply(ev("update", 40, value=40))
    assert c.get("tbl", "k").version == 40


def test_late_update_after_delete_does_not_resurrect():
    c = VersionedCache()
    c.apply(ev("create", 1))
    assert c.apply(ev("delete", 3))
    assert c.get("tbl", "k") is None
    assert not c.apply(ev("update", 2, value="late"))
    assert c.get("tbl", "k") is None and c.tombstones() == 1
    # A genuine re-create has a newer version and wins.
    assert c.apply(ev("create", 4, value="again"))
    assert c.get("tbl", "k").value == "again" and c.tombstones() == 0


def test_tombstones_expire_after_the_horizon():
    clock = Clock()
    c = VersionedCache(tombstone_horizon=10, clock=clock)
    c.apply(ev("delete", 3, key="old"))
    clock.now = 11
    c.apply(ev("delete", 4, key="new"))  # a delete triggers the purge
    assert c.tombstones() == 1 and c.version("tbl", "old") == 0


def test_reconcile_reports_only_what_was_missed():
    c = VersionedCache()
    c.apply(ev("create", 1, key="same", value=1))
    c.apply(ev("create", 2, key="stale", value=2))
    c.apply(ev("create", 3, key="gone", value=3))
    c.apply(ev("create", 9, key="other-topic", value=9, topic="u"))
    truth = [
        VersionedObject("t", "tbl", "same", 1, 1),
        VersionedObject("t", "tbl", "stale", 7, "new"),
        VersionedObject("t", "tbl", "fresh", 8, "f"),
    ]
    changes = c.reconcile({"t"}, truth)
    assert {(ch.action, ch.key, ch.version) for ch in changes} == {
        (Action.UPDATE, "stale", 7), (Action.CREATE, "fresh", 8), (Action.DELETE, "gone", 3)
    }
    assert c.get("tbl", "gone") is None and c.get("tbl", "other-topic").version == 9
    assert not c.apply(ev("update", 3, key="gone"))  # the reconcile's tombstone holds
    assert c.reconcile({"t"}, truth) == []
