"""VersionedCache.export with a key log (``ordered``, a controller that writes snapshots): a table is
copied a chunk of keys at a time under the lock, so the dispatch thread never waits for a whole
table's copy (issue 43: the snapshot's stall). What events change between two chunks shows in the
copy as it was when its chunk was read; docs/reliability.md says why a snapshot may hold that."""

from dfpubsub.controller import VersionedCache
from dfpubsub.controller.cache import _ORDER_SLACK
from dfpubsub.events import Action, Event, VersionedObject
from dfpubsub.store.api import PackedTable


def ev(action, version, key, table="tbl"):
    return Event("t", table, key, Action(action), version, None if action == "delete" else {"v": version})


class Interleaved:
    """Stands for the cache's lock: after each release outside a step, the next scripted step runs
    (a mutation, as the dispatch thread would make it between two of export's chunks)."""

    def __init__(self, lock, steps):
        self.lock, self.steps, self.busy = lock, list(steps), False

    def __enter__(self):
        self.lock.acquire()

    def __exit__(self, *exc):
        self.lock.release()
        if not self.busy and self.steps:
            self.busy = True
            try:
                step = self.steps.pop(0)
                if step is not None:
                    step()
            finally:
                self.busy = False


def _ops(c):
    for i in range(50):
        c.apply(ev("create", 1, f"k{i}"))
    c.fill([PackedTable("other", ["t"] * 3, ["a", "b", "c"], [4, 5, 6], [b"\x80"] * 3)])
    for i in range(0, 50, 3):
        c.apply(ev("update", 2, f"k{i}"))
    for i in range(0, 50, 5):
        c.apply(ev("delete", 3, f"k{i}"))
    c.apply(ev("create", 4, "k10"))  # created again after its delete
    c.correct({"t"}, [VersionedObject("t", "tbl", "k11", 7, {"fixed": 1})], [(("tbl", "k12"), 7)])


def _records(tables):
    return {t: {k: (v, topic, bytes(b)) for rows in parts for k, (v, topic, b) in rows.items()}
            for t, parts in tables.items()}


def test_an_ordered_export_equals_a_whole_copy_when_nothing_changes_meanwhile():
    plain, ordered = VersionedCache(), VersionedCache(ordered=True)
    ordered.export_chunk = 7
    _ops(plain)
    _ops(ordered)
    a, b = plain.export(), ordered.export()
    assert _records(a[0]) == _records(b[0]) and a[1] == b[1] and a[2] == b[2]
    assert set(_records(b[0])["tbl"]) == {f"k{i}" for i in range(50) if i % 5 or i == 10} - {"k12"}


def test_what_events_change_between_chunks_is_in_the_copy_as_its_chunk_found_it():
    c = VersionedCache(ordered=True)
    for i in range(10):
        c.apply(ev("create", 1, f"k{i}"))
    c.export_chunk = 2
    # Each step runs after a release: the first after export read the table names, then one
    # after each chunk (k0-k1, k2-k3, ...).
    c._lock = Interleaved(c._lock, [
        lambda: c.apply(ev("delete", 2, "k5")),  # before its chunk: not in the copy
        lambda: (c.apply(ev("update", 3, "k0")),  # after its chunk: as it was
                 c.apply(ev("delete", 3, "k1")),  # after its chunk: still in the copy
                 c.apply(ev("update", 3, "k8"))),  # before its chunk: as it is now
        lambda: c.apply(ev("create", 4, "new")),  # created during the walk: read at the log's end
    ])
    tables, tombs, _ = c.export()
    versions = {k: rec[0] for k, rec in _records(tables)["tbl"].items()}
    assert versions == {"k0": 1, "k1": 1, "k2": 1, "k3": 1, "k4": 1, "k6": 1, "k7": 1, "k8": 3, "k9": 1, "new": 4}
    assert tombs == {"tbl": {"k5": 2, "k1": 3}}  # read after the walk


def test_a_key_log_rebuilt_during_the_walk_is_read_again_from_its_start():
    c = VersionedCache(ordered=True)
    for i in range(10):
        c.apply(ev("create", 1, f"k{i}"))
    c.export_chunk = 3

    def rebuild():
        c._order["tbl"] = list(reversed(c._order["tbl"]))  # as the rebuild of a stale log makes a new list

    c._lock = Interleaved(c._lock, [None, rebuild])
    tables, _, _ = c.export()
    assert set(_records(tables)["tbl"]) == {f"k{i}" for i in range(10)}


def test_the_key_log_stays_bounded_under_churn_and_export_compacts_it():
    c = VersionedCache(ordered=True)
    c.apply(ev("create", 1, "stays"))
    for i in range(3 * _ORDER_SLACK):  # created and deleted: each leaves a stale key in the log
        c.apply(ev("create", 1, f"gone{i}"))
        c.apply(ev("delete", 2, f"gone{i}"))
        assert len(c._order["tbl"]) <= 2 * (len(c) + 1) + _ORDER_SLACK + 1  # checked as each key is created
    tables, _, _ = c.export()
    assert set(_records(tables)["tbl"]) == {"stays"} and c._order["tbl"] == ["stays"]
    c.clear()
    assert c._order == {} and c.export()[0] == {}


def test_without_a_key_log_nothing_is_kept_per_key():
    c = VersionedCache()
    c.apply(ev("create", 1, "k"))
    assert c._order is None and set(_records(c.export()[0])["tbl"]) == {"k"}
