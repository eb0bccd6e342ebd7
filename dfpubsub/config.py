"""Settings: declared once here, loaded from a TOML file, the environment and flags.

Precedence, highest first: command-line flags (``--pubsub.max-idle-time 3``),
environment (``DFPUBSUB_PUBSUB__MAX_IDLE_TIME=3``), the TOML file
(``--config`` or ``$DFPUBSUB_CONFIG``; sample in ``etc/dfpubsub.toml``), then
the defaults below. Everything is validated at start-up; a bad value raises
:class:`~dfpubsub.errors.ConfigError` naming the setting and its source.
"""

from __future__ import annotations

import argparse
import os
import tomllib
from collections.abc import Iterable
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator
from pydantic_settings import (
    BaseSettings,
    EnvSettingsSource,
    PydanticBaseSettingsSource,
    SettingsConfigDict,
    SettingsError,
)

from ._version import __version__
from .backends.access import ETCD_CONNECT_TIMEOUT, EtcdAccess, NatsAccess, RedisAccess
from .backends.access import configure as configure_backends
from .console import ArgumentParser
from .errors import ConfigError

__all__ = [
    "PubSubSettings",
    "CacheSettings",
    "StoreSettings",
    "NbApiSettings",
    "FeedSettings",
    "ControllerSettings",
    "ArchiveSettings",
    "PublisherServiceSettings",
    "NotifySettings",
    "LogSettings",
    "MetricsSettings",
    "DiscoverySettings",
    "LeaderSettings",
    "RelistSettings",
    "MAX_RELIST_LEASE",
    "EtcdSettings",
    "RedisSettings",
    "NatsSettings",
    "Settings",
    "load_settings",
    "add_config_arguments",
    "settings_from_args",
    "parse_settings",
]

CONFIG_ENV = "DFPUBSUB_CONFIG"


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid", validate_assignment=True)


class PubSubSettings(_Section):
    """``[pubsub]``: the transport and the reliability protocol."""

    driver: str = Field("zmq+tcp://127.0.0.1:8866", description="Driver name or URL, e.g. zmq+tcp://host:port, memory.")
    publisher_name: str = Field("", description="Stable, human-readable publisher name (default: host:object).")
    topics: list[str] = Field(default_factory=list, description="Topics a subscriber takes.")
    max_idle_time: float = Field(5.0, gt=0, description="Seconds of silence after which a publisher says hello.")
    message_delay_window: float = Field(0.5, gt=0, description="Seconds a subscriber waits for a missing message.")
    batch_max_events: int = Field(128, ge=1, description="Events per envelope at most.")
    batch_max_bytes: int = Field(256 * 1024, ge=256, description="Bytes of events per envelope at most.")
    batch_linger: float = Field(0.002, ge=0, description="Seconds a partial batch of a busy publisher waits for more events (0: no batching); "
                                "below 30 events per ms every event is sent at once.")
    batch_pause: float = Field(0.0001, ge=0, description="Seconds without a publish after which a partial batch "
                               "leaves before its linger: the caller's burst has ended (0: wait out the linger).")
    max_message_bytes: int = Field(1 << 20, ge=1024, description="Largest envelope sent or accepted, bytes.")
    schema_version: int = Field(
        1, ge=1, le=2, description="Wire schema of the event envelopes a publisher sends (docs/protocol.md §4.6): 2 "
                                   "carries each value as the store's msgpack bytes, not decoded and encoded again "
                                   "on the way; subscribers that know only schema 1 drop those, so upgrade every "
                                   "subscriber first (docs/deploy.md).")
    queue_size: int = Field(4096, ge=1, description="Envelopes buffered between receive and dispatch.")
    max_held: int = Field(1024, ge=1, description="Envelopes held per stream while a gap is open.")
    resync_base_interval: float = Field(0.1, ge=0, description="Least seconds between two resyncs.")
    resync_max_interval: float = Field(5.0, gt=0, description="Most seconds of resync backoff.")
    dead_after_idles: float = Field(3.0, ge=2, description="A publisher silent this many max_idle_times is dead.")
    max_publishers: int = Field(
        10_000, ge=1, description="Publishers a subscriber tracks at once; beyond, the longest silent are "
                                  "forgotten and their topics resynced (docs/security.md).")
    max_held_bytes: int = Field(64 << 20, ge=1024, description="Bytes of envelopes a subscriber holds over all "
                                                               "streams while gaps are open.")
    max_seq_jump: int = Field(
        100_000, ge=1, description="An envelope or hello this far below a stream's expected sequence restarts the "
                                   "stream there, with a resync (only a forged number can put a stream that far "
                                   "ahead of its publisher).")
    max_hello_idle: float = Field(3600.0, gt=0, description="Largest max_idle_time a subscriber believes of a "
                                                            "hello; larger ones are clamped.")
    forget_silent_after: float = Field(
        3600.0, gt=0, description="Seconds after which a silent publisher whose hellos turn dead-publisher "
                                  "detection off (max_idle_time <= 0, NaN or infinite) is forgotten.")
    multiproc: bool = Field(
        False, description="Publish through the host's publisher service (forked API workers) instead of binding."
    )
    multiproc_socket: str = Field(
        "/run/dfpubsub/publisher.sock", min_length=1,
        description="ipc socket of the host's publisher service (workers connect, the service binds).",
    )
    multiproc_batch_linger: float = Field(
        0.005, ge=0,
        description="batch_linger of a worker publishing through the service (when it batches: above 30 "
                    "events per ms): longer, as each envelope "
                    "costs the service a receive and a send and a worker has a fraction of the host's events.",
    )

    @model_validator(mode="after")
    def _check(self) -> PubSubSettings:
        if self.batch_max_bytes > self.max_message_bytes:
            raise ValueError("batch_max_bytes must not exceed max_message_bytes")
        if self.resync_max_interval < self.resync_base_interval:
            raise ValueError("resync_max_interval must be at least resync_base_interval")
        if max(self.batch_linger, self.multiproc_batch_linger) >= self.message_delay_window:
            raise ValueError("batch_linger and multiproc_batch_linger must be well under message_delay_window")
        return self


