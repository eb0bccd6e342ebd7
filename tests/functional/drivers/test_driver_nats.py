"""The NATS JetStream driver against private nats-servers (never the machine's own NATS)."""

import asyncio
import json
import os
import subprocess
import time
import uuid

import pytest

nats = pytest.importorskip("nats")

from dfpubsub.drivers.nats_jetstream import NatsJetStreamDriver  # noqa: E402

from dfpubsub import ConfigError, Publisher, PublisherOptions, TransportError, open_store  # noqa: E402
from dfpubsub.backends.access import NatsAccess, configure  # noqa: E402
from dfpubsub.codec import MAX_SEQ, BatchHeader, encode_batch, pack_event  # noqa: E402
from dfpubsub.metrics import Stats  # noqa: E402
from dfpubsub.publisher import _QUIET  # noqa: E402
from dfpubsub.testing.servers import NatsServer, TestCertificates  # noqa: E402
from tests.conftest import wait_for  # noqa: E402
from tests.functional.daemon_helpers import daemon_args, exe  # noqa: E402
from tests.functional.sink_helpers import (  # noqa: E402
    GatedSink,
    assert_outage_accounted,
    light_traffic_while_stopped,
    publishing_forever,
    record_lost,
    recv_all,
)


def new_options(**extra):
    name = f"t{uuid.uuid4().hex[:8]}"
    return {"prefix": name, "stream": name.upper(), **extra}


def make_pub(server, options, name="pub", **opts):
    stats = Stats("publisher", name)
    transport = NatsJetStreamDriver(server.url, options).publisher(stats)
    return Publisher(transport, name, PublisherOptions(**{"batch_linger": 0.001, **opts}), stats)


class Sink(GatedSink):
    """A subscriber recording events, resyncs and resync requests; ``gate.clear()`` stops its recv()."""

    def __init__(self, server, options, topics, **opts):
        stats = Stats("subscriber", "sink")
        super().__init__(NatsJetStreamDriver(server.url, options).subscriber(stats), topics, stats, **opts)


def raw_subscriber(server, options):
    t = NatsJetStreamDriver(server.url, options).subscriber(Stats("subscriber", "raw"))
    return t, record_lost(t)


def envelope(pid, topic, seq, key="k"):
    header = BatchHeader(pid, "raw", topic)
    return encode_batch(header, seq, time.time(), [pack_event("t", key, "update", seq, None, time.time())])


def js_call(server, fn):
    """Run ``fn(js)`` with a nats-py client of the test's own (what an operator or another program does)."""

    async def run():
        nc = await nats.connect(server.url)
        try:
            return await fn(nc.jetstream())
        finally:
            await nc.close()

    return asyncio.run(run())


def test_a_retried_envelope_is_stored_once_and_topics_do_not_share_ids(nats_server):
    options = new_options()
    stats = Stats("publisher", "p")
    t = NatsJetStreamDriver(nats_server.url, options).publisher(stats)
    t.send("a", envelope("pid1", "a", 1))
    t.send("a", envelope("pid1", "a", 1))  # a retry of the same envelope: the same Nats-Msg-Id
    t.send("b", envelope("pid1", "b", 1))  # same publisher and sequence, another topic: kept
    t.send("$ctl", b"not an envelope")  # no id: never deduplicated
    t.send("$ctl", b"not an envelope")
    t.close()  # waits for the acknowledgements
    state = js_call(nats_server, lambda js: js.stream_info(options["stream"]))
    assert state.state.messages == 4
    assert stats.get("drops", "nats_duplicate") == 1


def test_events_flow_in_order_to_subscribers_of_different_topics(nats_server):
    options = new_options()
    pub = make_pub(nats_server, options, batch_max_events=5)
    a = Sink(nats_server, options, ["a"])
    b = Sink(nats_server, options, ["b", "c.d *>"])  # a topic that no subject token could hold as is
    for s in (a, b):
        s.sub.start()
        assert s.sub.wait_synced(10)
    for i in range(600):
        pub.publish(("a", "b", "c.d *>")[i % 3], "t", f"k{i}", "update", i + 1)
    pub.flush()
    wait_for(lambda: len(a.seqs("a")) == 200 and len(b.seqs("b")) == 200 and len(b.seqs("c.d *>")) == 200)
    assert a.seqs("a") == list(range(1, 201)) and b.seqs("c.d *>") == list(range(1, 201))
    assert {e.topic for e in a.events} == {"a"}
    assert a.stats.get("gaps") == 0 and b.stats.get("gaps") == 0
    pub.close()
    a.close()
    b.close()


