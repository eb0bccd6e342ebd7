import gc
import tracemalloc

from hypothesis import given, settings
from hypothesis import strategies as st

from dfpubsub.codec import decode_header, encode_hello
from dfpubsub.events import Action, Bye, Event, EventBatch, Hello, kept_id
from dfpubsub.metrics import Stats
from dfpubsub.tracker import SequenceTracker, TrackerLimits

WINDOW = 0.5


def batch(seq, n=1, topic="t", pid="A"):
    events = [Event(topic, "tbl", f"k{seq + i}", Action.UPDATE, seq + i, None, 0.0, pid, seq + i) for i in range(n)]
    return EventBatch(pid, pid.lower(), topic, seq, 0.0, events)


def hello(seqs, pid="A", reason="idle", max_idle=1.0):
    return Hello(pid, pid.lower(), 0.0, seqs, reason, max_idle, "h")


def tracker(topics=("t",), **kw):
    return SequenceTracker(set(topics), WINDOW, Stats("test", "t"), **kw)


def seqs(batches):
    return [e.seq for b in batches for e in b.events]


def test_in_order_delivery():
    tr = tracker()
    out = []
    for s in range(1, 6):
        out += tr.on_batch(batch(s), 0.0)
    assert seqs(out) == [1, 2, 3, 4, 5]
    assert tr.requests == [] and tr.stats.get("gaps") == 0


def test_duplicates_are_dropped_and_counted():
    tr = tracker()
    tr.on_batch(batch(1, 3), 0.0)
    assert tr.on_batch(batch(2), 0.0) == []
    out = tr.on_batch(batch(3, 3), 0.0)  # overlaps: 3 is old, 4..5 new
    assert seqs(out) == [4, 5]
    assert tr.stats.get("duplicates") == 2


def test_gap_filled_within_the_window():
    tr = tracker()
    tr.on_batch(batch(1), 0.0)
    assert tr.on_batch(batch(3), 0.1) == []
    assert tr.on_batch(batch(4), 0.2) == []
    assert tr.next_deadline() == 0.1 + WINDOW
    assert seqs(tr.on_batch(batch(2), 0.3)) == [2, 3, 4]
    assert tr.next_deadline() is None and tr.requests == []
    assert tr.stats.get("gaps") == 1 and tr.stats.get("gaps_filled") == 1


def test_gap_that_expires_requests_resync_and_releases_what_was_held():
    tr = tracker()
    tr.on_batch(batch(1), 0.0)
    tr.on_batch(batch(3), 0.1)
    tr.on_batch(batch(5, 2), 0.1)
    assert tr.tick(0.1 + WINDOW - 0.01) == []
    out = tr.tick(0.1 + WINDOW)
    assert seqs(out) == [3, 5, 6]
    (req,) = tr.pop_requests()
    assert (req.topic, req.reason, req.publisher_id, req.missing) == ("t", "gap_expired", "A", (2, 4))
    # The stream goes on after the hole; a late message from the hole is a duplicate.
    assert seqs(tr.on_batch(batch(7), 1.0)) == [7]
    assert tr.on_batch(batch(2), 1.0) == []


def test_hello_ahead_of_received_opens_a_gap():
    tr = tracker()
    tr.on_batch(batch(1), 0.0)
    tr.on_hello(hello({"t": 3}), 0.1)
    assert tr.gap_open("A", "t")
    tr.tick(0.1 + WINDOW)
    (req,) = tr.pop_requests()
    assert req.reason == "gap_expired" and req.missing == (2, 3)
    # The stream is now at 3: the next message is 4 and opens no gap.
    assert seqs(tr.on_batch(batch(4), 1.0)) == [4]


def test_hello_in_agreement_or_stale_changes_nothing():
    tr = tracker()
    tr.on_batch(batch(1, 5), 0.0)
    tr.on_hello(hello({"t": 5}), 0.1)
    tr.on_hello(hello({"t": 2}), 0.1)  # stale: a reordering transport may deliver it late
    assert not tr.gap_open("A", "t") and tr.requests == []


