"""How this process reaches etcd and Redis: TLS and credentials, one setting for every user.

The store, discovery, the queues and the drivers of a backend all connect
through :func:`etcd_access` / :func:`redis_access`, which :func:`configure`
sets from the ``[etcd]`` and ``[redis]`` config sections when settings are
loaded (:func:`dfpubsub.config.load_settings`). A program that builds its
components by hand calls :func:`configure` itself. No backend library is
imported here.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..errors import ConfigError

__all__ = ["EtcdAccess", "RedisAccess", "configure", "etcd_access", "redis_access"]


@dataclass(frozen=True, slots=True)
class EtcdAccess:
    """TLS files (PEM) and an etcd user; empty strings: plain connections, no auth."""

    ca_file: str = ""
    cert_file: str = ""
    key_file: str = ""
    username: str = ""
    password: str = ""
    #: The name the server's certificate is checked against, when not the endpoint's host.
    server_name: str = ""

    @property
    def tls(self) -> bool:
        return bool(self.ca_file or self.cert_file)

    def pem(self) -> tuple[bytes | None, bytes | None, bytes | None]:
        """(CA, client key, client certificate) as gRPC wants them; ConfigError naming an
        unreadable file."""
        return _read(self.ca_file), _read(self.key_file), _read(self.cert_file)


@dataclass(frozen=True, slots=True)
class RedisAccess:
    """An ACL user and TLS; empty strings keep what the URL says (``redis://user:pass@``,
    ``rediss://``)."""

    username: str = ""
    password: str = ""
    tls: bool = False
    ca_file: str = ""
    cert_file: str = ""
    key_file: str = ""
    check_hostname: bool = True

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


_etcd = EtcdAccess()
_redis = RedisAccess()


def configure(etcd: EtcdAccess | None = None, redis: RedisAccess | None = None) -> None:
    """Set how connections opened from now on reach etcd and Redis (None: leave as is)."""
    global _etcd, _redis
    if etcd is not None:
        _etcd = etcd
    if redis is not None:
        _redis = redis


def etcd_access() -> EtcdAccess:
    return _etcd


def redis_access() -> RedisAccess:
    return _redis


def _read(path: str) -> bytes | None:
    if not path:
        return None
    try:
        return Path(path).read_bytes()
    except OSError as exc:
        raise ConfigError(f"cannot read {path}: {exc.strerror or exc}") from exc
