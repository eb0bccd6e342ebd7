"""Publisher discovery (docs/discovery.md): publishers register leased rows, subscribers watch them.

Each publisher registers ``{publisher_id, name, uris, host, pid, started_at,
topics}`` under a key that expires ``ttl`` seconds after its last renewal, and
renews it every ``renew_interval`` (at most ``ttl / 3``: Dragonflow renewed at
about its timeout, so live publishers were collected as dead). A crashed
publisher's row vanishes by itself; a closed one's is deleted at once.
Subscribers watch the table, connect to new publishers and drop vanished
ones.

``open_discovery(url, ttl, renew_interval, prefix)`` picks the backend by URL
scheme, like :func:`dfpubsub.store.open_store`:

- ``sqlite:///path`` (the embedded default): a table with ``expires_at``.
- ``etcd://host:port``: a lease per publisher, the key attached to it.
- ``redis://host:port/db``: a key with a ``PX`` expiry.

On top of any backend, :class:`PublisherAnnouncer` keeps a
:class:`~dfpubsub.publisher.Publisher` registered and
:class:`DiscoveryConnector` keeps a :class:`~dfpubsub.subscriber.Subscriber`
connected to the registered publishers.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import time
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Protocol
from urllib.parse import urlsplit, urlunsplit

from ..backends.extras import needs_extra
from ..backends.sqlite import require_sqlite_file, sqlite_path
from ..backends.urls import REDIS_SCHEMES
from ..errors import ConfigError, DfPubSubError
from .api import Discovery, PollingWatcher, PublisherRecord, RecordCallback, Registration, Watcher, check_timing

if TYPE_CHECKING:
    from ..config import Settings
    from ..subscriber import Subscriber
    from ..transport import PublisherTransport

__all__ = [
    "Discovery",
    "DiscoveryConnector",
    "PollingWatcher",
    "PublisherAnnouncer",
    "PublisherRecord",
    "RecordCallback",
    "Registration",
    "Watcher",
    "check_timing",
    "discovery_from_settings",
    "open_discovery",
]

log = logging.getLogger("dfpubsub.discovery")


def open_discovery(
    url: str,
    ttl: float = 10.0,
    renew_interval: float = 3.0,
    prefix: str = "dfpubsub",
    timeout: float | None = None,
) -> Discovery:
    """Open the discovery table at ``url``.

    Raises :class:`~dfpubsub.errors.ConfigError` for an unknown scheme or a
    ``renew_interval`` above ``ttl / 3``. ``timeout`` bounds each backend call
    (default: the renew interval, between 1 and 5 s).
    """
    scheme = urlsplit(url).scheme
    if scheme == "sqlite":
        from .sqlite import SqliteDiscovery

        return SqliteDiscovery(sqlite_path(url), ttl, renew_interval, prefix, timeout)
    if scheme == "etcd":
        with needs_extra("the etcd discovery"):
            from .etcd import EtcdDiscovery

        return EtcdDiscovery(url, ttl, renew_interval, prefix, timeout)
    if scheme in REDIS_SCHEMES:
        with needs_extra("the Redis discovery"):
            from .redis import RedisDiscovery

        return RedisDiscovery(url, ttl, renew_interval, prefix, timeout)
    raise ConfigError(f"unknown discovery URL {url!r}; use sqlite:///path, etcd://host:port, redis://host:port/db or redis+sentinel://host:port[,host:port]/master/db")


def discovery_from_settings(settings: Settings, create: bool = False) -> Discovery:
    """Open discovery as ``[discovery]`` says (its ``url`` defaults to ``store.url``). Unless
    ``create`` (``df-db init``) or ``[store] create``, a SQLite table's file must exist
    (:class:`~dfpubsub.errors.StoreMissing`), as the store's must: a watcher given a mistyped
    path would otherwise make an empty table and wait there for publishers that announce
    elsewhere, and an announcer would announce where nobody watches."""
    d = settings.discovery
    url = d.url or settings.store.url
    if not (create or settings.store.create):
        require_sqlite_file(url, "create it with df-db init, or fix discovery.url (empty: the store's URL)")
    return open_discovery(url, d.ttl, d.renew_interval, d.prefix)


def advertised_uri(uri: str, host: str) -> str:
    """``uri`` with a wildcard bind address (``0.0.0.0``, ``::``, ``*``) replaced by ``host``."""
    parts = urlsplit(uri)
    if parts.scheme != "tcp" or parts.hostname not in ("0.0.0.0", "::", "*"):
        return uri
    netloc = f"[{host}]" if ":" in host else host
    if parts.port is not None:
        netloc += f":{parts.port}"
    return urlunsplit(parts._replace(netloc=netloc))


class _IdSet(Protocol):
    """Where :class:`DiscoveryConnector` notes the feeds' ids (dfpubsub.controller.bookmarks.FeedIds)."""

    def add(self, publisher_id: str) -> None: ...
    def discard(self, publisher_id: str) -> None: ...


