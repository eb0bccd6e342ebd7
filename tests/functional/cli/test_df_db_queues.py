"""df-db's queue and notification commands: the installed script against queues on SQLite, etcd and Redis."""

from __future__ import annotations

import base64
import itertools
import os
import time

import pytest

from dfpubsub.notify import NotificationConfig, NotificationRegistry, Topic
from dfpubsub.notify.notification import encode, make_notification
from dfpubsub.queues import open_queues
from tests.functional.df_db_helpers import base_env, df_db, ok, refused

_prefix = itertools.count()


@pytest.fixture(params=["sqlite", "etcd", "redis"])
def queues(request, tmp_path):
    """(env, open QueueStore) of an empty queue backend; df-db finds it through --store and store.prefix."""
    prefix = f"dfdbq{next(_prefix)}-{os.getpid()}"
    if request.param == "sqlite":
        url = f"sqlite:///{tmp_path}/nb.sqlite"
        store = open_queues(url)
    else:
        url = request.getfixturevalue(f"shared_{request.param}").url
        store = open_queues(url, prefix=prefix)
    yield base_env(DFPUBSUB_STORE__URL=url, DFPUBSUB_STORE__PREFIX=prefix), store
    store.close()


def _notification(key: str, version: int, action: str = "create") -> bytes:
    event = "s3:ObjectRemoved:Delete" if action == "delete" else "s3:ObjectCreated:Put"
    return encode(make_notification("orders", event, action, "port", key, version, {"v": version}))


def test_queue_and_notification_commands(queues):
    env, store = queues
    assert ok(env, "queues", "list") == [] and ok(env, "deadletters") == []
    assert ok(env, "notifications") == {"topics": [], "configurations": []}

    registry = NotificationRegistry(store)
    registry.create_topic(Topic("orders", "http://127.0.0.1:9/hook", persistent=True, shards=2, max_retries=3,
                                max_entries=50))
    registry.create_topic(Topic("audit", "http://127.0.0.1:9/audit"))
    registry.put_configuration(NotificationConfig("c1", "port", "orders", ("create", "delete"), prefix="p"))
    registry.put_configuration(NotificationConfig("c2", "network", "audit"))
    markers = [store.commit("orders", store.reserve("orders", 100), _notification(f"p{i}", i)) for i in (1, 2)]
    store.commit("orders", store.reserve("orders", 10), b"not a notification")
    store.reserve("orders.1", 500)  # a writer between reserve and commit
    assert store.lock("orders.1", "worker-a", 120.0)
    store.dead_letter("orders", markers[0], _notification("p1", 1), "max_retries")

    listed = ok(env, "queues", "list")
    assert [q["queue"] for q in listed] == ["orders", "orders.1"]
    assert listed[0]["max_entries"] == 50 and listed[0]["created_at"] <= time.time()

    stats = {s["queue"]: s for s in ok(env, "queues", "stats")}
    assert stats["orders"]["entries"] == 3 and stats["orders"]["reservations"] == 0
    assert stats["orders"]["owner"] is None and stats["orders"]["owner_left"] is None
    assert stats["orders.1"]["reservations"] == 1 and stats["orders.1"]["reserved_bytes"] == 500
    assert stats["orders.1"]["owner"] == "worker-a" and 0 < stats["orders.1"]["owner_left"] <= 120
    assert [s["queue"] for s in ok(env, "queues", "stats", "orders.1")] == ["orders.1"]

    assert ok(env, "queues", "reservations") == [
        {"queue": "orders", "reservations": 0, "reserved_bytes": 0},
        {"queue": "orders.1", "reservations": 1, "reserved_bytes": 500}]
    owners = ok(env, "queues", "owners")
    assert [(o["queue"], o["owner"]) for o in owners] == [("orders", None), ("orders.1", "worker-a")]
    assert owners[1]["owner_until"] > time.time() and 0 < owners[1]["owner_left"] <= 120

    dump = ok(env, "queues", "dump", "orders")
    assert dump["queue"] == "orders" and dump["more"] is False
    assert [e["marker"] for e in dump["entries"][:2]] == markers
    first = dump["entries"][0]["notification"]
    assert (first["key"], first["version"], first["event_name"], first["bucket"]) == (
        "p1", 1, "s3:ObjectCreated:Put", "port")
    assert dump["entries"][2]["notification"] == {"undecodable": "malformed",
                                                  "data": base64.b64encode(b"not a notification").decode()}
    page = ok(env, "queues", "dump", "orders", "--max", "1", "--after", markers[0])
    assert [e["marker"] for e in page["entries"]] == [markers[1]] and page["more"] is True

    (letter,) = ok(env, "deadletters")
    assert (letter["queue"], letter["marker"], letter["reason"]) == ("orders", markers[0], "max_retries")
    assert letter["notification"]["key"] == "p1"
    assert ok(env, "deadletters", "orders.1") == []

    notes = ok(env, "notifications")
    assert [(t["name"], t["persistent"], t["shards"], t["queues"]) for t in notes["topics"]] == [
        ("audit", False, 11, []), ("orders", True, 2, ["orders", "orders.1"])]
    assert notes["topics"][1]["endpoint"] == "http://127.0.0.1:9/hook" and notes["topics"][1]["max_retries"] == 3
    assert [(c["id"], c["source"], c["topic"], c["actions"], c["prefix"]) for c in notes["configurations"]] == [
        ("c2", "network", "audit", [], ""), ("c1", "port", "orders", ["create", "delete"], "p")]
    assert [c["id"] for c in ok(env, "notifications", "--source", "port")["configurations"]] == ["c1"]

    for args in (["queues", "list"], ["queues", "owners"], ["queues", "dump", "orders"], ["deadletters"],
                 ["notifications"]):
        table = df_db(env, *args)
        assert table.returncode == 0 and "orders" in table.stdout, (args, table.stderr)
    assert "worker-a" in df_db(env, "queues", "owners").stdout