def test_hello_for_unsubscribed_topics_is_ignored():
    tr = tracker(topics=("t",))
    tr.on_hello(hello({"other": 99}), 0.0)
    assert tr.requests == [] and "other" not in tr.peers["A"].streams


def test_unknown_publisher_first_seen_mid_stream_requests_resync():
    tr = tracker()
    assert seqs(tr.on_batch(batch(40), 0.0)) == [40]
    (req,) = tr.pop_requests()
    assert (req.reason, req.missing) == ("first_seen", (1, 39))
    tr.on_hello(hello({"t": 10}, pid="B"), 0.0)
    (req,) = tr.pop_requests()
    assert (req.publisher_id, req.missing) == ("B", (1, 10))


def test_publisher_seen_from_its_start_needs_no_resync():
    tr = tracker()
    tr.on_hello(hello({}, reason="start"), 0.0)
    assert seqs(tr.on_batch(batch(1), 0.0)) == [1]
    tr.on_hello(hello({"t": 0}, pid="C"), 0.0)
    assert tr.requests == []


def test_publisher_restart_is_a_new_stream_without_false_gaps():
    tr = tracker()
    for s in range(1, 4):
        tr.on_batch(batch(s, pid="A"), 0.0)
    tr.on_hello(Bye("A", "a", 0.0, {"t": 3}), 0.1)
    assert "A" not in tr.peers
    tr.on_hello(hello({}, pid="A2", reason="start"), 0.2)
    assert seqs(tr.on_batch(batch(1, pid="A2"), 0.2)) == [1]
    assert tr.requests == [] and tr.stats.get("gaps") == 0


def test_bye_ahead_of_received_is_a_gap_then_forgotten():
    tr = tracker()
    tr.on_batch(batch(1), 0.0)
    tr.on_hello(Bye("A", "a", 0.0, {"t": 2}), 0.0)
    assert "A" in tr.peers
    tr.tick(WINDOW)
    assert [r.reason for r in tr.pop_requests()] == ["gap_expired"]
    assert "A" not in tr.peers


def test_silent_publisher_is_declared_lost_and_its_topics_resynced():
    tr = tracker()
    tr.on_hello(hello({"t": 0}, max_idle=1.0), 0.0)
    tr.on_batch(batch(1), 0.5)
    tr.tick(3.4)
    assert tr.requests == []
    tr.tick(3.6)
    (req,) = tr.pop_requests()
    assert req.reason == "publisher_lost" and "A" not in tr.peers


def test_many_topics_are_independent():
    tr = tracker(topics=[f"t{i}" for i in range(50)])
    out = []
    for s in range(1, 4):
        for i in range(50):
            if not (i == 7 and s == 2):
                out += tr.on_batch(batch(s, topic=f"t{i}"), 0.0)
    out += tr.tick(WINDOW)
    assert [r.topic for r in tr.pop_requests()] == ["t7"]
    assert len(seqs(out)) == 149


def test_hold_overflow_gives_up_early():
    tr = tracker(max_held=3)
    tr.on_batch(batch(1), 0.0)
    out = []
    for s in range(3, 7):
        out += tr.on_batch(batch(s), 0.0)
    assert seqs(out) == [3, 4, 5, 6]
    assert [r.reason for r in tr.pop_requests()] == ["hold_overflow"]
    assert seqs(tr.on_batch(batch(7), 0.0)) == [7]


# -- property: loss, duplication and reordering ------------------------------------


