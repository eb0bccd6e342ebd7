"""Finding drivers by name or URL through the ``dfpubsub.drivers`` entry points.

``zmq+tcp://host:port`` selects driver ``zmq`` with transport URL
``tcp://host:port``; ``redis://host:port`` selects ``redis`` with the whole URL, and so does
``redis+sentinel://host:port[,host:port]/master/db`` (the master Sentinel names: the ``+`` is
part of Redis's scheme there); a bare name such as ``memory`` selects the driver with no URL.
"""

from __future__ import annotations

from collections.abc import Mapping
from importlib.metadata import entry_points
from typing import Any

from .backends.extras import needs_extra
from .backends.urls import SENTINEL_SCHEMES
from .errors import DriverNotFound, MissingExtra
from .transport import Driver

__all__ = ["ENTRY_POINT_GROUP", "available_drivers", "driver_status", "parse_driver_url", "load_driver"]

ENTRY_POINT_GROUP = "dfpubsub.drivers"


def available_drivers() -> list[str]:
    """Names of the registered drivers, usable or not (see :func:`driver_status`)."""
    return sorted({ep.name for ep in entry_points(group=ENTRY_POINT_GROUP)})


def driver_status() -> dict[str, str]:
    """Each registered driver -> "" if it loads, else why not (the extra to install).

    Imports every driver's module, so it costs what loading them all does: for
    ``--help`` texts and diagnostics, not for hot paths.
    """
    status: dict[str, str] = {}
    for ep in sorted(entry_points(group=ENTRY_POINT_GROUP), key=lambda e: e.name):
        try:
            with needs_extra(f"driver {ep.name!r}"):
                ep.load()
            status[ep.name] = ""
        except MissingExtra as exc:
            status[ep.name] = str(exc)
    return status


def parse_driver_url(name_or_url: str) -> tuple[str, str | None]:
    """Split ``zmq+tcp://h:p`` into ``("zmq", "tcp://h:p")``; a bare name has no URL."""
    if "://" not in name_or_url:
        return name_or_url, None
    scheme, rest = name_or_url.split("://", 1)
    if scheme in SENTINEL_SCHEMES:
        return "redis", name_or_url
    if "+" in scheme:
        driver, transport = scheme.split("+", 1)
        return driver, f"{transport}://{rest}"
    return scheme, name_or_url


def load_driver(name_or_url: str, options: Mapping[str, Any] | None = None) -> Driver:
    """Instantiate the driver named by ``name_or_url`` with its ``options``.

    Raises :class:`DriverNotFound` listing the known drivers when none matches,
    :class:`MissingExtra` naming the extra to install when its library is
    missing. The driver module is imported only now, so an uninstalled backend
    costs nothing until it is asked for.
    """
    name, url = parse_driver_url(name_or_url)
    matches = [ep for ep in entry_points(group=ENTRY_POINT_GROUP) if ep.name == name]
    if not matches:
        raise DriverNotFound(name, available_drivers())
    with needs_extra(f"driver {name!r}"):
        cls = matches[0].load()
    if not (isinstance(cls, type) and issubclass(cls, Driver)):
        raise DriverNotFound(f"{name} (entry point is not a Driver subclass)", available_drivers())
    return cls(url, options)
