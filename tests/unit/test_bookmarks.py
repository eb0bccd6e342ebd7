"""Bookmarks: the hello's ``rev`` on the wire, the tracker passing it on only for streams in
agreement, and the rule by which a controller's positions follow a feed's unbroken streams
(dfpubsub.controller.bookmarks)."""

import msgpack
import pytest

from dfpubsub.codec import MAX_REV, decode, encode_hello, hello_parts
from dfpubsub.controller.bookmarks import FeedIds, FeedStreams
from dfpubsub.errors import DecodeError
from dfpubsub.events import Action, Bookmark, Event, EventBatch, Hello
from dfpubsub.metrics import Stats
from dfpubsub.tracker import SequenceTracker

FEED = "f" * 32


def hello(seqs, rev=None, more=False, pid=FEED):
    return Hello(pid, "feed", 1.0, dict(seqs), "bookmark", 5.0, "h", more, rev)


def batch(topic, seq, n=1, pid=FEED):
    events = [Event(topic, topic, f"k{seq + i}", Action.UPDATE, seq + i, {}) for i in range(n)]
    return EventBatch(pid, "feed", topic, seq, 1.0, events)


# -- the wire -----------------------------------------------------------------------------------


def test_a_hellos_rev_goes_out_and_comes_back_and_only_when_set():
    assert decode(encode_hello(hello({"port": 3}, rev=42))).rev == 42
    assert decode(encode_hello(hello({"port": 3}, rev=MAX_REV))).rev == MAX_REV
    plain = encode_hello(hello({"port": 3}))
    assert b"rev" not in plain and decode(plain).rev is None


@pytest.mark.parametrize("rev", [-1, -(1 << 63), 1.0, "7", None, True])
def test_a_rev_that_is_not_an_unsigned_64_bit_integer_is_malformed(rev):
    fields = msgpack.unpackb(encode_hello(hello({"port": 3}, rev=1)))
    fields["rev"] = rev
    with pytest.raises(DecodeError) as err:
        decode(msgpack.packb(fields))
    assert err.value.reason == "malformed"


def test_every_part_of_a_split_hello_carries_the_bookmark():
    parts = hello_parts(hello({f"t{i}": i + 1 for i in range(20)}, rev=9), 1024 + 270 * 4)
    assert len(parts) == 5 and all(p.rev == 9 for p in parts) and [p.more for p in parts][-1] is False


# -- the tracker --------------------------------------------------------------------------------


def tracker(topics=("port", "net")):
    return SequenceTracker(frozenset(topics), 0.5, Stats("subscriber", "t"))


def test_the_tracker_passes_a_bookmark_on_for_the_streams_in_agreement_only():
    tr = tracker()
    tr.on_hello(hello({"port": 0}), 0.0)  # first contact: nothing sent yet
    assert tr.on_batch(batch("port", 1, 3), 0.1)
    tr.on_hello(hello({"port": 3}, rev=100), 0.2)
    assert tr.pop_bookmarks() == [Bookmark(FEED, 100, {"port": 3, "net": 0})]
    # port's envelope 4 is lost: the bookmark at 4 opens a gap there and is not passed on for it
    tr.on_hello(hello({"port": 4}, rev=120), 0.3)
    assert tr.pop_bookmarks() == [Bookmark(FEED, 120, {"net": 0})]
    assert tr.gap_open(FEED, "port")


def test_a_part_of_a_split_hello_says_nothing_of_the_topics_it_does_not_list():
    tr = tracker()
    tr.on_hello(hello({"port": 0}), 0.0)
    tr.on_hello(hello({"port": 0}, rev=5, more=True), 0.1)
    assert tr.pop_bookmarks() == [Bookmark(FEED, 5, {"port": 0})]


def test_a_hello_without_rev_or_a_bye_passes_no_bookmark_on():
    tr = tracker()
    tr.on_hello(hello({"port": 0}), 0.0)
    assert tr.pop_bookmarks() == []


# -- the positions ------------------------------------------------------------------------------


def streams(*feeds):
    return FeedStreams(FeedIds(feeds or (FEED,)))


def mark(seqs, rev, pid=FEED):
    return Bookmark(pid, rev, dict(seqs))


def test_a_complete_repair_anchors_and_an_unbroken_stream_then_moves_the_position_on_each_bookmark():
    fs = streams()
    fs.applied(FEED, "port", 1, 3)
    fs.repaired({"port"})
    fs.applied(FEED, "port", 4, 6)
    assert fs.bookmark(mark({"port": 6}, 70), {"port": 50}) == ({"port": 70}, set())
    fs.applied(FEED, "port", 7, 7)
    assert fs.bookmark(mark({"port": 7}, 75), {"port": 70}) == ({"port": 75}, set())


def test_an_envelope_that_does_not_follow_the_last_one_stops_the_position_until_the_next_repair():
    fs = streams()
    fs.applied(FEED, "port", 1, 3)
    fs.repaired({"port"})
    fs.applied(FEED, "port", 5, 5)  # 4 never came
    moved, ask = fs.bookmark(mark({"port": 5}, 70), {"port": 50})
    assert moved == {} and ask == {"port"}  # a replay is asked for once...
    assert fs.bookmark(mark({"port": 5}, 71), {"port": 50}) == ({}, set())  # ...not again
    fs.repaired({"port"})
    assert fs.bookmark(mark({"port": 5}, 80), {"port": 71}) == ({"port": 80}, set())


