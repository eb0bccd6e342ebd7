"""The checks a daemon runs on its settings before it opens anything, and ``df-config check`` too.

Pydantic checks each value (types, ranges, the settings that go together); these check what
names something to load or reach: the store, queue, discovery and leader URLs (scheme, path, ports),
the pub/sub driver (found, its URL and ``[driver.<name>]`` options), and the names of the
tables and topics. They connect to nothing, so they pass or fail the same on any host. Every
daemon checks the whole configuration, not only the sections it uses: hosts share one file,
and a bad value in it is bad for every daemon that may read it.
"""

from __future__ import annotations

from ..backends.urls import check_backend_url
from ..config import Settings
from ..errors import ConfigError, DfPubSubError, InvalidValue
from ..factory import create_driver
from ..store.api import check_name

__all__ = ["check_settings"]


def check_settings(settings: Settings) -> Settings:
    """``settings``, if they pass the checks above; else ConfigError naming the setting."""
    check_backend_url(settings.store.url, "store.url")
    if settings.discovery.url:
        check_backend_url(settings.discovery.url, "discovery.url")
    if settings.notify.url:
        check_backend_url(settings.notify.url, "notify.url")
    if settings.leader.url:
        check_backend_url(settings.leader.url, "leader.url")
    for setting, names in (("store.tables", settings.store.tables), ("pubsub.topics", settings.pubsub.topics)):
        for name in names:
            try:
                check_name("table" if setting == "store.tables" else "topic", name)
            except InvalidValue as exc:
                raise ConfigError(f"{setting}: {exc}") from exc
    try:
        create_driver(settings)
    except DfPubSubError as exc:  # a bad URL or option; not installed (DriverNotFound), its extra missing
        raise ConfigError(f"pubsub.driver: {exc}") from exc
    return settings
