"""Publisher discovery on SQLite (embedded), etcd and Redis (real servers), and end to end on ZeroMQ."""

import argparse
import itertools
import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from dfpubsub import Publisher, PublisherOptions, Subscriber, SubscriberOptions, load_driver
from dfpubsub.config import DiscoverySettings, add_config_arguments, load_settings, settings_from_args
from dfpubsub.discovery import (
    DiscoveryConnector,
    PublisherAnnouncer,
    PublisherRecord,
    advertised_uri,
    discovery_from_settings,
    open_discovery,
)
from dfpubsub.errors import ConfigError, StoreMissing
from dfpubsub.metrics import Stats
from tests.conftest import reap, wait_for
from tests.functional.zmq_helpers import subscribed

CHILD = Path(__file__).with_name("discovery_child.py")
SAMPLE = Path(__file__).resolve().parents[3] / "etc" / "dfpubsub.toml"
TTL, RENEW = 1.5, 0.4  # fast, but keeping the rule renew_interval <= ttl / 3
_prefix = itertools.count()


@pytest.fixture(params=["sqlite", "etcd", "redis"])
def backend(request, tmp_path):
    """(url, prefix) of an empty discovery table of each backend."""
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path}/discovery.sqlite", "dfpubsub"
    server = request.getfixturevalue(f"shared_{request.param}")
    return server.url, f"d{next(_prefix)}-{os.getpid()}"


@pytest.fixture
def opened(backend):
    """Open discovery objects (each stands for a process of its own); all closed at the end."""
    url, prefix = backend
    made = []

    def open_(ttl=TTL, renew=RENEW):
        d = open_discovery(url, ttl, renew, prefix)
        made.append(d)
        return d

    yield open_
    for d in made:
        d.close()


def record(publisher_id="pub1", name="neutron-1", topics=("port", "network")):
    return PublisherRecord(publisher_id, name, ["tcp://10.0.0.1:8866"], "host-1", 4242, 1_700_000_000.5, list(topics))


class Seen:
    """Watcher callbacks, with the time of each."""

    def __init__(self):
        self.lock = threading.Lock()
        self.added, self.removed, self.updated = [], [], []

    def add(self, r):
        with self.lock:
            self.added.append((time.monotonic(), r))

    def remove(self, r):
        with self.lock:
            self.removed.append((time.monotonic(), r))

    def update(self, r):
        with self.lock:
            self.updated.append((time.monotonic(), r))

    def ids(self, which):
        with self.lock:
            return [r.publisher_id for _, r in getattr(self, which)]

    def watch(self, d):
        return d.watch(self.add, self.remove, self.update)


# -- 1. register, list, close ------------------------------------------------------------


def test_register_lists_the_record_and_close_deletes_it_at_once(opened):
    pub_side, sub_side = opened(), opened()
    seen = Seen()
    watcher = seen.watch(sub_side)
    reg = pub_side.register(record())
    [got] = sub_side.list()
    assert got == record()  # every stored field; lease_left does not take part in equality
    assert (got.publisher_id, got.name, got.uris, got.host, got.pid, got.started_at, got.topics) == (
        "pub1", "neutron-1", ["tcp://10.0.0.1:8866"], "host-1", 4242, 1_700_000_000.5, ["port", "network"])
    assert 0 < got.lease_left <= pub_side.effective_ttl
    assert got.age > 0
    wait_for(lambda: seen.ids("added") == ["pub1"], what="watcher to see the registration")

    reg.update(topics=["port", "router"])
    assert sub_side.list()[0].topics == ["port", "router"]
    wait_for(lambda: [r.topics for _, r in seen.updated] == [["port", "router"]], what="the update")

    reg.close()
    assert sub_side.list() == []  # at once, not after the TTL
    wait_for(lambda: seen.ids("removed") == ["pub1"], what="watcher to see the removal")
    watcher.close()


def test_a_new_watcher_is_told_of_existing_rows_before_watch_returns(opened):
    d = opened()
    regs = [d.register(record(f"pub{i}", f"n{i}")) for i in range(3)]
    seen = Seen()
    watcher = seen.watch(opened())
    assert sorted(seen.ids("added")) == ["pub0", "pub1", "pub2"]
    assert sorted(watcher.records) == ["pub0", "pub1", "pub2"]
    assert [r.name for r in d.list()] == ["n0", "n1", "n2"]
    for reg in regs:
        reg.close()
    wait_for(lambda: len(seen.removed) == 3)
    watcher.close()