@st.composite
def scenarios(draw):
    """Messages of one publisher on 3 topics, mangled by a network that loses,
    duplicates and reorders (within the window), then a final hello."""
    n_topics = 3
    sent = []  # (topic, seq, n)
    nxt = {f"t{i}": 1 for i in range(n_topics)}
    for _ in range(draw(st.integers(1, 40))):
        topic = f"t{draw(st.integers(0, n_topics - 1))}"
        n = draw(st.integers(1, 3))
        sent.append((topic, nxt[topic], n))
        nxt[topic] += n
    wire = []
    lost_topics = set()
    for msg in sent:
        fate = draw(st.sampled_from(["ok", "ok", "ok", "lost", "dup"]))
        if fate == "lost":
            lost_topics.add(msg[0])
            continue
        wire.append(msg)
        if fate == "dup":
            wire.append(msg)
    # Reorder: swap neighbours a few times (bounded displacement).
    for _ in range(draw(st.integers(0, len(wire)))):
        if len(wire) > 1:
            i = draw(st.integers(0, len(wire) - 2))
            wire[i], wire[i + 1] = wire[i + 1], wire[i]
    final = {t: s - 1 for t, s in nxt.items() if s > 1}
    return sent, wire, lost_topics, final


@settings(max_examples=400, deadline=None)
@given(scenarios())
def test_every_message_delivered_once_in_order_or_exactly_its_topic_resynced(scenario):
    sent, wire, lost_topics, final = scenario
    tr = tracker(topics=[f"t{i}" for i in range(3)])
    tr.on_hello(hello({}, reason="start"), 0.0)
    out = []
    now = 0.0
    for topic, seq, n in wire:
        now += WINDOW / (len(wire) + 2)  # everything arrives within one window
        out += tr.on_batch(batch(seq, n, topic=topic), now)
    tr.on_hello(hello(final), now)
    out += tr.tick(now + WINDOW + 1)
    delivered = {}
    for b in out:
        delivered.setdefault(b.topic, []).extend(e.seq for e in b.events)
    requested = {r.topic for r in tr.pop_requests()}
    assert requested == lost_topics
    for topic, last in final.items():
        got = delivered.get(topic, [])
        assert got == sorted(set(got)), "out of order or duplicated"
        if topic not in lost_topics:
            assert got == list(range(1, last + 1))


def test_publisher_that_said_bye_is_forgotten_when_its_gap_fills():
    tr = tracker()
    tr.on_batch(batch(1), 0.0)
    tr.on_hello(Bye("A", "a", 0.0, {"t": 2}), 0.0)
    assert "A" in tr.peers
    assert seqs(tr.on_batch(batch(2), 0.1)) == [2]
    assert "A" not in tr.peers and tr.requests == []


def test_topic_subscribed_after_the_hello_is_a_first_contact_not_a_gap():
    topics = {"t"}
    tr = SequenceTracker(topics, WINDOW, Stats("test", "t"))
    tr.on_hello(hello({"t": 0}), 0.0)
    tr.topics = topics | {"late"}
    assert seqs(tr.on_batch(batch(500, topic="late"), 0.1)) == [500]
    (req,) = tr.pop_requests()
    assert (req.topic, req.reason) == ("late", "first_seen") and not tr.gap_open("A", "late")


def test_publisher_never_heard_saying_hello_is_judged_by_the_assumed_max_idle():
    tr = tracker(assumed_max_idle=1.0)
    tr.on_batch(batch(1), 0.0)
    tr.tick(2.9)
    assert "A" in tr.peers
    tr.tick(3.1)
    assert [r.reason for r in tr.pop_requests()] == ["publisher_lost"] and "A" not in tr.peers


# -- bounded damage from unauthenticated peers (docs/security.md) ----------------------------------------

def _reasons(tr):
    return [r.reason for r in tr.pop_requests()]