def test_light_traffic_is_batched_while_envelopes_await_acknowledgement_from_a_stalled_server(nats_server):
    """While NATS acknowledges nothing (SIGSTOP: a server starved or stuck), what the publisher
    would send queues behind the unacknowledged envelopes anyway: it batches instead of sending
    an envelope per event."""
    options = new_options()
    pub = make_pub(nats_server, options, batch_linger=0.2)
    sink = Sink(nats_server, options, ["t"])
    sink.sub.start()
    assert sink.sub.wait_synced(10)
    wait_for(lambda: pub.transport.backlog == 0 and time.monotonic() > pub._last_send + _QUIET,
             what="a quiet spell after the hellos")
    assert light_traffic_while_stopped(pub, nats_server) > 0
    pub.flush()
    wait_for(lambda: len(sink.seqs("t")) == 20, what="every event once NATS runs again")
    assert sink.seqs("t") == list(range(1, 21)) and sink.stats.get("gaps") == 0
    assert pub.stats.get("envelopes_out") < 10  # one an event before
    wait_for(lambda: pub.transport.backlog == 0, what="every envelope acknowledged")
    pub.close()
    sink.close()


def test_what_the_stream_limits_dropped_is_counted_and_resynced(nats_server):
    options = new_options(max_msgs=10, count=4, max_pending_bytes=1)  # holds 4 messages when not read
    pub = make_pub(nats_server, options, batch_linger=0)  # one message per event
    sink = Sink(nats_server, options, ["a", "b"])
    sink.sub.start()
    assert sink.sub.wait_synced(10)
    for i in range(5):
        pub.publish("a", "t", f"early{i}", "create", i + 1)
    wait_for(lambda: len(sink.keys("a")) == 5)
    sink.gate.clear()  # the receive thread stops calling recv(); the inbox fills, then the stream
    time.sleep(0.2)
    for i in range(500):
        pub.publish("a", "t", f"late{i}", "update", i + 100)
        pub.publish("b", "t", f"late{i}", "update", i + 100)
    resyncs_before = len(sink.resyncs)
    sink.gate.set()
    wait_for(lambda: sink.keys("a")[-1:] == ["late499"], what="the newest events")
    wait_for(lambda: {"a", "b"} <= set().union(*sink.resyncs[resyncs_before:]), what="a resync of both")
    dropped = sink.stats.get("drops", "stream_limits")
    assert dropped > 0 and len(sink.keys("a")) + len(sink.keys("b")) < 5 + 1000
    assert sink.stats.get("resync_requests", "dropped") >= 2
    sent = pub.sequences()
    pub.close()
    wait_for(lambda: sink.undetected_losses(pub.id, sent) == {"a": [], "b": []}, what="every loss detected")
    sink.close()


def test_dropped_count_is_exact(nats_server):
    options = new_options(max_msgs=5, count=1, max_pending_bytes=1)  # holds one message when not read
    t, lost = raw_subscriber(nats_server, options)
    t.subscribe("a")
    p = NatsJetStreamDriver(nats_server.url, options).publisher(Stats("publisher", "p"))
    p.send("a", b"first")
    assert recv_all(t, 1) == [b"first"]
    for i in range(12):
        p.send("a", b"m%d" % i)
    got = recv_all(t, 5)
    while b"m11" not in got[-1:] and len(got) < 12:  # what the first pull brought comes first
        more = recv_all(t, 1)
        assert more, f"m11 never came after {got}"
        got += more
    # The inbox had room for what the first pull brought; the stream dropped what came after.
    assert got[-5:] == [b"m7", b"m8", b"m9", b"m10", b"m11"]
    held = len(got) - 5
    assert t.stats.get("drops", "stream_limits") == 12 - 5 - held
    # One report per hole: a pull that came while the publisher was still sending can have
    # brought a message from between two of them.
    seen = [int(m[1:]) for m in got]
    holes = (seen[0] > 0) + sum(b != a + 1 for a, b in zip(seen, seen[1:]))
    assert lost == [("a", "dropped")] * holes and (holes > 0) == (12 - 5 - held > 0)
    p.close()
    t.close()


