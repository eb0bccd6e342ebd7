"""Shared test helpers: waiting on conditions (never on bare sleeps) and free ports; the --soak
option; turns between pytest-xdist's workers for the tests marked ``alone``."""

from __future__ import annotations

import fcntl
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Generator, Iterator
from pathlib import Path

import pytest

from dfpubsub.backends import access
from dfpubsub.store import Store, open_store
from dfpubsub.testing.servers import EtcdServer, NatsServer, RedisServer, free_port

__all__ = ["wait_for", "free_port", "reap", "stopped", "undetected", "share_the_machine"]

#: This pytest-xdist worker's turns between the tests (pytest_runtest_protocol).
_turns: _Turns | None = None


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--soak", action="store_true",
                     help="run the chaos tests' longer rounds (more tries, rounds and kills; README, Quickstart)")


@pytest.fixture(scope="session")
def soak(request: pytest.FixtureRequest) -> bool:
    """Whether the run is a soak (``./dev test --soak``): a repeated chaos scenario runs its longer
    rounds then, and enough of them in a default run to prove its property each time."""
    return bool(request.config.getoption("soak"))


@pytest.hookimpl(tryfirst=True)  # before pytest-xdist reads the marks
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """A chaos test runs alone unless its module says ``beside``: a new chaos test is safe by default.

    The tests that run alone form one pytest-xdist group, run by one worker one after another: each
    would otherwise wait for the tests beside it to end while the workers that ended theirs idle
    (150 s of waits in a run of 908 s, measured; 7 s as one group)."""
    chaos = Path(__file__).parent / "chaos"
    for item in items:
        if item.path.is_relative_to(chaos) and item.get_closest_marker("beside") is None:
            item.add_marker("alone")
        if item.get_closest_marker("alone") is not None and item.get_closest_marker("xdist_group") is None:
            item.add_marker(pytest.mark.xdist_group("alone"))


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None) -> Generator[None, None, None]:
    """Under pytest-xdist (``./dev test`` runs two workers), a test marked ``alone`` runs while no
    other runs, its fixtures' set-up and tear-down included; the others run side by side. A worker
    that runs alone tests back to back keeps its turn from one to the next."""
    global _turns
    run = os.environ.get("PYTEST_XDIST_TESTRUNUID")
    if not run:
        yield
        return
    if _turns is None:
        _turns = _Turns(_turns_folder(run))
    alone = item.get_closest_marker("alone") is not None
    _turns.begin(alone)
    try:
        yield
    finally:
        if not (alone and nextitem is not None and nextitem.get_closest_marker("alone") is not None):
            _turns.end()


class _Turns:
    """A worker's turns: readers and a writer on two locks, the writer first. Once a test that must
    run alone waits at the gate no other starts, and it starts when those running have ended.

    POSIX record locks (lockf), not flock(2): a flock belongs to the open file, which a child
    forked by a test shares, so a child that outlived its test (one hung in gRPC after a fork did)
    kept the lock and every later test waited for it, the whole run stuck. A record lock belongs
    to the process: a child never holds it. (And closing any descriptor of a file drops the
    process's locks on it: the two files stay open for the worker's life.)"""

    def __init__(self, folder: Path) -> None:
        folder.mkdir(exist_ok=True)
        self.gate = open(folder / "gate", "a+")  # held for the worker's life
        self.running = open(folder / "running", "a+")
        self.held: str | None = None  # "alone", "shared" or None

    def begin(self, alone: bool) -> None:
        if alone and self.held == "alone":
            return  # the last test ran alone too: its turn goes on
        self.end()
        fcntl.lockf(self.gate, fcntl.LOCK_EX if alone else fcntl.LOCK_SH)
        fcntl.lockf(self.running, fcntl.LOCK_EX if alone else fcntl.LOCK_SH)
        if not alone:
            fcntl.lockf(self.gate, fcntl.LOCK_UN)
        self.held = "alone" if alone else "shared"

    def share(self) -> None:
        """From alone to beside, with no other alone test starting in between: the hold on
        ``running`` turns shared in place, and the gate opens."""
        if self.held == "alone":
            fcntl.lockf(self.running, fcntl.LOCK_SH)
            fcntl.lockf(self.gate, fcntl.LOCK_UN)
            self.held = "shared"

    def end(self) -> None:
        if self.held is not None:
            fcntl.lockf(self.running, fcntl.LOCK_UN)
            fcntl.lockf(self.gate, fcntl.LOCK_UN)
            self.held = None


def share_the_machine() -> None:
    """Let other tests start beside the ``alone`` test calling it, from now to its end.

    For a test whose timing is only part of what it proves: once its bounds of time are behind it
    (a failover's takeovers), what is left (waiting for outcomes with room, an audit) runs beside
    others. Nothing to do outside pytest-xdist."""
    if _turns is not None:
        _turns.share()


#: Set in the interpreter an ``own_process`` test runs in (see pytest_pyfunc_call).
_OWN_PROCESS = "DFPUBSUB_TEST_OWN_PROCESS"


