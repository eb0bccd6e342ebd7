"""The registry of notification topics and configurations, kept in the queue backend.

Topics and configurations are small JSON records of the :class:`QueueStore`
(kinds ``topic`` and ``notification_config``), so every process sharing the
queues shares them. A persistent topic owns the queues of its shards
(:mod:`dfpubsub.queues.sharding`), created with it and deleted with it or
when it stops being persistent. Its shard count is fixed when it is created
(``shards``, or the registry's ``default_shards`` at that moment): a topic
created before the default changed keeps its count, as in Ceph.

``matching_topics()`` (and ``persistent_topics()``, a notifier's question) is
on the path of every write, so it answers from a snapshot of all topics and
configurations, reloaded when older than ``cache_ttl`` seconds (and at once
after a change made through this object): a change made by another process is
seen within ``cache_ttl``.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import NamedTuple, TypeVar

from ..backends import foreign
from ..errors import AlreadyExists, InvalidValue, QueueNotFound, TopicNotFound
from ..queues import QueueStats, QueueStore
from ..queues.sharding import shard_names
from .topics import S3_EVENT_NAMES, NotificationConfig, Topic

__all__ = ["NotificationRegistry", "TopicStats", "Match", "DEFAULT_SHARDS"]

#: Ceph's rgw_bucket_persistent_notif_num_shards.
DEFAULT_SHARDS = 11
_TOPIC, _CONFIG = "topic", "notification_config"
T = TypeVar("T")


class TopicStats(NamedTuple):
    """A topic's queues summed over its shards, and each shard's own figures."""

    topic: str
    entries: int
    bytes: int
    reservations: int
    reserved_bytes: int
    shards: dict[str, QueueStats]

    @property
    def owners(self) -> dict[str, str | None]:
        """The lease holder of each shard (None: nobody delivers it now)."""
        return {name: s.owner for name, s in self.shards.items()}


class Match(NamedTuple):
    """A configuration that matched a change, and its topic."""

    topic: Topic
    config: NotificationConfig


class _Snapshot(NamedTuple):
    at: float
    by_source: dict[str, list[Match]]
    #: (table, action) -> the matches of persistent topics whose configurations take the action:
    #: what every notified write asks, decided once per snapshot (bounded: tables x actions).
    persistent: dict[tuple[str, str], list[Match]]


class NotificationRegistry:
    """Topics and notification configurations stored in ``queues``."""

    def __init__(self, queues: QueueStore, default_shards: int = DEFAULT_SHARDS, cache_ttl: float = 1.0,
                 clock: Callable[[], float] = time.monotonic):
        if default_shards.__class__ is not int or default_shards < 1:
            raise InvalidValue(f"default_shards must be an int >= 1, not {default_shards!r}")
        self.queues = queues
        self.default_shards = default_shards
        self.cache_ttl = cache_ttl
        self._clock = clock
        self._snapshot: _Snapshot | None = None
        self._lock = threading.Lock()

    # -- topics ---------------------------------------------------------------------------------

    def create_topic(self, topic: Topic) -> Topic:
        """Create a topic (and its shards' queues if persistent); the topic as stored.

        Creating it again with the same attributes returns it;
        :class:`~dfpubsub.errors.AlreadyExists` if they differ (use :meth:`set_topic`).
        """
        if topic.shards is None:
            topic = topic.with_shards(self.default_shards)
        existing = self._load_topic(topic.name)
        if existing is not None:
            if existing == topic:
                return existing
            raise AlreadyExists(f"topic {topic.name} exists with other attributes; set_topic() changes them")
        # Queues first: a writer that sees the topic finds its queues.
        self._ensure_queues(topic)
        self.queues.put_record(_TOPIC, topic.name, topic.to_json())
        self.invalidate()
        return topic

    def get_topic(self, name: str) -> Topic:
        """The topic; :class:`~dfpubsub.errors.TopicNotFound`."""
        topic = self._load_topic(name)
        if topic is None:
            raise TopicNotFound(f"no notification topic {name!r}")
        return topic

    def list_topics(self) -> list[Topic]:
        """Every topic, by name; a record that is not a topic is skipped (dfpubsub.backends.foreign)."""
        return self._records(_TOPIC, Topic.from_json)

    def set_topic(self, topic: Topic) -> Topic:
        """Change an existing topic's attributes; the topic as stored.

        Its shard count cannot change (``shards`` None or equal): delete and
        re-create the topic for another. Turning ``persistent`` on creates the
        shards' queues; turning it off deletes them with their pending entries.
        New queue limits apply to the existing shards.
        """
        old = self.get_topic(topic.name)
        if topic.shards is not None and topic.shards != old.shards:
            raise InvalidValue(f"topic {topic.name} has {old.shards} shards; delete and re-create it to change that")
        assert old.shards is not None
        topic = topic.with_shards(old.shards)
        if topic.persistent:
            self._ensure_queues(topic)
        self.queues.put_record(_TOPIC, topic.name, topic.to_json())
        if old.persistent and not topic.persistent:  # after the record: writers stop reserving first
            self._drop_queues(old)
        self.invalidate()
        return topic

    def delete_topic(self, name: str) -> bool:
        """Delete a topic, the configurations that use it and its queues; False if there was none."""
        topic = self._load_topic(name)
        for config in self.get_configurations():
            if config.topic == name:
                self.queues.delete_record(_CONFIG, self._config_name(config.source, config.id))
        existed = self.queues.delete_record(_TOPIC, name)
        if topic is not None:
            self._drop_queues(topic)
        self.invalidate()
        return existed

    def shard_names(self, topic: Topic) -> list[str]:
        """The queues of a persistent topic (none for another)."""
        assert topic.shards is not None, "a stored topic has its shard count"
        return shard_names(topic.name, topic.shards) if topic.persistent else []

    def topic_stats(self, name: str) -> TopicStats:
        """Entries, bytes and reservations summed over the topic's shards, and each shard's stats."""
        shards: dict[str, QueueStats] = {}
        for queue in self.shard_names(self.get_topic(name)):
            try:
                shards[queue] = self.queues.stats(queue)
            except QueueNotFound:  # the topic was just made non-persistent or deleted
                continue
        stats = list(shards.values())
        return TopicStats(name, sum(s.entries for s in stats), sum(s.bytes for s in stats),
                          sum(s.reservations for s in stats), sum(s.reserved_bytes for s in stats), shards)

    def _load_topic(self, name: str) -> Topic | None:
        if not isinstance(name, str) or not name:
            raise InvalidValue(f"topic name must be a non-empty str, not {name!r}")
        blob = self.queues.get_record(_TOPIC, name)
        return None if blob is None else Topic.from_json(blob)

    def _ensure_queues(self, topic: Topic) -> None:
        for queue in self.shard_names(topic):
            self.queues.create_queue(queue, topic.max_bytes, topic.max_entries, topic.stale_after)

    def _drop_queues(self, topic: Topic) -> None:
        for queue in shard_names(topic.name, topic.shards or 1):
            self.queues.delete_queue(queue)

    # -- configurations -------------------------------------------------------------------------

    @staticmethod
    def _config_name(source: str, config_id: str) -> str:
        return f"{source}/{config_id}"

    def put_configuration(self, config: NotificationConfig) -> None:
        """Add a configuration, or replace the one of the same source and id; its topic must exist."""
        self.get_topic(config.topic)
        self.queues.put_record(_CONFIG, self._config_name(config.source, config.id), config.to_json())
        self.invalidate()

    def get_configurations(self, source: str | None = None) -> list[NotificationConfig]:
        """The configurations of ``source`` (all if None), by source and id."""
        configs = self._records(_CONFIG, NotificationConfig.from_json)
        return [c for c in configs if source is None or c.source == source]

    def _records(self, kind: str, decode: Callable[[bytes], T]) -> list[T]:
        """The records of ``kind`` by name, decoded; one that does not decode is skipped and counted,
        so a foreign record never stops the writes and deliveries of the others."""
        out = []
        for name, blob in sorted(self.queues.list_records(kind).items()):
            record = foreign.decode(f"notify_{kind}", self.queues.record_key(kind, name), decode, blob)
            if record is not None:
                out.append(record)
        return out

    def delete_configuration(self, source: str, config_id: str | None = None) -> int:
        """Delete one configuration of ``source``, or all of them if ``config_id`` is None; how many."""
        ids = [c.id for c in self.get_configurations(source)] if config_id is None else [config_id]
        deleted = sum(self.queues.delete_record(_CONFIG, self._config_name(source, i)) for i in ids)
        self.invalidate()
        return deleted

    # -- the write path ---------------------------------------------------------------------------

    def matching_topics(self, table: str, key: str, action: str) -> list[Match]:
        """The configurations (with their topics) that a change of ``key`` in ``table`` by
        ``action`` matches, from a snapshot at most ``cache_ttl`` seconds old."""
        snapshot = self._snapshot
        if snapshot is None or self._clock() - snapshot.at > self.cache_ttl:
            snapshot = self._load()
        candidates = snapshot.by_source.get(table)
        if not candidates:
            return []
        return [m for m in candidates if m.config.matches(table, key, action)]

    def persistent_topics(self, table: str, key: str, action: str) -> list[Match]:
        """:meth:`matching_topics` of persistent topics only: :meth:`persistent_matches` whose
        configurations take ``key`` (its prefix and suffix)."""
        return [m for m in self.persistent_matches(table, action)
                if key.startswith(m.config.prefix) and key.endswith(m.config.suffix)]

    def persistent_matches(self, table: str, action: str) -> list[Match]:
        """The matches of persistent topics whose configurations take ``action`` on ``table``,
        whatever the key, as a notifier asks for every write: decided once per snapshot, and the
        same list object for as long as the snapshot serves (a notifier keys what it derives from
        them on it)."""
        snapshot = self._snapshot
        if snapshot is None or self._clock() - snapshot.at > self.cache_ttl:
            snapshot = self._load()
        found = snapshot.persistent.get((table, action))
        if found is None:
            candidates = snapshot.by_source.get(table)
            if not candidates:
                return []
            found = [m for m in candidates if m.topic.persistent and m.config.matches_action(action)]
            if action in S3_EVENT_NAMES:  # a configured table and a real action: bounded
                snapshot.persistent[(table, action)] = found
        return found

    def invalidate(self) -> None:
        """Drop the snapshot: the next :meth:`matching_topics` reloads."""
        self._snapshot = None

    def _load(self) -> _Snapshot:
        with self._lock:
            at = self._clock()
            topics = {t.name: t for t in self.list_topics()}
            by_source: dict[str, list[Match]] = {}
            for config in self.get_configurations():
                topic = topics.get(config.topic)
                if topic is not None:
                    by_source.setdefault(config.source, []).append(Match(topic, config))
            self._snapshot = _Snapshot(at, by_source, {})
            return self._snapshot
