"""Which shard (queue) of a topic a notification goes to.

A persistent topic of ``n`` shards has the queues ``topic``, ``topic.1`` …
``topic.(n-1)``: shard 0 is named like the topic, as in Ceph, so a one-shard
topic is simply the queue of its name. A notification about ``key`` in
``bucket`` (a table) goes to shard ``crc32("bucket:key") % n``: every change
of one key lands in one shard, whose queue keeps commit order, so per-key
order holds. CRC-32 (``zlib.crc32`` of the UTF-8 bytes, the IEEE polynomial
of zip and PNG) is stable across processes, hosts, Python versions and
languages, unlike Python's ``hash()``, which is salted per process.
"""

from __future__ import annotations

import zlib

from ..errors import InvalidValue

__all__ = ["shard_names", "shard_name", "shard_index", "shard_for", "key_hash"]


def _check(shards: int) -> None:
    if shards.__class__ is not int or shards < 1:
        raise InvalidValue(f"shards must be an int >= 1, not {shards!r}")


def shard_name(topic: str, index: int) -> str:
    """The queue of shard ``index`` of ``topic``."""
    return topic if index == 0 else f"{topic}.{index}"


def shard_names(topic: str, shards: int) -> list[str]:
    """The queues of a topic of ``shards`` shards, shard 0 first."""
    _check(shards)
    return [topic] + [f"{topic}.{i}" for i in range(1, shards)]


def key_hash(bucket: str, key: str) -> int:
    """``crc32("bucket:key")``: modulo a topic's shard count, the index of the key's shard (one
    hash serves every topic of a change)."""
    return zlib.crc32(f"{bucket}:{key}".encode())


def shard_index(bucket: str, key: str, shards: int) -> int:
    """``crc32("bucket:key") % shards``: the same on every host and in every language."""
    _check(shards)
    return key_hash(bucket, key) % shards


def shard_for(topic: str, shards: int, bucket: str, key: str) -> str:
    """The queue a notification about ``key`` of ``bucket`` goes to."""
    return shard_name(topic, shard_index(bucket, key, shards))
