"""The daemon's HTTP endpoint: ``/metrics`` for Prometheus, ``/livez`` and ``/readyz`` for probes.

``/livez`` (alias ``/healthz``) and ``/readyz`` answer 200 with ``ok``, or 503 with one
``[-]check failed: reason`` line per failing check; ``?verbose`` lists the passing ones too.
``/metrics`` (alias ``/``) is the Prometheus text format. Anything else is 404. Served by a
thread per request (daemon threads: a stuck scraper never holds up an exit).
"""

from __future__ import annotations

import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import urlsplit

from ..errors import ConfigError
from ..metrics import register_collector
from .health import Health

__all__ = ["ProbeServer"]


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    health: Health


class _Handler(BaseHTTPRequestHandler):
    server: _Server

    def do_GET(self) -> None:
        url = urlsplit(self.path)
        if url.path in ("/livez", "/healthz", "/readyz"):
            passing, body = self.server.health.report("ready" if url.path == "/readyz" else "live",
                                                      verbose="verbose" in url.query)
            self._send(200 if passing else 503, "text/plain; charset=utf-8", body.encode())
        elif url.path in ("/metrics", "/"):
            from prometheus_client import CONTENT_TYPE_LATEST, REGISTRY, generate_latest

            self._send(200, CONTENT_TYPE_LATEST, generate_latest(REGISTRY))
        else:
            self._send(404, "text/plain; charset=utf-8", b"not found: try /metrics, /livez or /readyz\n")

    def _send(self, status: int, content_type: str, body: bytes) -> None:
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: object) -> None:
        pass  # a scrape every few seconds is not worth a log line


class ProbeServer:
    """Serves ``health`` and the metrics on ``addr:port`` until :meth:`close`. ConfigError if the
    address cannot be bound (in use, or not this host's)."""

    def __init__(self, health: Health, port: int, addr: str = "127.0.0.1"):
        register_collector()
        try:
            self._server = _Server((addr, port), _Handler)
        except OSError as exc:
            raise ConfigError(f"cannot serve metrics on {addr}:{port}: {exc.strerror or exc}") from exc
        self._server.health = health
        self.port = self._server.server_address[1]
        self._thread = threading.Thread(target=self._server.serve_forever, kwargs={"poll_interval": 0.2},
                                        name="dfpubsub-probes", daemon=True)
        self._thread.start()

    def close(self) -> None:
        """Stop serving (within the poll interval)."""
        self._server.shutdown()
        self._server.server_close()
