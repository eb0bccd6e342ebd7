"""Private etcd, Redis and NATS servers for tests and benchmarks, on free loopback ports in temp dirs.

Tests kill and restart them to inject faults; they only ever touch the
processes they started themselves (never the machine's own servers).
Installed as ``dfpubsub.testing.servers``.
"""

from __future__ import annotations

import itertools
import json
import os
import random
import shutil
import signal
import socket
import ssl
import subprocess
import threading
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import NoReturn, Self

from tenacity import RetryCallState, Retrying, retry_if_result, stop_after_delay, wait_fixed

__all__ = ["ServerProcess", "EtcdServer", "RedisServer", "NatsServer", "TestCertificates", "free_port"]


def _private_ports() -> range:
    """Ports below the kernel's ephemeral range, which it never gives to an outgoing connection;
    in a pytest-xdist worker (and the processes it starts), the worker's own share of them."""
    try:
        low = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return range(0)
    if low <= 11000:
        return range(0)
    ports = range(10000, low)
    worker, workers = os.environ.get("PYTEST_XDIST_WORKER", ""), os.environ.get("PYTEST_XDIST_WORKER_COUNT", "")
    if worker.startswith("gw") and worker[2:].isdigit() and workers.isdigit() and int(workers) > 1:
        # Two workers taking turns through one range meet where their turns cross: a port one
        # handed out, free until its server binds it, could be handed out by the other.
        return ports[int(worker[2:]) :: int(workers)]
    return ports


_PORTS = _private_ports()
_ports_lock = threading.Lock()


def _turn() -> Iterator[int]:
    """This process's turn through the ports, from a random place so that processes rarely meet."""
    return itertools.count(random.randrange(max(len(_PORTS), 1)))


_next_port = _turn()


def _new_turn_in_child() -> None:
    global _next_port  # a forked child would otherwise hand out its parent's next ports
    _next_port = _turn()


os.register_at_fork(after_in_child=_new_turn_in_child)


