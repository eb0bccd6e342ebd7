"""etcd with TLS client certificates and with auth on, Redis with an ACL user: the store, discovery,
the driver and the queues all connect through the one [etcd] / [redis] section, and wrong
credentials give a clear error at once (docs/security.md)."""

from __future__ import annotations

import os
import socket
import subprocess
import time

import grpc
import pytest
from aetcd import rpc

from dfpubsub import Publisher, PublisherOptions, load_driver
from dfpubsub.backends.access import EtcdAccess, RedisAccess, configure
from dfpubsub.discovery import open_discovery
from dfpubsub.discovery.api import PublisherRecord
from dfpubsub.errors import AuthenticationError, DfPubSubError
from dfpubsub.metrics import Stats
from dfpubsub.queues import open_queues
from dfpubsub.store import open_store
from dfpubsub.testing.servers import EtcdServer, RedisServer, TestCertificates, free_port
from tests.conftest import wait_for
from tests.functional.df_db_helpers import base_env, df_db
from tests.functional.sink_helpers import RecordingSink


@pytest.fixture(autouse=True)
def _plain_afterwards():
    yield
    configure(EtcdAccess(), RedisAccess())


def _everything_works(url: str) -> None:
    """A round trip through each user of the backend at ``url``."""
    store = open_store(url, ["port"], prefix="auth")
    made = store.create("port", "p1", {"v": 1})
    assert store.get("port", "p1") == made
    store.close()
    queues = open_queues(url, prefix="auth")
    queues.create_queue("q")
    queues.commit("q", queues.reserve("q", 10), b"data")
    assert [e.data for e in queues.list("q")[0]] == [b"data"]
    queues.close()
    discovery = open_discovery(url, ttl=3.0, renew_interval=1.0, prefix="auth")
    record = PublisherRecord("a" * 32, "p", [], "h", os.getpid(), time.time(), ["port"])
    registration = discovery.register(record)
    assert [r.publisher_id for r in discovery.list()] == [record.publisher_id]
    registration.close()
    discovery.close()
    pub = Publisher(load_driver(url).publisher(Stats("publisher", "p")), "p", PublisherOptions(batch_linger=0.0))
    sink = RecordingSink(load_driver(url).subscriber(Stats("subscriber", "s")), ["port"])
    sink.sub.start()
    try:
        wait_for(lambda: (pub.publish("port", "port", "k", "create", 1), "k" in sink.keys())[1],
                 what="an event through the driver")
    finally:
        sink.sub.close()
        pub.close()


def _refused_quickly(url: str, expected: type[BaseException] = DfPubSubError) -> BaseException:
    store = open_store(url, ["port"], prefix="auth", timeout=2.0)
    started = time.monotonic()
    with pytest.raises(expected) as refused:
        store.get("port", "p1")
    assert time.monotonic() - started < 10
    store.close()
    return refused.value


def test_etcd_with_tls_client_certificates(tmp_path):
    certs = TestCertificates(tmp_path / "certs")
    server = EtcdServer(tmp_path / "etcd", tls=certs).start()
    try:
        configure(EtcdAccess(str(certs.ca), str(certs.client_cert), str(certs.client_key)))
        _everything_works(server.url)
        configure(EtcdAccess(ca_file=str(certs.ca)))  # no client certificate
        _refused_quickly(server.url)
        other = TestCertificates(tmp_path / "other")
        configure(EtcdAccess(ca_file=str(other.ca), cert_file=str(certs.client_cert),
                             key_file=str(certs.client_key)))  # the wrong CA
        assert "127.0.0.1" in str(_refused_quickly(server.url))
        configure(EtcdAccess())  # plain text to a TLS server
        _refused_quickly(server.url)
    finally:
        server.stop()


def _enable_etcd_auth(port: int, password: str) -> None:
    channel = grpc.insecure_channel(f"127.0.0.1:{port}")
    auth = rpc.AuthStub(channel)
    auth.UserAdd(rpc.AuthUserAddRequest(name="root", password=password), timeout=5)
    auth.UserGrantRole(rpc.AuthUserGrantRoleRequest(user="root", role="root"), timeout=5)
    auth.AuthEnable(rpc.AuthEnableRequest(), timeout=5)
    channel.close()


def test_etcd_with_auth_on(tmp_path):
    server = EtcdServer(tmp_path / "etcd").start()
    try:
        _enable_etcd_auth(server.port, "s3cret")
        configure(EtcdAccess(username="root", password="s3cret"))
        _everything_works(server.url)
        configure(EtcdAccess(username="root", password="wrong"))
        refused = _refused_quickly(server.url, AuthenticationError)
        assert "root" in str(refused) and "s3cret" not in str(refused)
        configure(EtcdAccess())
        _refused_quickly(server.url)  # no user at all: etcd refuses the calls
        # The CLI says it in one line, from the [etcd] section given in the environment.
        password = tmp_path / "password"
        password.write_text("wrong\n")
        env = base_env(DFPUBSUB_STORE__URL=server.url, DFPUBSUB_ETCD__USERNAME="root",
                       DFPUBSUB_ETCD__PASSWORD_FILE=str(password))
        out = df_db(env, "tables")
        assert out.returncode in (1, 2) and "Traceback" not in out.stderr
        assert out.stderr.count("\n") == 1 and "refused user 'root'" in out.stderr
    finally:
        server.stop()


def test_redis_with_an_acl_user(tmp_path):
    server = RedisServer(tmp_path / "redis", users=("alice on >s3cret ~* &* +@all",)).start()
    try:
        configure(redis=RedisAccess(username="alice", password="s3cret"))
        _everything_works(server.url)
        configure(redis=RedisAccess(username="alice", password="wrong"))
        refused = _refused_quickly(server.url, AuthenticationError)
        assert "s3cret" not in str(refused)
        configure(redis=RedisAccess())
        _refused_quickly(server.url)  # the default user is off
    finally:
        server.stop()


def test_redis_with_tls_when_the_server_has_it(tmp_path):
    certs = TestCertificates(tmp_path / "certs")
    port = free_port()
    server = subprocess.Popen(["redis-server", "--port", "0", "--tls-port", str(port), "--bind", "127.0.0.1",
                               "--tls-cert-file", str(certs.server_cert), "--tls-key-file", str(certs.server_key),
                               "--tls-ca-cert-file", str(certs.ca), "--dir", str(tmp_path), "--save", "",
                               "--appendonly", "no"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    try:
        def listening() -> bool:
            if server.poll() is not None:
                pytest.skip("this redis-server was built without TLS: "
                            + (server.stdout.read() if server.stdout else b"").decode(errors="replace")[-200:])
            with socket.socket() as s:
                return s.connect_ex(("127.0.0.1", port)) == 0
        wait_for(listening, what="redis-server with TLS")
        url = f"redis://127.0.0.1:{port}/0"
        configure(redis=RedisAccess(tls=True, ca_file=str(certs.ca), cert_file=str(certs.client_cert),
                                    key_file=str(certs.client_key)))
        _everything_works(url)
        configure(redis=RedisAccess(tls=True, ca_file=str(certs.ca)))  # no client certificate
        _refused_quickly(url)
    finally:
        server.kill()
        server.wait()
