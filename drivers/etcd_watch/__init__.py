"""etcd driver (``etcd://host:port[,host:port...]``): envelopes are leased keys, subscribers watch them.

A publisher puts each envelope under ``/{prefix}/ps/{topic}/{writer}-{n}``
(``writer`` is random per transport, ``n`` counts up). A thread writes them:
whatever queued up while one transaction was in flight goes in the next, up
to ``max_txn_ops`` envelopes or 1 MiB (group commit), so a lone envelope is
written at once and a busy publisher makes few round trips; ``send()`` waits
only while the next transaction is full. Keys carry a lease so that etcd does
not grow without bound. Leases are never kept alive: a fresh one is granted
every ``lease_ttl / 2`` seconds with a TTL of ``1.5 * lease_ttl``, and new
keys take the current one, so an envelope lives ``lease_ttl`` to
``1.5 * lease_ttl`` seconds.

A subscriber watches the whole ``/{prefix}/ps/`` range on one Watch stream and
keeps the envelopes of its topics (the key names the topic; the core checks
again); DELETE events (leases expiring) are filtered out by etcd. The watch
starts at the revision current when the first topic was subscribed, plus one.
After a lost connection, a restarted etcd, a fork, or a pause (``recv()`` not
keeping up with ``max_pending_bytes``), it resumes at the revision after the
last one received, so nothing written meanwhile is missed. When etcd has
compacted that revision away the history is gone: ``on_lost(topic,
"compacted")`` is called for every subscribed topic and the watch continues
from the current revision.

gRPC is used as in :mod:`dfpubsub.store.etcd`: aetcd's generated stubs and
messages on a synchronous channel (aetcd's own client is asyncio-only). A
channel is opened on first use, dropped after a failure (the next call
connects again, to the next endpoint) and closed just before ``os.fork()``
once the calls in flight have ended; both processes then reopen it.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from dfpubsub.backends.etcd import parse_endpoints
from dfpubsub.errors import ConfigError
from dfpubsub.metrics import Stats
from dfpubsub.transport import Driver, PublisherTransport, SubscriberTransport

from .publisher import EtcdPublisher
from .subscriber import EtcdSubscriber

__all__ = ["EtcdWatchDriver", "EtcdWatchOptions"]


class EtcdWatchOptions(BaseModel):
    """Options of the ``etcd`` driver (config table ``[driver.etcd]``)."""

    model_config = ConfigDict(extra="forbid")

    prefix: str = Field("dfpubsub", min_length=1, pattern=r"^[^/\x00]+$",
                        description="Envelopes live under /{prefix}/ps/.")
    lease_ttl: int = Field(60, ge=1, le=10**9, description="Seconds envelopes live in etcd (up to 1.5 times that).")
    timeout: float = Field(5.0, gt=0, description="Deadline of each etcd request, seconds.")
    max_txn_ops: int = Field(128, ge=1, description="Envelopes per transaction at most (etcd's --max-txn-ops).")
    max_pending_bytes: int = Field(
        64 << 20, ge=1, description="Bytes a subscriber holds for recv(); beyond, its watch pauses and later resumes."
    )


class EtcdWatchDriver(Driver):
    """``etcd://host:port[,host:port...]``: envelopes are leased etcd keys that subscribers watch."""

    name = "etcd"
    options_model = EtcdWatchOptions

    def __init__(self, url: str | None = None, options: Mapping[str, Any] | None = None):
        super().__init__(url, options)
        try:
            self.etcd_options = EtcdWatchOptions(**self.options)
        except ValidationError as exc:
            raise ConfigError(f"invalid [driver.etcd] options: {exc}") from exc
        if not url:
            raise ConfigError("the etcd driver needs a URL such as etcd://127.0.0.1:2379")
        parse_endpoints(url)
        self._url: str = url

    def publisher(self, stats: Stats) -> PublisherTransport:
        return EtcdPublisher(self._url, self.etcd_options, stats)

    def subscriber(self, stats: Stats) -> SubscriberTransport:
        return EtcdSubscriber(self._url, self.etcd_options, stats)
