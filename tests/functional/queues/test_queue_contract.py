"""One queue contract, three backends: SQLite (embedded), Redis and etcd (real servers)."""

import itertools
import json
import subprocess
import sys

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import Bundle, RuleBasedStateMachine, invariant, multiple, rule, run_state_machine_as_test

from dfpubsub.errors import InvalidValue, QueueFull, QueueNotFound, ReservationNotFound
from dfpubsub.queues import QueueEntry, QueueStats, open_queues
from dfpubsub.queues.api import marker as marker_of
from tests.functional.store_helpers import backend_location

END = "9" * 20  # a marker after every entry


class FakeClock:
    """A wall clock that moves only when told to."""

    def __init__(self, now: float = 1_000_000.0):
        self.now = now

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


@pytest.fixture(params=["sqlite", "redis", "etcd"])
def queues_url(request, tmp_path):
    """(url, options) of a fresh, empty queue backend of each kind."""
    return backend_location(request, tmp_path, "q", "queues.sqlite")


@pytest.fixture
def opened(queues_url):
    """Opens queue stores on the test's backend (several may share it) and closes them."""
    url, opts = queues_url
    stores = []

    def open_(**more):
        stores.append(open_queues(url, **opts, **more))
        return stores[-1]

    yield open_
    for s in stores:
        s.close()


@pytest.fixture
def clock():
    return FakeClock()


@pytest.fixture
def q(opened, clock):
    return opened(clock=clock)


def stats(q, name):
    s = q.stats(name)
    return (s.entries, s.bytes, s.reservations, s.reserved_bytes)


def test_commit_order_list_pages_and_remove(q):
    assert q.create_queue("t", max_bytes=10_000, max_entries=100) is True
    ids = [q.reserve("t", 10) for _ in range(5)]
    assert len(set(ids)) == 5 and stats(q, "t") == (0, 0, 5, 50)
    # Committed in another order than reserved: markers follow commits.
    markers = [q.commit("t", ids[i], f"e{i}".encode()) for i in (3, 0, 4, 1, 2)]
    assert markers == sorted(markers) and len(set(markers)) == 5
    assert stats(q, "t") == (5, 10, 0, 0)
    page, more = q.list("t", 2)
    assert [e.data for e in page] == [b"e3", b"e0"] and more is True
    page, more = q.list("t", 2, from_marker=page[-1].marker)
    assert [e.data for e in page] == [b"e4", b"e1"] and more is True
    page, more = q.list("t", 2, from_marker=page[-1].marker)
    assert [e.data for e in page] == [b"e2"] and more is False
    assert q.list("t", 10, from_marker=markers[-1]) == ([], False)
    entries, _ = q.list("t")
    assert [e.marker for e in entries] == markers
    assert all(isinstance(e.enqueued_at, float) and e.enqueued_at > 0 for e in entries)
    assert q.remove("t", markers[2]) == 3
    assert [e.data for e in q.list("t")[0]] == [b"e1", b"e2"] and stats(q, "t") == (2, 4, 0, 0)
    assert q.remove("t", markers[2]) == 0
    assert q.remove("t", END) == 2 and q.list("t") == ([], False) and stats(q, "t") == (0, 0, 0, 0)
    # Markers are never reused while the queue exists.
    assert q.commit("t", q.reserve("t", 1), b"x") > markers[-1]


def test_abort_gives_the_room_back(q):
    q.create_queue("t", max_bytes=100, max_entries=2)
    a, b = q.reserve("t", 60), q.reserve("t", 40)
    with pytest.raises(QueueFull):
        q.reserve("t", 1)
    assert q.abort("t", a) is True and stats(q, "t") == (0, 0, 1, 40)
    assert q.abort("t", a) is False  # already gone
    c = q.reserve("t", 60)
    q.commit("t", b, b"x" * 40)
    q.abort("t", c)
    assert stats(q, "t") == (1, 40, 0, 0)
    with pytest.raises(ReservationNotFound):
        q.commit("t", c, b"late")