def test_a_forged_sequence_far_ahead_is_a_gap_and_the_real_publisher_restarts_the_stream_below_it():
    tr = tracker(limits=TrackerLimits(max_seq_jump=1000))
    assert seqs(tr.on_batch(batch(1, 3), 0.0)) == [1, 2, 3]
    assert tr.on_batch(batch(2**62), 0.1) == []  # held: a gap like any loss (protocol.md §8.6)
    assert seqs(tr.on_batch(batch(4), 0.2)) == [4]  # the real publisher goes on meanwhile
    assert seqs(tr.tick(0.1 + WINDOW)) == [2**62]
    assert [(r.reason, r.missing) for r in tr.pop_requests()] == [("gap_expired", (5, 2**62 - 1))]
    # More than max_seq_jump below the stream: only a made-up number can have put it there.
    assert seqs(tr.on_batch(batch(5), 0.7)) == [5]
    assert _reasons(tr) == ["seq_jump"] and tr.stats.get("streams_restarted") == 1
    assert seqs(tr.on_batch(batch(6), 0.8)) == [6]
    assert tr.on_batch(batch(5), 0.8) == []  # and from there on, duplicates are duplicates
    # A forged hello as far: a gap that expires, then the real envelope steps the stream down.
    tr.on_hello(hello({"t": 2**62}), 0.9)
    tr.tick(0.9 + WINDOW)
    assert [(r.reason, r.missing) for r in tr.pop_requests()] == [("gap_expired", (7, 2**62))]
    assert seqs(tr.on_batch(batch(7), 1.5)) == [7] and tr.stats.get("streams_rebased") == 1
    assert seqs(tr.on_batch(batch(8), 1.6)) == [8] and tr.requests == []


def test_a_forged_hello_within_the_bound_costs_one_resync_then_the_stream_follows_the_real_numbers():
    tr = tracker()
    tr.on_batch(batch(1), 0.0)
    tr.on_hello(hello({"t": 50_000}), 0.1)  # under max_seq_jump: a gap like any other
    assert tr.gap_open("A", "t")
    tr.tick(0.1 + WINDOW + 0.01)
    assert _reasons(tr) == ["gap_expired"]
    # The real publisher goes on at 2: inside the run only the hello claimed.
    assert seqs(tr.on_batch(batch(2), 1.0)) == [2]
    assert tr.stats.get("streams_rebased") == 1
    assert seqs(tr.on_batch(batch(3), 1.1)) == [3]
    # and its losses are found again
    assert tr.on_batch(batch(5), 1.2) == [] and tr.gap_open("A", "t")


def test_a_forged_first_contact_does_not_silence_the_real_publisher():
    tr = tracker()
    assert seqs(tr.on_batch(batch(2**63 - 10), 0.0)) == [2**63 - 10]
    assert _reasons(tr) == ["first_seen"]
    assert seqs(tr.on_batch(batch(7), 0.1)) == [7]  # the real one, far below: the stream restarts
    assert _reasons(tr) == ["seq_jump"]
    assert seqs(tr.on_batch(batch(8), 0.2)) == [8]
    tr.on_hello(hello({"t": 2**62}, pid="B"), 0.3)  # a forged first hello, then B's real envelope
    assert seqs(tr.on_batch(batch(1, pid="B"), 0.4)) == [1]  # inside the run the hello claimed
    # A forged first contact, then a forged hello far below it (a restart, taken up like a first
    # contact by that hello), then the real publisher's hello inside the run the forged one claimed.
    tr.on_batch(batch(2**62, pid="C"), 0.5)
    tr.on_hello(hello({"t": 50_000}, pid="C"), 0.6)
    tr.pop_requests()
    tr.on_hello(hello({"t": 5}, pid="C"), 0.7)
    # C really sent 1-5, none received here, perhaps after the resyncs: waited for, then resynced.
    assert tr.on_batch(batch(6, pid="C"), 0.8) == [] and tr.gap_open("C", "t")
    assert seqs(tr.tick(0.7 + WINDOW)) == [6]
    assert [(r.publisher_id, r.reason, r.missing) for r in tr.pop_requests()] == [("C", "gap_expired", (1, 5))]
    # and once the real publisher delivered, a duplicate stays a duplicate, a forged number a gap
    assert tr.on_batch(batch(6, pid="C"), 1.3) == [] and tr.on_batch(batch(2**62, pid="C"), 1.3) == []
    assert tr.gap_open("C", "t")


def _forged_hello_given_up(tr):
    """P delivered 1; a hello forged with P's id claims 7; its gap expires (resync [2, 7]): the run
    2-7 is claimed, and the repair that resync asks for runs now."""
    tr.on_batch(batch(1), 0.0)
    tr.on_hello(hello({"t": 7}), 0.1)
    assert tr.tick(0.1 + WINDOW) == []
    assert [(r.reason, r.missing) for r in tr.pop_requests()] == [("gap_expired", (2, 7))]