class CacheSettings(_Section):
    """``[cache]``: the subscriber's versioned cache."""

    tombstone_horizon: float = Field(300.0, gt=0, description="Seconds a delete's tombstone blocks older updates.")


class StoreSettings(_Section):
    """``[store]``: the northbound DB."""

    url: str = Field(
        "sqlite:////var/lib/dfpubsub/nb.sqlite",
        description="sqlite:////abs/path or sqlite:///rel/path (embedded, default), etcd://host:port, "
        "redis://host:port/db or redis+sentinel://host:port[,host:port]/master/db.",
    )
    tables: list[str] = Field(
        default_factory=lambda: ["chassis", "network", "subnet", "port", "router", "secgroup"],
        description="The tables of the schema; any other table is an error.",
    )
    max_value_bytes: int = Field(1 << 20, ge=1024, description="Largest object value, bytes (msgpack).")
    prefix: str = Field("dfpubsub", description="Key namespace on etcd and Redis.")
    create: bool = Field(False, description="Daemons create a store (and a SQLite discovery table) that does not "
                         "exist (else they refuse to start: a mistyped path, Redis database or prefix must not "
                         "become an empty store; df-db init creates one).")


class NbApiSettings(_Section):
    """``[nbapi]``: how NbApi writers publish (docs/feed.md)."""

    publish: Literal["direct", "feed", "both"] = Field(
        "both", description="direct: publish after each write; feed: only write, df-feed publishes; "
        "both: publish directly and let df-feed publish every committed write too (the safety net).",
    )


class FeedSettings(_Section):
    """``[feed]``: the store's change feed and df-feed, which publishes it (docs/feed.md)."""

    max_entries: int = Field(100_000, ge=100, description="Feed entries the store keeps at most (SQLite, Redis).")
    max_age: float = Field(3600.0, gt=0, description="Seconds a feed entry is kept at most (SQLite, Redis; "
                           "df-feed compacts); etcd's own compaction bounds its history.")
    cursor: str = Field("/var/lib/dfpubsub/feed.cursor",
                        description="df-feed: file keeping its position (one per df-feed; empty: none, "
                        "every start makes subscribers resync).")
    fsync: bool = Field(False, description="df-feed: fsync the cursor after each batch.")
    batch: int = Field(1000, ge=1, description="df-feed: entries read and published per batch.")
    compact_interval: float = Field(60.0, ge=0, description="df-feed: seconds between compactions (0: never).")
    announce: bool = Field(True, description="df-feed: register in the [discovery] table.")
    advertise_host: str = Field("", description="df-feed: host subscribers reach a wildcard-bound endpoint at.")
    ready_lag: int = Field(10_000, ge=1, description="df-feed: /readyz fails while the reader is more than this "
                           "many revisions behind the feed's head.")
    bookmark_interval: float = Field(
        1.0, ge=0, description="df-feed: seconds between bookmarks while entries come (one also goes out as soon as "
        "the feed goes quiet); controllers that trust it move their positions on them without reading the store "
        "(0: none).")


