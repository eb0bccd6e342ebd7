"""The controller runtime, in client-go's shape: an informer keeps a versioned cache equal to the
store, a rate-limited work queue hands changed keys to level-triggered reconcilers.

- :mod:`.runtime`: :class:`Controller`, the informer and its workers;
- :mod:`.cache`, :mod:`.indexer`: the cache, its indexes and listers;
- :mod:`.replay`, :mod:`.relist`: repairing the cache from the store's change feed (what was
  missed), or from a listing (the whole topic) where the feed cannot; :mod:`.repairer`: both as
  a plain subscriber's ``on_resync``;
- :mod:`.admission`: a relist's turn, bounded over the fleet by slots in the store;
- :mod:`.bookmarks`: moving the position in the feed on a feed publisher's bookmarks, reading
  nothing;
- :mod:`.reconciler`: what users implement;
- :mod:`.workqueue`, :mod:`.ratelimit`: the queue of keys and its retry limiters, which know
  nothing of events, stores or pub/sub (an import contract holds them to it);
- :mod:`.status`: the status file ``df-db controller-status`` reads.
"""

from .admission import RelistAdmission
from .bookmarks import FeedIds
from .cache import Change, VersionedCache
from .indexer import Indexer, IndexFunc, Lister
from .ratelimit import ExponentialBackoff, RateLimiter, TokenBucket
from .reconciler import DONE, REQUEUE, HandlerReconciler, ObjectKey, Reconciler, Result, TableHandler
from .relist import Relisted, relist
from .repairer import Repairer
from .replay import AheadOfStore, Replayed, TooFarBehind
from .runtime import Bootstrap, Controller, ControllerOptions, FailedKey, Repair
from .status import StatusWriter, read_status, write_status
from .workqueue import WorkQueue

__all__ = ["AheadOfStore", "Bootstrap", "Change", "Controller", "ControllerOptions", "DONE", "ExponentialBackoff",
           "FailedKey", "FeedIds", "HandlerReconciler", "IndexFunc", "Indexer", "Lister", "ObjectKey", "REQUEUE",
           "RateLimiter", "Reconciler", "RelistAdmission", "Relisted", "Repair", "Repairer", "Replayed", "Result", "TooFarBehind", "StatusWriter",
           "TableHandler", "TokenBucket", "VersionedCache", "WorkQueue", "read_status", "relist", "write_status"]