def pytest_pyfunc_call(pyfuncitem: pytest.Function) -> bool | None:
    """A test marked ``own_process`` runs in an interpreter of its own: a pytest of that test alone,
    whose exit status is the test's (its output is shown if it fails). For the tests that fork
    beside live gRPC channels: forked from a worker where other tests' gRPC threads may hold a
    lock at that moment, the child can hang in gRPC (dfpubsub.backends.etcd, the fork hooks), the
    known limitation that failed such a test one suite in a few; an API server that forks its
    workers holds its own channels only, as the fresh interpreter does."""
    if pyfuncitem.get_closest_marker("own_process") is None or os.environ.get(_OWN_PROCESS):
        return None
    root = pyfuncitem.config.rootpath
    out = subprocess.run(
        [sys.executable, "-m", "pytest", pyfuncitem.nodeid, "-q", "-n", "0", "-p", "no:cacheprovider",
         *(["--soak"] if pyfuncitem.config.getoption("soak") else [])],
        cwd=root, env={**os.environ, _OWN_PROCESS: "1"}, capture_output=True, text=True, timeout=240)
    assert out.returncode == 0, f"{pyfuncitem.nodeid} in its own process:\n{out.stdout[-6000:]}{out.stderr[-3000:]}"
    return True


def pytest_configure(config: pytest.Config) -> None:
    # In the run's main process: name the run, so that it can remove the workers' lock files once
    # they have all ended (pytest_unconfigure; a worker that ended first could not).
    if not hasattr(config, "workerinput") and config.getoption("numprocesses", None) \
            and not config.getoption("testrunuid", None):
        config.option.testrunuid = uuid.uuid4().hex


def pytest_unconfigure(config: pytest.Config) -> None:
    run = None if hasattr(config, "workerinput") else config.getoption("testrunuid", None)
    if run:
        shutil.rmtree(_turns_folder(run), ignore_errors=True)


def _turns_folder(run: str) -> Path:
    return Path(tempfile.gettempdir()) / f"dfpubsub-tests-{run}"


def wait_for(cond: Callable[[], object], timeout: float = 10.0, interval: float = 0.01, what: str = "") -> None:
    """Poll ``cond`` until it is true; fail the test after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        if cond():
            return
        if time.monotonic() > deadline:
            pytest.fail(f"timed out after {timeout}s waiting for {what or cond}")
        time.sleep(interval)


def reap(pid: int, timeout: float = 60.0) -> int:
    """The exit code of a child the test forked, waited for at most ``timeout`` seconds. One that
    has not ended by then is killed and the test fails: a child forked from a process whose gRPC
    threads held a lock at the fork can hang in gRPC for ever (dfpubsub.backends.etcd, the fork
    hooks), and a test must not wait for it for ever."""
    status: list[int] = []

    def ended() -> bool:
        done, code = os.waitpid(pid, os.WNOHANG)
        if done:
            status.append(code)
        return bool(done)
    try:
        wait_for(ended, timeout, interval=0.02, what=f"the forked child {pid} to end")
    except BaseException:
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
        raise
    return os.waitstatus_to_exitcode(status[0])


def stopped(pid: int) -> bool:
    """Whether every thread of process ``pid`` is stopped (state T): after SIGSTOP one thread
    takes the stop to the others, which run on until it is scheduled."""
    try:
        return all((t / "stat").read_text().rsplit(")", 1)[1].split()[0] == "T"
                   for t in Path(f"/proc/{pid}/task").iterdir())
    except FileNotFoundError:  # a thread ended as we looked: look again
        return False


def undetected(delivered, holes, last: int) -> list[int]:
    """Sequence numbers 1..last neither in ``delivered`` nor inside one of the ``holes``
    (the (first, last) missing ranges of resync requests): loss nobody noticed."""
    got = set(delivered)
    holes = [h for h in holes if h]
    return [s for s in range(1, last + 1) if s not in got and not any(lo <= s <= hi for lo, hi in holes)]


@pytest.fixture
def redis_settings() -> Iterator[None]:
    """Lets a test ``access.configure(redis=...)`` ([redis] wait_replicas ...); the settings
    before it come back after."""
    before = access.redis_access()
    yield
    access.configure(redis=before)


@pytest.fixture(name="wait_for")
def _wait_for_fixture() -> Callable[..., None]:
    return wait_for


@pytest.fixture
def sqlite_store(tmp_path: Path) -> Iterator[Store]:
    """A SQLite store of tables port and network, in this test's temporary directory."""
    store = open_store(f"sqlite:///{tmp_path}/nb.sqlite", ["port", "network"])
    yield store
    store.close()


@pytest.fixture
def etcd_server(tmp_path: Path) -> Iterator[EtcdServer]:
    """An etcd of this test's own, free to kill and restart."""
    server = EtcdServer(tmp_path / "etcd").start()
    yield server
    server.kill()


@pytest.fixture
def redis_server(tmp_path: Path) -> Iterator[RedisServer]:
    """A redis-server of this test's own, free to kill and restart."""
    server = RedisServer(tmp_path / "redis").start()
    yield server
    server.kill()


@pytest.fixture
def nats_server(tmp_path: Path) -> Iterator[NatsServer]:
    """A nats-server with JetStream of this test's own, free to kill and restart."""
    server = NatsServer(tmp_path / "nats").start()
    yield server
    server.kill()


@pytest.fixture(scope="session")
def shared_etcd(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EtcdServer]:
    """One etcd for tests that only read and write (each under its own key prefix)."""
    server = EtcdServer(tmp_path_factory.mktemp("etcd-shared")).start()
    yield server
    server.kill()


@pytest.fixture(scope="session")
def shared_redis(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisServer]:
    """One redis-server for tests that only read and write (each under its own key prefix)."""
    server = RedisServer(tmp_path_factory.mktemp("redis-shared")).start()
    yield server
    server.kill()
