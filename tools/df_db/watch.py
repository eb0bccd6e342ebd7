"""``watch``: a live tail of the events on the configured driver, gaps marked as they are seen.

The subscriber's callbacks run on its threads; they only queue what they saw,
and the main thread prints it, so output never interleaves.
"""

from __future__ import annotations

import queue
import time
from typing import Annotated, Any

import typer
from rich.text import Text

from dfpubsub.codec import decode_header
from dfpubsub.discovery import DiscoveryConnector
from dfpubsub.errors import DecodeError
from dfpubsub.events import Event
from dfpubsub.factory import create_driver, subscriber_options
from dfpubsub.metrics import Stats
from dfpubsub.subscriber import Subscriber
from dfpubsub.tracker import ResyncRequest
from dfpubsub.transport import SubscriberTransport

from .context import CliState, state
from .output import clock, fail

__all__ = ["app"]

app = typer.Typer()

_WIDTHS = (12, 16, 7, 14, 10, 24, 7, 8)
_HEADER = ("time", "publisher", "seq", "topic", "table", "key", "action", "version")
_RIGHT = {2, 7}  # seq and version


def _fit(cells: tuple[Any, ...]) -> str:
    out = []
    for i, (cell, width) in enumerate(zip(cells, _WIDTHS)):
        s = str(cell)
        s = s if len(s) <= width else s[: width - 1] + "…"
        out.append(s.rjust(width) if i in _RIGHT else s.ljust(width))
    return " ".join(out).rstrip()


class _NamingTransport(SubscriberTransport):
    """The driver's transport, noting each publisher's name from the envelopes as they arrive.

    Events carry only their publisher's id, and the tracker forgets a publisher
    once it said bye, which may be before its last events are shown.
    """

    def __init__(self, inner: SubscriberTransport, max_bytes: int):
        self.inner = inner
        self.max_bytes = max_bytes
        self.names: dict[str, str] = {}

    @property
    def on_lost(self) -> Any:
        return self.inner.on_lost

    @on_lost.setter
    def on_lost(self, callback: Any) -> None:
        self.inner.on_lost = callback

    @property
    def endpoints(self) -> Any:
        """The inner transport's, for :class:`DiscoveryConnector` (zmq has them)."""
        return getattr(self.inner, "endpoints", None)

    def subscribe(self, topic: str) -> None:
        self.inner.subscribe(topic)

    def unsubscribe(self, topic: str) -> None:
        self.inner.unsubscribe(topic)

    def connect(self, uri: str) -> None:
        self.inner.connect(uri)

    def disconnect(self, uri: str) -> None:
        self.inner.disconnect(uri)

    def recv(self, timeout: float) -> list[bytes]:
        frames = self.inner.recv(timeout)
        for frame in frames:
            try:
                env = decode_header(frame, self.max_bytes)
            except DecodeError:  # the subscriber counts it and logs it
                continue
            self.names[env.publisher_id] = env.publisher_name
        return frames

    def close(self) -> None:
        self.inner.close()


