"""Backend URLs checked without connecting: what ``df-config check`` and a daemon's start refuse.

A store, queue or discovery URL names its backend by scheme (``sqlite:``, ``etcd://``,
``redis://``); a wrong scheme, a missing path or a port outside 1..65535 is
a configuration error, found before anything is opened (and without the backend's extra).
"""

from __future__ import annotations

import os
import re
import warnings
from dataclasses import dataclass
from urllib.parse import unquote, urlsplit

from ..errors import ConfigError

__all__ = ["REDIS_SCHEMES", "SENTINEL_SCHEMES", "SentinelUrl", "check_backend_url", "parse_endpoints", "parse_sentinel", "redacted", "sqlite_path"]

_FORMS = ("sqlite:////abs/path, etcd://host:port[,host:port], redis://host:port/db or "
          "redis+sentinel://host:port[,host:port]/master/db")
#: The schemes of a Redis reached through Sentinel (rediss+: TLS to the sentinels and the master).
SENTINEL_SCHEMES = ("redis+sentinel", "rediss+sentinel")
#: Every scheme of a Redis URL: one server (rediss: TLS) or a master found through Sentinel.
REDIS_SCHEMES = ("redis", "rediss", *SENTINEL_SCHEMES)


def redacted(url: str) -> str:
    """``url`` without its credentials, for messages."""
    return re.sub(r"//[^@/]*@", "//", url)


def sqlite_path(url: str) -> str:
    """The file of a ``sqlite:`` URL, as SQLAlchemy and oslo.db read them.

    ``sqlite:///relative/nb.sqlite`` is relative to the working directory,
    ``sqlite:////abs/nb.sqlite`` absolute, ``sqlite:///:memory:`` private and
    in memory. For the older reading, where three slashes meant an absolute
    path: a relative path whose folder does not exist while ``/folder`` does
    is taken as absolute, with a FutureWarning (write four slashes): a warning meant for
    the people who wrote the URL, which Python shows (it hides a DeprecationWarning).
    ConfigError without a path.
    """
    if not url.startswith("sqlite:///"):
        raise ConfigError(f"sqlite URL must start with sqlite:/// (relative) or sqlite://// (absolute): {url!r}")
    path = url[len("sqlite:///"):]
    if path == ":memory:":
        return path
    if not path:
        raise ConfigError(f"sqlite URL needs a path, e.g. sqlite:////var/lib/dfpubsub/nb.sqlite: {url!r}")
    folder = os.path.dirname(path)
    if folder and not os.path.isabs(path) and not os.path.isdir(folder) and os.path.isdir("/" + folder):
        warnings.warn(f"{url} names {path} in the missing folder {folder}; using /{path} as older versions "
                      f"did. Write sqlite:////{path} for an absolute path.", FutureWarning, stacklevel=1)
        return "/" + path
    return path


def parse_endpoints(url: str) -> list[tuple[str, int]]:
    """``etcd://host:port[,host:port...]`` as (host, port) pairs; ConfigError otherwise."""
    if not url.startswith("etcd://"):
        raise ConfigError(f"etcd URL must look like etcd://host:port[,host:port]: {url!r}")
    endpoints = []
    for part in url[len("etcd://"):].split("/", 1)[0].split(","):
        host, _, port = part.strip().rpartition(":")
        if not host or not port.isdigit() or "@" in host:
            raise ConfigError(f"etcd URL must look like etcd://host:port[,host:port]: {url!r}")
        if not 0 < int(port) < 65536:
            raise ConfigError(f"etcd URL {url!r}: port {port} is not between 1 and 65535")
        endpoints.append((host, int(port)))
    return endpoints


@dataclass(frozen=True, slots=True)
class SentinelUrl:
    """A parsed ``redis+sentinel://[user:password@]host:port[,host:port...]/master[/db]``: the
    sentinels, the name they know the master by, the database, the master's user and password
    (the sentinels' come from ``[redis] sentinel_username``), and whether both speak TLS."""

    sentinels: tuple[tuple[str, int], ...]
    service: str
    db: int
    username: str
    password: str
    tls: bool


def parse_sentinel(url: str) -> SentinelUrl:
    """``url`` parsed; ConfigError naming what is wrong (without the URL's password)."""
    form = "redis+sentinel://host:port[,host:port...]/master[/db]"
    scheme, sep, rest = url.partition("://")
    if scheme not in SENTINEL_SCHEMES or not sep:
        raise ConfigError(f"Sentinel URL must look like {form}: {redacted(url)!r}")
    netloc, _, path = rest.partition("/")
    userinfo, at, hosts = netloc.rpartition("@")
    username, _, password = userinfo.partition(":") if at else ("", "", "")
    sentinels = []
    for part in hosts.split(","):
        host, colon, port = part.strip().rpartition(":")
        if not colon:
            host, port = part.strip(), "26379"
        host = host.strip("[]")  # an IPv6 address in brackets
        if not host or not port.isdigit():
            raise ConfigError(f"Sentinel URL must look like {form}: {redacted(url)!r}")
        if not 0 < int(port) < 65536:
            raise ConfigError(f"Sentinel URL {redacted(url)!r}: port {port} is not between 1 and 65535")
        sentinels.append((host, int(port)))
    service, _, db = path.strip("/").partition("/")
    if not service:
        raise ConfigError(f"Sentinel URL {redacted(url)!r} names no master: {form}")
    if db and not db.isdigit():
        raise ConfigError(f"Sentinel URL {redacted(url)!r}: the database {db!r} is not a number")
    return SentinelUrl(tuple(sentinels), unquote(service), int(db or 0), unquote(username), unquote(password),
                       scheme == "rediss+sentinel")


def _check_redis(url: str) -> None:
    parts = urlsplit(url)
    try:
        port = parts.port
    except ValueError as exc:  # not a number, or out of range
        raise ConfigError(f"Redis URL {url!r}: {exc}") from exc
    if port == 0:
        raise ConfigError(f"Redis URL {url!r}: port 0 is not between 1 and 65535")
    if not parts.hostname:
        raise ConfigError(f"Redis URL must look like redis://host:port/db: {url!r}")
    db = parts.path.strip("/")
    if db and not db.isdigit():
        raise ConfigError(f"Redis URL {url!r}: the database {db!r} is not a number")


def check_backend_url(url: str, setting: str) -> None:
    """ConfigError naming ``setting`` unless ``url`` is a well-formed backend URL."""
    scheme = urlsplit(url).scheme
    try:
        if scheme == "sqlite":
            sqlite_path(url)
        elif scheme == "etcd":
            parse_endpoints(url)
        elif scheme in ("redis", "rediss"):
            _check_redis(url)
        elif scheme in SENTINEL_SCHEMES:
            parse_sentinel(url)
        else:
            raise ConfigError(f"unknown backend URL {url!r}; use {_FORMS}")
    except ConfigError as exc:
        raise ConfigError(f"{setting}: {exc}") from exc
