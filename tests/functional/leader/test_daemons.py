"""The daemons with ``[leader] enabled`` as operators run them: one instance acts while the others
stand by, ``dfpubsub_leader`` says which, a standby takes over within the lease after a kill -9 and
at once after a clean stop of the leader, and a standby stopped before it led exits 0."""

from __future__ import annotations

import contextlib
import signal
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from dfpubsub import Publisher, PublisherOptions, load_driver, open_store
from dfpubsub.leader import open_lease
from dfpubsub.metrics import Stats
from tests.conftest import free_port, stopped, wait_for

pytest.importorskip("pyarrow")

from tests.functional.pipeline.archiver_helpers import DaemonProcess, journaled, published_rows  # noqa: E402

pytestmark = pytest.mark.alone  # leases and takeovers within bounds of time

LEASE = ["--leader.enabled", "true", "--leader.lease-duration", "3", "--leader.renew-deadline", "1.8",
         "--leader.retry-period", "0.3", "--leader.clock-skew", "1"]
TAKEOVER = 3.0 + 0.4 + 4.0  # the lease, a jittered retry, a loaded machine's wake-ups
STARTUP = 90.0  # a Python daemon importing its modules on a machine shared by many


class Daemon(DaemonProcess):
    """A daemon with JSON logs and /metrics on a port of its own."""

    def __init__(self, script: str, *args: str):
        self.metrics_port = free_port()
        super().__init__(script, *args, "--log.format", "json", "--metrics.port", str(self.metrics_port))

    def leader_gauge(self) -> float | None:
        """``dfpubsub_leader`` as scraped; None while /metrics does not answer or lacks it."""
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.metrics_port}/metrics", timeout=2) as r:
                page = r.read().decode()
        except OSError:
            return None
        values = [float(line.split()[-1]) for line in page.splitlines() if line.startswith("dfpubsub_leader{")]
        return values[0] if values else None

    def readyz(self) -> tuple[int, str]:
        """(status, body) of /readyz."""
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.metrics_port}/readyz", timeout=2) as r:
                return r.status, r.read().decode()
        except urllib.error.HTTPError as exc:
            return exc.code, exc.read().decode()

    def stop(self, timeout: float = 15) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        return self.wait(timeout)

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()


def archiver(tmp_path: Path, name: str, bus: str) -> Daemon:
    return Daemon("df-archiver", "--pubsub.driver", bus, "--pubsub.topics", "port", "--archive.path",
                  str(tmp_path / name), "--archive.fsync", "false", "--archive.name", name,
                  "--leader.url", f"sqlite:///{tmp_path}/leases.sqlite", "--leader.identity", name, *LEASE)


def archived(log: Path) -> int:
    return len(published_rows(log)) + journaled(log) if log.exists() else 0


@contextlib.contextmanager
def leading_and_standing_by(start: Callable[[str], Daemon]) -> Iterator[tuple[Daemon, Daemon]]:
    """Two instances of one election, ``start("a")`` leading and ``start("b")`` standing by."""
    a, b = start("a"), None
    try:
        wait_for(lambda: a.leader_gauge() == 1.0, timeout=STARTUP, what="a leading")
        b = start("b")
        wait_for(lambda: b.leader_gauge() == 0.0, timeout=STARTUP, what="b standing by, its gauge served")
        # A standby is not ready, and says why (once it has set its readiness problem, a moment
        # after its gauge: a loaded machine once read the probe in between).
        wait_for(lambda: "leader failed: standing by" in b.readyz()[1], timeout=STARTUP, what="b's readyz saying why")
        assert b.readyz()[0] == 503
        yield a, b
    finally:
        for daemon in (a, b):
            if daemon is not None:
                daemon.kill()


@contextlib.contextmanager
def leader_and_standby(tmp_path: Path) -> Iterator[tuple[Publisher, Daemon, Daemon]]:
    """A publisher and two df-archivers of one election: a leading and subscribed, b standing by."""
    bus = f"zmq+tcp://127.0.0.1:{free_port()}"
    stats = Stats("p", "leader")
    pub = Publisher(load_driver(bus).publisher(stats), "api", PublisherOptions(batch_linger=0), stats)
    try:
        with leading_and_standing_by(lambda name: archiver(tmp_path, name, bus)) as (a, b):
            wait_for(lambda: stats.get("subscribers_joined") >= 1, what="a subscribing")
            yield pub, a, b
    finally:
        pub.close()


