"""Relist admission (docs/store.md#relist-slots): a counting semaphore of leased slots in the store
itself, so that a fleet's relists are bounded across hosts.

- ``etcd://``: a key per slot attached to an etcd lease (:mod:`.etcd`);
- ``redis://``: a key per slot with a ``PX`` expiry, taken by a script (:mod:`.redis`);
- ``sqlite:///``: a row per slot with its expiry, in a transaction (:mod:`.sqlite`).

The controller's side (jitter, waiting, renewing while a relist runs) is
:mod:`dfpubsub.controller.admission`. The backends load lazily.
"""

from __future__ import annotations

from .api import MAX_LEASE, SlotBackend, SlotHolder, new_ticket
from .factory import open_slots

__all__ = ["MAX_LEASE", "SlotBackend", "SlotHolder", "new_ticket", "open_slots"]