def test_full_on_bytes_and_on_entries(q):
    q.create_queue("bytes", max_bytes=100, max_entries=1000)
    q.commit("bytes", q.reserve("bytes", 50), b"x" * 50)
    q.reserve("bytes", 30)
    with pytest.raises(QueueFull) as err:
        q.reserve("bytes", 21)  # 50 committed + 30 reserved + 21 > 100
    assert err.value.queue == "bytes"
    q.reserve("bytes", 20)  # exactly full
    assert stats(q, "bytes") == (1, 50, 2, 50)

    q.create_queue("entries", max_bytes=10_000, max_entries=3)
    q.commit("entries", q.reserve("entries", 1), b"a")
    q.reserve("entries", 1)
    q.reserve("entries", 0)
    with pytest.raises(QueueFull):  # committed entries and reservations both count
        q.reserve("entries", 0)
    q.remove("entries", END)
    q.reserve("entries", 0)
    assert stats(q, "entries") == (0, 0, 3, 1)


def test_entry_larger_than_its_reservation(q):
    q.create_queue("t", max_bytes=100, max_entries=10)
    small = q.reserve("t", 10)
    other = q.reserve("t", 30)
    q.commit("t", small, b"x" * 60)  # takes 50 more: 60 + 30 <= 100
    assert stats(q, "t") == (1, 60, 1, 30)
    big = q.reserve("t", 5)
    with pytest.raises(QueueFull):
        q.commit("t", big, b"y" * 20)  # 60 + 30 + 20 > 100
    assert stats(q, "t") == (1, 60, 2, 35)  # the reservation is left as it was
    q.commit("t", big, b"y" * 10)  # 60 + 30 + 10 = 100
    q.commit("t", other, b"z")  # smaller than reserved: counts what it holds
    assert stats(q, "t") == (3, 71, 0, 0)
    assert [len(e.data) for e in q.list("t")[0]] == [60, 10, 1]


def test_batches_are_all_or_nothing(q, clock):
    q.create_queue("t", max_bytes=100, max_entries=5, stale_after=10)
    assert q.reserve_many("t", []) == [] and q.commit_many("t", []) == []
    with pytest.raises(QueueFull):
        q.reserve_many("t", [30, 30, 41])
    with pytest.raises(QueueFull):
        q.reserve_many("t", [0] * 6)
    assert stats(q, "t") == (0, 0, 0, 0)
    a, b, c = q.reserve_many("t", [30, 30, 40])
    assert stats(q, "t") == (0, 0, 3, 100)
    with pytest.raises(ReservationNotFound):
        q.commit_many("t", [(a, b"a"), ("nope", b"x")])
    with pytest.raises(QueueFull):
        q.commit_many("t", [(a, b"a" * 30), (b, b"b" * 31)])
    assert stats(q, "t") == (0, 0, 3, 100) and q.list("t") == ([], False)
    # A smaller entry frees room that a larger one after it may take.
    markers = q.commit_many("t", [(b, b"b" * 20), (a, b"a" * 40)])
    assert markers == sorted(markers) and stats(q, "t") == (2, 60, 1, 40)
    assert [e.data[:1] for e in q.list("t")[0]] == [b"b", b"a"]
    d = q.reserve("t", 0)
    clock.advance(5)
    e = q.reserve("t", 0)
    clock.advance(6)  # c and d expired, e lives
    with pytest.raises(ReservationNotFound):
        q.commit_many("t", [(e, b"e"), (d, b"d")])
    assert stats(q, "t") == (2, 60, 1, 0)  # nothing committed; the expired ones are gone
    for bad in ([(e, b"e"), (e, b"e")], [(e, "text")]):
        with pytest.raises(InvalidValue):
            q.commit_many("t", bad)
    with pytest.raises(InvalidValue):
        q.reserve_many("t", [1] * (q.max_batch + 1))
    with pytest.raises(QueueNotFound):
        q.reserve_many("nope", [1])
    with pytest.raises(QueueNotFound):
        q.commit_many("nope", [("r", b"x")])


def test_stale_reservations_expire_in_real_time(opened, wait_for):
    q = opened()  # the real clock
    q.create_queue("t", max_bytes=100, max_entries=10, stale_after=0.3)
    crashed = q.reserve("t", 100)  # a writer that dies before commit
    with pytest.raises(QueueFull):
        q.reserve("t", 1)

    def room() -> bool:
        try:
            q.abort("t", q.reserve("t", 100))
            return True
        except QueueFull:
            return False

    wait_for(room, timeout=10, what="the stale reservation's room to come back")
    assert stats(q, "t") == (0, 0, 0, 0)
    with pytest.raises(ReservationNotFound):
        q.commit("t", crashed, b"too late")


