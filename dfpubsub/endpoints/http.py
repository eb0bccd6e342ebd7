"""HTTP(S) webhooks: a POST per batch, acknowledged by a 2xx answer (aiohttp).

Formats and modes:

- ``s3``: ``{"Records": [...]}``, up to ``max_batch`` records per request;
- ``cloudevents``, ``mode=batch`` (default): a JSON batch of up to
  ``max_batch`` events (``application/cloudevents-batch+json``);
  ``mode=structured``: one event per request (``application/cloudevents+json``);
  ``mode=binary``: one event per request, attributes in ``ce-*`` headers.

Answers: 2xx acknowledges; 408, 429 and 5xx, connection errors and timeouts
raise :class:`EndpointError` (retry); any other status, redirects included
(following a redirect could turn the POST into a GET and fake an ack), raises
:class:`EndpointRejected`.
"""

from __future__ import annotations

import ssl
from collections.abc import Mapping, Sequence
from urllib.parse import urlsplit

import aiohttp

from ..errors import EndpointConfigError, EndpointError, EndpointRejected
from ..notify.notification import Notification
from ..notify.records import (
    CE_BATCH_JSON,
    CE_JSON,
    JSON,
    cloudevent,
    cloudevent_batch,
    cloudevent_binary,
    s3_message,
    to_json,
)
from .api import Endpoint

__all__ = ["HttpEndpoint", "RETRYABLE_STATUSES"]

#: Statuses worth retrying besides 5xx: request timeout and too many requests.
RETRYABLE_STATUSES = frozenset({408, 429})
_CE_MODES = ("batch", "structured", "binary")


class HttpEndpoint(Endpoint):
    """POSTs notifications to an ``http://`` or ``https://`` URL (kept whole, query included).

    Options: ``mode`` (cloudevents only: batch, structured, binary),
    ``verify_ssl`` (default true), ``ca_file`` (PEM bundle to verify with),
    ``connections`` (pool size, default 8), ``timeout`` (seconds per request,
    default 10), ``connect_timeout`` (seconds to connect) and ``read_timeout``
    (seconds waiting for the next bytes of the answer), both bounded by
    ``timeout``, ``max_batch`` (default 100; 1 in structured and binary mode),
    ``header.<Name>`` (extra request header).
    """

    OPTIONS = frozenset({"mode", "verify_ssl", "ca_file", "connections", "connect_timeout", "read_timeout"})
    OPTION_PREFIXES = ("header.",)

    def __init__(self, url: str, format: str = "s3", options: Mapping[str, str] | None = None):
        super().__init__(url, format, options)
        parts = urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise EndpointConfigError(f"not an http(s) URL with a host: {self.safe_url!r}")
        self.mode = self.options.get_choice("mode", _CE_MODES if format == "cloudevents" else ("batch",), "batch")
        if self.mode != "batch":
            self.max_batch = 1
        self.verify_ssl = self.options.get_bool("verify_ssl", True)
        self.ca_file = self.options.get_str("ca_file", "")
        self.connections = self.options.get_int("connections", 8)
        self.headers = self.options.prefixed("header.")
        self.connect_timeout = self.options.get_float("connect_timeout", self.timeout)
        self.read_timeout = self.options.get_float("read_timeout", self.timeout)
        self._ssl: ssl.SSLContext | bool = True
        if parts.scheme == "https":
            try:
                self._ssl = ssl.create_default_context(cafile=self.ca_file or None) if self.verify_ssl else False
            except OSError as exc:
                raise EndpointConfigError(f"endpoint {self.safe_url}: cannot read ca_file: {exc}") from exc
        self._session: aiohttp.ClientSession | None = None

    def _session_for_loop(self) -> aiohttp.ClientSession:
        # Built on first use: a ClientSession belongs to the running loop.
        if self._session is None or self._session.closed:
            self._session = aiohttp.ClientSession(
                connector=aiohttp.TCPConnector(limit=self.connections, ssl=self._ssl),
                timeout=aiohttp.ClientTimeout(total=self.timeout, sock_connect=self.connect_timeout,
                                              sock_read=self.read_timeout),
                headers=self.headers,
            )
        return self._session

    def _request(self, chunk: Sequence[Notification]) -> tuple[dict[str, str], bytes]:
        if self.format == "s3":
            return {"Content-Type": JSON}, to_json(s3_message(chunk, region=self.region))
        if self.mode == "batch":
            return {"Content-Type": CE_BATCH_JSON}, to_json(cloudevent_batch(chunk, region=self.region))
        if self.mode == "structured":
            return {"Content-Type": CE_JSON}, to_json(cloudevent(chunk[0], region=self.region))
        return cloudevent_binary(chunk[0], region=self.region)

    async def send(self, batch: Sequence[Notification]) -> None:
        """POST ``batch`` in chunks of :attr:`max_batch`, one after the other (order is kept)."""
        acked = 0
        session = self._session_for_loop()
        for chunk in self.chunks(batch):
            try:
                headers, body = self._request(chunk)
            except EndpointRejected as exc:
                exc.acked = acked
                raise
            await self._post(session, headers, body, acked)
            acked += len(chunk)

    async def _post(self, session: aiohttp.ClientSession, headers: dict[str, str], body: bytes, acked: int) -> None:
        try:
            async with session.post(self.url, data=body, headers=headers, allow_redirects=False) as resp:
                if resp.status < 300:
                    await resp.read()  # so the connection goes back to the pool
                    return
                status = resp.status
                detail = (await resp.content.read(200)).decode("utf-8", "replace").strip()
        except aiohttp.InvalidURL as exc:
            raise EndpointConfigError(f"invalid URL {self.safe_url!r}", acked) from exc
        except (TimeoutError, aiohttp.ClientError, OSError) as exc:
            # aiohttp's messages name host and port, never the URL's credentials; be sure anyway.
            reason = str(exc).replace(self.url, self.safe_url) or "timed out"
            raise EndpointError(f"{self.safe_url}: {type(exc).__name__}: {reason}", acked) from exc
        message = f"{self.safe_url} answered {status}" + (f": {detail}" if detail else "")
        if status >= 500 or status in RETRYABLE_STATUSES:
            raise EndpointError(message, acked, status)
        raise EndpointRejected(message, acked, status)

    async def close(self) -> None:
        """Close the connection pool."""
        if self._session is not None:
            await self._session.close()
            self._session = None