class ControllerSettings(_Section):
    """``[controller]``: the controller runtime (df-controller)."""

    name: str = Field("", description="Name in logs and metrics (default: host name).")
    reconcile_interval: float = Field(0.0, ge=0, description="Seconds between full reconciles (0: only on gaps).")
    discover: bool = Field(False, description="Connect to the publishers listed in the [discovery] table.")
    bookmarks: bool = Field(
        True, description="With discover: move the positions on the bookmarks of the df-feeds the [discovery] table "
        "names (role feed), so a checkpoint reads one revision instead of every entry since the last one.")
    bootstrap: str = Field(
        "", description="Snapshot root (df-pipeline compact) to full-sync from, then catch up from the store; "
        "empty: list the whole store.",
    )
    workers: int = Field(2, ge=1, le=256, description="Reconciler threads; a key is never with two at once.")
    resync_period: float = Field(
        600.0, ge=0, description="Seconds between re-deliveries of every cached key to the reconcilers, "
        "jittered by 10% (0: never); also retries the failed set.",
    )
    max_retries: int = Field(0, ge=0, description="Failures of a key before it goes to the failed set (0: no limit).")
    queue_size: int = Field(65536, ge=1, description="Keys waiting in the work queue at most (adds wait beyond).")
    retry_base_delay: float = Field(0.005, gt=0, description="Seconds of a key's first retry delay; doubles per failure.")
    retry_max_delay: float = Field(1000.0, gt=0, description="Seconds of a key's retry delay at most.")
    retry_qps: float = Field(10.0, gt=0, description="Retries per second of all keys together (token bucket).")
    retry_burst: int = Field(100, ge=1, description="Retries the token bucket grants at once.")
    sync_drains_queue: bool = Field(
        True, description="'synced' also waits for the reconcilers to take the first full sync (queue drained once).",
    )
    replay_max_ratio: float = Field(
        0.5, gt=0, description="A repair replays the store's change feed unless it holds more entries than this "
        "share of the cached objects (at least 1000), over what a feed entry costs against an object's version "
        "in a listing (SQLite 1.2, Redis 2.8, etcd 12); then it relists.",
    )
    checkpoint_interval: float = Field(
        60.0, ge=0, description="Seconds without a repair after which a replay moves the cache's feed position on, "
        "keeping it within the feed's history (0: never; then a repair after the history is gone relists).",
    )
    decoded_cache: int = Field(
        4096, ge=0, le=1 << 22, description="Objects the cache keeps decoded besides packed: the last ones written, "
        "which reconcilers read next (0: decode every read).",
    )
    state_dir: str = Field(
        "", description="Directory of the controller's snapshot (its cache, positions and tombstones), written every "
        "snapshot_interval and at a clean stop; a start resumes from it and reads only what changed while the "
        "controller was down (docs/controller.md#warm-restarts). Empty: none, every start lists the store.")
    snapshot_interval: float = Field(
        300.0, ge=0, description="With state_dir: seconds between snapshots (0: only at a clean stop).")
    snapshot_required: bool = Field(
        False, description="With state_dir: /readyz fails while the last snapshot could not be written (a full or "
        "read-only state_dir); without it, that is only counted (snapshot_errors) and logged.")
    status_file: str = Field("", description="File rewritten with synced, queue depth and the failed set, for "
                                             "df-db controller-status (empty: none).")
    status_interval: float = Field(5.0, gt=0, description="Seconds between rewrites of status_file.")

    @model_validator(mode="after")
    def _check(self) -> ControllerSettings:
        if self.retry_max_delay < self.retry_base_delay:
            raise ValueError("controller.retry_max_delay must be at least controller.retry_base_delay")
        return self


class ArchiveSettings(_Section):
    """``[archive]``: df-archiver, which writes the event log (docs/pipeline.md)."""

    path: str = Field("/var/lib/dfpubsub/archive", min_length=1, description="Root of the event log.")
    segment_max_bytes: int = Field(32 << 20, ge=1024, description="A segment rolls when its rows reach this size.")
    segment_max_age: float = Field(60.0, gt=0, description="A segment rolls this many seconds after its first row.")
    fsync: bool = Field(True, description="fsync segments and journals as they are published.")
    name: str = Field("", description="Name in logs and metrics (default: host name).")
    discover: bool = Field(False, description="Connect to the publishers listed in the [discovery] table.")
    backfill: bool = Field(
        False, description="Check what was received against the store's change feed ([store] url) and archive the "
        "writes that were not, a restart or a new leader included (docs/pipeline.md, \"No hole\").")
    backfill_after: float = Field(
        10.0, gt=0, description="Seconds a write in the feed waits for its event before it is read from the "
        "store instead (longer: fewer writes archived twice when events come late).")