def test_one_df_archiver_archives_and_a_standby_takes_over_within_the_lease_after_kill_9(tmp_path):
    with leader_and_standby(tmp_path) as (pub, a, b):
        for i in range(20):
            pub.publish("port", "port", f"k{i}", "create", i + 1, {"i": i})
        wait_for(lambda: archived(tmp_path / "a") == 20, what="a archiving")
        assert archived(tmp_path / "b") == 0 and b.leader_gauge() == 0.0
        a.kill()
        killed = time.monotonic()
        wait_for(lambda: b.leader_gauge() == 1.0, timeout=TAKEOVER + 5, what="b taking over")
        assert time.monotonic() - killed <= TAKEOVER
        wait_for(lambda: pub.stats.get("subscribers_joined") >= 2, what="b subscribing")
        for i in range(20, 30):
            pub.publish("port", "port", f"k{i}", "create", i + 1, {"i": i})
        wait_for(lambda: archived(tmp_path / "b") == 10, what="b archiving")
        assert b.stop() == 0
        assert b.logged("stopped leading", reason="released")


def test_a_standby_stopped_before_it_leads_exits_0_and_a_stopping_leader_hands_over_at_once(tmp_path):
    bus = f"zmq+tcp://127.0.0.1:{free_port()}"
    a = archiver(tmp_path, "a", bus)
    b = c = None
    try:
        wait_for(lambda: a.leader_gauge() == 1.0, timeout=STARTUP, what="a leading")
        b, c = archiver(tmp_path, "b", bus), archiver(tmp_path, "c", bus)
        wait_for(lambda: b.leader_gauge() == 0.0 and c.leader_gauge() == 0.0, timeout=STARTUP, what="standbys")
        assert b.stop() == 0 and not b.logged("archiver started")
        assert a.stop() == 0
        lease = open_lease(f"sqlite:///{tmp_path}/leases.sqlite", "df-archiver", 2.0)
        holder = lease.holder()  # released on the way out: free, or already c's
        lease.close()
        assert holder is None or holder.identity == "c", holder
        assert a.logged("stopped leading", reason="released")
        wait_for(lambda: c.leader_gauge() == 1.0, timeout=TAKEOVER, what="c taking over")
        wait_for(lambda: c.logged("archiver started"), what="c starting to archive")
    finally:
        for d in (a, b, c):
            if d is not None:
                d.kill()


def test_df_controller_standby_reconciles_nothing_until_the_leader_is_killed(tmp_path):
    db = f"sqlite:///{tmp_path}/nb.sqlite"
    store = open_store(db, ["port"])
    store.create("port", "existing", {"n": 0})
    store.close()

    def controller(name: str) -> Daemon:
        return Daemon("df-controller", "--store.url", db, "--store.tables", "port", "--pubsub.driver",
                      f"zmq+tcp://127.0.0.1:{free_port()}", "--controller.name", name, "--leader.identity", name,
                      *LEASE)

    with leading_and_standing_by(controller) as (a, b):
        wait_for(lambda: a.logged("reconcile", key="existing"), timeout=STARTUP, what="a reconciling")
        time.sleep(1.0)  # b campaigns meanwhile: it must not act
        assert not b.logged("reconcile")
        a.kill()
        wait_for(lambda: b.logged("reconcile", key="existing"), timeout=TAKEOVER + 10, what="b reconciling")
        assert b.leader_gauge() == 1.0
        assert b.stop() == 0


def test_a_df_archiver_stopped_past_its_lease_archives_nothing_when_it_resumes_and_exits_1(tmp_path):
    with leader_and_standby(tmp_path) as (pub, a, b):
        a.proc.send_signal(signal.SIGSTOP)
        # One thread takes the stop to the others: until it is scheduled they run on.
        wait_for(lambda: stopped(a.proc.pid), what="every thread of a to stop")
        # Sent while a is stopped: its socket holds them, to be read the moment it resumes.
        for i in range(10):
            pub.publish("port", "port", f"k{i}", "create", i + 1, {"i": i})
        wait_for(lambda: b.leader_gauge() == 1.0, timeout=TAKEOVER + 5, what="b taking over")
        a.proc.send_signal(signal.SIGCONT)
        assert a.wait(15) == 1  # its term ended under it: stopped as by SIGTERM, status 1
        assert a.logged("lost the leader lease: stopping")
        assert archived(tmp_path / "a") == 0
        wait_for(lambda: b.logged("archiver started"), what="b archiving")
        assert b.stop() == 0


def test_df_feed_publishes_from_one_instance_and_a_standby_takes_over(tmp_path):
    db = f"sqlite:///{tmp_path}/nb.sqlite"
    open_store(db, ["port"]).close()

    def feed(name: str) -> Daemon:
        return Daemon("df-feed", "--store.url", db, "--store.tables", "port", "--pubsub.driver",
                      f"zmq+tcp://127.0.0.1:{free_port()}", "--feed.cursor", "", "--feed.announce", "false",
                      "--leader.identity", name, *LEASE)

    with leading_and_standing_by(feed) as (a, b):
        assert a.logged("feed publisher starting") and not b.logged("feed publisher starting")
        a.kill()
        wait_for(lambda: b.logged("feed publisher starting"), timeout=TAKEOVER + 5, what="b taking over")
        assert b.leader_gauge() == 1.0
        assert b.stop() == 0
