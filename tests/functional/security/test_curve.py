"""CURVE with a ZAP allow-list on real ZeroMQ sockets, key files made by df-keys (docs/security.md)."""

from __future__ import annotations

import subprocess
import sys

import zmq
import zmq.auth

from tests.conftest import wait_for
from tests.functional.zmq_helpers import Sink, make_pub

DF_KEYS = [sys.executable, "-c", "import sys; from dfpubsub.tools.df_keys import main; sys.exit(main())"]


def df_keys(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([*DF_KEYS, *args], capture_output=True, text=True, timeout=60)


def _keys(tmp_path, name: str, where: str = "keys") -> str:
    out = df_keys("generate", str(tmp_path / where), name)
    assert out.returncode == 0, out.stderr
    return out.stdout.strip()


def test_only_subscribers_with_an_allowed_key_get_events_and_the_list_reloads(tmp_path):
    pub_public = _keys(tmp_path, "publisher")
    _keys(tmp_path, "alice")
    _keys(tmp_path, "mallory", where="others")
    allowed = tmp_path / "allowed"
    allowed.mkdir()
    (allowed / "alice.key").write_bytes((tmp_path / "keys" / "alice.key").read_bytes())
    (allowed / "junk.txt").write_text("not a key file\n")  # another tool's file: skipped
    pub = make_pub(options={"curve_secret_key_file": str(tmp_path / "keys" / "publisher.key_secret"),
                            "curve_allowed_dir": str(allowed)})

    def sink(secret_file):
        s = Sink(["t"], [pub.transport.uri], options={"curve_server_key": pub_public,
                                                      "curve_secret_key_file": str(secret_file)})
        s.sub.start()
        return s

    alice = sink(tmp_path / "keys" / "alice.key_secret")
    mallory = sink(tmp_path / "others" / "mallory.key_secret")
    anonymous = Sink(["t"], [pub.transport.uri], options={"curve_server_key": pub_public})  # a fresh pair
    anonymous.sub.start()
    try:
        wait_for(lambda: (pub.publish("t", "tbl", "k1", "create", 1), "k1" in alice.keys())[1],
                 what="the allowed subscriber's first event")
        wait_for(lambda: pub.stats.get("drops", "curve_refused") >= 2, what="the other two refused")
        assert mallory.keys() == [] and anonymous.keys() == [] and mallory.stats.get("hellos_in") == 0
        # Mallory's public key is added to the directory: let in at the next handshake (libzmq
        # does not retry a handshake the server refused: the subscriber connects again).
        (allowed / "mallory.key").write_bytes((tmp_path / "others" / "mallory.key").read_bytes())
        mallory.sub.disconnect(pub.transport.uri)
        mallory.sub.connect(pub.transport.uri)
        wait_for(lambda: (pub.publish("t", "tbl", "k2", "create", 1), "k2" in mallory.keys())[1],
                 timeout=30, what="the newly allowed subscriber's events")
        assert anonymous.keys() == []
        # and out again when its file goes, for its next connection
        (allowed / "mallory.key").unlink()
        refused = pub.stats.get("drops", "curve_refused")
        mallory.sub.disconnect(pub.transport.uri)
        mallory.sub.connect(pub.transport.uri)
        wait_for(lambda: pub.stats.get("drops", "curve_refused") > refused, what="mallory refused again")
    finally:
        for s in (alice, mallory, anonymous):
            s.sub.close()
        pub.close()


def test_a_subscriber_pinning_a_key_refuses_a_publisher_with_another(tmp_path):
    impostor = make_pub(options={"curve_secret_key": zmq.curve_keypair()[1].decode()})
    pinned = Sink(["t"], [impostor.transport.uri], options={"curve_server_key": _keys(tmp_path, "real")})
    pinned.sub.start()
    try:
        for i in range(20):
            impostor.publish("t", "tbl", f"k{i}", "create", 1)
            impostor.flush()
        wait_for(lambda: impostor.stats.get("envelopes_out") >= 20, what="the impostor's sends")
        assert pinned.keys() == [] and pinned.stats.get("hellos_in") == 0
    finally:
        pinned.sub.close()
        impostor.close()


def test_df_keys_shows_lists_and_refuses_bad_input_in_one_line(tmp_path):
    public = _keys(tmp_path, "p")
    assert df_keys("show", str(tmp_path / "keys" / "p.key")).stdout.strip() == public
    assert df_keys("show", str(tmp_path / "keys" / "p.key_secret")).stdout.strip() == public
    assert (tmp_path / "keys" / "p.key_secret").stat().st_mode & 0o777 == 0o600
    assert df_keys("list", str(tmp_path / "keys")).stdout.split() == [public]
    for args in (("generate", str(tmp_path / "keys"), "p"), ("show", str(tmp_path / "nope")),
                 ("show", str(tmp_path / "keys")), ("list", str(tmp_path / "nope")), ("frobnicate",)):
        out = df_keys(*args)
        assert out.returncode in (1, 2) and out.stderr.count("\n") == 1 and "Traceback" not in out.stderr, args


def test_a_subscriber_pins_the_key_each_discovered_publisher_registered(tmp_path):
    from dfpubsub.discovery import DiscoveryConnector, PublisherAnnouncer, open_discovery
    from dfpubsub.discovery.api import PublisherRecord

    discovery = open_discovery(f"sqlite:///{tmp_path}/nb.sqlite", ttl=3.0, renew_interval=1.0)
    pubs = [make_pub(name=f"p{i}", options={"curve_secret_key": zmq.curve_keypair()[1].decode()}) for i in range(2)]
    announcers = [PublisherAnnouncer(discovery, p, ["t"]) for p in pubs]
    assert {a.record.curve_key for a in announcers} == {p.transport.public_key for p in pubs}
    # An impostor's row names a real publisher's key for its own endpoint: the handshake fails.
    impostor = make_pub(name="impostor", options={"curve_secret_key": zmq.curve_keypair()[1].decode()})
    fake = discovery.register(PublisherRecord("impostor1", "impostor", [impostor.transport.uri], "h", 1, 0.0, ["t"],
                                              curve_key=pubs[0].transport.public_key))
    _keys(tmp_path, "sub")
    sink = Sink(["t"], options={"curve_secret_key_file": str(tmp_path / "keys" / "sub.key_secret")})
    connector = DiscoveryConnector(discovery, sink.sub)
    sink.sub.start()
    try:
        wait_for(lambda: len(connector.connected) == 3, what="the three rows connected")
        for i, p in enumerate(pubs):
            wait_for(lambda p=p, i=i: (p.publish("t", "tbl", f"real{i}", "create", 1), f"real{i}" in sink.keys())[1],
                     what=f"publisher {i}'s events")
        for i in range(20):
            impostor.publish("t", "tbl", f"fake{i}", "create", 1)
            impostor.flush()
        wait_for(lambda: impostor.stats.get("envelopes_out") >= 20, what="the impostor's sends")
        pubs[0].publish("t", "tbl", "last", "create", 1)
        wait_for(lambda: "last" in sink.keys(), what="an event sent after the impostor's")
        assert not any(k.startswith("fake") for k in sink.keys())
    finally:
        connector.close()
        sink.sub.close()
        fake.close()
        for a in announcers:
            a.close()
        for p in (*pubs, impostor):
            p.close()
        discovery.close()


def test_the_publisher_service_takes_only_workers_holding_the_hosts_key(tmp_path):
    from dfpubsub.drivers.zeromq.options import ZmqOptions
    from dfpubsub.drivers.zeromq.workers import WorkerIngress, WorkerPush

    from dfpubsub.metrics import Stats

    _keys(tmp_path, "host")
    opts = ZmqOptions(worker_curve_key_file=str(tmp_path / "keys" / "host.key_secret"))
    stats = Stats("publisher_service", "svc")
    ingress = WorkerIngress(str(tmp_path / "w.sock"), opts, stats)
    worker = WorkerPush(str(tmp_path / "w.sock"), opts, Stats("publisher", "w"))
    stranger = WorkerPush(str(tmp_path / "w.sock"), ZmqOptions(), Stats("publisher", "x"))  # no key
    # One that knows the service's public key but holds another pair: refused by the ZAP handler.
    wrong = zmq.Context.instance().socket(zmq.PUSH)
    wrong.curve_serverkey = zmq.auth.load_certificate(tmp_path / "keys" / "host.key")[0]
    wrong.curve_publickey, wrong.curve_secretkey = zmq.curve_keypair()
    wrong.connect(f"ipc://{tmp_path / 'w.sock'}")
    try:
        stranger.send("x", b"frame")
        wrong.send_multipart([b"y\x00", b"frame"])
        worker.send("a", b"frame")
        got = []
        wait_for(lambda: got.extend(ingress.recv(0.1)) or any(t == "a" for t, _ in got), what="the worker's frame")
        wait_for(lambda: stats.get("drops", "curve_refused") >= 1, what="the other pair refused")
        got.extend(ingress.recv(0.3))
        assert [t for t, _ in got] == ["a"]
    finally:
        wrong.close(0)
        for push in (worker, stranger):
            push.sock.setsockopt(zmq.LINGER, 0)
            push.close()
        ingress.close()
