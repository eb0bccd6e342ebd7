"""Building publishers and subscribers from :class:`~dfpubsub.config.Settings`."""

from __future__ import annotations

import os
import socket
from collections.abc import Callable, Iterable

from .config import PubSubSettings, Settings
from .errors import ConfigError
from .metrics import Stats
from .multiproc import WorkerPublisher
from .plugins import load_driver, parse_driver_url
from .publisher import Publisher, PublisherOptions
from .subscriber import EventHandler, ResyncHandler, Subscriber, SubscriberOptions
from .tracker import ResyncRequest, TrackerLimits
from .transport import Driver

__all__ = ["create_driver", "create_publisher", "create_subscriber", "publisher_options", "subscriber_options"]


def publisher_options(s: PubSubSettings) -> PublisherOptions:
    """The publisher's share of ``[pubsub]``."""
    return PublisherOptions(
        max_idle_time=s.max_idle_time,
        batch_max_events=s.batch_max_events,
        batch_max_bytes=s.batch_max_bytes,
        batch_linger=s.batch_linger,
        batch_pause=s.batch_pause,
        max_message_bytes=s.max_message_bytes,
        schema=s.schema_version,
    )


def subscriber_options(s: PubSubSettings) -> SubscriberOptions:
    """The subscriber's share of ``[pubsub]``."""
    return SubscriberOptions(
        message_delay_window=s.message_delay_window,
        queue_size=s.queue_size,
        max_held=s.max_held,
        max_message_bytes=s.max_message_bytes,
        resync_base_interval=s.resync_base_interval,
        resync_max_interval=s.resync_max_interval,
        dead_after_idles=s.dead_after_idles,
        max_idle_time=s.max_idle_time,
        limits=TrackerLimits(s.max_publishers, s.max_held_bytes, s.max_seq_jump, s.max_hello_idle,
                             s.forget_silent_after),
    )


def create_driver(settings: Settings) -> Driver:
    """Load the driver named by ``pubsub.driver`` with its ``[driver.<name>]`` options."""
    name, _ = parse_driver_url(settings.pubsub.driver)
    return load_driver(settings.pubsub.driver, settings.driver_options(name))


def create_publisher(settings: Settings, name: str | None = None) -> Publisher | WorkerPublisher:
    """The configured publisher: a started :class:`Publisher` bound on the driver, or, with
    ``pubsub.multiproc``, a fork-safe :class:`WorkerPublisher` into the host's publisher service
    (each process that publishes gets its own publisher, made at its first event)."""
    driver = create_driver(settings)
    pub_name = name or settings.pubsub.publisher_name
    options = publisher_options(settings.pubsub)
    if not settings.pubsub.multiproc:
        stats = Stats("publisher", pub_name or driver.name)
        return Publisher(driver.publisher(stats), pub_name, options, stats)
    socket_path = settings.pubsub.multiproc_socket
    options.batch_linger = settings.pubsub.multiproc_batch_linger
    if not driver.publisher_service:
        # Refused now, in the master, rather than at the first event of every worker.
        raise ConfigError(f"driver {driver.name!r} has no publisher service: set pubsub.multiproc = false, "
                          "every worker can publish directly")

    def per_process() -> Publisher:
        name = f"{pub_name or socket.gethostname()}/worker-{os.getpid()}"
        stats = Stats("publisher", name)
        return Publisher(driver.worker_publisher(stats, socket_path), name, options, stats)

    return WorkerPublisher(per_process)


def create_subscriber(
    settings: Settings,
    on_event: EventHandler,
    on_resync: ResyncHandler | None = None,
    topics: Iterable[str] | None = None,
    name: str = "subscriber",
    on_gap: Callable[[ResyncRequest], None] | None = None,
) -> Subscriber:
    """A :class:`Subscriber` (not yet started) on the configured driver and topics."""
    driver = create_driver(settings)
    stats = Stats("subscriber", name)
    return Subscriber(
        driver.subscriber(stats), settings.pubsub.topics if topics is None else topics,
        on_event, on_resync, subscriber_options(settings.pubsub), name, on_gap, stats,
    )