def test_server_killed_and_restarted_while_publishing(nats_server):
    options = new_options()
    pub = make_pub(nats_server, options)
    live = Sink(nats_server, options, ["a", "b"])
    paused = Sink(nats_server, options, ["a", "b"])  # does not read across the outages
    live.sub.start()
    paused.sub.start()
    with publishing_forever(pub):
        wait_for(lambda: len(live.keys()) >= 2000, what="traffic before the outage")
        paused.gate.clear()
        for _ in range(3):  # kill -9 three times mid-stream
            mark = len(live.keys())
            wait_for(lambda: len(live.keys()) >= mark + 1000, timeout=60, what="traffic before the kill")
            nats_server.kill()
            wait_for(lambda: pub.stats.get("send_errors") >= 1, what="the publisher to notice")
            nats_server.start()
        mark = len(live.keys())
        wait_for(lambda: len(live.keys()) >= mark + 2000, timeout=60, what="traffic after the restarts")
        paused.gate.set()
        mark = len(paused.keys())
        wait_for(lambda: len(paused.keys()) >= mark + 2000, timeout=60, what="the paused subscriber to resume")
    pub.close()
    assert_outage_accounted(pub, live, paused)
    # The paused subscriber read from the stream what it missed while not reading.
    # A catch-up of thousands of events: seconds here, more under load (20 s ran out once beside three
    # other workers); the wait ends as soon as it is done.
    wait_for(lambda: len(paused.keys()) > 0.9 * len(live.keys()), timeout=90,
             what="the paused subscriber to read what it missed from the stream")
    live.close()
    paused.close()


def test_position_file_resumes_after_the_subscribers_restart(nats_server, tmp_path):
    options = new_options(position_file=str(tmp_path / "pos.json"), position_interval=0.01)
    p = NatsJetStreamDriver(nats_server.url, options).publisher(Stats("publisher", "p"))
    t, lost = raw_subscriber(nats_server, options)
    t.subscribe("a")
    for i in range(5):
        p.send("a", b"before%d" % i)
    assert recv_all(t, 5) == [b"before%d" % i for i in range(5)]
    t.recv(0.01)  # what the last call returned is taken: the position covers it
    t.close()
    assert json.loads((tmp_path / "pos.json").read_text())["seq"] == 5
    for i in range(5):
        p.send("a", b"while_down%d" % i)  # the subscriber is not running
    t, lost = raw_subscriber(nats_server, options)
    t.subscribe("a")
    p.send("a", b"after")
    assert recv_all(t, 6) == [b"while_down%d" % i for i in range(5)] + [b"after"]
    assert lost == []
    t.close()
    p.close()


def test_a_position_the_stream_no_longer_holds_is_reported(nats_server, tmp_path):
    options = new_options(position_file=str(tmp_path / "pos.json"), position_interval=0.01, max_msgs=3)
    p = NatsJetStreamDriver(nats_server.url, options).publisher(Stats("publisher", "p"))
    t, _ = raw_subscriber(nats_server, options)
    t.subscribe("a")
    p.send("a", b"seen")
    assert recv_all(t, 1) == [b"seen"]
    t.recv(0.01)
    t.close()
    for i in range(10):
        p.send("a", b"m%d" % i)  # 7 of them are gone before the subscriber is back
    t, lost = raw_subscriber(nats_server, options)
    t.subscribe("a")
    assert recv_all(t, 3) == [b"m7", b"m8", b"m9"]
    assert lost == [("a", "dropped")] and t.stats.get("drops", "stream_limits") == 7
    t.close()
    p.close()