def test_unknown_queues_are_one_line_errors(tmp_path):
    env = base_env(DFPUBSUB_STORE__URL=f"sqlite:///{tmp_path}/nb.sqlite")
    open_queues(f"sqlite:///{tmp_path}/nb.sqlite").close()
    for args in (["queues", "stats", "nope"], ["queues", "owners", "nope"], ["queues", "dump", "nope"],
                 ["deadletters", "nope"]):
        assert "nope" in refused(env, *args)
    assert "not a queue marker" in refused(env, "queues", "dump", "x", "--after", "12")
    refused(env, "queues", "dump", status=2)
    refused(env, "queues", "frobnicate", status=2)


def test_queues_url_overrides_the_store(tmp_path):
    env = base_env(DFPUBSUB_STORE__URL=f"sqlite:///{tmp_path}/nb.sqlite")
    open_queues(f"sqlite:///{tmp_path}/nb.sqlite").close()
    with open_queues(f"sqlite:///{tmp_path}/queues.sqlite") as store:
        store.create_queue("elsewhere")
    assert ok(env, "queues", "list") == []
    assert [q["queue"] for q in ok(env, "--queues", f"sqlite:///{tmp_path}/queues.sqlite", "queues", "list")] == [
        "elsewhere"]


def test_dead_letters_are_redriven_into_their_queue_and_purged(queues):
    env, store = queues
    store.create_queue("orders", max_bytes=1 << 20, max_entries=4)
    for i in range(3):
        store.commit("orders", store.reserve("orders", 200), _notification(f"k{i}", 1))
    entries = store.list("orders")[0]
    store.set_aside("orders", entries[:2], "max_retries")
    store.set_aside("orders", entries[2:], "time_to_live")
    assert [d["marker"] for d in ok(env, "deadletters", "orders")] == [e.marker for e in entries]
    refused(env, "redrive", "orders")  # all of a queue needs --yes (no terminal here)
    # One by its marker, then those of a reason, then the rest.
    moved = ok(env, "redrive", "orders", entries[0].marker.lstrip("0"))
    assert [m["marker"] for m in moved] == [entries[0].marker]
    assert ok(env, "redrive", "orders", "--reason", "time_to_live", "--yes")[0]["marker"] == entries[2].marker
    assert [d["marker"] for d in ok(env, "deadletters", "orders")] == [entries[1].marker]
    # The queue holds what came back, once each, after what it held.
    assert sorted(e.data for e in store.list("orders")[0]) == sorted([entries[0].data, entries[2].data])
    store.commit("orders", store.reserve("orders", 200), _notification("k9", 1))
    store.commit("orders", store.reserve("orders", 200), _notification("k8", 1))
    assert "no room" in refused(env, "redrive", "orders", "--yes")  # full: the letter stays
    assert len(ok(env, "deadletters", "orders")) == 1
    refused(env, "purge-deadletters", "orders")
    assert ok(env, "purge-deadletters", "orders", "--yes") == {"purged": 1}
    assert ok(env, "deadletters") == [] and ok(env, "redrive", "orders", "--yes") == []
    refused(env, "redrive", "nope", "--yes")
