"""What every command shares: the global options and the backends the settings select."""

from __future__ import annotations

import enum
import functools
import sys
import time
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import typer

from dfpubsub.backends.sqlite import require_sqlite_file, sqlite_lacks_table
from dfpubsub.config import Settings, load_settings
from dfpubsub.discovery import Discovery, discovery_from_settings
from dfpubsub.errors import DfPubSubError
from dfpubsub.factory import create_publisher
from dfpubsub.nbapi import NbApi
from dfpubsub.notify.wiring import queues_from_settings
from dfpubsub.publisher import Publisher
from dfpubsub.queues import QueueStore
from dfpubsub.store import Store, open_store_from_settings

from .output import Output, fail

__all__ = ["Format", "CliState", "state", "confirm", "public_url"]

#: Seconds a writing df-db that binds a ZeroMQ endpoint waits for subscribers to join.
LISTEN_WAIT = 1.0
#: Name of df-db's publisher, so subscribers and the discovery table show who wrote.
PUBLISHER_NAME = "df-db"


class Format(str, enum.Enum):
    """``--format``: rich tables for people, JSON or YAML for scripts."""

    table = "table"
    json = "json"
    yaml = "yaml"


class CliState:
    """The global options of one df-db run; settings are loaded on first use."""

    def __init__(self, config: str | None, store_url: str | None, queues_url: str | None, fmt: Format):
        self.config = config
        self.store_url = store_url
        self.queues_url = queues_url
        self.out = Output(fmt.value)

    @functools.cached_property
    def settings(self) -> Settings:
        """``--config`` / ``$DFPUBSUB_CONFIG``, the environment, then ``--store`` over ``store.url``."""
        overrides: dict[str, Any] = {"store": {"url": self.store_url}} if self.store_url else {}
        return load_settings(self.config, overrides)

    def open_store(self, create: bool = False) -> Store:
        """The configured store (close it, or use it in ``with``); unless ``create``, a SQLite
        file must exist already: a command that only reads never leaves an empty one behind."""
        return open_store_from_settings(self.settings, create)

    def open_api(self, publish: bool) -> NbApi:
        """NbApi on the configured store, created if need be; with ``publish``, a publisher on the
        configured driver."""
        store = self.open_store(create=True)
        try:
            publisher = create_publisher(self.settings, PUBLISHER_NAME) if publish else None
        except DfPubSubError:
            store.close()
            raise
        if isinstance(publisher, Publisher):
            _await_listeners(publisher)
        return NbApi(store, publisher)

    def open_queues(self, create: bool = False) -> QueueStore:
        """The notification queues: ``--queues`` over ``notify.url`` (default: the store's URL);
        they must exist unless ``create``."""
        settings = self.settings
        if self.queues_url:
            settings = settings.model_copy(update={"notify": settings.notify.model_copy(update={"url": self.queues_url})})
        if not create:
            require_sqlite_file(settings.notify.url or settings.store.url)
        return queues_from_settings(settings)

    def never_written(self, what: str) -> bool:
        """Whether the ``queues`` or the ``discovery`` table were never written to (a SQLite
        file without their tables): a command that only reads shows them empty without opening
        them, which would add their tables to the file."""
        if what == "queues":
            return sqlite_lacks_table(self.queues_url or self.settings.notify.url or self.settings.store.url, "q_queues")
        return sqlite_lacks_table(self.settings.discovery.url or self.settings.store.url, "discovery_publishers")

    def open_discovery(self, create: bool = False) -> Discovery:
        """The configured discovery table (``discovery.url``, by default the store's URL); it
        must exist unless ``create``."""
        return discovery_from_settings(self.settings, create)


def state(ctx: typer.Context) -> CliState:
    """The :class:`CliState` the app's callback left on ``ctx``."""
    found = ctx.find_object(CliState)
    assert found is not None, "df-db commands run under the app's callback"
    return found


def confirm(question: str, yes: bool) -> None:
    """Ask before a destructive step; without ``--yes`` and without a terminal, refuse (exit 1)."""
    if yes:
        return
    if not sys.stdin.isatty():
        fail(f"refusing without --yes (stdin is not a terminal) to {question}")
    if not typer.confirm(f"{question[0].upper()}{question[1:]}?", default=False, err=True):
        fail("aborted; nothing was changed")


def public_url(url: str) -> str:
    """``url`` without a password, for output."""
    parts = urlsplit(url)
    if parts.password is None:
        return url
    netloc = parts.netloc.rsplit("@", 1)[1]
    user = f"{parts.username}@" if parts.username else ""
    return urlunsplit(parts._replace(netloc=user + netloc))


def _await_listeners(publisher: Publisher, wait: float = LISTEN_WAIT) -> None:
    """A one-shot df-db that binds a ZeroMQ endpoint publishes before any subscriber found it (a
    ``df-db watch`` reconnects every 100 ms): give them ``wait`` seconds to join, and say so
    when nobody did, rather than publish into the void silently."""
    uri = publisher.transport.uri
    if not uri.startswith(("tcp://", "ipc://")):
        return  # a driver through a server (etcd, Redis) keeps what is published for later readers
    deadline = time.monotonic() + wait
    while publisher.stats.get("subscribers_joined") == 0 and time.monotonic() < deadline:
        time.sleep(0.02)
    if publisher.stats.get("subscribers_joined") == 0:
        print(f"df-db: no subscriber was listening on {uri}; the change is stored all the same "
              "(a running df-feed publishes it from the store's change feed)", file=sys.stderr)