def test_a_stream_deleted_and_made_again_is_a_reset(nats_server):
    options = new_options()
    p = NatsJetStreamDriver(nats_server.url, options).publisher(Stats("publisher", "p"))
    t, lost = raw_subscriber(nats_server, options)
    t.subscribe("a")
    for i in range(5):
        p.send("a", b"old%d" % i)
    assert len(recv_all(t, 5)) == 5
    js_call(nats_server, lambda js: js.delete_stream(options["stream"]))
    wait_for(lambda: (t.recv(0.05), lost)[1], what="the subscriber to notice")  # its consumer went with it
    p2 = NatsJetStreamDriver(nats_server.url, options).publisher(Stats("publisher", "p2"))
    p2.send("a", b"new")  # made again: its sequences start at 1
    assert recv_all(t, 1) == [b"new"]
    assert ("a", "reset") in lost
    for x in (t, p, p2):
        x.close()


def test_foreign_subjects_and_garbage_are_counted_not_fatal(nats_server):
    options = new_options()
    pub = make_pub(nats_server, options)
    sink = Sink(nats_server, options, ["a"])
    sink.sub.start()
    assert sink.sub.wait_synced(10)
    root = f"{options['prefix']}.ps."

    async def garbage(js):
        await js.publish(root + "a", b"\xc1 not msgpack")
        await js.publish(root + "bad~ZZ", b"x")  # no topic is written so
        await js.publish(root + "deep.er", b"x")

    js_call(nats_server, garbage)
    for i in range(5):
        pub.publish("a", "t", f"k{i}", "create", i + 1)
    wait_for(lambda: len(sink.seqs("a")) == 5)
    wait_for(lambda: sink.stats.get("decode_errors") >= 1 and sink.transport.stats.get("drops", "foreign_subject") == 2)
    pub.close()
    sink.close()


def test_a_stream_that_is_not_the_drivers_own_is_refused(nats_server):
    options = new_options()
    js_call(nats_server, lambda js: js.add_stream(name=options["stream"], subjects=["other.>"]))
    t = NatsJetStreamDriver(nats_server.url, options).publisher(Stats("publisher", "p"))
    with pytest.raises(TransportError, match="give the driver a stream of its own"):
        t.send("a", b"x")
    t.close()


def test_subscribe_while_the_server_is_down_resolves_later_and_reports_the_topic(nats_server):
    options = new_options(timeout=0.5, ack_timeout=0.5)
    nats_server.kill()
    t, lost = raw_subscriber(nats_server, options)
    t.subscribe("a")
    nats_server.start()
    wait_for(lambda: (t.recv(0.05), lost)[1] == [("a", "subscribe_delayed")], timeout=15,
             what="the start to be resolved")
    p = NatsJetStreamDriver(nats_server.url, options).publisher(Stats("publisher", "p"))
    p.send("a", b"x")
    assert recv_all(t, 1) == [b"x"]
    p.close()
    t.close()


def test_credentials_from_the_nats_section(tmp_path):
    server = NatsServer(tmp_path / "nats", args=("--user", "alice", "--pass", "s3cret")).start()
    options = new_options(timeout=1.0)
    try:
        configure(nats=NatsAccess(username="alice", password="wrong"))
        t = NatsJetStreamDriver(server.url, options).publisher(Stats("publisher", "p"))
        with pytest.raises(TransportError, match="[Aa]uthorization"):  # the server's word, not a bare timeout
            t.send("a", b"x")
        t.close()
        configure(nats=NatsAccess(username="alice", password="s3cret"))
        t = NatsJetStreamDriver(server.url, options).publisher(Stats("publisher", "p"))
        t.send("a", b"x")
        t.close()
    finally:
        configure(nats=NatsAccess())
        server.kill()


@pytest.mark.parametrize("url, options, match", [
    ("redis://127.0.0.1:6379", {}, "nats://"),
    ("nats://127.0.0.1:notaport", {}, "invalid NATS URL"),
    ("nats://127.0.0.1:4222", {"prefix": "a.b"}, "prefix"),
    ("nats://127.0.0.1:4222", {"ack_timeout": 9, "timeout": 1}, "ack_timeout"),
    ("nats://127.0.0.1:4222", {"nonsense": 1}, "nonsense"),
])
def test_bad_configuration_is_a_config_error(url, options, match):
    with pytest.raises(ConfigError, match=match):
        NatsJetStreamDriver(url, options)


