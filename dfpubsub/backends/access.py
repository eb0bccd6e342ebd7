"""How this process reaches etcd, Redis and NATS: TLS and credentials, one setting for every user.

The store, discovery, the queues and the drivers of a backend all connect
through :func:`etcd_access` / :func:`redis_access` / :func:`nats_access`, which
:func:`configure` sets from the ``[etcd]``, ``[redis]`` and ``[nats]`` config sections when settings are
loaded (:func:`dfpubsub.config.load_settings`). A program that builds its
components by hand calls :func:`configure` itself. No backend library is
imported here.
"""

from __future__ import annotations

import ssl
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..errors import ConfigError
from .urls import SentinelUrl, parse_sentinel

__all__ = ["ETCD_CONNECT_TIMEOUT", "EtcdAccess", "NatsAccess", "RedisAccess", "configure", "etcd_access", "nats_access", "redis_access"]


#: Seconds a connection to an etcd endpoint may take to come up (TCP, TLS, HTTP/2's settings):
#: about four round trips with TLS, so 2 s at 500 ms of round trip, and a lost SYN costs 1 s more.
ETCD_CONNECT_TIMEOUT = 5.0


@dataclass(frozen=True, slots=True)
class EtcdAccess:
    """TLS files (PEM), an etcd user and the connect timeout; empty strings: plain connections,
    no auth."""

    ca_file: str = ""
    cert_file: str = ""
    key_file: str = ""
    username: str = ""
    password: str = ""
    #: The name the server's certificate is checked against, when not the endpoint's host.
    server_name: str = ""
    connect_timeout: float = ETCD_CONNECT_TIMEOUT

    @property
    def tls(self) -> bool:
        return bool(self.ca_file or self.cert_file)

    def pem(self) -> tuple[bytes | None, bytes | None, bytes | None]:
        """(CA, client key, client certificate) as gRPC wants them; ConfigError naming an
        unreadable file."""
        return _read(self.ca_file), _read(self.key_file), _read(self.cert_file)


@dataclass(frozen=True, slots=True)
class _ClientAccess:
    """A user and TLS over what a URL says (Redis, NATS); empty strings keep the URL's."""

    username: str = ""
    password: str = ""
    tls: bool = False
    ca_file: str = ""
    cert_file: str = ""
    key_file: str = ""
    check_hostname: bool = True


@dataclass(frozen=True, slots=True)
class RedisAccess(_ClientAccess):
    """An ACL user and TLS; empty strings keep what the URL says (``redis://user:pass@``,
    ``rediss://``). Through Sentinel (``redis+sentinel://``) the sentinels take their own user,
    and every write may wait for ``wait_replicas`` replicas (docs/store.md#failover)."""

    sentinel_username: str = ""
    sentinel_password: str = ""
    wait_replicas: int = 0
    wait_timeout: float = 1.0

    def sentinel_args(self, url: str) -> tuple[SentinelUrl, dict[str, Any], dict[str, Any]]:
        """A ``redis+sentinel://`` URL parsed, with the keyword arguments of the master's
        connections (the URL's user under the settings', TLS) and of the sentinels' (their own
        user, the same TLS); ConfigError for a malformed URL."""
        parsed = parse_sentinel(url)
        master: dict[str, Any] = {"db": parsed.db}
        username, password = self.username or parsed.username, self.password or parsed.password
        if username:
            master["username"] = username
        if password:
            master["password"] = password
        sentinel: dict[str, Any] = {}
        if self.sentinel_username:
            sentinel["username"] = self.sentinel_username
        if self.sentinel_password:
            sentinel["password"] = self.sentinel_password
        if parsed.tls or self.tls or self.ca_file or self.cert_file:
            tls: dict[str, Any] = {"ssl": True, "ssl_check_hostname": self.check_hostname, "ssl_cert_reqs": "required"}
            if self.ca_file:
                tls["ssl_ca_certs"] = self.ca_file
            if self.cert_file:
                tls.update(ssl_certfile=self.cert_file, ssl_keyfile=self.key_file or None)
            master.update(tls)
            sentinel.update(tls)
        return parsed, master, sentinel

    def connect_args(self, url: str) -> tuple[str, dict[str, Any]]:
        """``url`` and keyword arguments for redis-py's ``from_url``: the settings win over the
        URL's user and password, and TLS turns ``redis://`` into ``rediss://`` (redis-py picks
        the connection class by scheme)."""
        kw: dict[str, Any] = {}
        if self.username:
            kw["username"] = self.username
        if self.password:
            kw["password"] = self.password
        if (self.tls or self.ca_file or self.cert_file) and url.startswith("redis://"):
            url = "rediss://" + url[len("redis://"):]
        if url.startswith("rediss://"):
            kw.update(ssl_check_hostname=self.check_hostname, ssl_cert_reqs="required")
            if self.ca_file:
                kw["ssl_ca_certs"] = self.ca_file
            if self.cert_file:
                kw.update(ssl_certfile=self.cert_file, ssl_keyfile=self.key_file or None)
        return url, kw


@dataclass(frozen=True, slots=True)
class NatsAccess(_ClientAccess):
    """User and password, a token, an NKey seed file or a creds file (one way to authenticate),
    and TLS; empty strings: what the URL says (``nats://user:pass@``, ``nats+tls://``)."""

    token: str = ""
    nkey_seed_file: str = ""
    creds_file: str = ""

    def connect_args(self) -> dict[str, Any]:
        """Keyword arguments of nats-py's ``connect`` (no NATS library is needed to make them)."""
        kw: dict[str, Any] = {}
        if self.username:
            kw.update(user=self.username, password=self.password)
        if self.token:
            kw["token"] = self.token
        if self.nkey_seed_file:
            kw["nkeys_seed"] = self.nkey_seed_file
        if self.creds_file:
            kw["user_credentials"] = self.creds_file
        if self.tls or self.ca_file or self.cert_file:
            context = ssl.create_default_context(cafile=self.ca_file or None)
            context.check_hostname = self.check_hostname
            if self.cert_file:
                try:
                    context.load_cert_chain(self.cert_file, self.key_file or None)
                except (OSError, ssl.SSLError) as exc:
                    raise ConfigError(f"cannot load the NATS client certificate {self.cert_file}: {exc}") from exc
            kw["tls"] = context
        return kw


_etcd = EtcdAccess()
_redis = RedisAccess()
_nats = NatsAccess()


def configure(etcd: EtcdAccess | None = None, redis: RedisAccess | None = None,
              nats: NatsAccess | None = None) -> None:
    """Set how connections opened from now on reach etcd, Redis and NATS (None: leave as is)."""
    global _etcd, _redis, _nats
    if etcd is not None:
        _etcd = etcd
    if redis is not None:
        _redis = redis
    if nats is not None:
        _nats = nats


def etcd_access() -> EtcdAccess:
    return _etcd


def redis_access() -> RedisAccess:
    return _redis


def nats_access() -> NatsAccess:
    return _nats


def _read(path: str) -> bytes | None:
    if not path:
        return None
    try:
        return Path(path).read_bytes()
    except OSError as exc:
        raise ConfigError(f"cannot read {path}: {exc.strerror or exc}") from exc