def test_reservations_of_no_bytes_hold_their_places_until_they_expire(q, clock):
    """The reserved bytes stay 0, yet each reservation holds an entry's place (Redis once looked
    at its reservations only when their bytes were not 0: found by test_accounting_never_leaks)."""
    q.create_queue("zero", max_bytes=100, max_entries=2, stale_after=10)
    q.reserve("zero", 0)
    q.reserve("zero", 0)
    with pytest.raises(QueueFull):
        q.reserve("zero", 0)
    assert stats(q, "zero") == (0, 0, 2, 0)
    clock.advance(11)
    assert stats(q, "zero") == (0, 0, 0, 0)
    q.reserve("zero", 0)
    assert stats(q, "zero") == (0, 0, 1, 0)


def test_expiry_is_exact_and_commit_refuses_expired(q, clock):
    q.create_queue("t", max_bytes=100, max_entries=10, stale_after=10)
    a = q.reserve("t", 40)
    clock.advance(5)
    b = q.reserve("t", 40)
    clock.advance(5)  # a expires at this very moment: still live
    assert stats(q, "t") == (0, 0, 2, 80)
    clock.advance(0.5)
    assert stats(q, "t") == (0, 0, 1, 40)
    with pytest.raises(ReservationNotFound, match="expired|unknown"):
        q.commit("t", a, b"x")
    assert q.commit("t", b, b"y" * 40) and stats(q, "t") == (1, 40, 0, 0)
    c = q.reserve("t", 60)
    clock.advance(11)
    assert q.abort("t", c) is False and stats(q, "t") == (1, 40, 0, 0)


def test_errors_are_typed(q):
    with pytest.raises(QueueNotFound):
        q.reserve("nope", 1)
    with pytest.raises(QueueNotFound):
        q.commit("nope", "r", b"x")
    for call in (lambda: q.list("nope"), lambda: q.remove("nope", END), lambda: q.stats("nope"),
                 lambda: q.queue_info("nope"), lambda: q.lock("nope", "me", 1), lambda: q.owner("nope"),
                 lambda: q.dead_letter("nope", "1".zfill(20), b"", "r"), lambda: q.abort("nope", "r")):
        with pytest.raises(QueueNotFound):
            call()
    q.create_queue("t")
    with pytest.raises(ReservationNotFound):
        q.commit("t", "no-such-reservation", b"x")
    for bad in ("", "a/b", "a b", "x" * 201, None):
        with pytest.raises(InvalidValue):
            q.create_queue(bad)
    for call in (lambda: q.reserve("t", -1), lambda: q.reserve("t", 1.5), lambda: q.list("t", 0),
                 lambda: q.list("t", 1, from_marker="12"), lambda: q.remove("t", "x" * 20),
                 lambda: q.commit("t", q.reserve("t", 1), "text"), lambda: q.create_queue("u", max_bytes=0),
                 lambda: q.lock("t", "", 1), lambda: q.lock("t", "me", 0), lambda: q.put_record("a/b", "n", b""),
                 lambda: q.put_record("k", "", b""), lambda: q.put_record("k", "n", "text")):
        with pytest.raises(InvalidValue):
            call()


def test_registry_of_queues(q):
    assert q.list_queues() == []
    assert q.create_queue("b", max_bytes=100, max_entries=5, stale_after=7) is True
    assert q.create_queue("a.1") is True
    assert q.list_queues() == ["a.1", "b"]
    info = q.queue_info("b")
    assert (info.name, info.max_bytes, info.max_entries, info.stale_after) == ("b", 100, 5, 7.0)
    q.commit("b", q.reserve("b", 10), b"x" * 10)
    # Idempotent: a second create keeps the entries and updates the limits.
    assert q.create_queue("b", max_bytes=200, max_entries=6, stale_after=8) is False
    assert q.queue_info("b")[1:4] == (200, 6, 8.0) and q.queue_info("b").created_at == info.created_at
    s = q.stats("b")
    assert (s.entries, s.max_bytes, s.max_entries) == (1, 200, 6)


