"""A relist's turn: jittered, bounded across the fleet by slots in the store, renewed while it runs,
and read in pages.

A relist reads a whole table from the store. When a fleet must relist at
once (a cold start, a feed whose history is gone for every controller, a
store restored from a backup), N controllers would read it N times at the
same moment. So a relist first waits for its turn (:meth:`RelistAdmission.turn`):

1. a random delay of up to ``jitter`` seconds, so a fleet started together
   does not ask together;
2. one of ``slots`` slots of a semaphore kept in the store itself
   (:mod:`dfpubsub.admission`), so the bound holds over every host that
   shares the store. Refused, it asks again after a jittered exponential
   backoff (``retry_base`` doubling up to ``retry_max``, each wait drawn
   between half and all of it), counted; it waits until admitted or stopped;
3. while the relist runs, a thread renews the slot every third of ``lease``;
   afterwards the slot is released. A controller killed while it lists stops
   renewing, and its slot frees itself within ``lease`` seconds;
4. the relist reads its listing of values in pages of ``page_size`` objects
   (:func:`~dfpubsub.controller.relist.relist_pages`), each merged into the
   cache before the next is read (0: in one piece).

Without slots (``slots=None``: ``[relist] slots = 0``) a relist is still
jittered and paged, but not bounded.

A slot that cannot be renewed (lost to a long pause) does not stop the relist:
a relist only reads, and the bound is a load limit, not a safety one. A store
that does not answer fails the turn like the relist it guards
(StoreUnavailable: the subscriber retries the repair with backoff).

Counters (the controller's): ``relist_admitted``, ``relist_waits`` (relists
that found every slot taken), ``relist_refusals`` (refused asks),
``relist_slot_lost`` and ``relist_slot_errors`` (renewals and releases that
failed); histogram ``relist_wait`` (seconds from asking to admitted).
"""

from __future__ import annotations

import logging
import random
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING

from ..admission import SlotBackend, new_ticket, open_slots
from ..errors import StoreError, StoreUnavailable
from ..metrics import Stats

if TYPE_CHECKING:
    from ..config import Settings

__all__ = ["RelistAdmission"]

log = logging.getLogger(__name__)


class RelistAdmission:
    """Turns of relists against the semaphore in ``slots`` (``bound`` slots, see the module's doc;
    None: no bound). ``identity`` names this controller in the slots it holds (default host:pid)."""

    def __init__(self, slots: SlotBackend | None, bound: int = 0, *, lease: float = 30.0, jitter: float = 2.0,
                 retry_base: float = 0.2, retry_max: float = 5.0, page_size: int = 0, identity: str = "",
                 rng: random.Random | None = None):
        if slots is not None and bound < 1:
            raise ValueError("a relist admission needs at least one slot")
        self.slots = slots
        self.bound = bound
        self.lease = lease
        self.jitter = jitter
        self.retry_base = retry_base
        self.retry_max = retry_max
        self.page_size = page_size
        self.identity = identity
        self._rng = rng or random.Random()

    @classmethod
    def from_settings(cls, settings: Settings, identity: str = "") -> RelistAdmission:
        """As ``[relist]`` says, its slots in ``relist.url`` (default: the store's; none when
        ``relist.slots`` is 0)."""
        s = settings.relist
        timeout = max(0.5, min(5.0, s.lease / 6))  # a renewal must fit well within a third of the lease
        backend = open_slots(s.url or settings.store.url, s.name, timeout, settings.store.prefix) if s.slots else None
        return cls(backend, s.slots, lease=s.lease, jitter=s.jitter, retry_base=s.retry_base,
                   retry_max=s.retry_max, page_size=s.page_size, identity=identity)

    @contextmanager
    def turn(self, stats: Stats, stop: threading.Event) -> Iterator[int | None]:
        """Wait for a slot (see the module's doc) and hold it for the ``with`` block; yields its
        number (None without slots). StoreUnavailable if ``stop`` is set while waiting, or the
        store does not answer."""
        ticket = new_ticket(self.identity)
        asked = time.monotonic()
        if self.jitter > 0 and stop.wait(self._rng.uniform(0.0, self.jitter)):
            raise StoreUnavailable("stopped while waiting to relist")
        slots = self.slots
        if slots is None:
            yield None
            return
        refusals = 0
        while (slot := slots.acquire(ticket, self.bound, self.lease)) is None:
            if not refusals:
                stats.inc("relist_waits")
            stats.inc("relist_refusals")
            delay = min(self.retry_max, self.retry_base * 2 ** min(refusals, 30)) * self._rng.uniform(0.5, 1.0)
            refusals += 1
            if stop.wait(delay):
                raise StoreUnavailable(f"stopped while waiting for one of {self.bound} relist slots")
        stats.inc("relist_admitted")
        stats.histogram("relist_wait").observe(time.monotonic() - asked)
        done = threading.Event()
        renewer = threading.Thread(target=self._renew, args=(slots, ticket, slot, done, stats), daemon=True,
                                   name="dfpubsub-relist-slot")
        renewer.start()
        try:
            yield slot
        finally:
            done.set()
            renewer.join()
            try:
                slots.release(ticket, slot)
            except StoreError as exc:  # it expires by itself within the lease
                stats.inc("relist_slot_errors")
                log.warning("could not release relist slot %d: %s", slot, exc)

    def _renew(self, slots: SlotBackend, ticket: str, slot: int, done: threading.Event, stats: Stats) -> None:
        while not done.wait(self.lease / 3):
            try:
                if not slots.renew(ticket, slot, self.lease):
                    stats.inc("relist_slot_lost")
                    log.warning("relist slot %d was lost (expired or taken over); the relist goes on", slot)
                    return
            except StoreError as exc:  # the next renewal may get through before the lease ends
                stats.inc("relist_slot_errors")
                log.warning("could not renew relist slot %d: %s", slot, exc)

    def close(self) -> None:
        """Close the slots' connection."""
        if self.slots is not None:
            self.slots.close()