class Announced(Protocol):
    """What :class:`PublisherAnnouncer` reads of a publisher: a
    :class:`~dfpubsub.publisher.Publisher`, or the :class:`~dfpubsub.relay.Relay` of a publisher service."""

    @property
    def id(self) -> str: ...
    @property
    def name(self) -> str: ...
    @property
    def transport(self) -> PublisherTransport: ...
    def sequences(self) -> dict[str, int]: ...


class PublisherAnnouncer:
    """Keeps ``publisher`` registered in ``discovery`` until :meth:`close`.

    The record holds the publisher's id and name, ``[publisher.transport.uri]``
    (with a wildcard bind address replaced by ``advertise_host`` if given),
    this host and pid, the time of the announcement, and ``topics``; without
    ``topics`` they follow the topics the publisher has used
    (``publisher.sequences()``), refreshed at every renewal. Registering raises
    :class:`~dfpubsub.errors.StoreUnavailable` if the backend is down now.
    """

    def __init__(
        self,
        discovery: Discovery,
        publisher: Announced,
        topics: Iterable[str] | None = None,
        *,
        advertise_host: str | None = None,
        started_at: float | None = None,
        role: str = "",
    ):
        self.discovery = discovery
        self.publisher = publisher
        uri = publisher.transport.uri
        if uri and advertise_host:
            uri = advertised_uri(uri, advertise_host)
        elif uri and advertised_uri(uri, "x") != uri:
            log.warning("publisher bound to a wildcard address; only subscribers on this host can use its uri "
                        "(pass advertise_host)", extra={"uri": uri})
        record = PublisherRecord(
            publisher_id=publisher.id,
            name=publisher.name,
            uris=[uri] if uri else [],
            host=socket.gethostname(),
            pid=os.getpid(),
            started_at=time.time() if started_at is None else started_at,
            topics=sorted(set(publisher.sequences() if topics is None else topics)),
            curve_key=getattr(publisher.transport, "public_key", ""),
            role=role,
        )
        self.registration = discovery.register(record)
        if topics is None:
            self.registration.follow_topics(lambda: publisher.sequences().keys())

    @property
    def record(self) -> PublisherRecord:
        return self.registration.record

    def close(self) -> None:
        """Unregister: the row is deleted at once."""
        self.registration.close()

    def __enter__(self) -> PublisherAnnouncer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class DiscoveryConnector:
    """Connects ``subscriber`` to the publishers in ``discovery`` as they come and go.

    A new record's URIs are connected (``subscriber.connect``); when the record
    vanishes (closed, or expired after a crash) they are disconnected, unless
    another live record still lists them (a publisher restarted on the same
    port). Only URIs this connector connected are ever disconnected: the
    subscriber's own endpoints, ``static`` and those its transport already
    had (``transport.endpoints``, where the driver has it), are left alone.
    ``accept(record)`` may filter the publishers to follow. ``feeds`` (a
    :class:`~dfpubsub.controller.bookmarks.FeedIds`, say) is told the ids of the
    accepted records whose role is ``feed`` as they come and go: the publishers
    whose bookmarks a controller trusts. Errors of the subscriber (a URI its
    driver refuses, a closed subscriber) are logged, not raised.
    """

    def __init__(
        self,
        discovery: Discovery,
        subscriber: Subscriber,
        static: Iterable[str] = (),
        accept: Callable[[PublisherRecord], bool] | None = None,
        feeds: _IdSet | None = None,
    ):
        self.discovery = discovery
        self.subscriber = subscriber
        self.accept = accept
        self.feeds = feeds
        self._static = set(static) | set(self._transport_endpoints())
        self._lock = threading.Lock()
        self._uris_of: dict[str, list[str]] = {}  # publisher id -> URIs it holds connected
        self._owners: dict[str, set[str]] = {}  # URI connected by us -> publisher ids listing it
        self._curve_keys: dict[str, str] = {}  # publisher id -> its CURVE public key, to pin
        self.watcher = discovery.watch(self._added, self._removed, self._updated)

    @property
    def connected(self) -> set[str]:
        """The URIs this connector has connected."""
        with self._lock:
            return set(self._owners)

    def close(self, disconnect: bool = True) -> None:
        """Stop watching and (unless ``disconnect`` is false) disconnect what this connector connected."""
        self.watcher.close()
        with self._lock:
            uris, self._owners, self._uris_of = list(self._owners), {}, {}
            if disconnect:
                for uri in uris:
                    self._call(self.subscriber.disconnect, uri)

    def __enter__(self) -> DiscoveryConnector:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _transport_endpoints(self) -> frozenset[str]:
        """The endpoints the subscriber's transport reports (zmq's ``endpoints``), if any."""
        endpoints = getattr(self.subscriber.transport, "endpoints", None)
        if not isinstance(endpoints, (set, frozenset, list, tuple)):
            return frozenset()
        for _ in range(3):
            try:
                return frozenset(endpoints)
            except RuntimeError:  # changed size on the receive thread while copied: again
                continue
        return frozenset()

    def _added(self, record: PublisherRecord) -> None:
        if self.accept is not None and not self.accept(record):
            return
        self._note_role(record, True)
        with self._lock:
            self._curve_keys[record.publisher_id] = record.curve_key
            self._hold(record.publisher_id, record.uris)

    def _updated(self, record: PublisherRecord) -> None:
        with self._lock:
            self._curve_keys[record.publisher_id] = record.curve_key
            old = self._uris_of.pop(record.publisher_id, [])
            accepted = self.accept is None or self.accept(record)
            self._note_role(record, accepted)
            if accepted:
                self._hold(record.publisher_id, record.uris)  # connect what is new before dropping what went
            kept = self._uris_of.get(record.publisher_id, [])
            self._release(record.publisher_id, [uri for uri in old if uri not in kept])

    def _removed(self, record: PublisherRecord) -> None:
        self._note_role(record, False)
        with self._lock:
            self._curve_keys.pop(record.publisher_id, None)
            self._release(record.publisher_id, self._uris_of.pop(record.publisher_id, []))

    def _note_role(self, record: PublisherRecord, present: bool) -> None:
        if self.feeds is None:
            return
        if present and record.role == "feed":
            self.feeds.add(record.publisher_id)
        else:
            self.feeds.discard(record.publisher_id)

    def _hold(self, publisher_id: str, uris: list[str]) -> None:
        held: list[str] = []
        for uri in uris:
            if uri in self._static or uri in held:
                continue
            owners = self._owners.get(uri)
            if owners is None:
                if uri in self._transport_endpoints():  # connected by someone else: not ours
                    continue
                if key := self._curve_keys.get(publisher_id, ""):
                    pin = getattr(self.subscriber.transport, "pin", None)  # zmq: CURVE per endpoint
                    if pin is not None:
                        pin(uri, key)
                if not self._call(self.subscriber.connect, uri):
                    continue
                owners = self._owners[uri] = set()
                log.info("connected to a discovered publisher", extra={"uri": uri, "publisher_id": publisher_id})
            owners.add(publisher_id)
            held.append(uri)
        self._uris_of[publisher_id] = held

    def _release(self, publisher_id: str, uris: list[str]) -> None:
        for uri in uris:
            owners = self._owners.get(uri)
            if owners is None:
                continue
            owners.discard(publisher_id)
            if not owners:
                del self._owners[uri]
                self._call(self.subscriber.disconnect, uri)
                log.info("disconnected from a vanished publisher", extra={"uri": uri, "publisher_id": publisher_id})

    def _call(self, fn: Callable[[str], None], uri: str) -> bool:
        try:
            fn(uri)
        except DfPubSubError as exc:
            log.warning("subscriber refused a discovered endpoint", extra={"uri": uri, "error": str(exc)})
            return False
        return True
