"""What a slot backend does: a counting semaphore of leased slots kept in the store itself.

A relist reads a whole table; a fleet that relists at once (a cold start, a
feed whose history is gone for every controller, a store restored from a
backup) would read it N times at the same moment. So a relist first takes one
of ``slots`` slots of a named semaphore, kept in the store every controller
already shares (so that the bound holds across hosts), and gives it back when
it is done. A slot is a lease, as a leader lease is (:mod:`dfpubsub.leader`),
counted by the backend (etcd's lease TTL, Redis's ``PX``, a SQLite row's
``expires``): a holder killed while it lists frees its slot within the lease.

A relist only reads, so nothing needs a fencing token: a holder that lost its
slot (a long pause) lists on, and the bound is exceeded by one for a moment.
Each turn holds a *ticket* of its own (``"{nonce} {identity}"``, the nonce new
per turn), which renewals and the release compare, so a turn never extends
or frees another's slot.

Trust (DESIGN.md §10): anything found in a slot that this code did not write
like this (not a ticket, no expiry, or an expiry beyond :data:`MAX_LEASE`) is
skipped, counted in ``dfpubsub_skipped_records_total{kind="relist_slot"}``, and
the slot taken over as free: garbage can neither crash a controller nor shrink
the bound for good.
"""

from __future__ import annotations

import os
import re
import socket
from typing import NamedTuple, Protocol

from ..config import MAX_RELIST_LEASE

__all__ = ["MAX_LEASE", "SKIP_KIND", "SlotBackend", "SlotHolder", "is_ticket", "new_ticket"]

#: Seconds a slot's lease may last at most: a slot claiming more is garbage (``[relist] lease`` ≤ this).
MAX_LEASE = MAX_RELIST_LEASE
#: The kind skipped slots are counted under.
SKIP_KIND = "relist_slot"
_TICKET = re.compile(r"^[0-9a-f]{32} \S.{0,254}$", re.DOTALL)


def new_ticket(identity: str = "") -> str:
    """A ticket for one turn: a fresh nonce and who holds it (default ``host:pid``)."""
    who = identity or f"{socket.gethostname()}:{os.getpid()}"
    return f"{os.urandom(16).hex()} {who}"


def is_ticket(value: object) -> bool:
    """Whether ``value`` (str or bytes) reads as a ticket :func:`new_ticket` made."""
    if isinstance(value, bytes):
        try:
            value = value.decode()
        except UnicodeDecodeError:
            return False
    return isinstance(value, str) and _TICKET.match(value) is not None


class SlotHolder(NamedTuple):
    """A slot's holder: its ticket and for how many seconds more the backend counts its lease."""

    slot: int
    ticket: str
    remaining: float


class SlotBackend(Protocol):
    """One named semaphore in a backend. Calls raise StoreUnavailable when the backend does not
    answer within its timeout, StoreError when it refuses."""

    def acquire(self, ticket: str, slots: int, duration: float) -> int | None:
        """Take a free slot (absent, expired or garbage) among ``slots`` for ``duration`` seconds;
        its number, or None while every one is held."""

    def renew(self, ticket: str, slot: int, duration: float) -> bool:
        """Extend ``slot`` to ``duration`` seconds from now if ``ticket`` still holds it."""

    def release(self, ticket: str, slot: int) -> None:
        """Free ``slot`` at once if ``ticket`` still holds it (else nothing)."""

    def holders(self, slots: int) -> list[SlotHolder]:
        """The slots among ``slots`` held now (garbage skipped and counted)."""

    def close(self) -> None:
        """Close the backend's connection."""
