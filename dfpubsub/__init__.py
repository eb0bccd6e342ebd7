"""dfpubsub: reliable, distributed publish/subscribe of versioned change events.

Publishers stamp every event with a per-publisher id and a per-topic sequence
number; subscribers detect gaps, wait a short window for late messages, and
otherwise resync the affected topics from the source of truth. Transports are
pluggable drivers (``memory``, ``zmq``, ...) found through entry points.
"""

from ._version import __version__ as __version__
from .config import Settings, load_settings
from .controller.cache import Change, VersionedCache
from .controller.reconciler import DONE, REQUEUE, ObjectKey, Reconciler, Result, TableHandler
from .controller.relist import Relisted, relist
from .controller.repairer import Repairer
from .controller.runtime import Controller, ControllerOptions, FailedKey
from .errors import (
    AlreadyExists,
    ClosedError,
    ConfigError,
    DecodeError,
    DfPubSubError,
    DriverNotFound,
    InvalidEvent,
    InvalidValue,
    NotFound,
    PayloadTooLarge,
    ProtocolError,
    StoreError,
    StoreUnavailable,
    TransportError,
    UnknownTable,
    ValueTooLarge,
    VersionConflict,
)
from .events import CONTROL_TOPIC, Action, Bye, Event, EventBatch, Hello, VersionedObject
from .factory import create_driver, create_publisher, create_subscriber
from .nbapi import AsyncNbApi, NbApi
from .plugins import available_drivers, load_driver
from .publisher import Publisher, PublisherOptions
from .store import AsyncStore, Store, open_store
from .subscriber import Subscriber, SubscriberOptions
from .tracker import ResyncRequest, SequenceTracker, TrackerLimits
from .transport import Driver, PublisherTransport, SubscriberTransport

__all__ = [
    "Action",
    "AlreadyExists",
    "AsyncNbApi",
    "AsyncStore",
    "Controller",
    "ControllerOptions",
    "DONE",
    "FailedKey",
    "ObjectKey",
    "REQUEUE",
    "Reconciler",
    "Relisted",
    "Result",
    "InvalidValue",
    "NbApi",
    "NotFound",
    "Store",
    "StoreError",
    "StoreUnavailable",
    "TableHandler",
    "UnknownTable",
    "ValueTooLarge",
    "VersionConflict",
    "open_store",
    "Bye",
    "CONTROL_TOPIC",
    "Change",
    "ClosedError",
    "ConfigError",
    "DecodeError",
    "DfPubSubError",
    "Driver",
    "DriverNotFound",
    "Event",
    "EventBatch",
    "Hello",
    "InvalidEvent",
    "PayloadTooLarge",
    "ProtocolError",
    "Publisher",
    "PublisherOptions",
    "PublisherTransport",
    "ResyncRequest",
    "SequenceTracker",
    "TrackerLimits",
    "Settings",
    "Subscriber",
    "SubscriberOptions",
    "SubscriberTransport",
    "TransportError",
    "VersionedCache",
    "VersionedObject",
    "available_drivers",
    "create_driver",
    "create_publisher",
    "create_subscriber",
    "load_driver",
    "load_settings",
    "relist",
    "Repairer",
]