class _Tail:
    """What the subscriber saw, in order, for the main thread to show."""

    def __init__(self, names: dict[str, str]) -> None:
        self.items: queue.SimpleQueue[tuple[str, float, Any]] = queue.SimpleQueue()
        self.names = names

    def on_event(self, event: Event) -> None:
        self.items.put(("event", time.time(), event))

    def on_gap(self, request: ResyncRequest) -> None:
        self.items.put(("gap", time.time(), request))

    def on_resync(self, topics: set[str]) -> None:
        self.items.put(("resync", time.time(), topics))

    def name(self, publisher_id: str) -> str:
        return self.names.get(publisher_id) or publisher_id[:8]

    def show(self, st: CliState, kind: str, now: float, item: Any) -> None:
        if kind == "event":
            e: Event = item
            name = self.name(e.publisher_id)
            st.out.line(
                {"type": "event", "time": e.timestamp, "publisher_id": e.publisher_id, "publisher": name,
                 "seq": e.seq, "topic": e.topic, "table": e.table, "key": e.key, "action": e.action.value,
                 "version": e.version, "value": e.value},
                Text(_fit((clock(e.timestamp), name, e.seq, e.topic, e.table, e.key, e.action.value, e.version))),
            )
        elif kind == "gap":
            r: ResyncRequest = item
            name = self.name(r.publisher_id) if r.publisher_id else "-"
            lo, hi = r.missing or (0, 0)
            seqs = "-" if r.missing is None else str(lo) if lo == hi else f"{lo}-{hi}"
            st.out.line(
                {"type": "gap", "time": now, "publisher_id": r.publisher_id, "publisher": name, "topic": r.topic,
                 "reason": r.reason, "missing": None if r.missing is None else list(r.missing)},
                Text(_fit((clock(now), name, seqs, r.topic, "", f"GAP: {r.reason}", "", "")), style="bold red"),
            )
        else:
            st.out.line({"type": "resync", "time": now, "topics": sorted(item)},
                        Text(f"{clock(now)} resync of {', '.join(sorted(item))} (a cache would re-read it now)",
                             style="yellow"))


@app.command()
def watch(
    ctx: typer.Context,
    topics: Annotated[list[str] | None, typer.Argument(
        metavar="[TOPIC]...", help="Topics to watch (default: pubsub.topics, else the store's tables).")] = None,
    connect: Annotated[list[str] | None, typer.Option(
        "--connect", metavar="URI", help="Also connect to this publisher, e.g. tcp://host:8866 (repeatable).")] = None,
    discover: Annotated[bool, typer.Option(
        "--discover", help="Connect to the publishers of the discovery table as they come and go.")] = False,
    count: Annotated[int | None, typer.Option("--count", min=1, help="Stop after N events.")] = None,
    timeout: Annotated[float | None, typer.Option("--timeout", min=0, help="Stop after S seconds.")] = None,
) -> None:
    """Show events as they arrive: time, publisher, seq, topic, table, key, action, version; and gaps."""
    st = state(ctx)
    settings = st.settings
    watched = topics or settings.pubsub.topics or settings.store.tables
    driver = create_driver(settings)
    options = subscriber_options(settings.pubsub)
    options.initial_sync = False  # a tail has no cache to fill
    stats = Stats("subscriber", "df-db")
    transport = _NamingTransport(driver.subscriber(stats), options.max_message_bytes)
    tail = _Tail(transport.names)
    sub = Subscriber(transport, watched, tail.on_event, tail.on_resync, options, "df-db",
                     tail.on_gap, stats)
    connector = discovery = None
    events = 0
    deadline = None if timeout is None else time.monotonic() + timeout
    try:
        for uri in connect or []:
            sub.connect(uri)
        sub.start()
        if discover:
            discovery = st.open_discovery()
            static = [*(connect or []), *([driver.url] if driver.url else [])]
            connector = DiscoveryConnector(discovery, sub, static=static)
        st.out.note(f"df-db: watching {', '.join(sorted(watched))} on {driver.name}; Ctrl-C stops")
        if not st.out.json:
            st.out.console.print(Text(_fit(_HEADER), style="bold"))
        while count is None or events < count:
            wait = 0.5 if deadline is None else min(0.5, deadline - time.monotonic())
            if wait <= 0:
                break
            try:
                kind, now, item = tail.items.get(timeout=wait)
            except queue.Empty:
                continue
            tail.show(st, kind, now, item)
            events += kind == "event"
    except KeyboardInterrupt:
        pass
    finally:
        if connector is not None:
            connector.close(disconnect=False)
        if discovery is not None:
            discovery.close()
        sub.close()
    if count is not None and events < count and deadline is not None and time.monotonic() >= deadline:
        fail(f"timed out after {timeout:g} s with {events} of {count} events")
