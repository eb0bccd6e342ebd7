"""Counters of publishers and subscribers, exported to Prometheus.

Each component owns a :class:`Stats` (plain integers, cheap on the hot path);
one Prometheus collector reads all live ones at scrape time, so publishing an
event never takes prometheus-client's locks.
"""

from __future__ import annotations

import threading
import weakref
from bisect import bisect_left
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from prometheus_client import Metric

__all__ = ["COUNTERS", "GAUGES", "HISTOGRAMS", "ROLE_COUNTERS", "Histogram", "LabelledCounter", "Stats",
           "register_collector", "start_metrics_server"]

_live: weakref.WeakSet[Stats] = weakref.WeakSet()
_registered = False
_register_lock = threading.Lock()

#: Help strings of every counter; the exported name is ``dfpubsub_<name>_total``.
COUNTERS: dict[str, str] = {
    "events_in": "Events delivered to handlers.",
    "events_out": "Events handed to the transport.",
    "envelopes_in": "Envelopes decoded.",
    "envelopes_out": "Envelopes sent.",
    "envelopes_schema1": "Event envelopes received in wire schema 1 (values as msgpack objects).",
    "envelopes_schema2": "Event envelopes received in wire schema 2 (values as their msgpack bytes).",
    "bad_values": "Schema 2 values that passed the check at receipt but did not decode (their key was repaired "
                  "from the store).",
    "hellos_in": "Hello messages received.",
    "hellos_out": "Hello messages sent.",
    "duplicates": "Events dropped as duplicates.",
    "gaps": "Sequence gaps opened.",
    "gaps_filled": "Gaps closed by late messages within the delay window.",
    "streams_rebased": "Streams stepped down to the start of a run only a hello claimed, by a frame inside it (a forged claim, or late): the numbers below the frame are then a gap.",
    "streams_restarted": "Streams started anew at a number more than max_seq_jump below the expected one (a forged number).",
    "strings_clamped": "Strings from the wire kept shortened, by field (pub, name, host).",
    "resync_requests": "Resyncs requested, by reason.",
    "resyncs": "Resyncs run.",
    "resync_failures": "Resync callbacks that raised.",
    "decode_errors": "Frames that failed to decode, by reason.",
    "drops": "Messages dropped, by reason.",
    "handler_errors": "Event handlers that raised.",
    "send_errors": "Transport send failures.",
    "reopens": "Sockets a ZeroMQ subscriber replaced to drop an endpoint (libzmq's disconnect can abort mid-message).",
    "background_errors": "Unexpected errors a background thread survived (logged with their traceback).",
    "subscribers_joined": "Subscribers a publisher saw join (where the transport tells).",
    "peers_cut": "Subscribers a ZeroMQ publisher cut off, by reason (flood: sent more than its budget; stalled: read nothing).",
    "events_archived": "Events written to the event log (df-archiver).",
    "segments_published": "Parquet segments published to the event log.",
    "segment_bytes": "Bytes of the Parquet segments published.",
    "journals_recovered": "Journals a crashed archiver left, published at start.",
    "notifications_enqueued": "Persistent notifications a writer committed to their queues.",
    "notifications_refused": "Writes refused because a notification queue was full (QueueFull), by topic.",
    "notifications_lost": "Writes that stand but whose notification could not be committed, by reason.",
    "workqueue_adds": "Keys added to a controller's work queue (a key already queued counts once).",
    "workqueue_retries": "Keys put back on a controller's work queue after a failure or a requeue.",
    "workqueue_full": "Adds that waited because a controller's work queue was full.",
    "workqueue_steals": "Keys an idle worker took from the untouched end of another worker's batch.",
    "reconciles": "Reconciles run, by outcome (done, requeue, error).",
    "reconcile_failed": "Keys moved to the failed set after max_retries failures.",
    "redeliveries": "Cached keys handed to the reconcilers again by the periodic resync.",
    "replays": "Repairs of a controller's cache by replaying the store's change feed, by cause.",
    "relists": "Repairs of a controller's cache by listing its topics (first sync, history gone, too far behind, "
               "periodic), by cause.",
    "replay_entries": "Change-feed entries replays read.",
    "replay_objects": "Objects replays read from the store (what the cache had missed, or could not prove).",
    "relist_objects": "Objects of the topics relists listed.",
    "bookmark_moves": "Feed publishers' bookmarks that moved a controller's positions without reading the store.",
    "bookmarks_refused": "Times a controller's positions went back to where the store last proved them, by reason "
                         "(ahead_of_store: a bookmark named a revision the store had not reached).",
    "checkpoint_proofs": "Checkpoints that proved positions moved by bookmarks with one read of the store's head "
                         "instead of a replay.",
    "snapshots_written": "Snapshots a controller with a state_dir wrote (docs/controller.md#warm-restarts).",
    "snapshot_errors": "Snapshots a controller could not write, by reason (ENOSPC, EROFS, EACCES, EFBIG, ...: the "
                       "errno; store: its identity or feed unreadable); the last good one stays.",
    "leader_transitions": "Times this process started or stopped leading, by reason (acquired, released, "
                          "lost, expired).",
    "leader_errors": "Lease calls (acquire, renew, release) that failed: the backend down, slow or refusing.",
    "stale_events": "Events older than what a controller's cache held, dropped.",
    "resync_changes": "Changes a controller's repairs found that the events had missed.",
    "suspect_empty_syncs": "First syncs that found an empty store where the previous run held objects (its status "
                           "file says so): a wrong store.url or prefix, or a wiped store.",
    "envelopes_relayed": "Envelopes df-publisher-service relayed from workers to subscribers.",
    "workers_seen": "Forked workers df-publisher-service heard from for the first time.",
    "workers_forgotten": "Workers df-publisher-service forgot after their silence.",
    "feed_entries": "Change-feed entries df-feed read.",
    "feed_published": "Changes df-feed published.",
    "feed_store_errors": "Reads of the change feed that failed (retried with backoff).",
    "feed_history_gone": "Times df-feed found its position compacted away (subscribers resync).",
    "feed_declared_lost": "Times df-feed declared its topics lost (subscribers resync).",
    "feed_gone_since": "Changes deleted before df-feed could read them (their delete follows).",
    "feed_unpublishable": "Changes df-feed could not publish (too large): their topic is declared lost.",
    "feed_bookmarks": "Bookmarks df-feed sent (every entry up to its position published).",
    "feed_undecodable": "Objects df-feed could not decode (written by something else), skipped.",
    "feed_compacted": "Change-feed entries df-feed compacted away.",
    "delivered": "Notifications delivered to their endpoint.",
    "retries": "Notification deliveries retried.",
    "send_failures": "Notification sends that failed, by reason (rejected, retryable).",
    "dead_letters": "Notifications moved to the dead letters, by reason.",
    "shard_failures": "Shard tasks of df-notify that failed and were restarted.",
}

