"""The ZeroMQ driver with real sockets on loopback."""

import json
import os
import signal
import socket
import subprocess
import sys
from pathlib import Path

import msgpack
import pytest
import zmq

from dfpubsub import TransportError
from tests.conftest import undetected, wait_for
from tests.functional.zmq_helpers import Sink, joined, make_pub, raw_envelope, subscribed

CHILD = Path(__file__).with_name("zmq_child.py")


def test_topic_filter_is_exact_despite_zmq_prefix_matching():
    pub = make_pub()
    sink = Sink(["port"], [pub.transport.uri])
    sink.sub.start()
    joined(pub)
    for i in range(50):
        pub.publish("portbinding", "pb", f"b{i}", "create", 1)
        pub.publish("port", "port", f"p{i}", "create", 1)
        pub.publish("po", "x", f"x{i}", "create", 1)
    wait_for(lambda: len(sink.keys()) == 50)
    pub.close()
    wait_for(lambda: sink.stats.get("hellos_in") >= 2)  # the bye
    assert sink.keys() == [f"p{i}" for i in range(50)]
    # ZeroMQ itself filtered: nothing foreign even reached the core's own check.
    assert sink.stats.get("drops", "foreign_topic") == 0
    sink.sub.close()


def test_two_subscribers_with_different_topics_see_no_false_gaps():
    pub = make_pub(batch_max_events=16)
    s1 = Sink(["a", "b"], [pub.transport.uri])
    s2 = Sink(["b", "c"], [pub.transport.uri])
    s1.sub.start()
    s2.sub.start()
    joined(pub, 2)
    for i in range(3000):
        pub.publish("abc"[i % 3], "t", f"k{i}", "update", i + 1)
    pub.flush()
    wait_for(lambda: len(s1.keys()) == 2000 and len(s2.keys()) == 2000)
    for s in (s1, s2):
        assert s.stats.get("gaps") == 0 and s.gaps == [] and s.stats.get("duplicates") == 0
        seqs = {}
        for e in s.events:
            seqs.setdefault(e.topic, []).append(e.seq)
        assert all(v == list(range(1, 1001)) for v in seqs.values())
    pub.close()
    s1.sub.close()
    s2.sub.close()


def child_report(child):
    child.stdin.write("report\n")
    child.stdin.flush()
    return json.loads(child.stdout.readline())


def undetected_losses(report, pid, sent):
    """Sequence numbers neither delivered nor inside a resync request's missing range."""
    return {topic: undetected(report["delivered"].get(f"{pid}/{topic}", []),
                              [g["missing"] for g in report["gaps"] if g["topic"] == topic], last)
            for topic, last in sent.items()}


def test_loss_from_a_tiny_hwm_and_a_stalled_subscriber_is_detected_and_resynced():
    pub = make_pub(options={"sndhwm": 1}, batch_linger=0, max_idle_time=0.3)
    child = subprocess.Popen(
        [sys.executable, str(CHILD), pub.transport.uri, "a,b", "1"],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
    )
    try:
        assert child.stdout.readline().strip() == "ready"
        joined(pub)
        os.kill(child.pid, signal.SIGSTOP)
        value = {"blob": "x" * 200}
        for i in range(30000):
            pub.publish("ab"[i % 2], "t", f"k{i % 100}", "update", i + 1, value)
        os.kill(child.pid, signal.SIGCONT)
        sent = pub.sequences()
        # Once the pipe drains, idle hellos reveal whatever the HWM dropped.
        wait_for(lambda: undetected_losses(child_report(child), pub.id, sent) == {"a": [], "b": []},
                 timeout=20, interval=0.2, what="every loss to be detected")
        report = child_report(child)
    finally:
        pub.close()
        child.kill()
    assert {g["topic"] for g in report["gaps"]} == {"a", "b"}
    assert {g["reason"] for g in report["gaps"]} <= {"gap_expired", "hold_overflow"}
    assert any(set(r) & {"a", "b"} for r in report["resyncs"][1:])
    for topic, last in sent.items():
        assert len(report["delivered"][f"{pub.id}/{topic}"]) < last  # loss really happened on the wire


