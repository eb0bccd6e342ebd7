"""df-db administers notification topics and configurations on every backend, radosgw-admin style."""

from __future__ import annotations

import itertools
import json
import os

import pytest

from dfpubsub.notify import NotificationRegistry
from dfpubsub.queues import open_queues
from tests.functional.df_db_helpers import base_env, ok, refused

_prefix = itertools.count()


@pytest.fixture(params=["sqlite", "etcd", "redis"])
def env(request, tmp_path):
    """The environment of an empty store and its queues on one backend."""
    prefix = f"dfadm{next(_prefix)}-{os.getpid()}"
    url = (f"sqlite:///{tmp_path}/nb.sqlite" if request.param == "sqlite"
           else request.getfixturevalue(f"shared_{request.param}").url)
    return base_env(DFPUBSUB_STORE__URL=url, DFPUBSUB_STORE__PREFIX=prefix, DFPUBSUB_NOTIFY__DEFAULT_SHARDS="3")


def test_topics_and_configurations_round_trip(env):
    topic = {"name": "ports", "endpoint": "http://user:secret@127.0.0.1:9/hook", "persistent": True,
             "time_to_live": 60}
    made = ok(env, "topic", "create", json.dumps(topic))
    assert made["shards"] == 3 and made["endpoint"] == "http://user@127.0.0.1:9/hook"  # no password shown
    assert ok(env, "topic", "create", json.dumps(topic))["name"] == "ports"  # again, unchanged: no error
    assert ok(env, "topic", "set", json.dumps({**topic, "max_retries": 5}))["max_retries"] == 5
    config = {"id": "c1", "source": "port", "topic": "ports", "actions": ["s3:ObjectCreated:*"], "prefix": "p"}
    assert ok(env, "notification", "put", json.dumps(config))["id"] == "c1"
    listed = ok(env, "notifications")
    assert [t["name"] for t in listed["topics"]] == ["ports"] and listed["topics"][0]["max_retries"] == 5
    assert listed["topics"][0]["queues"] == ["ports", "ports.1", "ports.2"]
    assert [c["id"] for c in listed["configurations"]] == ["c1"]

    assert "no notification topic 'nope'" in refused(env, "notification", "put",
                                                     json.dumps({**config, "id": "c2", "topic": "nope"}))
    assert "refusing without --yes" in refused(env, "topic", "rm", "ports")
    assert ok(env, "notification", "rm", "port", "c1", "--yes")["deleted"] == 1
    assert "no configuration c1 of port" in refused(env, "notification", "rm", "port", "c1", "--yes")
    assert ok(env, "topic", "rm", "ports", "--yes") == {"deleted": "ports", "pending_dropped": 0}
    assert ok(env, "notifications") == {"topics": [], "configurations": []}


def test_bad_topic_records_are_one_line_errors(env):
    assert "endpoint must be a URL" in refused(env, "topic", "create", '{"name": "t", "endpoint": "nowhere"}')
    assert "unexpected" in refused(env, "topic", "create", '{"name": "t", "endpoint": "http://h/", "colour": 1}')
    assert "no notification topic 'ghost'" in refused(env, "topic", "set", '{"name": "ghost", "endpoint": "http://h/"}')
    refused(env, "topic", "create", status=2)


def test_a_topic_made_by_df_db_is_what_the_registry_reads(tmp_path):
    env = base_env(DFPUBSUB_STORE__URL=f"sqlite:///{tmp_path}/nb.sqlite")
    ok(env, "topic", "create", '{"name": "t", "endpoint": "redis://127.0.0.1:6379/0", "persistent": true}')
    with open_queues(f"sqlite:///{tmp_path}/nb.sqlite") as queues:
        topic = NotificationRegistry(queues).get_topic("t")
        assert topic.persistent and topic.shards == 11 and len(queues.list_queues()) == 11
