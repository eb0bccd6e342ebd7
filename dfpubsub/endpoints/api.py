"""The endpoint contract and how an endpoint URL picks its implementation.

An :class:`Endpoint` pushes batches of notifications to one destination and
returns only once the destination acknowledged all of them (delivery is at
least once: a failure may follow a partial or even complete delivery).
Implementations register under the ``dfpubsub.endpoints`` entry-point group,
one name per URL scheme, and import their client library only when loaded.
"""

from __future__ import annotations

import abc
import re
from collections.abc import Mapping, Sequence
from importlib.metadata import entry_points
from types import TracebackType
from typing import Any, ClassVar
from urllib.parse import SplitResult, parse_qsl, urlencode, urlsplit, urlunsplit

from ..backends.extras import needs_extra
from ..errors import EndpointConfigError, MissingExtra
from ..notify.notification import Notification
from ..notify.records import CE_JSON, JSON, cloudevent, s3_message, to_json

__all__ = [
    "ENTRY_POINT_GROUP",
    "FORMATS",
    "Endpoint",
    "Options",
    "available_endpoints",
    "open_endpoint",
    "safe_url",
    "split_query_options",
]

ENTRY_POINT_GROUP = "dfpubsub.endpoints"
FORMATS = ("s3", "cloudevents")


def safe_url(url: str) -> str:
    """``url`` for messages and logs: no user, password or query values (tokens hide there)."""
    url = re.sub(r"//[^@/?#]*@", "//", url)
    return re.sub(r"=([^&#]*)", "=***", url)


def split_query_options(url: str, names: frozenset[str]) -> tuple[str, dict[str, str]]:
    """Take the query parameters in ``names`` out of ``url``; return the rest of the URL and them."""
    parts = urlsplit(url)
    mine: dict[str, str] = {}
    rest: list[tuple[str, str]] = []
    for name, value in parse_qsl(parts.query, keep_blank_values=True):
        if name in names:
            mine[name] = value
        else:
            rest.append((name, value))
    return urlunsplit(SplitResult(parts.scheme, parts.netloc, parts.path, urlencode(rest), parts.fragment)), mine


class Options:
    """Typed access to an endpoint's string options; unknown names are a config error."""

    def __init__(self, url: str, options: Mapping[str, str], known: frozenset[str], prefixes: tuple[str, ...] = ()):
        unknown = sorted(k for k in options if k not in known and not k.startswith(prefixes))
        if unknown:
            raise EndpointConfigError(
                f"endpoint {safe_url(url)}: unknown option(s) {', '.join(unknown)}; "
                f"known: {', '.join(sorted(known) + [p + '*' for p in prefixes])}"
            )
        self.url = url
        self.values = {k: str(v) for k, v in options.items()}

    def _bad(self, name: str, expected: str) -> EndpointConfigError:
        return EndpointConfigError(f"endpoint {safe_url(self.url)}: option {name}={self.values[name]!r} is not {expected}")

    def get_str(self, name: str, default: str) -> str:
        """A string option."""
        return self.values.get(name, default)

    def get_choice(self, name: str, choices: Sequence[str], default: str) -> str:
        """One of ``choices``."""
        value = self.values.get(name, default)
        if value not in choices:
            raise self._bad(name, f"one of {', '.join(choices)}")
        return value

    def get_int(self, name: str, default: int, minimum: int = 1) -> int:
        """An integer of at least ``minimum``."""
        if name not in self.values:
            return default
        try:
            value = int(self.values[name])
        except ValueError:
            value = minimum - 1
        if value < minimum:
            raise self._bad(name, f"an integer >= {minimum}")
        return value

    def get_float(self, name: str, default: float) -> float:
        """A positive number."""
        if name not in self.values:
            return default
        try:
            value = float(self.values[name])
        except ValueError:
            value = 0.0
        if not value > 0:
            raise self._bad(name, "a positive number")
        return value

    def get_bool(self, name: str, default: bool) -> bool:
        """true/false, yes/no, 1/0, on/off."""
        if name not in self.values:
            return default
        value = self.values[name].strip().lower()
        if value in ("1", "true", "yes", "on"):
            return True
        if value in ("0", "false", "no", "off"):
            return False
        raise self._bad(name, "a boolean")

    def prefixed(self, prefix: str) -> dict[str, str]:
        """Options named ``prefix<name>``, as ``{name: value}``."""
        return {k[len(prefix):]: v for k, v in self.values.items() if k.startswith(prefix)}