def test_a_row_deleted_behind_the_registrations_back_is_recreated(opened):
    d = opened()
    reg = d.register(record())
    # Delete the row through a second registration object of the same id (as an operator's
    # cleanup would), then wait for the keep-alive to notice and put it back.
    other = opened()
    with reg._lock:  # no renewal in between
        impostor = other.register(record())
        impostor.close()
        assert d.list() == []
    wait_for(lambda: [r.publisher_id for r in d.list()] == ["pub1"], timeout=3 * RENEW + 2,
             what="the keep-alive to re-create the row")
    assert reg.failures == 0
    reg.close()


# -- 2. a killed publisher vanishes after the TTL ------------------------------------------


@pytest.mark.alone  # renewals and expiries within TTLs of a few seconds
def test_a_killed_publisher_vanishes_after_the_ttl_and_watchers_see_it(opened, backend):
    url, prefix = backend
    d = opened()
    seen = Seen()
    watcher = seen.watch(d)
    child = subprocess.Popen([sys.executable, str(CHILD), url, str(TTL), str(RENEW), prefix, "doomed"],
                             stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        info = json.loads(child.stdout.readline())
        wait_for(lambda: seen.ids("added") == ["doomed"], what="the child's registration")
        [rec] = d.list()
        assert rec.pid == info["pid"] == child.pid
        time.sleep(2 * RENEW)  # it keeps itself alive meanwhile
        assert [r.publisher_id for r in d.list()] == ["doomed"]

        killed = time.monotonic()
        child.send_signal(signal.SIGKILL)
        child.wait()
        ttl = info["ttl"]  # etcd's granted lease TTL: whole seconds, at least its minimum
        wait_for(lambda: seen.ids("removed") == ["doomed"], timeout=ttl + 3, what="the expiry")
        gone_after = seen.removed[0][0] - killed
        assert d.list() == []
    finally:
        child.kill()
        child.wait()
        child.stdout.close()
        child.stdin.close()
    # Not before the TTL since its last renewal (at most RENEW before the kill), and soon after it.
    assert ttl - RENEW - 0.1 <= gone_after <= ttl + d.poll_interval + 1.0, gone_after
    print(f"\n{url.split(':')[0]}: killed publisher gone after {gone_after:.2f}s (ttl {ttl}s)")
    watcher.close()


# -- 3. renewing well inside the TTL keeps a live publisher listed (the Dragonflow bug) ----


@pytest.mark.alone  # renewals and expiries within TTLs of a few seconds
def test_a_live_registration_never_vanishes_over_several_ttls(opened):
    pub_side, sub_side = opened(), opened()
    seen = Seen()
    watcher = seen.watch(sub_side)
    reg = pub_side.register(record())
    observe = 5.0
    deadline = time.monotonic() + observe
    lease_left = []
    while time.monotonic() < deadline:
        rows = sub_side.list()
        assert [r.publisher_id for r in rows] == ["pub1"], "a live publisher was listed as gone"
        lease_left.append(rows[0].lease_left)
        time.sleep(0.05)
    assert seen.ids("removed") == [] and seen.ids("added") == ["pub1"]
    assert reg.failures == 0 and reg.renewals >= observe / RENEW - 2
    # The row never came near expiry: it was renewed with two thirds of its TTL to spare.
    assert min(lease_left) > 0
    print(f"\n{sub_side.backend}: {reg.renewals} renewals in {observe}s, "
          f"least lease left {min(lease_left):.2f}s of {sub_side.effective_ttl}s")
    reg.close()
    watcher.close()


def test_dragonflow_timing_is_refused(backend):
    url, prefix = backend
    with pytest.raises(ConfigError, match="renew_interval"):
        open_discovery(url, ttl=10, renew_interval=10, prefix=prefix)  # renewed at about the timeout
    with pytest.raises(ConfigError, match="ttl / 3"):
        open_discovery(url, ttl=9, renew_interval=3.5, prefix=prefix)
    open_discovery(url, ttl=9, renew_interval=3, prefix=prefix).close()  # exactly a third is fine


# -- the backend goes away and comes back ------------------------------------------------


@pytest.mark.parametrize("server_fixture", ["etcd_server", "redis_server"])
def test_registration_and_watch_survive_a_server_restart(request, server_fixture):
    server = request.getfixturevalue(server_fixture)
    ttl, renew = 6.0, 0.5  # longer than the restart takes: the row must outlive the outage
    pub_side = open_discovery(server.url, ttl, renew, "restart")
    sub_side = open_discovery(server.url, ttl, renew, "restart")
    seen = Seen()
    watcher = seen.watch(sub_side)
    reg = pub_side.register(record("before"))
    wait_for(lambda: seen.ids("added") == ["before"])
    time.sleep(1.2)  # Redis appends to its file every second: let the row reach the disk

    server.kill()
    time.sleep(2 * renew)  # renewals and listings fail meanwhile
    assert reg.failures >= 1
    assert seen.ids("removed") == []  # an outage is not a removal
    server.start()

    wait_for(lambda: reg.renewals > 0 and time.monotonic() - reg.last_renewed < renew * 2, timeout=10,
             what="renewals to resume")
    late = pub_side.register(record("after"))
    wait_for(lambda: sorted(seen.ids("added")) == ["after", "before"], timeout=10, what="the watch to resume")
    assert seen.ids("removed") == []
    assert sorted(r.publisher_id for r in sub_side.list()) == ["after", "before"]
    late.close()
    wait_for(lambda: seen.ids("removed") == ["after"])
    reg.close()
    watcher.close()
    pub_side.close()
    sub_side.close()


# -- 4. configuration ----------------------------------------------------------------------


@pytest.mark.parametrize(
    "toml",
    [
        "[discovery]\nttl = 3.0\nrenew_interval = 2.0\n",
        "[discovery]\nrenew_interval = 3.5\n",  # the default TTL of 10 s allows 3.33 s
        "[discovery]\nttl = 2.0\n",  # the default renew interval of 3 s is too long for it
    ],
)
def test_config_refuses_a_renew_interval_above_a_third_of_the_ttl(tmp_path, toml):
    cfg = tmp_path / "bad.toml"
    cfg.write_text(toml)
    with pytest.raises(ConfigError) as err:
        load_settings(str(cfg))
    message = str(err.value)
    assert "discovery.renew_interval" in message and "discovery.ttl" in message, message
    assert str(cfg) in message


def test_config_refuses_it_from_the_environment_and_flags_too(monkeypatch):
    monkeypatch.setenv("DFPUBSUB_DISCOVERY__RENEW_INTERVAL", "4")
    with pytest.raises(ConfigError, match="discovery.renew_interval"):
        load_settings()
    monkeypatch.delenv("DFPUBSUB_DISCOVERY__RENEW_INTERVAL")
    parser = argparse.ArgumentParser()
    add_config_arguments(parser)
    with pytest.raises(ConfigError, match=r"discovery.renew_interval \(2 s\) must be at most discovery.ttl / 3"):
        settings_from_args(parser.parse_args(["--discovery.ttl", "3", "--discovery.renew-interval", "2"]))
    ok = settings_from_args(parser.parse_args(["--discovery.ttl", "3", "--discovery.renew-interval", "1"]))
    assert (ok.discovery.ttl, ok.discovery.renew_interval) == (3.0, 1.0)


def test_config_defaults_and_sample(tmp_path):
    s = load_settings()
    assert (s.discovery.url, s.discovery.ttl, s.discovery.renew_interval, s.discovery.prefix) == (
        "", 10.0, 3.0, "dfpubsub")
    text = SAMPLE.read_text()
    assert "\n[discovery]\n" in text
    for name in DiscoverySettings.model_fields:
        assert f"\n{name} =" in text.split("\n[discovery]\n", 1)[1], f"discovery.{name} missing from the sample"
    assert load_settings(str(SAMPLE)).discovery == DiscoverySettings()
    # An empty discovery.url means the store's URL.
    cfg = tmp_path / "c.toml"
    cfg.write_text(f'[store]\nurl = "sqlite:///{tmp_path}/nb.sqlite"\n[discovery]\nttl = 3\nrenew_interval = 1\n')
    with pytest.raises(StoreMissing, match="discovery.url"):  # only an announcer creates the table
        discovery_from_settings(load_settings(str(cfg)))
    assert not (tmp_path / "nb.sqlite").exists()
    d = discovery_from_settings(load_settings(str(cfg)), create=True)
    assert (d.backend, d.ttl, d.renew_interval) == ("sqlite", 3.0, 1.0)
    d.close()
    discovery_from_settings(load_settings(str(cfg))).close()


def test_unknown_discovery_url_is_a_config_error():
    with pytest.raises(ConfigError, match="unknown discovery URL"):
        open_discovery("zk://127.0.0.1:2181")


# -- records --------------------------------------------------------------------------------


def test_record_round_trips_and_refuses_bad_fields():
    r = record()
    assert PublisherRecord.from_json(r.to_json()) == r
    for bad in ({"publisher_id": "a/b"}, {"pid": "12"}, {"uris": "tcp://x:1"}, {"topics": [1]}):
        with pytest.raises(ValueError):
            PublisherRecord(**{**r.to_dict(), **bad})
    with pytest.raises(ValueError):
        PublisherRecord.from_json(b'{"publisher_id": "x"}')
    assert advertised_uri("tcp://0.0.0.0:8866", "node-7") == "tcp://node-7:8866"
    assert advertised_uri("tcp://127.0.0.1:8866", "node-7") == "tcp://127.0.0.1:8866"


# -- the connector --------------------------------------------------------------------------


class FakeTransport:
    def __init__(self, endpoints=()):
        self.endpoints = set(endpoints)


class FakeSubscriber:
    """Records connect/disconnect calls, like Subscriber's."""

    def __init__(self, endpoints=()):
        self.transport = FakeTransport(endpoints)
        self.calls = []

    def connect(self, uri):
        self.calls.append(("connect", uri))
        self.transport.endpoints.add(uri)

    def disconnect(self, uri):
        self.calls.append(("disconnect", uri))
        self.transport.endpoints.discard(uri)


def test_connector_keeps_a_uri_another_live_record_lists_and_skips_static_ones(tmp_path):
    d = open_discovery(f"sqlite:///{tmp_path}/d.sqlite", TTL, RENEW)
    sub = FakeSubscriber(endpoints=["tcp://static:1"])
    connector = DiscoveryConnector(d, sub)
    mk = lambda pid, uris: PublisherRecord(pid, pid, uris, "h", 1, time.time(), [])  # noqa: E731
    old = d.register(mk("old", ["tcp://a:1", "tcp://static:1"]))
    wait_for(lambda: connector.connected == {"tcp://a:1"})
    # The publisher restarts on the same port: a new id while the old row still lives.
    new = d.register(mk("new", ["tcp://a:1"]))
    old.close()
    time.sleep(3 * d.poll_interval)
    assert sub.calls == [("connect", "tcp://a:1")]  # neither disconnected nor reconnected
    new.update(uris=["tcp://b:1"])
    wait_for(lambda: connector.connected == {"tcp://b:1"})
    assert sub.calls[1:] == [("connect", "tcp://b:1"), ("disconnect", "tcp://a:1")]
    connector.close()
    assert sub.calls[-1] == ("disconnect", "tcp://b:1")
    assert sub.transport.endpoints == {"tcp://static:1"}  # never touched
    d.close()


# -- 5. end to end on ZeroMQ -------------------------------------------------------------------


def make_pub(name):
    stats = Stats("publisher", name)
    transport = load_driver("zmq+tcp://127.0.0.1:*", {}).publisher(stats)
    return Publisher(transport, name, PublisherOptions(batch_linger=0.001, max_idle_time=0.5), stats)


@pytest.mark.zmq
def test_subscriber_follows_publishers_announced_at_run_time(opened):
    pytest.importorskip("zmq")
    events, lock = [], threading.Lock()

    def on_event(e):
        with lock:
            events.append((e.publisher_id, e.key))

    def keys(pub):
        with lock:
            return [k for p, k in events if p == pub.id]

    stats = Stats("subscriber", "discovered")
    sub = Subscriber(load_driver("zmq", {}).subscriber(stats), ["port"], on_event, None,
                     SubscriberOptions(message_delay_window=0.2), "discovered", None, stats)
    sub.start()
    connector = DiscoveryConnector(opened(), sub)  # no static endpoints at all
    assert sub.transport.endpoints == set() and connector.connected == set()

    pub_a, pub_b = make_pub("pub-a"), make_pub("pub-b")
    ann_a = PublisherAnnouncer(opened(), pub_a)
    ann_b = PublisherAnnouncer(opened(), pub_b)
    uri_a, uri_b = pub_a.transport.uri, pub_b.transport.uri
    assert ann_a.record.uris == [uri_a] and uri_a.startswith("tcp://127.0.0.1:")
    wait_for(lambda: sub.transport.endpoints == {uri_a, uri_b}, what="the subscriber to connect to both")
    assert connector.connected == {uri_a, uri_b}
    for pub in (pub_a, pub_b):
        subscribed(pub, "port")  # connected after it subscribed: a join alone is not enough
        for i in range(10):
            pub.publish("port", "port", f"{pub.name}-{i}", "create", i + 1)
    wait_for(lambda: len(keys(pub_a)) == 10 and len(keys(pub_b)) == 10, what="events of both publishers")
    # The announcer follows the topics the publisher uses.
    wait_for(lambda: [r.topics for r in connector.watcher.discovery.list()] == [["port"], ["port"]],
             what="the records to list the topic")

    subscriptions_b = pub_b.transport.subscriptions("port")
    ann_a.close()  # unregistered: the subscriber lets go of it, though it still runs
    wait_for(lambda: uri_a not in sub.transport.endpoints, what="the subscriber to disconnect")
    assert sub.transport.endpoints == {uri_b} and connector.connected == {uri_b}
    # Dropping an endpoint gives the subscriber a new socket (docs/drivers.md): it joins pub_b again.
    subscribed(pub_b, "port", subscriptions_b + 1)
    pub_a.publish("port", "port", "late-a", "create", 99)
    pub_b.publish("port", "port", "late-b", "create", 99)
    wait_for(lambda: "late-b" in keys(pub_b), what="the other publisher's event")
    time.sleep(0.3)
    assert "late-a" not in keys(pub_a)

    connector.close()  # lets go of what it connected
    wait_for(lambda: sub.transport.endpoints == set(), what="the connector to disconnect on close")
    ann_b.close()
    sub.close()
    pub_a.close()
    pub_b.close()


def test_a_forked_child_closing_its_copy_leaves_the_parents_row(tmp_path):
    import multiprocessing

    d = open_discovery(f"sqlite:///{tmp_path}/d.sqlite", TTL, RENEW)
    reg = d.register(record())
    child = multiprocessing.get_context("fork").Process(target=d.close)  # closes every inherited registration
    child.start()
    child.join(10)
    assert child.exitcode == 0
    assert [r.publisher_id for r in d.list()] == ["pub1"]
    time.sleep(2 * RENEW)
    assert reg.renewals >= 1 and not reg.closed
    d.close()  # the parent's close does delete it
    with open_discovery(f"sqlite:///{tmp_path}/d.sqlite", TTL, RENEW) as again:
        assert again.list() == []


@pytest.mark.own_process
@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork")
def test_etcd_discovery_survives_a_fork_while_it_renews_and_watches(etcd_server):
    """Its channels are the store's EtcdChannel: closed around the fork (a renewal or the watch in
    flight is cancelled and resumes), reopened on both sides; the child works on channels of its own."""
    d = open_discovery(etcd_server.url, TTL, RENEW, "fork")
    reg = d.register(record("pub1"))
    seen: set[str] = set()
    watcher = d.watch(lambda r: seen.add(r.publisher_id), lambda r: seen.discard(r.publisher_id))
    try:
        wait_for(lambda: reg.renewals >= 2 and "pub1" in seen, what="renewals and the watch under way")
        pid = os.fork()
        if pid == 0:  # child: report through the exit status, never return into pytest
            code = 1
            try:
                code = 0 if [r.publisher_id for r in d.list()] == ["pub1"] else 1
            finally:
                os._exit(code)
        assert reap(pid) == 0
        renewals = reg.renewals
        other = d.register(record("pub2"))
        wait_for(lambda: reg.renewals > renewals + 2 and "pub2" in seen,
                 what="the parent's renewals and watch to go on after the fork")
        assert not reg.closed
        other.close()
        wait_for(lambda: "pub2" not in seen, what="the watch to see the removal")
    finally:
        watcher.close()
        d.close()


def test_etcd_watch_lists_again_when_its_revision_was_compacted(etcd_server):
    import grpc
    from aetcd import rpc

    d = open_discovery(etcd_server.url, TTL, RENEW, "compact")  # an etcd of its own: it compacts it
    seen = Seen()
    watcher = seen.watch(d)
    reg = d.register(record("alive"))
    wait_for(lambda: seen.ids("added") == ["alive"])
    for i in range(3):  # history to compact
        reg.update(topics=[f"t{i}"])
    wait_for(lambda: len(seen.updated) == 3)
    # As if the watcher had been cut off and missed the deletion of "ghost" meanwhile, and etcd
    # had compacted the revisions it would resume from.
    watcher._records["ghost"] = record("ghost")
    with grpc.insecure_channel(etcd_server.url[len("etcd://"):]) as channel:
        kv = rpc.KVStub(channel)
        now = kv.Range(rpc.RangeRequest(key=b"/"), timeout=5).header.revision
        kv.Compact(rpc.CompactionRequest(revision=now, physical=True), timeout=5)
    assert now > 2
    watcher._revision = 1
    watcher._interrupt()  # the stream breaks; the resume finds revision 2 compacted
    wait_for(lambda: seen.ids("removed") == ["ghost"], what="the listing after the compaction")
    assert watcher.relists == 1 and sorted(watcher.records) == ["alive"]
    reg.close()
    wait_for(lambda: seen.ids("removed") == ["ghost", "alive"], what="the watch to go on after the listing")
    d.close()