#: Help strings of the gauges; the exported name is ``dfpubsub_<name>``.
GAUGES: dict[str, str] = {
    "pending": "Notifications waiting in the shards a df-notify worker owns, per topic.",
    "shards_owned": "Shards of a topic whose lease this df-notify worker holds.",
    "workqueue_depth": "Keys waiting in a controller's work queue.",
    "workqueue_oldest_seconds": "Age of the oldest key waiting in a controller's work queue.",
    "workqueue_delayed": "Keys waiting for their retry delay to pass.",
    "workqueue_processing": "Keys being reconciled now or waiting in a worker's batch.",
    "reconcile_failed_keys": "Keys in a controller's failed set (given up until the next periodic resync).",
    "repair_position": "Store revision up to which a controller's cache holds every committed write.",
    "leader": "1 while this process holds its leader lease and may act, else 0 (a standby; [leader] enabled).",
    "leader_token": "Fencing token of the lease this process holds or last held (0: never held).",
    "up": "1 while a daemon runs (0 as it stops).",
    "synced": "1 once a daemon did its first sync (controller: cache listed and reconciled; df-feed: caught up "
              "with the feed; df-notify: queues walked).",
    "ready": "1 while every readiness check of a daemon passes (/readyz answers 200).",
    "cache_objects": "Objects in a controller's cache, per table.",
    "cache_bytes": "Bytes of the packed values and keys in a controller's cache, per table (the containers "
                   "around them cost ~90 bytes more an object).",
    "cache_tombstones": "Tombstones (deleted objects remembered for the tombstone horizon) in a controller's cache, "
                        "per table.",
    "cache_transform_errors": "Values a controller's cache transform raised on, cached whole.",
    "snapshot_age_seconds": "Seconds since a controller with a state_dir last wrote its snapshot (0: none yet).",
    "snapshot_bytes": "Size of the snapshot a controller last wrote.",
}