class PublisherServiceSettings(_Section):
    """``[publisher_service]``: df-publisher-service, which relays forked workers' events."""

    announce: bool = Field(True, description="Register the service in the [discovery] table.")
    advertise_host: str = Field("", description="Host subscribers reach a wildcard-bound endpoint at.")
    drain_timeout: float = Field(2.0, ge=0, description="Seconds SIGTERM waits for workers' last envelopes.")
    max_workers: int = Field(1024, ge=1, description="Workers the service tracks for its welcomes; a worker "
                                                     "beyond is relayed all the same, and subscribers learn its "
                                                     "sequences from its envelopes (a resync each).")
    max_topics: int = Field(10_000, ge=1, description="Topics the service tracks (per worker, and in all); "
                                                      "envelopes on topics beyond are relayed all the same.")


class NotifySettings(_Section):
    """``[notify]``: persistent notifications (writers' queues and the df-notify workers)."""

    url: str = Field("", description="Queue backend URL, like store.url; empty: the store's URL.")
    enabled: bool = Field(False, description="Writers through NbApi enqueue notifications for matching topics.")
    default_shards: int = Field(11, ge=1, le=1024, description="Shards of a new topic (existing topics keep theirs).")
    renew_interval: float = Field(30.0, gt=0, description="df-notify: seconds between lease renewals (walks).")
    lease: float = Field(90.0, gt=0, description="df-notify: seconds after which another worker takes a shard.")
    poll_interval: float = Field(0.2, gt=0, description="df-notify: seconds an empty shard waits before listing again.")
    batch_size: int = Field(100, ge=1, description="df-notify: entries listed and delivered per round.")
    max_inflight: int = Field(64, ge=1, description="df-notify: endpoint sends in flight at once, all topics.")
    endpoint_inflight: int = Field(8, ge=1, description="df-notify: sends in flight at once per topic's endpoint "
                                                       "(a topic's max_inflight endpoint option overrides it).")
    bridge: bool = Field(False, description="df-notify: enqueue events arriving over pub/sub (writers not on NbApi).")
    worker_id: str = Field("", description="df-notify: lease owner name (default: host:pid).")

    @model_validator(mode="after")
    def _check(self) -> NotifySettings:
        if self.renew_interval > self.lease / 3:
            raise ValueError(
                f"notify.renew_interval ({self.renew_interval:g} s) must be at most notify.lease / 3 "
                f"({self.lease / 3:g} s), so that an owner survives two late renewals"
            )
        return self


class LogSettings(_Section):
    """``[log]``."""

    level: Literal["debug", "info", "warning", "error"] = Field("info", description="Log level.")
    format: Literal["json", "text"] = Field("json", description="json (one object per line) or text.")


class MetricsSettings(_Section):
    """``[metrics]``: the Prometheus endpoint."""

    port: int = Field(0, ge=0, le=65535, description="HTTP port of /metrics (0: off).")
    addr: str = Field("127.0.0.1", description="Address the metrics server binds.")


class DiscoverySettings(_Section):
    """``[discovery]``: the publishers' leased registrations (see :mod:`dfpubsub.discovery`)."""

    url: str = Field("", description="Discovery backend URL, like store.url; empty: the store's URL.")
    ttl: float = Field(10.0, gt=0, description="Seconds a registration lives without renewal.")
    renew_interval: float = Field(3.0, gt=0, description="Seconds between renewals; at most ttl / 3.")
    prefix: str = Field("dfpubsub", min_length=1, description="Key namespace of the registrations.")

    @model_validator(mode="after")
    def _check(self) -> DiscoverySettings:
        # Dragonflow renewed at about its timeout, so live publishers were collected as dead.
        if self.renew_interval > self.ttl / 3:
            raise ValueError(
                f"discovery.renew_interval ({self.renew_interval:g} s) must be at most discovery.ttl / 3 "
                f"({self.ttl / 3:g} s with discovery.ttl = {self.ttl:g} s), so that a live publisher "
                "survives two lost renewals; lower discovery.renew_interval or raise discovery.ttl"
            )
        return self


