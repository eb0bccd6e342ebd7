"""df-db as operators run it: the installed console script in a subprocess, on every store backend."""

from __future__ import annotations

import itertools
import json
import os
import pty
import subprocess
import threading

import pytest

from dfpubsub import Publisher, PublisherOptions, load_driver
from dfpubsub.discovery import PublisherAnnouncer, open_discovery
from dfpubsub.metrics import Stats
from dfpubsub.testing import LossyTransport, drop_nth
from tests.conftest import free_port, wait_for
from tests.functional.df_db_helpers import EXE, base_env, df_db, ok, refused
from tests.functional.zmq_helpers import subscribed

_prefix = itertools.count()


@pytest.fixture(params=["sqlite", "etcd", "redis"])
def backend(request, tmp_path):
    """(store URL, environment) of an empty store: the URL goes in --store, the prefixes in the environment."""
    prefix = f"dfdb{next(_prefix)}-{os.getpid()}"
    env = base_env(DFPUBSUB_STORE__PREFIX=prefix, DFPUBSUB_DISCOVERY__PREFIX=prefix)
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path}/nb.sqlite", env
    return request.getfixturevalue(f"shared_{request.param}").url, env


def test_store_commands_round_trip(backend):
    url, env = backend
    s = ("--store", url)
    init = ok(env, *s, "init")
    assert init["backend"] == url.split(":")[0] and "port" in init["tables"] and init["publishers"] == 0
    added = ok(env, *s, "add", "port", '[{"key": "p1", "value": {"mac": "m1"}}, {"key": "p2", "value": [1, 2]}]')
    assert [(o["key"], o["topic"]) for o in added] == [("p1", "port"), ("p2", "port")]
    assert added[1]["version"] > added[0]["version"] > 0
    (net,) = ok(env, *s, "add", "network", '{"key": "n1", "value": "x", "topic": "tenant-a"}')
    counts = {r["table"]: r["objects"] for r in ok(env, *s, "tables")}
    assert counts["port"] == 2 and counts["network"] == 1 and counts["router"] == 0
    assert ok(env, *s, "ls", "port") == added
    assert ok(env, *s, "get", "port", "p1") == {**added[0], "value": {"mac": "m1"}}

    (upd,) = ok(env, *s, "update", "port", json.dumps({"key": "p1", "value": {"mac": "m2"},
                                                       "version": added[0]["version"]}))
    assert upd["version"] > net["version"]
    assert "expected version" in refused(env, *s, "update", "port", json.dumps(
        {"key": "p1", "value": 0, "version": added[0]["version"]}))
    dump = ok(env, *s, "dump")
    assert [(o["table"], o["key"], o["value"]) for o in dump] == [
        ("network", "n1", "x"), ("port", "p1", {"mac": "m2"}), ("port", "p2", [1, 2])]
    assert [o["key"] for o in ok(env, *s, "dump", "port")] == ["p1", "p2"]
    assert ok(env, *s, "topics") == [{"topic": "port", "objects": 2, "tables": {"port": 2}},
                                     {"topic": "tenant-a", "objects": 1, "tables": {"network": 1}}]

    gone = ok(env, *s, "rm", "port", "p2", "--yes")
    assert gone["key"] == "p2" and gone["version"] > upd["version"] and "value" not in gone
    assert refused(env, *s, "rm", "port", "p2", "--yes") == "df-db: port/p2 does not exist\n"
    assert ok(env, *s, "clean", "--yes") == {"deleted": 2}
    assert all(r["objects"] == 0 for r in ok(env, *s, "tables"))
    ok(env, *s, "add", "router", '[{"key": "r1", "value": 1}, {"key": "r2", "value": 2}]')
    assert ok(env, *s, "dropall", "--yes") == {"dropped": 2}
    assert ok(env, *s, "dump") == [] and ok(env, *s, "topics") == []