_SUBSCRIBER = ("events_in", "envelopes_in", "envelopes_schema1", "envelopes_schema2", "bad_values", "hellos_in", "duplicates", "gaps", "gaps_filled", "streams_rebased",
               "streams_restarted", "strings_clamped", "resync_requests", "resyncs", "resync_failures",
               "decode_errors", "drops", "handler_errors")
_PUBLISHER = ("events_out", "envelopes_out", "hellos_out", "send_errors", "drops", "subscribers_joined")
_RELAY = ("envelopes_in", "envelopes_out", "envelopes_relayed", "drops", "decode_errors", "hellos_out",
          "workers_seen", "workers_forgotten", "subscribers_joined")

#: Counters a component of each role shows from its start, at zero until they move, so a
#: scrape tells "nothing happened" from "not exported" (an alert on a rate has its series).
ROLE_COUNTERS: dict[str, tuple[str, ...]] = {
    "publisher": _PUBLISHER,
    "subscriber": _SUBSCRIBER,
    "subscriber-transport": ("decode_errors", "drops", "reopens"),
    # A controller's subscriber counts into the controller's Stats.
    "controller": _SUBSCRIBER + (
        "workqueue_adds", "workqueue_retries", "workqueue_full", "workqueue_steals", "reconciles", "reconcile_failed",
        "redeliveries", "replays", "relists", "replay_entries", "replay_objects", "relist_objects", "stale_events",
        "resync_changes", "suspect_empty_syncs", "bookmark_moves", "bookmarks_refused", "checkpoint_proofs"),
    "relay": _RELAY,
    "publisher_service": _RELAY + ("send_errors",),
    "archiver": ("events_archived", "segments_published", "segment_bytes", "journals_recovered"),
    "notifier": ("notifications_enqueued", "notifications_refused", "notifications_lost"),
    "notify": ("delivered", "retries", "send_failures", "dead_letters", "shard_failures"),
    # df-feed's publisher: a publisher's counters and the feed's (FeedPublisher seeds them).
    "feed": ("feed_entries", "feed_published", "feed_store_errors", "feed_history_gone", "feed_declared_lost",
             "feed_gone_since", "feed_unpublishable", "feed_undecodable", "feed_compacted", "feed_bookmarks"),
    "leader": ("leader_transitions", "leader_errors"),
}

#: Help strings of the histograms (seconds); exported as ``dfpubsub_<name>_seconds``.
HISTOGRAMS: dict[str, str] = {
    "workqueue_wait": "Seconds a key waited in a controller's work queue before a worker took it.",
    "workqueue_work": "Seconds a worker held a key (its reconcile, after those taken before it in its batch).",
}

#: Upper bounds of the histogram buckets: 1-2.5-5 steps from 10 us to 1000 s.
BUCKETS: tuple[float, ...] = tuple(m * 10.0 ** e for e in range(-5, 3) for m in (1, 2.5, 5)) + (1000.0,)


class Histogram:
    """Counts of observations per bucket of :data:`BUCKETS`, and their sum."""

    __slots__ = ("counts", "sum")

    def __init__(self) -> None:
        self.counts = [0] * (len(BUCKETS) + 1)  # the last one is +Inf
        self.sum = 0.0

    def observe(self, value: float, n: int = 1) -> None:
        """Count ``n`` observations of ``value`` (not locked: a lost increment under a race is tolerable)."""
        self.counts[bisect_left(BUCKETS, value)] += n
        self.sum += value * n

    @property
    def count(self) -> int:
        return sum(self.counts)

    def quantile(self, q: float) -> float:
        """Upper bound of the bucket holding the ``q`` quantile (inf past the last bound, 0 when empty)."""
        counts = list(self.counts)
        rank, seen = q * sum(counts), 0
        for i, c in enumerate(counts):
            seen += c
            if c and seen >= rank:
                return BUCKETS[i] if i < len(BUCKETS) else float("inf")
        return 0.0


