"""A local webhook that receives notifications, for the demo, tests and benchmarks.

It runs an aiohttp server on its own thread and event loop, records every S3
record or CloudEvent it is sent (and when: ``arrivals``), answers ``status``
(set it to 503 to play a broken endpoint), and can be stopped and started
again on the same port to play an endpoint that is down for a while.
:class:`HungWebhook` plays a hung one: it accepts connections and never answers.
"""

from __future__ import annotations

import asyncio
import json
import socket
import threading
import time
from typing import Any

from aiohttp import web

from dfpubsub.testing.servers import free_port

__all__ = ["WebhookReceiver", "HungWebhook"]


class WebhookReceiver:
    """``url`` receives POSTs of ``{"Records": [...]}``, CloudEvents (batched or one) or binary CloudEvents."""

    def __init__(self, port: int | None = None, path: str = "/hook"):
        self.port = port or free_port()
        self.url = f"http://127.0.0.1:{self.port}{path}"
        self.path = path
        self.status = 200
        self.requests = 0
        self._records: list[dict[str, Any]] = []
        self._arrivals: list[float] = []
        self._lock = threading.Lock()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._runner: web.AppRunner | None = None
        self._thread: threading.Thread | None = None

    @property
    def records(self) -> list[dict[str, Any]]:
        """What was received and acknowledged, in arrival order (S3 records or CloudEvents)."""
        with self._lock:
            return list(self._records)

    @property
    def arrivals(self) -> list[tuple[float, dict[str, Any]]]:
        """``(time.time() on arrival, record)`` of every record in :attr:`records`."""
        with self._lock:
            return list(zip(self._arrivals, self._records))

    async def _hook(self, request: web.Request) -> web.Response:
        body = await request.read()
        self.requests += 1
        if self.status >= 300:
            return web.Response(status=self.status, text="unavailable")
        if "ce-id" in request.headers:  # binary CloudEvent: attributes in headers
            items = [{"ce": {k[3:]: v for k, v in request.headers.items() if k.lower().startswith("ce-")},
                      "data": json.loads(body) if body else None}]
        else:
            doc = json.loads(body)
            items = doc["Records"] if isinstance(doc, dict) and "Records" in doc else doc
            items = items if isinstance(items, list) else [items]
        now = time.time()
        with self._lock:
            self._records.extend(items)
            self._arrivals.extend([now] * len(items))
        return web.Response(status=self.status)

    def start(self) -> WebhookReceiver:
        """Listen (again) on the port; returns once it accepts connections."""
        ready = threading.Event()

        async def serve() -> None:
            app = web.Application(client_max_size=64 << 20)
            app.router.add_post(self.path, self._hook)
            self._runner = web.AppRunner(app, access_log=None)
            await self._runner.setup()
            await web.TCPSite(self._runner, "127.0.0.1", self.port, reuse_address=True).start()
            ready.set()

        self._loop = asyncio.new_event_loop()
        loop = self._loop

        def main() -> None:
            asyncio.set_event_loop(loop)
            loop.run_until_complete(serve())
            loop.run_forever()
            loop.close()

        self._thread = threading.Thread(target=main, name="webhook", daemon=True)
        self._thread.start()
        if not ready.wait(10):
            raise RuntimeError(f"webhook on port {self.port} did not start")
        return self

    def stop(self) -> None:
        """Stop listening (connections are refused until :meth:`start`)."""
        loop, runner, thread = self._loop, self._runner, self._thread
        if loop is None or runner is None or thread is None:
            return
        asyncio.run_coroutine_threadsafe(runner.cleanup(), loop).result(10)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(10)
        self._loop = self._runner = self._thread = None

    def __enter__(self) -> WebhookReceiver:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


class HungWebhook:
    """``url`` accepts connections on loopback and never answers (a hung webhook); ``accepted``
    holds the connections, open until :meth:`close`."""

    def __init__(self, path: str = "/hook"):
        self._sock = socket.create_server(("127.0.0.1", 0), backlog=512)
        self.url = f"http://127.0.0.1:{self._sock.getsockname()[1]}{path}"
        self.accepted: list[socket.socket] = []
        self._thread = threading.Thread(target=self._accept, name="hung-webhook", daemon=True)
        self._thread.start()

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self._sock.accept()
            except OSError:  # closed
                return
            self.accepted.append(conn)

    def close(self) -> None:
        """Stop accepting and drop the connections held."""
        self._sock.close()
        for conn in self.accepted:
            conn.close()

    def __enter__(self) -> HungWebhook:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def main(argv: list[str] | None = None) -> int:
    """Serve a webhook until SIGTERM (``python -m dfpubsub.tools.webhook --port N``)."""
    import argparse
    import signal

    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--port", type=int, required=True)
    args = parser.parse_args(argv)
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    with WebhookReceiver(args.port):
        print("ready", flush=True)
        stop.wait()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
