"""A writer whose queues live apart from its store, killed with SIGKILL at the worst moments of a
notified write: after reserving, before its store write; after its store write, before its
commit (docs/notifications.md, failure windows).

The writer runs in a process of its own with the step armed (dfpubsub.testing.crash) and writes
round-robin until the step kills it. Afterwards every write it made before the fatal one is
notified exactly once, the fatal one is made and not notified (after_store_write) or not made
(after_reserve), nothing is notified that was not written, the dead writer's reservations and
credits expire after the topic's ``stale_after``, and a new writer notifies on the same shards.
"""

import itertools
import json
import random
import signal
import subprocess
import sys

import pytest

from dfpubsub.nbapi import NbApi
from dfpubsub.notify import NotificationConfig, NotificationRegistry, Topic
from dfpubsub.notify.notification import decode
from dfpubsub.notify.producer import Notifier
from dfpubsub.queues import open_queues
from dfpubsub.store import open_store
from tests.conftest import wait_for

# What a kill loses and what comes back, not when: the kills follow counted writes.
pytestmark = pytest.mark.beside

TABLES = ["port"]
KEYS = 12
STALE_AFTER = 2.0
_n = itertools.count()

_WRITER = """
import json, sys
from dfpubsub.nbapi import NbApi
from dfpubsub.notify import NotificationRegistry
from dfpubsub.notify.producer import Notifier
from dfpubsub.queues import open_queues
from dfpubsub.store import open_store
from dfpubsub.testing.crash import arm_kill
store_url, queues_url, options, point, nth, keys = sys.argv[1], sys.argv[2], json.loads(sys.argv[3]), sys.argv[4], int(sys.argv[5]), int(sys.argv[6])
store, queues = open_store(store_url, ["port"], **options), open_queues(queues_url, **options)
assert not queues.shares_store(store)
api = NbApi(store, None, Notifier(NotificationRegistry(queues), queues))
arm_kill(point, nth)
i = 0
while True:
    print(api.update("port", f"k{i % keys}", {"i": i}).version, flush=True)
    i += 1
"""


@pytest.fixture(params=["sqlite", "redis", "etcd"])
def apart(request, tmp_path):
    """(store URL, queues URL, options) of a store and queues that do not share a transaction."""
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path}/nb.sqlite", f"sqlite:///{tmp_path}/queues.sqlite", {}
    server = request.getfixturevalue("shared_etcd" if request.param == "etcd" else "shared_redis")
    options = {"prefix": f"wc{next(_n)}-{tmp_path.name[-24:]}"}
    if request.param == "etcd":  # etcd's queues always reserve and commit around the write
        url = f"etcd://127.0.0.1:{server.port}"
        return url, url, options
    return f"redis://127.0.0.1:{server.port}/0", f"redis://127.0.0.1:{server.port}/1", options


def _notified_versions(queues, registry, topic):
    versions = []
    for shard in registry.shard_names(topic):
        items, more = queues.list(shard, 100_000)
        assert not more
        versions += [decode(e.data).version for e in items]
    return sorted(versions)


def _reserved(queues, registry, topic):
    """Reservations and reserved bytes held on the topic's shards."""
    stats = [queues.stats(shard) for shard in registry.shard_names(topic)]
    return sum(s.reservations for s in stats), sum(s.reserved_bytes for s in stats)


@pytest.mark.parametrize("point", ["after_reserve", "after_store_write"])
def test_a_writer_killed_mid_write_loses_only_that_write_and_its_room_comes_back(apart, point):
    store_url, queues_url, options = apart
    store, queues = open_store(store_url, TABLES, **options), open_queues(queues_url, **options)
    try:
        registry = NotificationRegistry(queues)
        topic = registry.create_topic(Topic("orders", "http://127.0.0.1:9/hook", persistent=True, shards=3,
                                            stale_after=STALE_AFTER))
        registry.put_configuration(NotificationConfig("all", "port", "orders"))
        for k in range(KEYS):
            store.create("port", f"k{k}", 0)
        nth = random.randint(40, 160)  # the fatal write: any of them is the worst moment
        proc = subprocess.run([sys.executable, "-c", _WRITER, store_url, queues_url, json.dumps(options),
                               f"notify.{point}", str(nth), str(KEYS)], capture_output=True, text=True, timeout=120)
        assert proc.returncode == -signal.SIGKILL, proc.stderr
        written = [int(line) for line in proc.stdout.split()]  # the versions of the writes that returned
        assert len(written) == nth - 1

        # Every write that returned is notified once, nothing else is: the fatal write, made
        # (after_store_write) or not (after_reserve), is not.
        assert _notified_versions(queues, registry, topic) == written
        fatal = store.get("port", f"k{(nth - 1) % KEYS}").version
        if point == "after_store_write":
            assert fatal > written[-1], "the fatal write was made"
        else:
            assert fatal in written or fatal < written[0], "the fatal write was not made"
        assert _reserved(queues, registry, topic)[0] >= 1, "the dead writer held its reservation"

        # Its reservations and credits expire after stale_after; a new writer's write sweeps the
        # shard it notifies on, and the statistics of a shard count only what is live.
        api = NbApi(store, None, Notifier(registry, queues))
        wait_for(lambda: _reserved(queues, registry, topic) == (0, 0) or None, timeout=STALE_AFTER + 30,
                 what="the dead writer's reservations to expire")
        after = [api.update("port", f"k{k}", {"k": k}).version for k in range(KEYS)]
        assert _notified_versions(queues, registry, topic) == written + after
        api.notifier.close()
    finally:
        queues.close()
        store.close()