class Stats:
    """Named counters of one component, optionally split by a ``reason`` label."""

    __slots__ = ("role", "name", "counts", "levels", "labelled", "histograms", "__weakref__")

    def __init__(self, role: str, name: str):
        self.role = role
        self.name = name
        self.counts: dict[tuple[str, str], int] = {}
        self.levels: dict[str, float | Callable[[], float]] = {}
        #: gauge -> (its label, a callable of label value -> value)
        self.labelled: dict[str, tuple[str, Callable[[], dict[str, float]]]] = {}
        self.histograms: dict[str, Histogram] = {}
        self.seed(*ROLE_COUNTERS.get(role, ()))
        _live.add(self)

    def seed(self, *counters: str) -> None:
        """Export ``counters`` at zero until they move (a component that plays a second role)."""
        for counter in counters:
            self.counts.setdefault((counter, ""), 0)

    def set(self, gauge: str, value: float | Callable[[], float]) -> None:
        """Set a gauge (exported as ``dfpubsub_<gauge>``); a callable is read at every scrape."""
        self.levels[gauge] = value

    def set_by(self, gauge: str, label: str, values: Callable[[], dict[str, float]]) -> None:
        """A gauge of several series, one per value of ``label`` (``dfpubsub_<gauge>{<label>=...}``),
        each scrape reading them all from ``values``."""
        self.labelled[gauge] = (label, values)

    def levels_by(self, gauge: str) -> dict[str, float]:
        """The series of a gauge set with :meth:`set_by` now ({} when never set)."""
        entry = self.labelled.get(gauge)
        return entry[1]() if entry is not None else {}

    def level(self, gauge: str) -> float:
        """Current value of a gauge (0 when never set)."""
        value = self.levels.get(gauge, 0.0)
        return value() if callable(value) else value

    def histogram(self, name: str) -> Histogram:
        """The histogram ``name`` (exported as ``dfpubsub_<name>_seconds``), made on first use."""
        hist = self.histograms.get(name)
        if hist is None:
            hist = self.histograms[name] = Histogram()
        return hist

    def inc(self, counter: str, n: int = 1, reason: str = "") -> None:
        """Add ``n`` to ``counter`` (with an optional ``reason`` label)."""
        key = (counter, reason)
        self.counts[key] = self.counts.get(key, 0) + n

    def get(self, counter: str, reason: str | None = None) -> int:
        """Current value; with ``reason=None`` the sum over all reasons."""
        if reason is not None:
            return self.counts.get((counter, reason), 0)
        return sum(v for (c, _), v in list(self.counts.items()) if c == counter)

    def by_reason(self, counter: str) -> dict[str, int]:
        """``counter``'s values by reason, those that moved."""
        return {r: v for (c, r), v in list(self.counts.items()) if c == counter and r and v}

    def snapshot(self) -> dict[str, int]:
        """All counters that moved, as ``{"name" or "name:reason": value}``."""
        return {f"{c}:{r}" if r else c: v for (c, r), v in sorted(self.counts.items()) if v}


class LabelledCounter:
    """One process-wide counter with its own labels (``dfpubsub_<name>_total{labels}``).

    For counts that belong to no single component, such as records skipped
    by whichever listing read them (:mod:`dfpubsub.backends.foreign`).
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
    """Reads every live :class:`Stats` at scrape time.

    A counter carries the ``reason`` label only if some component counted it
    with a reason; then its reason-less zero (the seed) is left out rather
    than exported as ``reason=""``.
    """

    def collect(self) -> Iterator[Metric]:
        from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily

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
        hists: dict[str, HistogramMetricFamily] = {}
        for stats in live:
            for gauge in list(stats.levels):
                gfam = gauges.get(gauge)
                if gfam is None:
                    gfam = gauges[gauge] = GaugeMetricFamily(f"dfpubsub_{gauge}", GAUGES.get(gauge, gauge),
                                                             labels=["role", "name"])
                gfam.add_metric([stats.role, stats.name], stats.level(gauge))
            for gauge, (label, read) in list(stats.labelled.items()):
                gfam = gauges.get(gauge)
                if gfam is None:
                    gfam = gauges[gauge] = GaugeMetricFamily(f"dfpubsub_{gauge}", GAUGES.get(gauge, gauge),
                                                             labels=["role", "name", label])
                for series, level in read().items():
                    gfam.add_metric([stats.role, stats.name, series], level)
            for name, hist in list(stats.histograms.items()):
                hfam = hists.get(name)
                if hfam is None:
                    hfam = hists[name] = HistogramMetricFamily(f"dfpubsub_{name}_seconds", HISTOGRAMS.get(name, name),
                                                               labels=["role", "name"])
                counts, running = list(hist.counts), 0
                buckets = []
                for bound, c in zip((*(str(b) for b in BUCKETS), "+Inf"), counts):
                    running += c
                    buckets.append((bound, running))
                hfam.add_metric([stats.role, stats.name], buckets, hist.sum)
        yield from gauges.values()
        yield from hists.values()
        for labelled in _counters:
            fam = CounterMetricFamily(f"dfpubsub_{labelled.name}", labelled.help, labels=list(labelled.labels))
            for values, value in list(labelled.counts.items()):
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
