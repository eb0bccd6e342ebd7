"""df-notify killed with SIGKILL at every step of a batch: no committed notification is lost.

The daemon runs under ``python -m dfpubsub.testing.crash POINT@N -- df-notify ...``, which kills it at
a crash point: after an endpoint acknowledged a batch and before its removal, and right after an
entry was set aside (dead-lettered and removed in one step); a second df-notify then takes the shard over.
"""

import os
import shutil
import signal
import subprocess
import sys

import pytest
from dfpubsub.tools.webhook import WebhookReceiver

from dfpubsub.notify import NotificationRegistry
from dfpubsub.queues import open_queues
from tests.conftest import wait_for
from tests.functional.notify_helpers import delivered_keys, enqueue, enqueue_raw, make_topic, wait_drained

# What is delivered, not when: a kill lands at its fault point whatever the load.
pytestmark = pytest.mark.beside

EXPECTED = {(f"{p}{i}", i + 1) for p in "ab" for i in range(5)}


@pytest.fixture(params=["sqlite", "redis"])
def backend(request, tmp_path):
    """(queues, url, key prefix) of a fresh queue backend, and the df-notify processes started on it
    (killed at the end)."""
    if request.param == "sqlite":
        url, options = f"sqlite:///{tmp_path}/queues.sqlite", {}
    else:
        url, options = request.getfixturevalue("shared_redis").url, {"prefix": f"crash-{tmp_path.name[-16:]}"}
    queues = open_queues(url, **options)
    started = []

    def df_notify(worker_id, crash_at="", batch_size=4):
        started.append(_df_notify(url, options.get("prefix", "dfpubsub"), worker_id, crash_at, batch_size))
        return started[-1]

    yield queues, df_notify
    for p in started:
        if p.poll() is None:
            p.kill()
            p.wait(10)
    queues.close()


def _df_notify(url, prefix, worker_id, crash_at, batch_size):
    launcher = ([sys.executable, "-m", "dfpubsub.testing.crash", crash_at, "--", "df-notify"] if crash_at
                else [shutil.which("df-notify", path=os.path.dirname(sys.executable))])
    return subprocess.Popen([*launcher, "--notify.url", url, "--store.prefix", prefix, "--notify.worker-id", worker_id,
                             "--notify.renew-interval", "0.2", "--notify.lease", "1.0",
                             "--notify.poll-interval", "0.02", "--notify.batch-size", str(batch_size),
                             "--log.level", "error"])


def _fill(queues, url):
    """Five valid notifications, an undecodable entry, five more, on a one-shard topic."""
    registry = NotificationRegistry(queues)
    topic = make_topic(registry, "crash", url, shards=1)
    for i in range(5):
        enqueue(queues, topic, "port", f"a{i}", "create", i + 1)
    bad = enqueue_raw(queues, "crash", b"\xc1 garbage")
    for i in range(5):
        enqueue(queues, topic, "port", f"b{i}", "create", i + 1)
    return registry, bad


def _assert_nothing_lost(queues, registry, webhook, bad):
    # A successor's start, the dead one's lease running out and the redelivery: a few seconds, and
    # more than 30 at a load average of 50 on 2 cores (twice). The wait ends when it drained.
    wait_drained(registry, "crash", timeout=90)
    assert set(delivered_keys(webhook)) == EXPECTED
    assert [(d.marker, d.reason.split(":")[0]) for d in queues.list_dead_letters("crash")] == [(bad, "undecodable")]


@pytest.mark.parametrize("crash_at", ["notify.after_send@1", "notify.after_send@2", "notify.after_send@3",
                                      "notify.after_set_aside@1"])
def test_kill_9_at_every_step_of_a_batch_loses_nothing(backend, crash_at):
    queues, df_notify = backend
    with WebhookReceiver() as webhook:
        registry, bad = _fill(queues, webhook.url)
        # Batches of 4: a0-a3, then a4, the bad entry (set aside), b0, b1, then b2-b4.
        assert df_notify("a", crash_at).wait(30) == -signal.SIGKILL, "df-notify did not reach the fault point"
        df_notify("b")
        _assert_nothing_lost(queues, registry, webhook, bad)


def test_kill_9_after_setting_aside_an_undecodable_entry_while_the_endpoint_is_down(backend):
    """The issue's case: 5 of 10 arrived, as the valid entries ahead of the bad one went with it."""
    queues, df_notify = backend
    webhook = WebhookReceiver()  # down
    registry, bad = _fill(queues, webhook.url)
    first = df_notify("a", batch_size=100)
    wait_for(lambda: queues.list_dead_letters("crash"), timeout=60, what="the undecodable entry set aside")
    first.kill()
    first.wait(10)
    with webhook:
        df_notify("b")
        _assert_nothing_lost(queues, registry, webhook, bad)