def test_uri_hides_the_password():
    t = NatsJetStreamDriver("nats://bob:hunter2@127.0.0.1:1").publisher(Stats("publisher", "p"))
    assert t.uri == "nats://bob@127.0.0.1:1"
    t.close()


def test_a_forged_envelope_written_into_the_stream_costs_resyncs_and_traffic_goes_on(nats_server):
    # The attack of tests/functional/security/test_attacks.py over NATS: anyone who may publish on
    # the stream's subjects writes the real publisher's id with the largest sequence. Like any
    # envelope far ahead, it is held, resynced and delivered (docs/protocol.md §8.6); the real
    # publisher's next envelope, far below it, restarts the stream and resyncs again, so the
    # application's resync brings the cache back to the store (truth wins).
    options = new_options()
    pub = make_pub(nats_server, options)
    sink = Sink(nats_server, options, ["a"], max_idle_time=0.3)
    sink.sub.start()
    assert sink.sub.wait_synced(10)
    pub.publish("a", "t", "k0", "create", 1)
    wait_for(lambda: sink.seqs("a") == [1])
    forged = encode_batch(BatchHeader(pub.id, pub.name, "a"), MAX_SEQ, time.time(),
                          [pack_event("t", "k0", "update", 2**64 - 1, {"owned": True}, time.time())])
    js_call(nats_server, lambda js: js.publish(f"{options['prefix']}.ps.a", forged))
    wait_for(lambda: sink.stats.get("resync_requests", "gap_expired") > 0, what="the forged gap to be resynced")
    for i in range(2, 6):
        pub.publish("a", "t", f"k{i}", "update", i)
    wait_for(lambda: sink.seqs("a")[-4:] == [2, 3, 4, 5], what="the real traffic")
    assert sink.stats.get("streams_restarted") == 1
    assert sink.stats.get("resync_requests", "seq_jump") > 0
    pub.close()
    sink.close()


def test_tls_with_the_ca_from_the_nats_section(tmp_path):
    certs = TestCertificates(tmp_path / "certs")
    server = NatsServer(tmp_path / "nats", args=("--tls", "--tlscert", str(certs.server_cert),
                                                 "--tlskey", str(certs.server_key))).start()
    options = new_options(timeout=1.0)
    try:
        configure(nats=NatsAccess(tls=True))  # the system's CAs do not know the test CA
        t = NatsJetStreamDriver(server.url, options).publisher(Stats("publisher", "p"))
        with pytest.raises(TransportError, match="CERTIFICATE_VERIFY_FAILED|certificate verify failed"):
            t.send("a", b"x")
        t.close()
        configure(nats=NatsAccess(tls=True, ca_file=str(certs.ca)))
        t = NatsJetStreamDriver(server.url, options).publisher(Stats("publisher", "p"))
        s, _ = raw_subscriber(server, options)
        s.subscribe("a")
        t.send("a", b"over tls")
        assert recv_all(s, 1) == [b"over tls"]
        t.close()
        s.close()
    finally:
        configure(nats=NatsAccess())
        server.kill()


def test_a_subscriber_joining_is_welcomed_with_every_publishers_sequences(nats_server):
    """A subscriber says it joined (a core NATS message outside the stream) once its start is
    fixed; each publisher answers with a welcome hello stored after that start, so the newcomer
    knows every publisher's sequences at once, not at the next idle hello (a minute here)."""
    options = new_options()
    pub = make_pub(nats_server, options, max_idle_time=60.0)
    raw = NatsJetStreamDriver(nats_server.url, options).publisher(Stats("publisher", "raw"))
    late = Sink(nats_server, options, ["a"])
    try:
        for i in range(3):
            pub.publish("a", "t", f"k{i}", "update", i + 1)
        pub.flush()
        wait_for(lambda: pub.transport.backlog == 0, what="the events to be stored")
        late.sub.start()
        wait_for(lambda: late.stats.get("hellos_in") >= 1, what="the welcome hello")
        assert pub.stats.get("hellos_out", "welcome") >= 1
        assert late.stats.get("envelopes_in") == 0, "the events stored before the join are not read"
        # The newcomer knows the publisher is at 3 on "a": the next envelope it sees, 5, opens a gap.
        raw.send("a", envelope(pub.id, "a", 5))
        wait_for(lambda: [g for g in late.gaps if g.missing == (4, 4)],
                 what="the late subscriber to find the hole from the welcome's sequence")
    finally:
        raw.close()
        pub.close()
        late.close()