def test_malformed_frames_are_counted_and_dropped_while_valid_traffic_flows():
    pub = make_pub()
    raw = zmq.Context.instance().socket(zmq.PUB)
    port = raw.bind_to_random_port("tcp://127.0.0.1")
    sink = Sink(["a"], [pub.transport.uri, f"tcp://127.0.0.1:{port}"], max_message_bytes=64 * 1024)
    sink.sub.start()
    joined(pub)
    probes = iter(range(1, 10_000))

    def probe_arrived():
        # The raw socket sends no hello: probe until its subscription has propagated.
        n = next(probes)
        raw.send_multipart([b"a\x00", raw_envelope("a", n, f"probe{n}")])
        return sink.keys("a")

    wait_for(probe_arrived, what="the raw socket to reach the subscriber")
    bad = [
        [b"a\x00", b"\xc1 not msgpack"],
        [b"a\x00"],
        [b"a\x00", b"x", b"y"],
        [b"a\x00", msgpack.packb({"v": 99, "kind": "event"})],
        [b"a\x00", raw_envelope("a", 10_000, "big")[:-5]],
        [b"a\x00", b"\x00" * (100 * 1024)],
        [b"a\x00", raw_envelope("zzz", 1, "wrong-topic-inside")],
    ]
    for i in range(20):
        for frames in bad:
            raw.send_multipart(frames)
        # A sound header over a bad event: found when the events are decoded.
        raw.send_multipart([b"a\x00", msgpack.packb({
            "v": 1, "kind": "event", "pub": "p", "name": "", "topic": "a", "seq": i + 1,
            "sent_at": 0.0, "events": [["t", "k", "create", "NaN", None, 0]]})])
        pub.publish("a", "t", f"good{i}", "create", i + 1)
    wait_for(lambda: len([k for k in sink.keys("a") if k.startswith("good")]) == 20)
    wait_for(lambda: sink.stats.get("decode_errors") >= 20 * 6)
    s = sink.stats
    assert s.get("decode_errors", "not_msgpack") >= 20
    assert s.get("decode_errors", "bad_frames") >= 40
    assert s.get("decode_errors", "schema_version") >= 20
    assert s.get("decode_errors", "truncated") >= 20
    assert s.get("decode_errors", "oversize") >= 20
    assert s.get("decode_errors", "malformed") >= 20
    assert s.get("drops", "foreign_topic") >= 20
    assert [k for k in sink.keys("a") if k.startswith("good")] == [f"good{i}" for i in range(20)]
    raw.close(0)
    pub.close()
    sink.sub.close()


def test_one_subscriber_many_publishers_added_and_removed_at_run_time():
    pubs = [make_pub(f"p{i}") for i in range(3)]
    sink = Sink(["t"])
    sink.sub.start()
    for p in pubs:
        sink.sub.connect(p.transport.uri)
    for p in pubs:
        subscribed(p, "t")  # connected after it subscribed: a join alone is not enough
    for i, p in enumerate(pubs):
        p.publish("t", "tbl", f"from{i}", "create", 1)
        p.flush()
    wait_for(lambda: sorted(sink.keys()) == ["from0", "from1", "from2"])
    subscriptions = [p.transport.subscriptions("t") for p in pubs]
    sink.sub.disconnect(pubs[1].transport.uri)
    # After the disconnect has taken effect, p1's traffic no longer arrives. The subscriber's new
    # socket joins the other two again (what they send before it has joined is a gap to it).
    wait_for(lambda: sink.sub.transport.endpoints == {pubs[0].transport.uri, pubs[2].transport.uri})
    for i in (0, 2):
        subscribed(pubs[i], "t", subscriptions[i] + 1)
    for round_ in range(3):
        for i, p in enumerate(pubs):
            p.publish("t", "tbl", f"r{round_}-{i}", "update", round_ + 2)
            p.flush()
    wait_for(lambda: len(sink.keys()) == 3 + 6)
    assert not [k for k in sink.keys() if k.endswith("-1")]
    for p in pubs:
        p.close()
    sink.sub.close()


def test_curve_encryption():
    public, secret = zmq.curve_keypair()
    pub = make_pub(options={"curve_secret_key": secret.decode()})
    good = Sink(["t"], [pub.transport.uri], options={"curve_server_key": public.decode()})
    wrong_key = zmq.curve_keypair()[0].decode()
    bad = Sink(["t"], [pub.transport.uri], options={"curve_server_key": wrong_key})
    plain = Sink(["t"], [pub.transport.uri])
    for s in (good, bad, plain):
        s.sub.start()
    joined(pub)
    pub.publish("t", "tbl", "secret", "create", 1)
    pub.flush()
    wait_for(lambda: good.keys() == ["secret"])
    pub.close()
    wait_for(lambda: good.stats.get("hellos_in") >= 2)
    assert bad.keys() == [] and plain.keys() == [] and bad.stats.get("hellos_in") == 0
    for s in (good, bad, plain):
        s.sub.close()