def test_a_forged_claim_never_hides_the_real_publishers_loss_reported_by_its_hello():
    # docs/model.md Findings: P's real envelope 2, sent after that repair, is lost; its idle hello
    # at 2 is inside the claimed run. Stepping down to 3 passed 2 silently; now 2 is a gap.
    tr = tracker()
    _forged_hello_given_up(tr)
    tr.on_hello(hello({"t": 2}), 1.0)
    assert tr.gap_open("A", "t") and tr.stats.get("streams_rebased") == 1
    tr.tick(1.0 + WINDOW)
    assert [(r.reason, r.missing) for r in tr.pop_requests()] == [("gap_expired", (2, 2))]
    assert seqs(tr.on_batch(batch(3), 1.6)) == [3] and tr.requests == []


def test_a_forged_claim_never_hides_the_real_publishers_loss_shown_by_its_next_envelope():
    tr = tracker()
    _forged_hello_given_up(tr)
    assert tr.on_batch(batch(3), 1.0) == [] and tr.gap_open("A", "t")  # 2 was lost: held, not passed
    assert seqs(tr.on_batch(batch(2), 1.1)) == [2, 3] and not tr.gap_open("A", "t")  # late, not lost
    assert tr.on_batch(batch(5), 1.2) == []
    assert seqs(tr.tick(1.2 + WINDOW)) == [5]
    assert [(r.reason, r.missing) for r in tr.pop_requests()] == [("gap_expired", (4, 4))]


def test_after_a_step_down_the_real_publishers_hello_is_not_stale_below_the_forged_claim():
    # The step down reaches the real numbers; a loss after it must be found by the next hello,
    # although that hello is below what the forged one claimed (it used to be taken as stale).
    tr = tracker()
    _forged_hello_given_up(tr)
    assert seqs(tr.on_batch(batch(2), 1.0)) == [2]
    tr.on_hello(hello({"t": 4}), 1.1)  # 3 and 4 lost
    assert tr.gap_open("A", "t")
    tr.tick(1.1 + WINDOW)
    assert [(r.reason, r.missing) for r in tr.pop_requests()] == [("gap_expired", (3, 4))]


def test_a_forged_first_hello_never_hides_the_real_publishers_first_loss():
    # A first contact by a forged hello (first_seen resync), then the real publisher's envelope 1,
    # sent after that resync, lost, and its envelope 2: 1 is a gap, not passed over.
    tr = tracker()
    tr.on_hello(hello({"t": 9}), 0.0)
    assert [(r.reason, r.missing) for r in tr.pop_requests()] == [("first_seen", (1, 9))]
    assert tr.on_batch(batch(2), 0.1) == [] and tr.gap_open("A", "t")
    assert seqs(tr.tick(0.1 + WINDOW)) == [2]
    assert [(r.reason, r.missing) for r in tr.pop_requests()] == [("gap_expired", (1, 1))]


