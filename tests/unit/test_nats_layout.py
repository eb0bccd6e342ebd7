"""The NATS driver's subjects and message ids: one subject per topic and back, ids per envelope."""

import time

import pytest
from hypothesis import given
from hypothesis import strategies as st

pytest.importorskip("nats")

from dfpubsub.drivers.nats_jetstream.layout import msg_id, subject_of, topic_of  # noqa: E402

from dfpubsub.codec import BatchHeader, encode_batch, encode_hello, pack_event  # noqa: E402
from dfpubsub.events import CONTROL_TOPIC, Hello  # noqa: E402

ROOT = "p.ps."


@given(st.text(min_size=1).filter(lambda t: "\x00" not in t))
def test_every_topic_has_one_subject_token_and_comes_back(topic):
    subject = subject_of(ROOT, topic)
    token = subject[len(ROOT):]
    assert token and not any(c in token for c in ".*> \t\r\n") and token.isprintable()
    assert topic_of(ROOT, subject) == topic


def test_plain_topics_are_kept_as_they_are():
    assert subject_of(ROOT, "port") == "p.ps.port"
    assert subject_of(ROOT, CONTROL_TOPIC) == "p.ps.$ctl"
    assert subject_of(ROOT, "a.b c~") == "p.ps.a~2Eb~20c~7E"


@pytest.mark.parametrize("subject", ["q.ps.a", "p.ps.", "p.ps.a.b", "p.ps.bad~ZZ", "p.ps.~FF"])
def test_subjects_no_topic_maps_to_are_refused(subject):
    assert topic_of(ROOT, subject) is None


def test_message_ids_name_publisher_sequence_and_topic():
    frame = encode_batch(BatchHeader("pid", "name", "port"), 7, time.time(),
                         [pack_event("t", "k", "create", 1, None, time.time())])
    assert msg_id(frame) == "pid:7:port"
    assert msg_id(encode_hello(Hello("pid", "name", time.time(), {"port": 7}))) is None
    assert msg_id(b"\xc1 garbage") is None