def test_ipc_socket_mode_stale_file_and_live_conflict(tmp_path):
    path = tmp_path / "run" / "pub.sock"
    path.parent.mkdir()
    stale = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    stale.bind(str(path))
    stale.close()  # the file stays, as after a crash
    pub = make_pub(url=f"zmq+ipc://{path}")
    assert (path.stat().st_mode & 0o777) == 0o660
    with pytest.raises(TransportError, match="in use"):
        make_pub(url=f"zmq+ipc://{path}")
    sink = Sink(["t"], [f"ipc://{path}"])
    sink.sub.start()
    joined(pub)
    pub.publish("t", "tbl", "over-ipc", "create", 1)
    pub.flush()
    wait_for(lambda: sink.keys() == ["over-ipc"])
    pub.close()
    assert not path.exists()
    sink.sub.close()
    notsock = tmp_path / "plain"
    notsock.write_text("x")
    with pytest.raises(TransportError, match="not a socket"):
        make_pub(url=f"zmq+ipc://{notsock}")


def test_worker_ingress_hands_over_views_that_the_publisher_relays_without_copying(tmp_path):
    from dfpubsub.drivers.zeromq.options import ZmqOptions
    from dfpubsub.drivers.zeromq.publisher import ZmqPublisher
    from dfpubsub.drivers.zeromq.workers import WorkerIngress

    from dfpubsub.metrics import Stats

    stats = Stats("publisher_service", "t")
    ingress = WorkerIngress(str(tmp_path / "w.sock"), ZmqOptions(), stats)
    egress = ZmqPublisher("tcp://127.0.0.1:*", ZmqOptions(), stats)
    push = zmq.Context.instance().socket(zmq.PUSH)
    push.connect(ingress.uri)
    sub = zmq.Context.instance().socket(zmq.SUB)
    sub.connect(egress.uri)
    sub.setsockopt(zmq.SUBSCRIBE, b"a\x00")
    try:
        wait_for(lambda: egress.sock.poll(0), what="the subscription")
        egress.new_subscribers()  # takes it (XPUB_MANUAL)
        payload = os.urandom(50_000)
        for frames in ([b"a\x00"], [b"a\x00", b"x", b"y"], [b"no-nul", b"x"], [b"a\x00", payload]):
            push.send_multipart(frames)
        got = []
        wait_for(lambda: got.extend(ingress.recv(0.1)) or got, what="the envelope")
        assert len(got) == 1 and got[0][0] == "a" and type(got[0][1]) is memoryview
        assert stats.get("decode_errors", "bad_frames") == 3
        view = got[0][1]
        egress.send("a", view)  # the received message itself
        egress.send("a", view[7:9])  # part of it: only that part
        assert sub.recv_multipart() == [b"a\x00", payload]
        assert sub.recv_multipart() == [b"a\x00", payload[7:9]]
    finally:
        push.close(0)
        sub.close(0)
        ingress.close()
        egress.close()


_CHURN = r"""
import sys, threading, time
import zmq
from dfpubsub import load_driver
from dfpubsub.codec import topic_frame
from dfpubsub.metrics import Stats

ctx = zmq.Context.instance()
stop, uris = threading.Event(), []

def blast(sock):
    frame = topic_frame("t")
    while not stop.is_set():
        try:
            sock.send_multipart([frame, b"x" * 64], zmq.NOBLOCK)
        except zmq.Again:
            time.sleep(0.0001)
    sock.close(0)

threads = []
for _ in range(2):
    sock = ctx.socket(zmq.PUB)
    uris.append(f"tcp://127.0.0.1:{sock.bind_to_random_port('tcp://127.0.0.1')}")
    threads.append(threading.Thread(target=blast, args=(sock,)))
sub = load_driver("zmq", {}).subscriber(Stats("subscriber", "churn"))
sub.subscribe("t")
for uri in uris:
    sub.connect(uri)
for t in threads:
    t.start()
got, cycles, end = 0, 0, time.monotonic() + float(sys.argv[1])
while cycles < 300:
    got += len(sub.recv(0.01))
    sub.disconnect(uris[0])
    got += len(sub.recv(0.0))
    sub.connect(uris[0])
    cycles += 1
while got <= 1000 and time.monotonic() < end:
    got += len(sub.recv(0.1))
stop.set()
for t in threads:
    t.join()
sub.close()
print(got, cycles)
"""


def test_dropping_an_endpoint_while_messages_stream_in_keeps_the_subscriber_receiving():
    # Dropping an endpoint replaces the socket (libzmq 4.3's zmq_disconnect aborted the process
    # in 4 of 8 runs of tests/functional/security/test_curve.py here): hundreds of replacements while two
    # publishers stream must neither crash nor stall it. In a child, so a crash fails only this.
    # After 300 replacements (a fixed number: how much arrives while each new socket reconnects
    # depends on the machine's load) it must go on receiving.
    child = subprocess.run([sys.executable, "-c", _CHURN, "40"], capture_output=True, text=True, timeout=60)
    assert child.returncode == 0, child.stderr[-2000:]
    got, cycles = map(int, child.stdout.split())
    assert cycles == 300 and got > 1000, child.stdout