def test_publishers_are_bounded_and_the_longest_silent_go_first():
    tr = tracker(limits=TrackerLimits(max_publishers=100))
    tr.on_batch(batch(1, pid="real"), 0.0)
    for i in range(1000):
        tr.on_hello(hello({"t": 3}, pid=f"fake{i}", max_idle=-1.0), 1.0 + i / 1000)
        if i % 50 == 0:
            tr.on_batch(batch(2 + i // 50, pid="real"), 1.0 + i / 1000)  # the real one keeps talking
    assert len(tr.peers) <= 100 and "real" in tr.peers
    assert tr.stats.get("drops", "publisher_evicted") >= 900
    assert {r.reason for r in tr.pop_requests()} <= {"first_seen", "publisher_evicted"}


def test_hellos_cannot_make_a_publisher_immortal():
    tr = tracker(limits=TrackerLimits(max_hello_idle=10.0, forget_silent_after=100.0))
    tr.on_hello(hello({"t": 0}, pid="big", max_idle=1e18), 0.0)
    tr.on_hello(hello({"t": 0}, pid="off", max_idle=-5.0), 0.0)
    tr.tick(29.0)
    assert set(tr.peers) == {"big", "off"}
    tr.tick(31.0)  # 3 x the clamped 10 s
    assert set(tr.peers) == {"off"}
    tr.tick(101.0)
    assert tr.peers == {} and tr.stats.get("drops", "publisher_silent") == 1


def test_held_bytes_are_bounded_over_all_streams():
    tr = tracker(topics=("t", "u"), max_held=10_000, limits=TrackerLimits(max_held_bytes=64 * 20))
    for topic in ("t", "u"):
        tr.on_batch(batch(1, topic=topic), 0.0)
    out = []
    for s in range(3, 40):
        out += tr.on_batch(batch(s, topic="t"), 0.1)
    reasons = _reasons(tr)
    assert "hold_overflow" in reasons and tr._held_bytes <= 64 * 20
    assert seqs(out)  # what was held was handed on when the tracker stopped waiting
    tr.tick(10.0)
    assert tr._held_bytes == 0


def test_ten_thousand_tracked_fakes_cost_at_most_16_mb_whatever_their_hellos_hold():
    """Strings from the wire are not kept whole (issue 31): long names are not kept, long ids are
    kept as a bounded stand-in. Frames decoded as the subscriber decodes them, so each string is
    its own object."""
    tr = tracker(topics=("port", "net"))
    name = "n" * 4096
    tracemalloc.start()
    try:
        for i in range(11_250):  # the 10,001st evicts an eighth: 10,000 tracked at the end
            pid = f"{i:032x}" + ("x" * 1000 if i % 2 else "")
            frame = encode_hello(Hello(pid, name, 0.0, {"port": 3, "net": 5, "other" * 50: 7}, "idle", -1.0, name))
            tr.on_hello(decode_header(frame), 1.0 + i)
            tr.pop_requests()
        gc.collect()
        held, _ = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert len(tr.peers) == 10_000
    assert held <= 16 << 20, f"{held / 10_000:.0f} bytes per tracked publisher"
    assert tr.stats.get("strings_clamped", "pub") == 11_250 // 2
    assert all(len(pid) <= 128 for pid in tr.peers)


def test_long_ids_stay_apart_and_are_reported_as_kept():
    tr = tracker()
    a, b = "a" * 1000 + "1", "a" * 1000 + "2"
    assert seqs(tr.on_batch(batch(1, pid=a), 0.0)) == [1]
    assert seqs(tr.on_batch(batch(5, pid=b), 0.0)) == [5]  # another publisher: a first contact
    (req,) = tr.pop_requests()
    assert req.reason == "first_seen" and req.publisher_id == kept_id(b) != kept_id(a)
    assert len(tr.peers) == 2 and tr.stats.get("strings_clamped", "pub") == 2


def test_a_hello_advertising_infinity_or_nan_is_never_dead_only_forgotten_after_silence():
    tr = tracker(limits=TrackerLimits(forget_silent_after=100.0))
    tr.on_hello(hello({"t": 0}, pid="inf", max_idle=float("inf")), 0.0)
    tr.on_hello(hello({"t": 0}, pid="nan", max_idle=float("nan")), 0.0)
    tr.tick(99.0)
    assert set(tr.peers) == {"inf", "nan"}
    tr.tick(100.5)
    assert tr.peers == {} and _reasons(tr) == ["publisher_silent", "publisher_silent"]


def test_below_a_first_contact_envelope_is_a_duplicate_never_delivered_out_of_order():
    tr = tracker()
    assert seqs(tr.on_batch(batch(5), 0.0)) == [5]
    assert tr.on_batch(batch(3), 0.1) == []
    assert seqs(tr.on_batch(batch(6), 0.2)) == [6]
    tr.tick(5.0)
    assert [(r.reason, r.missing) for r in tr.pop_requests()] == [("first_seen", (1, 4))]
    assert not tr.gap_open("A", "t") and tr.stats.get("duplicates") == 1
