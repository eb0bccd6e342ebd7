"""What a lease backend does: take a free or expired lease with a new fencing token, renew it while
it is still the caller's, release it.

A backend keeps, per election name, the holder's identity, the lease's expiry
(counted by the backend: etcd's lease TTL, Redis's ``PX``, the SQLite row's
``expires``) and a fencing token that only grows: each acquisition gets a
larger one than every acquisition before it, whoever made it. A resource the
leader writes to can refuse a write carrying a token lower than one it has
seen, which closes what a lease alone cannot (a holder paused between its
check and its write). The timing rules live with the elector
(:mod:`.elector`); a backend only answers.
"""

from __future__ import annotations

from typing import NamedTuple, Protocol

__all__ = ["Holder", "LeaseBackend"]


class Holder(NamedTuple):
    """Who holds a lease, with which fencing token, and for how many seconds more as the backend
    counts (negative: expired, not yet taken over)."""

    identity: str
    token: int
    remaining: float


class LeaseBackend(Protocol):
    """One election's lease in a backend. Calls raise StoreUnavailable when the backend does not
    answer within the backend's timeout, StoreError when it refuses."""

    def acquire(self, identity: str, duration: float) -> int | None:
        """Take the lease for ``duration`` seconds if nobody holds it or its holder's expired; the new
        fencing token, or None while another (or this identity, from an earlier term) holds it."""

    def renew(self, identity: str, token: int, duration: float) -> bool:
        """Extend the lease ``token`` of ``identity`` to ``duration`` seconds from now; False when it is
        no longer theirs (expired, taken over, deleted)."""

    def release(self, identity: str, token: int) -> None:
        """Give the lease up at once if it is still ``token`` of ``identity`` (else nothing)."""

    def holder(self) -> Holder | None:
        """The lease's holder, or None when nobody ever held it or it was released."""

    def close(self) -> None:
        """Close the backend's connection."""