class LeaderSettings(_Section):
    """``[leader]``: one active instance of df-archiver, df-feed or df-controller, the others standing by
    (docs/leader.md)."""

    enabled: bool = Field(False, description="Act only while holding the leader lease; a standby takes over "
                                             "when the holder stops renewing it.")
    url: str = Field("", description="Lease backend URL, like store.url; empty: the store's URL.")
    name: str = Field("", description="The election: instances with the same name share one lease "
                                      "(default: the daemon's name, e.g. df-archiver).")
    identity: str = Field("", description="This instance in the lease, logs and metrics (default: host:pid).")
    lease_duration: float = Field(15.0, gt=0, description="Seconds after its last renewal at which a lease "
                                                          "passes to a standby (etcd rounds up to whole seconds, "
                                                          "at least 2).")
    renew_deadline: float = Field(10.0, gt=0, description="Seconds after its last renewal at which the holder "
                                                          "stops acting: before the lease can pass to another.")
    retry_period: float = Field(2.0, gt=0, description="Seconds between renewals, and between a standby's tries.")
    clock_skew: float = Field(1.0, ge=0, description="Seconds the holder's clock may run slow against the "
                                                     "backend's over one lease: lease_duration - renew_deadline "
                                                     "must be at least this.")

    @model_validator(mode="after")
    def _check(self) -> LeaderSettings:
        if self.renew_deadline + self.clock_skew > self.lease_duration:
            raise ValueError(
                f"leader.renew_deadline ({self.renew_deadline:g} s) + leader.clock_skew ({self.clock_skew:g} s) "
                f"must be at most leader.lease_duration ({self.lease_duration:g} s), so that the holder stops "
                "acting before its lease can pass to another")
        if 2 * self.retry_period > self.renew_deadline:
            raise ValueError(
                f"leader.retry_period ({self.retry_period:g} s) must be at most leader.renew_deadline / 2 "
                f"({self.renew_deadline / 2:g} s), so that the holder tries at least twice before it gives up")
        return self


#: Seconds a relist slot's lease may last at most: a slot read back claiming more is garbage.
MAX_RELIST_LEASE = 300.0


class RelistSettings(_Section):
    """``[relist]``: relists that never storm the store (docs/controller.md#relist-admission): a bound
    on the relists the store serves at once, shared through the store itself, jittered starts, and
    listings read in pages."""

    slots: int = Field(8, ge=0, le=1024, description="Relists the store serves at once, counted over every "
                                                      "controller that shares it (0: no bound).")
    url: str = Field("", description="Where the slots live, like store.url; empty: the store's URL (so the "
                                     "bound holds across hosts).")
    name: str = Field("relist", description="The semaphore: controllers with the same name share its slots.")
    lease: float = Field(30.0, gt=1, le=MAX_RELIST_LEASE, description="Seconds a slot stays taken after its "
                                                                      "holder's last renewal (a controller killed "
                                                                      "while listing frees it within this).")
    jitter: float = Field(2.0, ge=0, description="Seconds, at most, of random delay before a relist first asks for "
                                                 "a slot (spreads a fleet's cold start).")
    retry_base: float = Field(0.2, gt=0, description="Seconds of the first wait for a slot; doubles per refusal, "
                                                     "jittered.")
    retry_max: float = Field(5.0, gt=0, description="Seconds of a wait for a slot at most.")
    page_size: int = Field(5000, ge=0, description="Objects per page of a relist's listing of values, each "
                                                   "merged into the cache before the next is read (0: the "
                                                   "listing in one piece).")

    @model_validator(mode="after")
    def _check(self) -> RelistSettings:
        if self.retry_max < self.retry_base:
            raise ValueError("relist.retry_max must be at least relist.retry_base")
        return self


def _check_access(section: str, s: Any, password_needs_user: bool = False) -> None:
    """What the [etcd], [redis] and [nats] sections share: readable files, a certificate with its
    key, one password setting (and, where the URL cannot give the user, no password without it)."""
    for name in ("ca_file", "cert_file", "key_file", "password_file"):
        path = getattr(s, name)
        if path and not os.path.isfile(path):
            raise ValueError(f"{section}.{name} {path!r} is not a readable file")
    if bool(s.cert_file) != bool(s.key_file):
        raise ValueError(f"{section}.cert_file and {section}.key_file go together")
    _password(section, s.password, s.password_file)
    if password_needs_user and (s.password or s.password_file) and not s.username:
        raise ValueError(f"{section}.password needs {section}.username")


def _password(section: str, password: str, password_file: str) -> str:
    """The password, or the first line of ``password_file`` (kept out of flags and process lists)."""
    if password and password_file:
        raise ValueError(f"set {section}.password or {section}.password_file, not both")
    if not password_file:
        return password
    try:
        with open(password_file, encoding="utf-8") as f:
            return f.readline().rstrip("\r\n")
    except (OSError, UnicodeError) as exc:
        raise ValueError(f"{section}.password_file {password_file!r}: {exc}") from exc