def test_a_server_without_jetstream_is_refused_naming_it(tmp_path):
    """Core NATS alone (at most once, no replay) cannot hold what a subscriber misses while away:
    the driver refuses it with one line that says so, at a subscriber's start (a daemon exits with
    it) and on each publish."""
    server = NatsServer(tmp_path / "nats", jetstream=False).start()
    options = new_options(timeout=1.0)
    try:
        t = NatsJetStreamDriver(server.url, options).subscriber(Stats("subscriber", "s"))
        with pytest.raises(ConfigError, match="has no JetStream .*start nats-server with -js"):
            t.subscribe("a")
        t.close()
        p = NatsJetStreamDriver(server.url, options).publisher(Stats("publisher", "p"))
        with pytest.raises(TransportError, match="has no JetStream"):
            p.send("a", b"x")
        p.close()
        store = tmp_path / "nb.sqlite"
        open_store(f"sqlite:///{store}", ["port"]).close()
        out = subprocess.run([exe("df-controller"), *daemon_args("df-controller", tmp_path, f"sqlite:///{store}"),
                              "--pubsub.driver", server.url], capture_output=True, text=True, timeout=60)
        assert out.returncode == 2, out.stderr
        last = out.stderr.strip().splitlines()[-1]
        assert last.startswith(f"df-controller: NATS at {server.url} has no JetStream"), out.stderr
        assert "Traceback" not in out.stderr
    finally:
        server.kill()


def _login(server, options):
    """A publisher and a subscriber through ``server`` with the [nats] section in force: an event
    reaches the subscriber."""
    pub = make_pub(server, options)
    sink = Sink(server, options, ["a"])
    try:
        sink.sub.start()
        assert sink.sub.wait_synced(10)
        pub.publish("a", "t", "k", "update", 1)
        pub.flush()
        wait_for(lambda: sink.keys("a") == ["k"], what="the event through the authenticated server")
    finally:
        pub.close()
        sink.close()


def test_token_login_from_the_nats_section(tmp_path):
    server = NatsServer(tmp_path / "nats", args=("--auth", "s3cret-token")).start()
    options = new_options(timeout=1.0)
    try:
        configure(nats=NatsAccess(token="wrong"))
        t = NatsJetStreamDriver(server.url, options).publisher(Stats("publisher", "p"))
        with pytest.raises(TransportError, match="[Aa]uthorization"):
            t.send("a", b"x")
        t.close()
        configure(nats=NatsAccess(token="s3cret-token"))
        _login(server, options)
    finally:
        configure(nats=NatsAccess())
        server.kill()


def test_nkey_login_from_the_nats_section(tmp_path):
    nkeys = pytest.importorskip("nkeys")
    seed = nkeys.encode_seed(os.urandom(32), nkeys.PREFIX_BYTE_USER)
    public = nkeys.from_seed(bytearray(seed)).public_key.decode()
    other = nkeys.encode_seed(os.urandom(32), nkeys.PREFIX_BYTE_USER)
    (tmp_path / "user.nk").write_bytes(seed)
    (tmp_path / "other.nk").write_bytes(other)
    conf = tmp_path / "nats.conf"
    conf.write_text(f'authorization {{\n  users = [ {{ nkey: "{public}" }} ]\n}}\n')
    server = NatsServer(tmp_path / "nats", args=("-c", str(conf))).start()
    options = new_options(timeout=1.0)
    try:
        configure(nats=NatsAccess(nkey_seed_file=str(tmp_path / "other.nk")))  # a key the server does not know
        t = NatsJetStreamDriver(server.url, options).publisher(Stats("publisher", "p"))
        with pytest.raises(TransportError, match="[Aa]uthorization"):
            t.send("a", b"x")
        t.close()
        configure(nats=NatsAccess(nkey_seed_file=str(tmp_path / "user.nk")))
        _login(server, options)
    finally:
        configure(nats=NatsAccess())
        server.kill()
