"""Which subscriptions a publisher's XPUB takes: valid topic frames, a bounded number of them.

Without ``ZMQ_XPUB_MANUAL`` libzmq applies whatever a connected peer asks
for, and anyone who can reach a publisher's port can make it hold 100,000
made-up subscriptions (~450 MB). In manual mode every (un)subscription reaches
this code first, and only those it applies cost memory:

- a subscription must be a topic frame of the protocol (docs/protocol.md): a
  valid topic, or the control topic, ending in its NUL;
- the control topic and topics this publisher has sent are always taken
  (hellos reach every subscriber); other topics (subscribers
  usually connect before the first event) are taken up to ``max_topics``
  distinct ones. libzmq forgets a peer's subscriptions silently when it
  disconnects, so that set only grows: once a flood has filled it, a new topic
  is taken only after the publisher has sent on it. Its subscribers still
  converge: the publisher's hellos show them the gap and they resync.

Everything refused is counted in ``drops`` with the reason. Those taken are counted per topic
(``taken``): a subscriber's join (its control subscription) is no sign that its topics' are in
place, as libzmq sends a subscriber's subscriptions in byte order when it connects after
subscribing (at run time, through discovery, or again after a reconnect), and ``$ctl`` sorts
before every topic.
"""

from __future__ import annotations

import zmq

from dfpubsub.errors import InvalidEvent
from dfpubsub.events import CONTROL_TOPIC, validate_topic
from dfpubsub.metrics import Stats

__all__ = ["Subscriptions"]

_CONTROL = CONTROL_TOPIC.encode() + b"\x00"


class Subscriptions:
    """Applies the (un)subscriptions an ``XPUB_MANUAL`` socket reads (see the module's doc)."""

    def __init__(self, sock: zmq.Socket[bytes], stats: Stats, max_topics: int):
        self.sock = sock
        self.stats = stats
        self.max_topics = max_topics
        #: Topic frames sent on: always taken (the publisher's ``send`` adds to it).
        self.published: set[bytes] = set()
        self._taken: set[bytes] = set()
        #: Subscriptions taken, by topic frame (one per subscriber and connection; unsubscriptions
        #: do not count down). Bounded like the topics taken.
        self.taken: dict[bytes, int] = {}

    def take(self, msg: bytes) -> bool:
        """Apply one message read from the XPUB; True if it is a subscription to the control
        topic (a subscriber joined)."""
        if len(msg) < 2 or msg[0] > 1 or not _valid(msg[1:]):
            self.stats.inc("drops", reason="subscription_invalid")
            return False
        frame = msg[1:]
        if msg[0] == 0:
            self.sock.setsockopt(zmq.UNSUBSCRIBE, frame)
            return False
        if frame not in self._taken and frame not in self.published and frame != _CONTROL:
            if len(self._taken) >= self.max_topics:
                self.stats.inc("drops", reason="subscription_cap")
                return False
            self._taken.add(frame)
        self.sock.setsockopt(zmq.SUBSCRIBE, frame)
        self.taken[frame] = self.taken.get(frame, 0) + 1
        return frame == _CONTROL


def _valid(frame: bytes) -> bool:
    if frame == _CONTROL:
        return True
    if len(frame) > 256 or frame[-1] != 0:
        return False
    try:
        validate_topic(frame[:-1].decode("utf-8"))
    except (UnicodeDecodeError, InvalidEvent):
        return False
    return True