def test_delete_queue_takes_everything_with_it(q):
    q.create_queue("t")
    q.commit("t", q.reserve("t", 1), b"x")
    pending = q.reserve("t", 5)
    q.lock("t", "me", 60)
    q.dead_letter("t", "1".zfill(20), b"x", "ttl")
    q.create_queue("other")
    q.dead_letter("other", "1".zfill(20), b"y", "ttl")
    assert q.delete_queue("t") is True and q.delete_queue("t") is False
    assert q.list_queues() == ["other"]
    with pytest.raises(QueueNotFound):
        q.stats("t")
    assert [d.queue for d in q.list_dead_letters()] == ["other"]
    q.create_queue("t")  # a new queue of the same name starts empty
    assert stats(q, "t") == (0, 0, 0, 0) and q.owner("t") is None and q.list("t") == ([], False)
    with pytest.raises(ReservationNotFound):
        q.commit("t", pending, b"x")


def test_leases(q, clock):
    q.create_queue("t")
    assert q.owner("t") is None
    assert q.lock("t", "rgw-1", 90) is True
    assert q.owner("t") == ("rgw-1", clock.now + 90)
    assert q.lock("t", "rgw-2", 90) is False  # held
    clock.advance(30)
    assert q.lock("t", "rgw-1", 90) is True  # renewed
    s = q.stats("t")
    assert (s.owner, s.owner_until) == ("rgw-1", clock.now + 90)
    clock.advance(90)  # until == now: still held
    assert q.lock("t", "rgw-2", 90) is False
    clock.advance(0.5)  # rgw-1 stopped renewing: expired
    assert q.owner("t") is None and q.stats("t").owner is None
    assert q.lock("t", "rgw-2", 90) is True and q.owner("t")[0] == "rgw-2"
    assert q.unlock("t", "rgw-1") is False and q.owner("t")[0] == "rgw-2"
    assert q.unlock("t", "rgw-2") is True and q.owner("t") is None
    assert q.lock("t", "rgw-1", 1) is True


def test_dead_letters(q):
    q.create_queue("b")
    q.create_queue("a")
    m1, m2 = "1".zfill(20), "2".zfill(20)
    assert q.dead_letter("b", m2, b"two", "max_retries") is True
    assert q.dead_letter("b", m1, b"one", "time_to_live") is True
    assert q.dead_letter("b", m1, b"again", "other") is False  # idempotent: the first stays
    assert q.dead_letter("a", m1, b"\x00\xff", "max_retries") is True
    letters = q.list_dead_letters()
    assert [(d.queue, d.marker, d.data, d.reason) for d in letters] == [
        ("a", m1, b"\x00\xff", "max_retries"), ("b", m1, b"one", "time_to_live"), ("b", m2, b"two", "max_retries")]
    assert all(d.at > 0 for d in letters)
    assert [d.marker for d in q.list_dead_letters("b")] == [m1, m2]
    assert len(q.list_dead_letters(max=2)) == 2
    assert stats(q, "b") == (0, 0, 0, 0)  # not counted in the queue
    assert q.purge_dead_letters("b") == 2 and [d.queue for d in q.list_dead_letters()] == ["a"]
    assert q.purge_dead_letters() == 1 and q.list_dead_letters() == []


def test_a_dead_letter_is_redriven_once_to_the_end_of_its_queue(q, opened):
    q.create_queue("t", max_bytes=1000, max_entries=3)
    first = q.commit("t", q.reserve("t", 10), b"first")
    entry = q.list("t")[0][0]
    assert q.set_aside("t", [entry], "max_retries") == 1
    q.commit("t", q.reserve("t", 10), b"second")
    again = q.redrive("t", first)
    assert again is not None and again > first
    assert [e.data for e in q.list("t")[0]] == [b"second", b"first"]
    assert q.list_dead_letters("t") == [] and stats(q, "t")[:2] == (2, len(b"second") + len(b"first"))
    # Gone meanwhile (redriven by someone else, purged): nothing happens, twice over.
    assert q.redrive("t", first) is None and opened().redrive("t", first) is None
    assert len(q.list("t")[0]) == 2
    # No room: the letter stays where it is.
    q.dead_letter("t", "9".zfill(20), b"x" * 990, "max_retries")
    with pytest.raises(QueueFull):
        q.redrive("t", "9".zfill(20))
    assert [d.marker for d in q.list_dead_letters("t")] == ["9".zfill(20)]
    with pytest.raises(QueueNotFound):
        q.redrive("nope", first)