class EtcdSettings(_Section):
    """``[etcd]``: TLS, credentials and the connect timeout of every etcd connection (store, feed, discovery,
    queues, leases, driver)."""

    ca_file: str = Field("", description="PEM CA bundle the servers' certificates are checked with; turns TLS on.")
    cert_file: str = Field("", description="PEM client certificate (etcd --client-cert-auth); turns TLS on.")
    key_file: str = Field("", description="PEM key of cert_file.")
    server_name: str = Field("", description="Name the servers' certificates must carry (default: the host).")
    username: str = Field("", description="etcd user (auth enabled); empty: no authentication.")
    password: str = Field("", description="Its password (prefer password_file).")
    password_file: str = Field("", description="File whose first line is the password.")
    connect_timeout: float = Field(
        ETCD_CONNECT_TIMEOUT, gt=0,
        description="Seconds a connection to an etcd endpoint may take to come up (TCP, TLS, HTTP/2 settings: "
        "about four round trips); the default leaves room for 500 ms of round trip (a WAN, another region) "
        "with TLS and a lost packet. An endpoint that never answers costs this much before the next is tried.")

    @model_validator(mode="after")
    def _check(self) -> EtcdSettings:
        _check_access("etcd", self, password_needs_user=True)
        return self

    def access(self) -> EtcdAccess:
        return EtcdAccess(self.ca_file, self.cert_file, self.key_file, self.username,
                          _password("etcd", self.password, self.password_file), self.server_name,
                          self.connect_timeout)


class _ClientSettings(_Section):
    """What the [redis] and [nats] sections share: a user and TLS that override the URL's."""

    username: str = Field("", description="User (a Redis ACL user, a NATS user); empty: the URL's.")
    password: str = Field("", description="Its password (prefer password_file); empty: the URL's.")
    password_file: str = Field("", description="File whose first line is the password.")
    tls: bool = Field(False, description="Connect with TLS (as a rediss:// or nats+tls:// URL does).")
    ca_file: str = Field("", description="PEM CA bundle the server's certificate is checked with; implies tls.")
    cert_file: str = Field("", description="PEM client certificate, for servers that check clients; implies tls.")
    key_file: str = Field("", description="PEM key of cert_file.")
    check_hostname: bool = Field(True, description="Check the server's certificate names its host.")


class RedisSettings(_ClientSettings):
    """``[redis]``: ACL user and TLS of every Redis connection (store, discovery, queues, driver);
    they override the URL's. Through Sentinel (``redis+sentinel://``) the sentinels take the same
    TLS and a user of their own; ``wait_replicas`` makes every write wait for replicas."""

    sentinel_username: str = Field("", description="User of the sentinels (their ACL); empty: none.")
    sentinel_password: str = Field("", description="Its password (prefer sentinel_password_file).")
    sentinel_password_file: str = Field("", description="File whose first line is the sentinels' password.")
    wait_replicas: int = Field(
        0, ge=0, le=16, description="Replicas each write waits for (WAIT) before it returns; fewer within "
        "wait_timeout: WriteOutcomeUnknown. 0: none (a failover may lose a write that returned).")
    wait_timeout: float = Field(1.0, gt=0, description="Seconds a write waits for wait_replicas replicas (keep it "
                                "below the clients' socket timeouts, 5 s by default).")

    @model_validator(mode="after")
    def _check(self) -> RedisSettings:
        _check_access("redis", self)
        if self.sentinel_password_file and not os.path.isfile(self.sentinel_password_file):
            raise ValueError(f"redis.sentinel_password_file {self.sentinel_password_file!r} is not a readable file")
        _password("redis.sentinel", self.sentinel_password, self.sentinel_password_file)
        return self

    def access(self) -> RedisAccess:
        return RedisAccess(self.username, _password("redis", self.password, self.password_file), self.tls,
                           self.ca_file, self.cert_file, self.key_file, self.check_hostname, self.sentinel_username,
                           _password("redis.sentinel", self.sentinel_password, self.sentinel_password_file),
                           self.wait_replicas, self.wait_timeout)