def test_missing_objects_bad_input_and_usage_errors(tmp_path):
    env = base_env(DFPUBSUB_STORE__URL=f"sqlite:///{tmp_path}/nb.sqlite")
    ok(env, "add", "port", '{"key": "p1", "value": 1}')
    assert refused(env, "get", "port", "nope") == "df-db: port/nope does not exist\n"
    assert "unknown table 'nope'" in refused(env, "ls", "nope")
    assert "unknown table" in refused(env, "get", "nope", "p1")
    assert "bad JSON in the argument" in refused(env, "add", "port", "{not json")
    assert "missing field 'value'" in refused(env, "add", "port", '{"key": "p2"}')
    assert "item 1: unknown field(s) colour" in refused(env, "add", "port", '[{"key": "a", "value": 1}, '
                                                                              '{"key": "b", "value": 1, "colour": 2}]')
    assert "topic cannot change" in refused(env, "update", "port", '{"key": "p1", "value": 1, "topic": "t"}')
    assert "already exists" in refused(env, "add", "port", '{"key": "p1", "value": 2}')
    assert "does not exist" in refused(env, "update", "port", '{"key": "ghost", "value": 2}')
    assert "cannot read" in refused(env, "add", "port", "--file", str(tmp_path / "missing.json"))
    assert ok(env, "dump") == [{"table": "port", "key": "p1", "topic": "port", "version": 1, "value": 1}]

    refused(env, "get", "port", status=2)  # typer's usage errors
    refused(env, "add", "port", status=2)  # neither JSON nor --file
    refused(env, "add", "port", "{}", "--file", "x.json", status=2)
    refused(env, "--format", "xml", "tables", status=2)
    refused(env, "frobnicate", status=2)
    assert "unknown store URL" in refused(env, "--store", "gopher://x", "tables", status=2)

    path = tmp_path / "objs.json"
    path.write_text('[{"key": "f1", "value": {"from": "file"}}]')
    assert [o["key"] for o in ok(env, "add", "port", "--file", str(path))] == ["f1"]
    out = subprocess.run([EXE, "-o", "json", "add", "port", "-f", "-"], env=env, input='{"key": "s1", "value": 0}',
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0 and json.loads(out.stdout)[0]["key"] == "s1"


def test_config_file_selects_the_backend_and_store_overrides_it(tmp_path):
    config = tmp_path / "df.toml"
    config.write_text(f'[store]\nurl = "sqlite:///{tmp_path}/a.sqlite"\ntables = ["widget"]\n'
                      '[pubsub]\ndriver = "memory"\n')
    env = base_env()
    ok(env, "--config", str(config), "add", "widget", '{"key": "w", "value": 1}')
    assert [r["table"] for r in ok(env, "--config", str(config), "tables")] == ["widget"]
    other = ("--config", str(config), "--store", f"sqlite:///{tmp_path}/b.sqlite")
    assert "no database at" in refused(env, *other, "tables")  # reading never creates a database
    ok(env, *other, "init")
    assert ok(env, *other, "tables") == [{"table": "widget", "objects": 0}]
    assert ok(env, "--config", str(config), "get", "widget", "w")["value"] == 1


@pytest.mark.parametrize("server", ["etcd", "redis"])
def test_unreachable_backend_is_one_line(server):
    url = f"{server}://127.0.0.1:{free_port()}" + ("/0" if server == "redis" else "")
    message = refused(base_env(), "--store", url, "tables")
    assert "unavailable" in message or "cannot" in message


def test_destructive_commands_confirm(tmp_path):
    env = base_env(DFPUBSUB_STORE__URL=f"sqlite:///{tmp_path}/nb.sqlite")
    ok(env, "add", "port", '[{"key": "a", "value": 1}, {"key": "b", "value": 2}]')
    for args in (["rm", "port", "a"], ["clean"], ["dropall"]):
        assert "refusing without --yes" in refused(env, *args)

    def answer(reply: bytes, *args: str) -> subprocess.CompletedProcess:
        master, slave = pty.openpty()
        try:
            proc = subprocess.Popen([EXE, "-o", "json", *args], env=env, stdin=slave, stdout=subprocess.PIPE,
                                    stderr=subprocess.PIPE, text=True)
            os.write(master, reply)
            out, err = proc.communicate(timeout=60)
        finally:
            os.close(master)
            os.close(slave)
        return subprocess.CompletedProcess(args, proc.returncode, out, err)

    no = answer(b"n\n", "rm", "port", "a")
    assert no.returncode == 1 and "Delete port/a (version 1)?" in no.stderr and "aborted" in no.stderr
    assert len(ok(env, "dump")) == 2
    yes = answer(b"y\n", "dropall")
    assert yes.returncode == 0 and json.loads(yes.stdout) == {"dropped": 2}


def test_writes_publish_and_watch_shows_them_from_another_process(tmp_path, shared_redis):
    """Two df-db processes: one watches Redis Streams, the other writes through NbApi."""
    prefix = f"dfdbw{os.getpid()}"
    env = base_env(DFPUBSUB_STORE__URL=f"sqlite:///{tmp_path}/nb.sqlite", DFPUBSUB_PUBSUB__DRIVER=shared_redis.url,
                   DFPUBSUB_DRIVER=json.dumps({"redis": {"prefix": prefix}}))
    watch = subprocess.Popen([EXE, "-o", "json", "watch", "port", "network", "--count", "3", "--timeout", "60"],
                             env=env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                             text=True)
    try:
        assert "watching network, port on redis" in watch.stderr.readline()
        ok(env, "add", "port", '{"key": "quiet", "value": 0}', "--no-publish")
        (p1,) = ok(env, "add", "port", '{"key": "p1", "value": {"n": 1}}')
        ok(env, "update", "port", '{"key": "p1", "value": {"n": 2}}')
        ok(env, "rm", "port", "p1", "--yes")
        out, err = watch.communicate(timeout=60)
    finally:
        watch.kill()
    assert watch.returncode == 0, err
    lines = [json.loads(line) for line in out.splitlines()]
    assert [(e["type"], e["action"], e["key"], e["seq"]) for e in lines] == [
        ("event", "create", "p1", 1), ("event", "update", "p1", 1), ("event", "delete", "p1", 1)]
    assert lines[0]["publisher"] == "df-db" and lines[0]["version"] == p1["version"]
    assert lines[1]["value"] == {"n": 2} and lines[2]["value"] is None
    assert len({e["publisher_id"] for e in lines}) == 3  # every df-db run is a new publisher


def _zmq_publisher(uri: str, rule=None) -> Publisher:
    stats = Stats("publisher", "test")
    transport = load_driver(uri).publisher(stats)
    if rule is not None:
        transport = LossyTransport(transport, rule)
    return Publisher(transport, "api-test", PublisherOptions(batch_linger=0), stats)


def _read_lines(proc: subprocess.Popen) -> list[str]:
    lines: list[str] = []
    threading.Thread(target=lambda: lines.extend(proc.stdout), daemon=True).start()
    return lines


def test_watch_marks_gaps_as_they_are_seen(tmp_path):
    port = free_port()
    pub = _zmq_publisher(f"zmq+tcp://127.0.0.1:{port}", drop_nth("port", 2))
    env = base_env(DFPUBSUB_STORE__URL=f"sqlite:///{tmp_path}/nb.sqlite", DFPUBSUB_PUBSUB__DRIVER="zmq",
                   DFPUBSUB_PUBSUB__MESSAGE_DELAY_WINDOW="0.2")
    watch = subprocess.Popen([EXE, "-o", "json", "watch", "port", "--connect", f"tcp://127.0.0.1:{port}",
                              "--count", "4", "--timeout", "60"],
                             env=env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                             text=True)
    lines = _read_lines(watch)
    try:
        subscribed(pub, "port", timeout=30)
        for n in range(1, 5):  # the second is lost on the way
            pub.publish("port", "port", f"p{n}", "create", n, {"n": n})
        wait_for(lambda: any(json.loads(line)["type"] == "gap" for line in list(lines)), timeout=30,
                 what="the gap to be shown")
        pub.publish("port", "port", "p5", "update", 5, {"n": 5})
        assert watch.wait(timeout=60) == 0, watch.stderr.read()
    finally:
        watch.kill()
        pub.close()
    docs = [json.loads(line) for line in lines]
    (gap,) = [d for d in docs if d["type"] == "gap"]
    assert gap["missing"] == [2, 2] and gap["topic"] == "port" and gap["reason"] == "gap_expired"
    assert gap["publisher"] == "api-test" and gap["publisher_id"] == pub.id
    events = [d for d in docs if d["type"] == "event"]
    assert [(e["seq"], e["key"], e["version"]) for e in events] == [(1, "p1", 1), (3, "p3", 3), (4, "p4", 4),
                                                                    (5, "p5", 5)]
    assert {e["publisher"] for e in events} == {"api-test"} and events[3]["action"] == "update"
    assert docs.index(gap) < docs.index(events[-1])


def test_publishers_shows_an_announced_publisher(backend):
    url, env = backend
    prefix = env["DFPUBSUB_DISCOVERY__PREFIX"]
    pub = _zmq_publisher("zmq+tcp://127.0.0.1:*")
    discovery = open_discovery(url, ttl=6.0, renew_interval=1.0, prefix=prefix)
    try:
        assert ok(env, "--store", url, "publishers") == []
        with PublisherAnnouncer(discovery, pub, topics=["port", "network"]):
            (row,) = ok(env, "--store", url, "publishers")
            assert row["publisher_id"] == pub.id and row["name"] == "api-test"
            assert row["uris"] == [pub.transport.uri] and row["pid"] == os.getpid()
            assert row["topics"] == ["network", "port"] and row["host"]
            assert 0 <= row["age"] < 60 and 0 < row["lease_left"] <= 6.0
            table = df_db(env, "--store", url, "publishers")
            assert table.returncode == 0 and "api-test" in table.stdout and pub.id in table.stdout
        assert ok(env, "--store", url, "publishers") == []
    finally:
        discovery.close()
        pub.close()


def test_watch_discovers_publishers_and_prints_a_table(tmp_path):
    db = f"sqlite:///{tmp_path}/nb.sqlite"
    pub = _zmq_publisher("zmq+tcp://127.0.0.1:*")
    discovery = open_discovery(db, ttl=3.0, renew_interval=0.5)
    env = base_env(DFPUBSUB_STORE__URL=db, DFPUBSUB_PUBSUB__DRIVER="zmq")
    try:
        with PublisherAnnouncer(discovery, pub, topics=["port"]):
            watch = subprocess.Popen([EXE, "watch", "--discover", "--count", "1", "--timeout", "60"], env=env,
                                     stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                     text=True)
            try:
                # The watch subscribed before discovery connected it: its join comes before its
                # subscription to 'port' (zmq_helpers.subscribed).
                subscribed(pub, "port", timeout=30)
                pub.publish("port", "port", "found-it", "create", 7, {"via": "discovery"})
                out, err = watch.communicate(timeout=60)
            finally:
                watch.kill()
        assert watch.returncode == 0, err
        header, row = out.splitlines()
        assert header.split() == ["time", "publisher", "seq", "topic", "table", "key", "action", "version"]
        assert row.split()[1:] == ["api-test", "1", "port", "port", "found-it", "create", "7"]
    finally:
        discovery.close()
        pub.close()


def test_watch_times_out_with_a_message(tmp_path):
    env = base_env(DFPUBSUB_STORE__URL=f"sqlite:///{tmp_path}/nb.sqlite", DFPUBSUB_PUBSUB__DRIVER="zmq")
    out = df_db(env, "-o", "json", "watch", "port", "--count", "1", "--timeout", "0.5")
    assert out.returncode == 1 and out.stdout == ""
    assert out.stderr.splitlines()[-1] == "df-db: timed out after 0.5 s with 0 of 1 events"
    assert df_db(env, "-o", "json", "watch", "port", "--timeout", "0.3").returncode == 0