def test_records(q):
    assert q.get_record("topic", "t1") is None and q.list_records("topic") == {}
    q.put_record("topic", "t1", b"one")
    q.put_record("topic", "t2", b"two")
    q.put_record("topic", "t1", b"uno")  # replaced
    q.put_record("config", "port/c1", b"\x00binary")
    assert q.get_record("topic", "t1") == b"uno"
    assert q.list_records("topic") == {"t1": b"uno", "t2": b"two"}
    assert q.list_records("config") == {"port/c1": b"\x00binary"}
    assert q.delete_record("topic", "t1") is True and q.delete_record("topic", "t1") is False
    assert q.list_records("topic") == {"t2": b"two"} and q.list_queues() == []


def test_clients_see_each_others_changes(opened, clock):
    """Two stores on one backend (like two processes): caches never make a refusal wrong."""
    a, b = opened(clock=clock), opened(clock=clock)
    a.create_queue("t", max_bytes=100, max_entries=2)
    m = a.commit("t", a.reserve("t", 50), b"x" * 50)
    b.commit("t", b.reserve("t", 50), b"y" * 50)
    with pytest.raises(QueueFull):
        a.reserve("t", 1)
    assert b.remove("t", END) == 2
    a.commit("t", a.reserve("t", 100), b"z" * 100)  # a sees the room b freed
    assert [e.data for e in b.list("t", from_marker=m)[0]] == [b"z" * 100]
    assert stats(a, "t") == stats(b, "t") == (1, 100, 0, 0)
    b.delete_queue("t")
    with pytest.raises(QueueNotFound):
        a.reserve("t", 1)


class QueueMachine(RuleBasedStateMachine):
    """Random reserve / commit / abort / remove / time steps against a model of the counters."""

    MAX_BYTES, MAX_ENTRIES, STALE = 400, 6, 10.0
    names = itertools.count()
    reservations = Bundle("reservations")

    def __init__(self, store, clock):
        super().__init__()
        self.q, self.clock = store, clock
        self.name = f"m{next(self.names)}"
        self.q.create_queue(self.name, self.MAX_BYTES, self.MAX_ENTRIES, self.STALE)
        self.res: dict[str, tuple[int, float]] = {}  # id -> (size, expires_at)
        self.entries: list[tuple[str, bytes]] = []

    def live(self) -> dict[str, tuple[int, float]]:
        self.res = {r: v for r, v in self.res.items() if v[1] >= self.clock.now}
        return self.res

    def used(self) -> int:
        return sum(len(d) for _, d in self.entries) + sum(s for s, _ in self.live().values())

    @rule(target=reservations, size=st.integers(0, 150))
    def reserve(self, size):
        if self.used() + size <= self.MAX_BYTES and len(self.entries) + len(self.live()) < self.MAX_ENTRIES:
            rid = self.q.reserve(self.name, size)
            assert rid not in self.res
            self.res[rid] = (size, self.clock.now + self.STALE)
            return rid
        with pytest.raises(QueueFull):
            self.q.reserve(self.name, size)
        return multiple()

    @rule(rid=reservations, size=st.integers(0, 200))
    def commit(self, rid, size):
        data = bytes([size % 256]) * size
        if rid not in self.live():
            with pytest.raises(ReservationNotFound):
                self.q.commit(self.name, rid, data)
        elif size > self.res[rid][0] and self.used() - self.res[rid][0] + size > self.MAX_BYTES:
            with pytest.raises(QueueFull):
                self.q.commit(self.name, rid, data)
        else:
            m = self.q.commit(self.name, rid, data)
            assert not self.entries or m > self.entries[-1][0]
            del self.res[rid]
            self.entries.append((m, data))

    @rule(target=reservations, sizes=st.lists(st.integers(0, 100), min_size=1, max_size=4))
    def reserve_many(self, sizes):
        if self.used() + sum(sizes) <= self.MAX_BYTES and len(self.entries) + len(self.live()) + len(sizes) \
                <= self.MAX_ENTRIES:
            rids = self.q.reserve_many(self.name, sizes)
            self.res.update((r, (s, self.clock.now + self.STALE)) for r, s in zip(rids, sizes))
            return multiple(*rids)
        with pytest.raises(QueueFull):
            self.q.reserve_many(self.name, sizes)
        return multiple()

    @rule(rids=st.lists(reservations, min_size=1, max_size=4, unique=True), size=st.integers(0, 120))
    def commit_many(self, rids, size):
        items = [(r, bytes([i]) * (size + i)) for i, r in enumerate(rids)]
        live = self.live()
        possible = set()
        if any(r not in live for r in rids):
            possible.add(ReservationNotFound)
        used = self.used()
        for r, data in items:
            if r not in live:
                break
            used += len(data) - live[r][0]
            if len(data) > live[r][0] and used > self.MAX_BYTES:
                possible.add(QueueFull)
                break
        if possible:
            with pytest.raises((QueueFull, ReservationNotFound)) as err:
                self.q.commit_many(self.name, items)
            assert err.type in possible
            return
        markers = self.q.commit_many(self.name, items)
        assert markers == sorted(markers) and (not self.entries or markers[0] > self.entries[-1][0])
        for (r, data), m in zip(items, markers):
            del self.res[r]
            self.entries.append((m, data))

    @rule(rid=reservations)
    def abort(self, rid):
        assert self.q.abort(self.name, rid) is (rid in self.live())
        self.res.pop(rid, None)

    @rule(k=st.integers(0, 7))
    def remove(self, k):
        upto = self.entries[k][0] if k < len(self.entries) else END
        gone = [e for e in self.entries if e[0] <= upto]
        assert self.q.remove(self.name, upto) == len(gone)
        self.entries = self.entries[len(gone):]

    @rule(picks=st.lists(st.integers(0, 7), max_size=4), aside=st.booleans())
    def remove_exactly(self, picks, aside):
        """Remove (or set aside) some entries wherever they are; a pick past the end is one already gone."""
        chosen = {self.entries[k] for k in picks if k < len(self.entries)}
        stale = [(marker_of(len(self.entries) + k + 1000), b"") for k in picks if k >= len(self.entries)]
        if aside:
            listed = [QueueEntry(m, d, 0.0) for m, d in [*chosen, *stale]]
            assert self.q.set_aside(self.name, listed, "why") == len(chosen)
            letters = {d.marker: d.data for d in self.q.list_dead_letters(self.name, max=1000)}
            assert all(letters.get(m) == d for m, d in chosen)
        else:
            assert self.q.remove_markers(self.name, [m for m, _ in [*chosen, *stale]]) == len(chosen)
        self.entries = [e for e in self.entries if e not in chosen]

    @rule(dt=st.sampled_from([0.5, 1.0, 5.0, 9.5, 10.0, 20.0]))
    def tick(self, dt):
        self.clock.advance(dt)

    @invariant()
    def counters_are_what_is_there(self):
        live = self.live()
        assert self.q.stats(self.name)[:6] == (
            len(self.entries), sum(len(d) for _, d in self.entries), len(live), sum(s for s, _ in live.values()),
            self.MAX_BYTES, self.MAX_ENTRIES)
        assert [(e.marker, e.data) for e in self.q.list(self.name, 100)[0]] == self.entries

    def teardown(self):
        self.q.delete_queue(self.name)