class NatsSettings(_ClientSettings):
    """``[nats]``: credentials and TLS of every NATS connection (the nats driver); they override the
    URL's. Set one way to authenticate."""

    token: str = Field("", description="Authentication token (server authorization { token }).")
    nkey_seed_file: str = Field("", description="File holding an NKey seed (SU...), for servers that list NKey users.")
    creds_file: str = Field("", description="Decentralised auth: a .creds file (user JWT and NKey seed).")

    @model_validator(mode="after")
    def _check(self) -> NatsSettings:
        _check_access("nats", self, password_needs_user=True)
        for name in ("nkey_seed_file", "creds_file"):
            path = getattr(self, name)
            if path and not os.path.isfile(path):
                raise ValueError(f"nats.{name} {path!r} is not a readable file")
        ways = [bool(self.username), bool(self.token), bool(self.nkey_seed_file), bool(self.creds_file)]
        if sum(ways) > 1:
            raise ValueError("set one of nats.username, nats.token, nats.nkey_seed_file, nats.creds_file")
        return self

    def access(self) -> NatsAccess:
        return NatsAccess(self.username, _password("nats", self.password, self.password_file), self.tls,
                          self.ca_file, self.cert_file, self.key_file, self.check_hostname, self.token,
                          self.nkey_seed_file, self.creds_file)


class Settings(BaseSettings):
    """All settings. ``driver`` holds each driver's own table, validated by the driver."""

    model_config = SettingsConfigDict(env_prefix="DFPUBSUB_", env_nested_delimiter="__", extra="forbid")

    pubsub: PubSubSettings = Field(default_factory=PubSubSettings)
    driver: dict[str, dict[str, Any]] = Field(default_factory=dict)
    cache: CacheSettings = Field(default_factory=CacheSettings)
    store: StoreSettings = Field(default_factory=StoreSettings)
    nbapi: NbApiSettings = Field(default_factory=NbApiSettings)
    feed: FeedSettings = Field(default_factory=FeedSettings)
    controller: ControllerSettings = Field(default_factory=ControllerSettings)
    archive: ArchiveSettings = Field(default_factory=ArchiveSettings)
    publisher_service: PublisherServiceSettings = Field(default_factory=PublisherServiceSettings)
    notify: NotifySettings = Field(default_factory=NotifySettings)
    log: LogSettings = Field(default_factory=LogSettings)
    metrics: MetricsSettings = Field(default_factory=MetricsSettings)
    discovery: DiscoverySettings = Field(default_factory=DiscoverySettings)
    leader: LeaderSettings = Field(default_factory=LeaderSettings)
    relist: RelistSettings = Field(default_factory=RelistSettings)
    etcd: EtcdSettings = Field(default_factory=EtcdSettings)
    redis: RedisSettings = Field(default_factory=RedisSettings)
    nats: NatsSettings = Field(default_factory=NatsSettings)

    @model_validator(mode="after")
    def _check(self) -> Settings:
        if self.cache.tombstone_horizon <= self.pubsub.message_delay_window * 10:
            raise ValueError("cache.tombstone_horizon must be far longer than pubsub.message_delay_window")
        return self

    def driver_options(self, name: str) -> dict[str, Any]:
        """The ``[driver.<name>]`` table."""
        return dict(self.driver.get(name, {}))


class _EnvSource(EnvSettingsSource):
    """The environment, where a list may also be given as ``a,b`` (as on the command line)."""

    def decode_complex_value(self, field_name: str, field: Any, value: Any) -> Any:
        try:
            return super().decode_complex_value(field_name, field, value)
        except ValueError:
            if getattr(field.annotation, "__origin__", None) is list and isinstance(value, str):
                return _split_list(value)
            raise


def _split_list(value: str) -> list[str]:
    return [v.strip() for v in value.split(",") if v.strip()]


class _DictSource(PydanticBaseSettingsSource):
    def __init__(self, settings_cls: type[BaseSettings], data: dict[str, Any]):
        super().__init__(settings_cls)
        self.data = data

    def get_field_value(self, field: Any, field_name: str) -> tuple[Any, str, bool]:
        return self.data.get(field_name), field_name, False

    def __call__(self) -> dict[str, Any]:
        return self.data


def _read_toml(path: str) -> dict[str, Any]:
    try:
        with open(path, "rb") as fh:
            return tomllib.load(fh)
    except FileNotFoundError as exc:
        raise ConfigError(f"config file {path} does not exist") from exc
    except IsADirectoryError as exc:
        raise ConfigError(f"config file {path} is a directory, not a TOML file") from exc
    except OSError as exc:
        raise ConfigError(f"cannot read config file {path}: {exc.strerror or exc}") from exc
    except UnicodeDecodeError as exc:
        raise ConfigError(f"config file {path} is not UTF-8 text (byte {exc.start})") from exc
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"config file {path} is not valid TOML: {exc}") from exc