class Endpoint(abc.ABC):
    """Where the notifications of a topic go. Asyncio; one instance per topic and event loop.

    ``url`` is kept as given (it may hold credentials: print :attr:`safe_url`).
    Constructors validate the URL and options and raise
    :class:`EndpointConfigError`; they do not connect (the first :meth:`send` does).
    """

    #: Options every endpoint accepts, in addition to its own ``OPTIONS``.
    COMMON_OPTIONS: ClassVar[frozenset[str]] = frozenset({"max_batch", "timeout", "region", "max_inflight"})
    OPTIONS: ClassVar[frozenset[str]] = frozenset()
    #: Option prefixes an implementation accepts (``header.`` for HTTP headers).
    OPTION_PREFIXES: ClassVar[tuple[str, ...]] = ()
    DEFAULT_MAX_BATCH: ClassVar[int] = 100
    DEFAULT_TIMEOUT: ClassVar[float] = 10.0

    #: How many notifications one :meth:`send` carries at most (longer batches are split, in order).
    max_batch: int
    #: Sends in flight at once to this endpoint (its topic's slots in df-notify); 0: the worker's default.
    max_inflight: int

    def __init__(self, url: str, format: str = "s3", options: Mapping[str, str] | None = None):
        if format not in FORMATS:
            raise EndpointConfigError(f"endpoint {safe_url(url)}: unknown format {format!r}; known: {', '.join(FORMATS)}")
        self.url = url
        self.format = format
        self.options = Options(url, options or {}, self.COMMON_OPTIONS | self.OPTIONS, self.OPTION_PREFIXES)
        self.max_batch = self.options.get_int("max_batch", self.DEFAULT_MAX_BATCH)
        self.timeout = self.options.get_float("timeout", self.DEFAULT_TIMEOUT)
        self.max_inflight = self.options.get_int("max_inflight", 0)
        self.region = self.options.get_str("region", "")

    @property
    def safe_url(self) -> str:
        """The URL without credentials or query values."""
        return safe_url(self.url)

    def chunks(self, batch: Sequence[Notification]) -> list[Sequence[Notification]]:
        """``batch`` cut into pieces of at most :attr:`max_batch`, in order."""
        step = self.max_batch
        return [batch[i:i + step] for i in range(0, len(batch), step)]

    def message(self, n: Notification) -> tuple[str, bytes]:
        """``(content_type, body)`` of one notification sent as one message: an S3 event
        message with one record, or one structured CloudEvent."""
        if self.format == "s3":
            return JSON, to_json(s3_message((n,), region=self.region))
        return CE_JSON, to_json(cloudevent(n, region=self.region))

    @abc.abstractmethod
    async def send(self, batch: Sequence[Notification]) -> None:
        """Deliver ``batch`` in order; return once the endpoint acknowledged every notification.

        Raises :class:`~dfpubsub.errors.EndpointError` when a retry may succeed
        and :class:`~dfpubsub.errors.EndpointRejected` when it will not; both
        carry ``acked``, the count of leading notifications already acknowledged.
        """

    @abc.abstractmethod
    async def close(self) -> None:
        """Release connections; the endpoint may not be used afterwards."""

    async def __aenter__(self) -> Endpoint:
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.close()

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.safe_url} format={self.format} max_batch={self.max_batch}>"


def available_endpoints() -> list[str]:
    """URL schemes with an installed endpoint implementation."""
    return sorted({ep.name for ep in entry_points(group=ENTRY_POINT_GROUP)})


def open_endpoint(url: str, *, format: str = "s3", options: Mapping[str, str] | None = None) -> Endpoint:
    """The endpoint for ``url``, chosen by its scheme (``http``, ``https``, ``amqp``, ``amqps``, ``redis``...).

    Raises :class:`EndpointConfigError` for an unknown scheme, a bad URL or bad options.
    """
    scheme = urlsplit(url).scheme.lower() if "://" in url else ""
    matches = [ep for ep in entry_points(group=ENTRY_POINT_GROUP) if ep.name == scheme]
    if not matches:
        raise EndpointConfigError(
            f"no endpoint for {safe_url(url)!r}; known schemes: {', '.join(available_endpoints()) or 'none'}"
        )
    try:
        with needs_extra(f"endpoint scheme {scheme!r}"):
            cls: Any = matches[0].load()
    except MissingExtra as exc:
        raise EndpointConfigError(str(exc)) from exc
    if not (isinstance(cls, type) and issubclass(cls, Endpoint)):
        raise EndpointConfigError(f"entry point {scheme!r} of {ENTRY_POINT_GROUP} is not an Endpoint subclass")
    return cls(url, format, options)
