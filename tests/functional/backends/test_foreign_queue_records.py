"""Foreign queue records (issue 31): a queue the registry names but that has no record behind it,
and queue metadata whose limits another writer overwrote with text, written with raw clients
beside valid queues. Listings skip and count the foreign record and list the others; what a
shard already holds is delivered (delivering needs no limits); a write to that shard is refused
before it changes anything (docs/security.md)."""

from __future__ import annotations

import itertools
import json
import sqlite3

import msgpack
import pytest
import redis as redis_py
from aetcd import rpc
from dfpubsub.tools.webhook import WebhookReceiver

from dfpubsub.backends.etcd import txn
from dfpubsub.backends.foreign import SKIPPED
from dfpubsub.errors import ForeignRecord
from dfpubsub.nbapi import NbApi
from dfpubsub.notify import NotificationConfig, NotificationRegistry
from dfpubsub.notify.producer import Notifier
from dfpubsub.queues import open_queues
from dfpubsub.store import open_store
from tests.conftest import wait_for
from tests.functional.df_db_helpers import base_env, df_db
from tests.functional.notify_helpers import delivered_keys, delivery, make_topic

_n = itertools.count()


def _open(backend, request, tmp_path):
    """(url, options) of queues on ``backend`` under a prefix of their own."""
    if backend == "sqlite":
        return f"sqlite:///{tmp_path}/nb.sqlite", {}
    return request.getfixturevalue(f"shared_{backend}").url, {"prefix": f"fq{next(_n)}-{tmp_path.name[-12:]}"}


def test_a_registered_queue_name_without_a_queue_is_skipped_by_every_listing(shared_redis):
    prefix = f"fqg{next(_n)}"
    queues = open_queues(shared_redis.url, prefix=prefix)
    for name in ("a", "b"):
        queues.create_queue(name)
    queues.lock("b", "w1", 60.0)
    redis_py.Redis.from_url(shared_redis.url).sadd(f"{prefix}:q:queues", "ghost", "ghost2")
    before = SKIPPED.get("queue_name")
    assert queues.list_queues() == ["a", "b"]
    assert SKIPPED.get("queue_name") - before == 2
    env = base_env(DFPUBSUB_STORE__URL=shared_redis.url, DFPUBSUB_STORE__PREFIX=prefix)
    for command in ("list", "stats", "owners", "reservations"):
        out = df_db(env, "-o", "json", "queues", command)
        assert out.returncode == 0 and "Traceback" not in out.stderr, out.stderr
        listed = json.loads(out.stdout)
        assert [q["queue"] for q in listed["items"]] == ["a", "b"], command
        assert {s["key"] for s in listed["skipped"]} == {f"{prefix}:q:queues member 'ghost'",
                                                         f"{prefix}:q:queues member 'ghost2'"}, command
    owners = json.loads(df_db(env, "-o", "json", "queues", "owners").stdout)["items"]
    assert [o["owner"] for o in owners] == [None, "w1"]
    # A queue named on the command line that does not exist is still an error of the user's.
    missing = df_db(env, "queues", "stats", "ghost")
    assert missing.returncode == 1 and "no queue 'ghost'" in missing.stderr and "Traceback" not in missing.stderr
    queues.close()


def _text_limits(backend, url, options, shard, tmp_path):
    """Overwrite the limits of queue ``shard`` with text, as another writer might."""
    if backend == "sqlite":
        raw = sqlite3.connect(f"{tmp_path}/nb.sqlite", isolation_level=None)
        raw.execute("UPDATE q_queues SET max_bytes = 'lots', max_entries = 'many', stale_after = 'x' "
                    "WHERE name = ?", (shard,))
        raw.close()
    elif backend == "redis":
        redis_py.Redis.from_url(url).hset(f"{options['prefix']}:q:m:{shard}",
                                          mapping={"max_bytes": "lots", "max_entries": "many", "stale_after": "x"})
    else:
        probe = open_queues(url, **options)
        key = probe._state_key(shard)
        state = msgpack.unpackb(probe._send([], [rpc.RangeRequest(key=key)]).responses[0].response_range.kvs[0].value)
        state[0:3] = ["lots", "many", "x"]
        probe._conn.commit(txn([], [rpc.PutRequest(key=key, value=msgpack.packb(state))]))
        probe.close()


@pytest.mark.parametrize("backend", ["sqlite", "redis", "etcd"])
def test_a_shard_whose_limits_are_text_still_delivers_what_it_holds(backend, request, tmp_path):
    url, options = _open(backend, request, tmp_path)
    queues = open_queues(url, **options)
    registry = NotificationRegistry(queues, cache_ttl=0.0)
    with WebhookReceiver() as webhook:
        topic = make_topic(registry, "orders", webhook.url, shards=1)
        registry.put_configuration(NotificationConfig("all", "port", "orders"))
        (shard,) = registry.shard_names(topic)
        other = make_topic(registry, "audit", webhook.url, shards=1)
        registry.put_configuration(NotificationConfig("audit", "port", "audit"))
        store = open_store(url, ["port"], **options)
        api = NbApi(store, None, Notifier(registry, queues))
        written = [api.create("port", f"p{i}", {"i": i}).key for i in range(5)]
        _text_limits(backend, url, options, shard, tmp_path)
        # A write whose notification would go to that shard is refused before it changes anything,
        # its room cannot be counted; a write holding room reserved ahead (the notifier's credits)
        # may still go in first.
        for i in range(100):
            try:
                written.append(api.create("port", f"q{i}", {"i": i}).key)
            except ForeignRecord:
                break
        assert store.get("port", f"q{i}") is None and len(written) < 105
        lost = api.notifier.stats.get("notifications_lost", reason="foreign_record")
        worker = delivery(queues)
        try:
            # Both shards delivered whole, the one with foreign limits too.
            wait_for(lambda: len(delivered_keys(webhook)) == 2 * len(written) - lost, timeout=20,
                     what="every entry of both shards delivered")
            # Each shard removes what it delivered once the endpoint has answered: wait for both.
            wait_for(lambda: queues.list(shard, 10)[0] == [], what="the delivered entries removed")
            wait_for(lambda: queues.stats(registry.shard_names(other)[0]).entries == 0,
                     what="the other shard's delivered entries removed")
        finally:
            worker.stop()
        assert set(written[:5]) <= {k for k, _ in delivered_keys(webhook)} <= set(written)
        store.close()
    env = base_env(DFPUBSUB_STORE__URL=url, **({"DFPUBSUB_STORE__PREFIX": options["prefix"]} if options else {}))
    listed = json.loads(df_db(env, "-o", "json", "queues", "list").stdout)
    assert [q["queue"] for q in listed["items"]] == registry.shard_names(other) and len(listed["skipped"]) == 1
    queues.close()