def test_numbers_passed_over_by_a_resync_request_break_the_stream():
    fs = streams()
    fs.repaired({"port"})
    fs.applied(FEED, "port", 1, 2)
    fs.passed(FEED, "port", 4)  # 3 and 4 given up on: the hello said 4, nothing came
    assert fs.bookmark(mark({"port": 4}, 30), {"port": 10})[0] == {}
    fs.repaired({"port"})  # the repair of that gap: now anchored at 4
    fs.applied(FEED, "port", 5, 5)
    assert fs.bookmark(mark({"port": 5}, 40), {"port": 30})[0] == {"port": 40}


def test_a_bookmark_ahead_of_what_was_applied_proves_nothing():
    fs = streams()
    fs.repaired({"port"})
    fs.applied(FEED, "port", 1, 2)
    assert fs.bookmark(mark({"port": 3}, 30), {"port": 10})[0] == {}
    fs.applied(FEED, "port", 4, 4)  # and 3 is not taken as applied after it
    assert fs.bookmark(mark({"port": 4}, 40), {"port": 10})[0] == {}


def test_bookmarks_of_publishers_not_named_as_feeds_are_ignored():
    fs = streams()
    other = "o" * 32
    fs.passed(other, "port", 3)
    assert fs.bookmark(mark({"port": 0}, 999, pid=other), {"port": 10}) == ({}, set())
    assert fs.ignored == 1


def test_a_stream_met_mid_stream_is_not_anchored_by_a_bookmark_whose_sequence_may_carry_a_newer_entry():
    # The fleet benchmark's miss: df-feed published seqs 1..6, the last one an entry above 2023,
    # then a hello (rev 2023, seq 7) - a hello carries the latest rev with the sequences of the
    # moment. The controller, whose relist had read up to 2023, met the stream at 7.
    fs = streams()
    fs.applied(FEED, "port", 7, 7)
    fs.passed(FEED, "port", 6)  # the first_seen request for 1..6 comes after the envelope
    moved, ask = fs.bookmark(mark({"port": 7}, 2023), {"port": 2023})
    assert moved == {} and ask == {"port"}  # no anchor: a replay reads what 1..6 carried
    fs.applied(FEED, "port", 8, 8)
    assert fs.bookmark(mark({"port": 8}, 2027), {"port": 2023}) == ({}, set())
    fs.repaired({"port"})  # that replay: anchored at 8
    fs.applied(FEED, "port", 9, 9)
    assert fs.bookmark(mark({"port": 9}, 2030), {"port": 2027}) == ({"port": 2030}, set())


def test_a_stream_applied_whole_from_its_first_sequence_is_anchored_by_a_bookmark_at_the_position():
    fs = streams()
    fs.applied(FEED, "port", 1, 3)
    assert fs.bookmark(mark({"port": 3}, 50), {"port": 40}) == ({}, {"port"})  # the cache is not at 50
    fs2 = streams()
    fs2.applied(FEED, "port", 1, 3)
    assert fs2.bookmark(mark({"port": 3}, 50), {"port": 50}) == ({}, set())  # anchors
    fs2.applied(FEED, "port", 4, 4)
    assert fs2.bookmark(mark({"port": 4}, 60), {"port": 50}) == ({"port": 60}, set())


def test_the_anchor_stays_where_a_repair_put_it_while_bookmarks_move_the_position():
    # A hello's rev may be older than its sequences: (6, 70) may carry entries above 70 at 5 and 6.
    # Taken as the anchor, it would vouch for nothing it did not see; it moves the position only.
    fs = streams()
    fs.applied(FEED, "port", 1, 3)
    fs.repaired({"port"})
    fs.applied(FEED, "port", 4, 6)
    assert fs.bookmark(mark({"port": 6}, 70), {"port": 50}) == ({"port": 70}, set())
    assert fs.bookmark(mark({"port": 4}, 75), {"port": 70}) == ({"port": 75}, set())  # still after 3
    fs.applied(FEED, "port", 8, 8)  # 7 never came
    assert fs.bookmark(mark({"port": 8}, 90), {"port": 75}) == ({}, {"port"})


def test_an_idle_topic_moves_with_the_bookmarks_and_a_fresh_bookmark_at_the_position_anchors():
    fs = streams()
    assert fs.bookmark(mark({"net": 0}, 10), {"net": 10}) == ({}, set())  # at the position: anchors
    assert fs.bookmark(mark({"net": 0}, 25), {"net": 10}) == ({"net": 25}, set())


def test_an_older_bookmark_than_the_anchor_moves_nothing_back():
    fs = streams()
    fs.applied(FEED, "port", 1, 5)
    fs.repaired({"port"})
    assert fs.bookmark(mark({"port": 3}, 40), {"port": 50}) == ({}, set())
    assert fs.bookmark(mark({"port": 5}, 45), {"port": 50}) == ({}, set())  # below the position: no move


def test_a_forgotten_publisher_proves_nothing_until_it_is_anchored_again():
    fs = streams()
    fs.applied(FEED, "port", 1, 1)
    fs.repaired({"port"})
    fs.forget(FEED)
    fs.applied(FEED, "port", 2, 2)  # same id again: a fresh stream, not anchored
    assert fs.bookmark(mark({"port": 2}, 9), {"port": 5})[0] == {}


def test_feed_ids_change_while_read():
    ids = FeedIds(["a"])
    ids.add("b")
    ids.discard("a")
    assert not ids("a") and ids("b") and list(ids) == ["b"]
