"""Counters of publishers and subscribers, exported to Prometheus.

Each component owns a :class:`Stats` (plain integers, cheap on the hot path);
one Prometheus collector reads all live ones at scrape time, so publishing an
event never takes prometheus-client's locks.
"""

from __future__ import annotations

import threading
import weakref
from collections.abc import Iterator

__all__ = ["Stats", "LabelledCounter", "register_collector", "start_metrics_server"]

_live: "weakref.WeakSet[Stats]" = weakref.WeakSet()
_registered = False
_register_lock = threading.Lock()

#: Help strings of every counter; the exported name is ``dfpubsub_<name>_total``.
COUNTERS: dict[str, str] = {
    "events_in": "Events delivered to handlers.",
    "events_out": "Events handed to the transport.",
    "envelopes_in": "Envelopes decoded.",
    "envelopes_out": "Envelopes sent.",
    "hellos_in": "Hello messages received.",
    "hellos_out": "Hello messages sent.",
    "duplicates": "Events dropped as duplicates.",
    "gaps": "Sequence gaps opened.",
    "gaps_filled": "Gaps closed by late messages within the delay window.",
    "resync_requests": "Resyncs requested, by reason.",
    "resyncs": "Resyncs run.",
    "resync_failures": "Resync callbacks that raised.",
    "decode_errors": "Frames that failed to decode, by reason.",
    "drops": "Messages dropped, by reason.",
    "handler_errors": "Event handlers that raised.",
    "send_errors": "Transport send failures.",
    "background_errors": "Unexpected errors a background thread survived (logged with their traceback).",
    "subscribers_joined": "Subscribers a publisher saw join (where the transport tells).",
    "events_archived": "Events written to the event log (df-archiver).",
    "segments_published": "Parquet segments published to the event log.",
    "segment_bytes": "Bytes of the Parquet segments published.",
    "journals_recovered": "Journals a crashed archiver left, published at start.",
    "notifications_enqueued": "Persistent notifications a writer committed to their queues.",
    "notifications_refused": "Writes refused because a notification queue was full (QueueFull), by topic.",
    "notifications_lost": "Writes that stand but whose notification could not be committed, by reason.",
}


class Stats:
    """Named counters of one component, optionally split by a ``reason`` label."""

    __slots__ = ("role", "name", "counts", "levels", "__weakref__")

    def __init__(self, role: str, name: str):
        self.role = role
        self.name = name
        self.counts: dict[tuple[str, str], int] = {}
        self.levels: dict[str, float] = {}
        _live.add(self)

    def set(self, gauge: str, value: float) -> None:
        """Set a gauge (exported as ``dfpubsub_<gauge>``)."""
        self.levels[gauge] = value

    def inc(self, counter: str, n: int = 1, reason: str = "") -> None:
        """Add ``n`` to ``counter`` (with an optional ``reason`` label)."""
        key = (counter, reason)
        self.counts[key] = self.counts.get(key, 0) + n

    def get(self, counter: str, reason: str | None = None) -> int:
        """Current value; with ``reason=None`` the sum over all reasons."""
        if reason is not None:
            return self.counts.get((counter, reason), 0)
        return sum(v for (c, _), v in list(self.counts.items()) if c == counter)

    def snapshot(self) -> dict[str, int]:
        """All counters as ``{"name" or "name:reason": value}``."""
        return {f"{c}:{r}" if r else c: v for (c, r), v in sorted(self.counts.items())}


class LabelledCounter:
    """One process-wide counter with its own labels (``dfpubsub_<name>_total{labels}``).

    For counts that belong to no single component, such as records skipped
    by whichever listing read them (:mod:`dfpubsub.foreign`).
    """

    def __init__(self, name: str, help: str, labels: tuple[str, ...]):
        self.name = name
        self.help = help
        self.labels = labels
        self.counts: dict[tuple[str, ...], int] = {}
        self._lock = threading.Lock()
        _counters.append(self)

    def inc(self, *values: str, n: int = 1) -> None:
        """Add ``n`` to the series of label ``values``."""
        with self._lock:
            self.counts[values] = self.counts.get(values, 0) + n

    def get(self, *values: str) -> int:
        """The series' value; with fewer values, the sum over the series that start with them."""
        with self._lock:
            return sum(v for k, v in self.counts.items() if k[:len(values)] == values)


_counters: list[LabelledCounter] = []


class _Collector:
    def collect(self) -> Iterator[object]:
        from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

        families: dict[str, CounterMetricFamily] = {}
        gauges: dict[str, GaugeMetricFamily] = {}
        for stats in list(_live):
            for gauge, level in list(stats.levels.items()):
                gfam = gauges.get(gauge)
                if gfam is None:
                    gfam = gauges[gauge] = GaugeMetricFamily(f"dfpubsub_{gauge}", GAUGES.get(gauge, gauge),
                                                             labels=["role", "name"])
                gfam.add_metric([stats.role, stats.name], level)
            for (counter, reason), value in list(stats.counts.items()):
                fam = families.get(counter)
                if fam is None:
                    fam = families[counter] = CounterMetricFamily(
                        f"dfpubsub_{counter}", COUNTERS.get(counter, counter),
                        labels=["role", "name", "reason"],
                    )
                fam.add_metric([stats.role, stats.name, reason], value)
        yield from families.values()
        yield from gauges.values()
        for counter in _counters:
            fam = CounterMetricFamily(f"dfpubsub_{counter.name}", counter.help, labels=list(counter.labels))
            for values, value in list(counter.counts.items()):
                fam.add_metric(list(values), value)
            yield fam


def register_collector() -> None:
    """Register the dfpubsub collector with prometheus-client's default registry (once)."""
    global _registered
    with _register_lock:
        if not _registered:
            from prometheus_client import REGISTRY

            REGISTRY.register(_Collector())
            _registered = True


def start_metrics_server(port: int, addr: str = "127.0.0.1") -> None:
    """Serve ``/metrics`` over HTTP on ``addr:port`` (0 disables it)."""
    if port:
        from prometheus_client import start_http_server

        from .errors import ConfigError

        register_collector()
        try:
            start_http_server(port, addr=addr)
        except OSError as exc:  # in use, or not an address of this host
            raise ConfigError(f"cannot serve metrics on {addr}:{port}: {exc.strerror or exc}") from exc
