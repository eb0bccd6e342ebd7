"""Building publishers and subscribers from :class:`~dfpubsub.config.Settings`."""

from __future__ import annotations

from collections.abc import Callable, Iterable

from .api import Driver
from .config import PubSubSettings, Settings
from .metrics import Stats
from .publisher import Publisher, PublisherOptions
from .registry import load_driver, parse_driver_url
from .subscriber import EventHandler, ResyncHandler, Subscriber, SubscriberOptions
from .tracker import ResyncRequest

__all__ = ["create_driver", "create_publisher", "create_subscriber", "publisher_options", "subscriber_options"]


def publisher_options(s: PubSubSettings) -> PublisherOptions:
    """The publisher's share of ``[pubsub]``."""
    return PublisherOptions(
        max_idle_time=s.max_idle_time,
        batch_max_events=s.batch_max_events,
        batch_max_bytes=s.batch_max_bytes,
        batch_linger=s.batch_linger,
        max_message_bytes=s.max_message_bytes,
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
    )


def create_driver(settings: Settings) -> Driver:
    """Load the driver named by ``pubsub.driver`` with its ``[driver.<name>]`` options."""
    name, _ = parse_driver_url(settings.pubsub.driver)
    return load_driver(settings.pubsub.driver, settings.driver_options(name))


def create_publisher(settings: Settings, name: str | None = None) -> Publisher:
    """A started :class:`Publisher` on the configured driver."""
    driver = create_driver(settings)
    pub_name = name or settings.pubsub.publisher_name
    stats = Stats("publisher", pub_name or driver.name)
    return Publisher(driver.publisher(stats), pub_name, publisher_options(settings.pubsub), stats)


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