def test_accounting_never_leaks(queues_url, opened, clock):
    store = opened(clock=clock)
    examples = 40 if queues_url[0].startswith("etcd") else 80
    run_state_machine_as_test(
        lambda: QueueMachine(store, clock),
        settings=settings(max_examples=examples, stateful_step_count=30, deadline=None,
                          suppress_health_check=list(HealthCheck)))


_WORKER = """
import json, sys
from dfpubsub.queues import open_queues
url, opts, worker, n = sys.argv[1], json.loads(sys.argv[2]), sys.argv[3], int(sys.argv[4])
q = open_queues(url, **opts)
done = []
for i in range(n):
    rid = q.reserve("shared", 16)
    if i % 5 == 4:  # a failed write: the reservation is given back
        q.abort("shared", rid)
        continue
    done.append([q.commit("shared", rid, f"{worker}:{i}".encode()), f"{worker}:{i}"])
q.close()
print(json.dumps(done))
"""


def test_four_processes_write_concurrently(queues_url, opened):
    url, opts = queues_url
    q = opened()
    q.create_queue("shared", max_bytes=1 << 20, max_entries=10_000)
    n = 40 if url.startswith("etcd") else 150
    procs = [subprocess.Popen([sys.executable, "-c", _WORKER, url, json.dumps(opts), f"w{w}", str(n)],
                              stdout=subprocess.PIPE, text=True) for w in range(4)]
    committed = {}
    for p in procs:
        out, _ = p.communicate(timeout=240)
        assert p.returncode == 0
        committed.update({m: d for m, d in json.loads(out)})
    expected = 4 * (n - n // 5)
    assert len(committed) == expected  # unique markers
    entries, more = q.list("shared", 10_000)
    assert not more and [(e.marker, e.data.decode()) for e in entries] == sorted(committed.items())
    for w in range(4):  # each writer's entries in its own order
        mine = [int(e.data.split(b":")[1]) for e in entries if e.data.startswith(f"w{w}:".encode())]
        assert mine == sorted(mine)
    s = q.stats("shared")
    assert s[:4] == (expected, sum(len(e.data) for e in entries), 0, 0)
    assert isinstance(s, QueueStats)


def test_timestamps_come_from_the_clock(q, clock):
    q.create_queue("t")
    q.commit("t", q.reserve("t", 1), b"x")
    assert q.list("t")[0][0].enqueued_at == clock.now
    assert q.queue_info("t").created_at == clock.now


def test_remove_markers_removes_exactly_those_entries(q):
    q.create_queue("t", max_bytes=10_000, max_entries=100)
    markers = [q.commit("t", q.reserve("t", 10), f"e{i}".encode()) for i in range(6)]
    # The middle and the end go; the entries before and between them stay, whatever their position.
    assert q.remove_markers("t", [markers[1], markers[3], markers[5]]) == 3
    assert [e.marker for e in q.list("t")[0]] == [markers[0], markers[2], markers[4]]
    assert stats(q, "t") == (3, 6, 0, 0)
    assert q.remove_markers("t", [markers[1], markers[2]]) == 1  # one was already gone
    assert q.remove_markers("t", []) == 0
    assert [e.data for e in q.list("t")[0]] == [b"e0", b"e4"] and stats(q, "t") == (2, 4, 0, 0)
    with pytest.raises(QueueNotFound):
        q.remove_markers("nope", [markers[0]])
    with pytest.raises(InvalidValue):
        q.remove_markers("t", ["x"])


def test_set_aside_records_and_removes_each_entry_in_one_step(q):
    q.create_queue("t", max_bytes=10_000, max_entries=100)
    markers = [q.commit("t", q.reserve("t", 10), f"e{i}".encode()) for i in range(5)]
    listed = q.list("t")[0]
    # An undecodable entry in the middle: only it moves; the valid ones ahead of it stay queued.
    assert q.set_aside("t", [listed[2]], "undecodable: bad") == 1
    assert [e.marker for e in q.list("t")[0]] == [markers[0], markers[1], markers[3], markers[4]]
    assert stats(q, "t") == (4, 8, 0, 0)
    assert [(d.marker, d.data, d.reason) for d in q.list_dead_letters("t")] == [(markers[2], b"e2", "undecodable: bad")]
    # Again (an owner replaced after the move): nothing queued to move, the record stays as it was.
    assert q.set_aside("t", [listed[2]], "other") == 0
    # A record made alone earlier (dead_letter() of an older worker) is completed: the entry goes.
    q.dead_letter("t", markers[4], b"e4", "time_to_live")
    assert q.set_aside("t", [listed[0], listed[4]], "max_retries (2)") == 2
    assert [e.marker for e in q.list("t")[0]] == [markers[1], markers[3]] and stats(q, "t") == (2, 4, 0, 0)
    letters = {d.marker: d for d in q.list_dead_letters("t")}
    assert sorted(letters) == [markers[0], markers[2], markers[4]]
    assert letters[markers[0]].data == b"e0" and letters[markers[0]].reason == "max_retries (2)"
    with pytest.raises(QueueNotFound):
        q.set_aside("nope", [listed[0]], "x")


def test_exact_removal_pages_through_long_batches(q):
    q.create_queue("t", max_bytes=1 << 20, max_entries=1000)
    for chunk in range(3):
        q.commit_many("t", [(r, f"e{chunk}-{i}".encode()) for i, r in enumerate(q.reserve_many("t", [8] * 100))])
    listed = q.list("t", 300)[0]
    odd, even = listed[1::2], listed[0::2]
    assert q.set_aside("t", odd[:q.max_batch], "max_retries") == min(150, q.max_batch)
    assert q.remove_markers("t", [e.marker for e in even[:q.max_batch]]) == min(150, q.max_batch)
    left = q.list("t", 300)[0]
    assert len(left) == 300 - 2 * min(150, q.max_batch) == q.stats("t").entries
    assert len(q.list_dead_letters("t", max=1000)) == min(150, q.max_batch)
