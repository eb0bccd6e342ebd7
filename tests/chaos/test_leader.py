"""Leader election against real backends, as an adversary: the leader killed with SIGKILL, stopped
with SIGSTOP past its lease, cut off by a network partition. Every actor appends its fencing
token to one log while it acts (tests/chaos/leader_actor.py); the log must show one actor at a
time, tokens that only grow, and a standby acting within the lease time."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from dfpubsub.testing.servers import EtcdServer, RedisServer
from tests.chaos.netns import ip
from tests.conftest import stopped as all_stopped
from tests.conftest import wait_for

ACTOR = Path(__file__).with_name("leader_actor.py")
# etcd grants whole seconds, at least 2: a 3 s lease; the holder stops acting 1.2 s before it can pass.
LEASE, DEADLINE, RETRY, SKEW = 3.0, 1.8, 0.3, 1.0
# A standby acts within the lease, a retry period (jittered) and etcd's expiry scan (0.5 s) of the
# holder's last renewal, plus what two cores shared with other work add to a process's wake-up.
TAKEOVER = LEASE + 1.2 * RETRY + 0.5 + 3.0


def start_server(kind: str, workdir: Path, host: str = "127.0.0.1") -> RedisServer | EtcdServer:
    return (RedisServer if kind == "redis" else EtcdServer)(workdir / kind, host=host).start()


@pytest.fixture(params=["sqlite", "redis", "etcd"])
def lease_url(request, tmp_path):
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path}/leases.sqlite"
        return
    server = start_server(request.param, tmp_path)
    try:
        yield server.url
    finally:
        server.stop()


class Actor:
    """leader_actor.py in a process of its own (in network namespace ``netns`` if given)."""

    def __init__(self, url: str, log: Path, identity: str, workdir: Path, netns: str | None = None):
        self.identity = identity
        self.stderr = workdir / f"{identity}.log"
        prefix = ["ip", "netns", "exec", netns] if netns else []
        with open(self.stderr, "wb") as err:
            self.proc = subprocess.Popen([*prefix, sys.executable, str(ACTOR), url, str(log), identity,
                                          str(LEASE), str(DEADLINE), str(RETRY), str(SKEW)], stderr=err)

    def logged(self, text: str) -> bool:
        return text in self.stderr.read_text()

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGCONT)
            self.proc.terminate()
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


def acts(log: Path) -> list[tuple[int, str, float]]:
    """The fencing log: (token, identity, time) per act, in the order of the acts."""
    if not log.exists():
        return []
    out = []
    text = log.read_text()
    # Only whole lines: an actor may be writing the last one as we read (a torn read failed a run).
    for line in text[:text.rfind("\n") + 1].splitlines():
        token, identity, at = line.split()
        out.append((int(token), identity, float(at)))
    return out


def terms(log: Path) -> list[tuple[int, str, float, float]]:
    """(token, identity, first act, last act) per term, checking the log's one rule: one actor at a
    time, with tokens that only grow (a token's acts are not interleaved with another's)."""
    out: list[tuple[int, str, float, float]] = []
    for token, identity, at in acts(log):
        if out and out[-1][0] == token:
            assert out[-1][1] == identity, f"token {token} acted by {out[-1][1]} and {identity}"
            out[-1] = (token, identity, out[-1][2], at)
            continue
        assert not out or token > out[-1][0], f"token {token} of {identity} acted after token {out[-1][0]}"
        out.append((token, identity, at, at))
    return out


def leading(log: Path) -> str | None:
    """The identity of the last act, if any."""
    t = terms(log)
    return t[-1][1] if t else None


def two_actors(url: str, tmp_path: Path, log: Path) -> tuple[Actor, Actor]:
    """Two actors, the first of them leading (it starts first), the second standing by."""
    a = Actor(url, log, "a", tmp_path)
    wait_for(lambda: leading(log) == "a", timeout=90, what="a leading")
    return a, Actor(url, log, "b", tmp_path)


def test_kill_9_the_leader_and_the_standby_acts_within_the_lease(lease_url, tmp_path):
    log = tmp_path / "fencing.log"
    a, b = two_actors(lease_url, tmp_path, log)
    try:
        time.sleep(LEASE)  # b campaigns for a whole lease meanwhile, and must not act
        assert [t[1] for t in terms(log)] == ["a"]
        last_a = acts(log)[-1][2]
        a.proc.kill()
        a.proc.wait()
        wait_for(lambda: leading(log) == "b", timeout=TAKEOVER + 5, what="b taking over")
        (token_a, _, _, end_a), (token_b, _, start_b, _) = terms(log)
        assert token_b > token_a
        assert start_b - last_a <= TAKEOVER, f"b acted {start_b - last_a:.2f}s after a's last act"
        assert start_b - end_a >= LEASE - DEADLINE - 0.5  # b waited for the lease to pass, not for a to die
    finally:
        a.stop()
        b.stop()


def test_sigstop_the_leader_past_its_lease_and_it_does_not_act_when_it_resumes(lease_url, tmp_path):
    log = tmp_path / "fencing.log"
    a, b = two_actors(lease_url, tmp_path, log)
    try:
        a.proc.send_signal(signal.SIGSTOP)
        wait_for(lambda: all_stopped(a.proc.pid), what="every thread of a to stop")
        stopped = time.time()
        # From b's own log: a stopped between its check and its write holds the fencing log's lock.
        wait_for(lambda: b.logged('"msg": "leading"'), timeout=TAKEOVER + 5, what="b taking over")
        b_acts = len(acts(log))
        a.proc.send_signal(signal.SIGCONT)
        # a resumes past its deadline: its first check already says no; its elector then steps down.
        wait_for(lambda: a.logged("stopped leading"), timeout=10, what="a stepping down")
        wait_for(lambda: len(acts(log)) > b_acts + 50, timeout=10, what="b acting on")
        found = terms(log)
        assert [t[1] for t in found] == ["a", "b"], found
        assert found[0][3] < stopped  # a decided its last act before it was stopped: none once it resumed
        assert found[1][2] - stopped >= LEASE - 1.5 * RETRY  # not before a's lease could have passed
        assert a.proc.poll() is None  # a stands by again: it campaigns, but b holds the lease
    finally:
        a.stop()
        b.stop()
    assert [t[1] for t in terms(log)] == ["a", "b"]


@pytest.fixture(params=["redis", "etcd"])
def partitioned(request, far_side, tmp_path):
    """(the server's URL, the far side's namespace, this side's interface): the server listens on
    this side's end of a veth pair into a namespace; an actor in the namespace reaches it across the link."""
    ns, here, _, near = far_side
    server = start_server(request.param, tmp_path, host=near)
    try:
        yield server.url, ns, here
    finally:
        server.stop()


def test_a_leader_cut_off_by_a_partition_stops_acting_before_the_standby_starts(partitioned, tmp_path):
    url, ns, here = partitioned
    log = tmp_path / "fencing.log"
    a = Actor(url, log, "a", tmp_path, netns=ns)
    b = None
    try:
        wait_for(lambda: leading(log) == "a", timeout=90, what="a (across the link) leading")
        b = Actor(url, log, "b", tmp_path)
        time.sleep(2 * RETRY)
        ip("link", "set", here, "down")
        cut = time.time()
        wait_for(lambda: leading(log) == "b", timeout=TAKEOVER + 5, what="b taking over")
        wait_for(lambda: a.logged("stopped leading"), timeout=10, what="a stepping down")
        ip("link", "set", here, "up")
        wait_for(lambda: len(acts(log)) > 0 and acts(log)[-1][2] > time.time() - 1.0, timeout=10,
                 what="b acting on")
        time.sleep(2 * LEASE)  # a reaches the server again, and stands by
        found = terms(log)
        assert [t[1] for t in found] == ["a", "b"], found
        (_, _, _, end_a), (_, _, start_b, _) = found
        # a stopped acting within its renew deadline of its last renewal, sent before the cut,
        # although its elector's thread was blocked in a call to the server that had not answered.
        assert end_a < cut + DEADLINE
        assert start_b > end_a + (LEASE - DEADLINE) / 2  # and well before b started
        assert '"reason": "expired"' in a.stderr.read_text()
    finally:
        a.stop()
        if b is not None:
            b.stop()