def _explain(exc: ValidationError, source: str) -> str:
    lines = []
    for err in exc.errors():
        loc = ".".join(str(p) for p in err["loc"]) or "settings"
        got = f" (got {err['input']!r})" if "input" in err and not isinstance(err["input"], dict) else ""
        lines.append(f"{loc}: {err['msg']}{got}")
    # One line: it is what a console script prints (dfpubsub.console).
    return f"invalid configuration ({source}): " + "; ".join(lines)


def load_settings(config_file: str | None = None, overrides: dict[str, Any] | None = None) -> Settings:
    """Load and validate settings: ``overrides`` (flags) > environment > file > defaults."""
    path = config_file or os.environ.get(CONFIG_ENV) or None
    file_data = _read_toml(path) if path else {}

    class _Loaded(Settings):
        @classmethod
        def settings_customise_sources(
            cls, settings_cls: type[BaseSettings], init_settings: PydanticBaseSettingsSource,
            env_settings: PydanticBaseSettingsSource, dotenv_settings: PydanticBaseSettingsSource,
            file_secret_settings: PydanticBaseSettingsSource,
        ) -> tuple[PydanticBaseSettingsSource, ...]:
            return (init_settings, _EnvSource(settings_cls), _DictSource(settings_cls, file_data))

    try:
        loaded = _Loaded(**(overrides or {}))
    except ValidationError as exc:
        raise ConfigError(_explain(exc, f"file {path}, environment, flags" if path else "environment, flags")) from exc
    except SettingsError as exc:
        raise ConfigError(f"invalid configuration (environment): {exc}") from exc
    settings = Settings.model_construct(**{name: getattr(loaded, name) for name in Settings.model_fields})
    # One [etcd], [redis] and [nats] section for every connection this process opens (backend_access).
    configure_backends(settings.etcd.access(), settings.redis.access(), settings.nats.access())
    return settings


# Every section of Settings gets its flags; a new section needs nothing more.
_SECTIONS: dict[str, type[_Section]] = {
    name: info.annotation
    for name, info in Settings.model_fields.items()
    if isinstance(info.annotation, type) and issubclass(info.annotation, _Section)
}


def add_config_arguments(parser: argparse.ArgumentParser, sections: Iterable[str] | None = None) -> None:
    """Add ``--version``, ``--config`` and one ``--section.field`` flag per setting to ``parser``.

    ``sections`` limits the flags (and so ``--help``) to the sections a program
    uses; the config file and environment may still set the others. A section
    named with an underscore takes its flags with a hyphen too
    (``--publisher-service.announce``), as every other word of a flag does.
    """

    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    parser.add_argument("--config", metavar="FILE", help=f"TOML config file (default: ${CONFIG_ENV})")
    chosen = _SECTIONS if sections is None else {name: _SECTIONS[name] for name in sections}
    for section, model in chosen.items():
        group = parser.add_argument_group(f"[{section}]", model.__doc__)
        for name, info in model.model_fields.items():
            flag = f"{section}.{name.replace('_', '-')}"
            spellings = [f"--{flag.replace('_', '-')}"] + ([f"--{flag}"] if "_" in section else [])
            group.add_argument(
                *spellings,
                dest=f"set__{section}__{name}",
                metavar=name.upper(),
                # argparse formats help with %: a literal one in a description must be doubled.
                help=f"{info.description} [default: {info.get_default(call_default_factory=True)!r}]".replace("%", "%%"),
            )


def settings_from_args(args: argparse.Namespace) -> Settings:
    """Build :class:`Settings` from a namespace made by a parser with :func:`add_config_arguments`."""
    overrides: dict[str, dict[str, Any]] = {}
    for dest, value in vars(args).items():
        if not dest.startswith("set__") or value is None:
            continue
        _, section, name = dest.split("__", 2)
        field = _SECTIONS[section].model_fields[name]
        if getattr(field.annotation, "__origin__", None) is list:
            value = _split_list(value)
        overrides.setdefault(section, {})[name] = value
    return load_settings(args.config, overrides)


def parse_settings(
    prog: str, description: str, argv: list[str] | None = None, sections: Iterable[str] | None = None
) -> Settings:
    """A daemon's command line: ``--config`` and the flags of ``sections`` (all if None). Bad
    settings print one line (``prog: what is wrong``) and exit with status 2, as argparse does
    for bad flags."""
    parser = ArgumentParser(prog=prog, description=description,
                            usage="%(prog)s [-h] [--version] [--config FILE] [--SECTION.SETTING VALUE ...]")
    add_config_arguments(parser, sections)
    args = parser.parse_args(argv)
    try:
        return settings_from_args(args)
    except ConfigError as exc:
        parser.exit(2, f"{prog}: {exc}\n")