def _bindable(port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def free_port() -> int:
    """A TCP port on 127.0.0.1 that is free now and will not be handed out again soon.

    bind(0)'s port is taken from the ephemeral range, where any outgoing connection (an etcd
    client, a writer) or a second call may take it before the server meant to bind it does (a
    daemon failed to bind one in CI). So ports are handed out in turn from below that range."""
    with _ports_lock:
        for _ in range(len(_PORTS)):
            port: int = _PORTS[next(_next_port) % len(_PORTS)]
            if _bindable(port):
                return port
    with socket.socket() as s:  # no such range here (not Linux): the kernel's choice
        s.bind(("127.0.0.1", 0))
        chosen: int = s.getsockname()[1]
    return chosen


class ServerProcess:
    """A server binary run in its own directory; ``kill()`` is SIGKILL, ``restart()`` keeps data."""

    binary = ""

    def __init__(self, workdir: Path, host: str = "127.0.0.1"):
        if shutil.which(self.binary) is None:
            raise RuntimeError(f"{self.binary} is not installed; ./dev test installs it (apt)")
        #: The address clients use (a test may put it on an interface of its own, to cut it).
        self.host = host
        self.workdir = workdir
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.port = free_port()
        self.proc: subprocess.Popen[bytes] | None = None

    def argv(self) -> list[str]:
        raise NotImplementedError

    def ready(self) -> bool:
        raise NotImplementedError

    def start(self, timeout: float = 30.0) -> Self:
        log = open(self.workdir / f"{self.binary}.log", "ab")
        self.proc = subprocess.Popen(self.argv(), stdout=log, stderr=subprocess.STDOUT, cwd=self.workdir)
        log.close()

        def not_ready(_: RetryCallState) -> NoReturn:
            raise RuntimeError(f"{self.binary} not ready after {timeout}s; see {self.workdir}")

        # Every 50 ms until it answers; a server that exited raises at once (errors are not retried).
        Retrying(retry=retry_if_result(lambda up: not up), wait=wait_fixed(0.05), stop=stop_after_delay(timeout),
                 retry_error_callback=not_ready)(self._up)
        return self

    def _up(self) -> bool:
        """Whether the server answers; RuntimeError when its process is gone."""
        if self.ready():
            return True
        assert self.proc is not None
        if self.proc.poll() is not None:
            raise RuntimeError(f"{self.binary} exited with {self.proc.returncode}; see {self.workdir}")
        return False

    def kill(self) -> None:
        """SIGKILL: no shutdown, like a crash."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait()

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.kill()

    def restart(self) -> Self:
        self.kill()
        return self.start()

    def _tcp_open(self) -> bool:
        try:
            with socket.create_connection((self.host, self.port), timeout=0.2):
                return True
        except OSError:
            return False


class EtcdServer(ServerProcess):
    """A single-member etcd cluster; with ``tls`` (a :class:`TestCertificates`) it serves TLS only
    and requires a client certificate signed by its CA."""

    binary = "etcd"

    def __init__(self, workdir: Path, tls: TestCertificates | None = None, host: str = "127.0.0.1"):
        super().__init__(workdir, host)
        self.peer_port = free_port()
        self.tls = tls

    @property
    def url(self) -> str:
        return f"etcd://{self.host}:{self.port}"

    def argv(self) -> list[str]:
        peer = f"http://127.0.0.1:{self.peer_port}"
        client = f"{'https' if self.tls else 'http'}://{self.host}:{self.port}"
        tls = [] if self.tls is None else [
            "--cert-file", str(self.tls.server_cert), "--key-file", str(self.tls.server_key),
            "--trusted-ca-file", str(self.tls.ca), "--client-cert-auth"]
        return [
            "etcd", "--name", "test", "--data-dir", str(self.workdir / "data"),
            "--listen-client-urls", client, "--advertise-client-urls", client,
            "--listen-peer-urls", peer, "--initial-advertise-peer-urls", peer,
            "--initial-cluster", f"test={peer}", "--max-request-bytes", str(4 << 20),
            "--quota-backend-bytes", str(2 << 30), "--log-level", "warn", *tls,
        ]

    def ready(self) -> bool:
        context = None
        if self.tls is not None:
            context = ssl.create_default_context(cafile=str(self.tls.ca))
            context.load_cert_chain(str(self.tls.client_cert), str(self.tls.client_key))
        scheme = "https" if self.tls else "http"
        try:
            with urllib.request.urlopen(f"{scheme}://{self.host}:{self.port}/health", timeout=0.5,
                                        context=context) as r:
                health: object = json.loads(r.read()).get("health")
                return health == "true"
        except (OSError, ValueError):
            return False


class TestCertificates:
    """A CA, a server certificate for 127.0.0.1/localhost and a client certificate, made with
    openssl in ``workdir`` (EC keys: quick)."""

    __test__ = False  # not a pytest class, despite its name

    def __init__(self, workdir: Path):
        workdir.mkdir(parents=True, exist_ok=True)
        self.ca, ca_key = workdir / "ca.crt", workdir / "ca.key"
        self.server_cert, self.server_key = workdir / "server.crt", workdir / "server.key"
        self.client_cert, self.client_key = workdir / "client.crt", workdir / "client.key"
        key = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"]
        _openssl("req", "-x509", *key, "-keyout", ca_key, "-out", self.ca, "-days", "2", "-subj", "/CN=dfpubsub-test-ca")
        for cert, pem_key, name, usage in ((self.server_cert, self.server_key, "127.0.0.1", "serverAuth,clientAuth"),
                                           (self.client_cert, self.client_key, "client", "clientAuth")):
            csr, ext = workdir / f"{name}.csr", workdir / f"{name}.ext"
            ext.write_text(f"subjectAltName=IP:127.0.0.1,DNS:localhost\nextendedKeyUsage={usage}\n")
            _openssl("req", *key, "-keyout", pem_key, "-out", csr, "-subj", f"/CN={name}")
            _openssl("x509", "-req", "-in", csr, "-CA", self.ca, "-CAkey", ca_key, "-CAcreateserial",
                     "-out", cert, "-days", "2", "-extfile", ext)


def _openssl(*args: object) -> None:
    subprocess.run(["openssl", *map(str, args)], check=True, capture_output=True)


class RedisServer(ServerProcess):
    """redis-server with an append-only file, so a kill loses at most a second (``durable``: none
    it acknowledged, the file fsynced before each answer); ``users`` are ACL lines
    (``"alice on >secret ~* &* +@all"``): with them the default user is off."""

    binary = "redis-server"

    def __init__(self, workdir: Path, users: tuple[str, ...] = (), host: str = "127.0.0.1", durable: bool = False):
        super().__init__(workdir, host)
        self.users = users
        self.durable = durable

    @property
    def url(self) -> str:
        return f"redis://{self.host}:{self.port}/0"

    def argv(self) -> list[str]:
        return [
            "redis-server", "--port", str(self.port), "--bind", self.host, "--dir", str(self.workdir),
            "--save", "", "--appendonly", "yes", "--daemonize", "no",
            # everysec (the default) answers writes it has not written yet while an fsync runs,
            # for up to 2 s: a kill -9 then loses writes it acknowledged.
            "--appendfsync", "always" if self.durable else "everysec",
            # Protected mode refuses every client but loopback ones while the default user has no
            # password: a test that serves on an address of its own lets its own clients in.
            "--protected-mode", "yes" if self.host == "127.0.0.1" else "no",
            *(arg for line in self.users for arg in ("--user", *line.split())),
            *(("--user", "default", "off") if self.users else ()),
        ]

    def ready(self) -> bool:
        try:
            with socket.create_connection((self.host, self.port), timeout=0.5) as s:
                s.sendall(b"PING\r\n")
                return s.recv(64).startswith((b"+PONG", b"-NOAUTH"))
        except OSError:
            return False


class NatsServer(ServerProcess):
    """nats-server with JetStream, its store in the work dir (kept across ``restart()``); its
    monitoring port answers readiness. ``args`` are extra flags (``--user``, ``--tls`` ...)."""

    binary = "nats-server"

    def __init__(self, workdir: Path, args: tuple[str, ...] = (), host: str = "127.0.0.1"):
        super().__init__(workdir, host)
        self.monitor_port = free_port()
        self.args = args

    @property
    def url(self) -> str:
        return f"nats://{self.host}:{self.port}"

    def argv(self) -> list[str]:
        return [
            "nats-server", "-a", self.host, "-p", str(self.port), "-m", str(self.monitor_port),
            "-n", f"dfpubsub-test-{self.port}", "-js", "-sd", str(self.workdir / "jetstream"), *self.args,
        ]

    def ready(self) -> bool:
        # /healthz answers ok once JetStream has recovered its streams, not merely when the port is open.
        try:
            with urllib.request.urlopen(f"http://{self.host}:{self.monitor_port}/healthz", timeout=0.5) as r:
                status: object = json.loads(r.read()).get("status")
                return status == "ok"
        except (OSError, ValueError):
            return False


def _cleanup_env() -> None:
    # etcd reads ETCD_* variables; a developer's environment must not leak into tests.
    for name in list(os.environ):
        if name.startswith("ETCD_"):
            del os.environ[name]


_cleanup_env()
