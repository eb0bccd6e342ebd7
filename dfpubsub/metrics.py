"""Counters of publishers and subscribers, exported to Prometheus.

Each component owns a :class:`Stats` (plain integers, cheap on the hot path);
one Prometheus collector reads all live ones at scrape time, so publishing an
event never takes prometheus-client's locks.
"""

from __future__ import annotations

import threading
import weakref
from collections.abc import Iterator
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from prometheus_client import Metric

__all__ = ["COUNTERS", "GAUGES", "ROLE_COUNTERS", "Stats", "register_collector", "start_metrics_server"]

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
    "subscribers_joined": "Subscribers a publisher saw join (where the transport tells).",
    "events_archived": "Events written to the event log (df-archiver).",
    "segments_published": "Parquet segments published to the event log.",
    "segment_bytes": "Bytes of the Parquet segments published.",
    "journals_recovered": "Journals a crashed archiver left, published at start.",
    "notifications_enqueued": "Persistent notifications a writer committed to their queues.",
    "notifications_refused": "Writes refused because a notification queue was full (QueueFull), by topic.",
    "notifications_lost": "Writes that stand but whose notification could not be committed, by reason.",
}

#: Help strings of every gauge; the exported name is ``dfpubsub_<name>``.
GAUGES: dict[str, str] = {
    "pending": "Notifications waiting in the shards a df-notify worker owns, per topic.",
    "shards_owned": "Shards of a topic whose lease this df-notify worker holds.",
}

#: Counters a component of each role shows from its start, at zero until they move, so a
#: scrape tells "nothing happened" from "not exported" (a dashboard can alert on a rate).
ROLE_COUNTERS: dict[str, tuple[str, ...]] = {
    "publisher": ("events_out", "envelopes_out", "hellos_out", "send_errors", "drops"),
    "subscriber": ("events_in", "envelopes_in", "hellos_in", "duplicates", "gaps", "gaps_filled",
                   "resync_requests", "resyncs", "resync_failures", "decode_errors", "drops", "handler_errors"),
    "controller": ("handler_errors",),
    "relay": ("envelopes_in", "envelopes_out", "drops"),
    "archiver": ("events_archived", "segments_published", "segment_bytes", "journals_recovered"),
    "notifier": ("notifications_enqueued", "notifications_refused", "notifications_lost"),
}


class Stats:
    """Named counters of one component, optionally split by a ``reason`` label."""

    __slots__ = ("role", "name", "counts", "levels", "__weakref__")

    def __init__(self, role: str, name: str):
        self.role = role
        self.name = name
        self.counts: dict[tuple[str, str], int] = {}
        self.levels: dict[str, float] = {}
        for counter in ROLE_COUNTERS.get(role, ()):
            self.counts[(counter, "")] = 0
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
        """All counters that moved, as ``{"name" or "name:reason": value}``."""
        return {f"{c}:{r}" if r else c: v for (c, r), v in sorted(self.counts.items()) if v}


class _Collector:
    """Reads every live :class:`Stats` at scrape time.

    A counter carries the ``reason`` label only if some component counted it
    with a reason; then its reason-less zero (the seed) is left out rather
    than exported as ``reason=""``.
    """

    def collect(self) -> Iterator["Metric"]:
        from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

        live = list(_live)
        samples: dict[str, list[tuple[str, str, str, int]]] = {}
        for stats in live:
            for (counter, reason), value in list(stats.counts.items()):
                samples.setdefault(counter, []).append((stats.role, stats.name, reason, value))
        for counter, rows in samples.items():
            reasoned = any(reason for _, _, reason, _ in rows)
            fam = CounterMetricFamily(f"dfpubsub_{counter}", COUNTERS.get(counter, counter),
                                      labels=["role", "name", "reason"] if reasoned else ["role", "name"])
            for role, name, reason, value in rows:
                if not reasoned:
                    fam.add_metric([role, name], value)
                elif reason or value:
                    fam.add_metric([role, name, reason], value)
            yield fam
        gauges: dict[str, GaugeMetricFamily] = {}
        for stats in live:
            for gauge, level in list(stats.levels.items()):
                gfam = gauges.get(gauge)
                if gfam is None:
                    gfam = gauges[gauge] = GaugeMetricFamily(f"dfpubsub_{gauge}", GAUGES.get(gauge, gauge),
                                                             labels=["role", "name"])
                gfam.add_metric([stats.role, stats.name], level)
        yield from gauges.values()


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

        register_collector()
        start_http_server(port, addr=addr)
