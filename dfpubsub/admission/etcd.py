"""Slots in etcd (``etcd://host:port[,...]``, the store's own cluster): a key per held slot,
attached to an etcd lease of its holder, created in a transaction guarded on the slot being free.

Keys: ``/{prefix}/relist/{name}/{slot}`` holding the ticket. Taking a slot:
one range read of the semaphore's keys, ``LeaseGrant`` (etcd counts whole
seconds, at least 1), then a ``Txn`` that puts the ticket on the first free
slot, guarded on that slot being absent (``create_revision == 0``) or still
the garbage that was read (its ``mod_revision``); a slot taken meanwhile by
another makes it read again. Garbage: a key without a lease (it would never
expire), a value that is not a ticket, or a key name that is not a slot
number under the semaphore; it is skipped, counted and replaced (or, not
being a slot, deleted). Renewing: one ``LeaseKeepAlive`` exchange and a check
that the slot still holds the ticket on that lease. When renewals stop, etcd
revokes the lease and deletes the key by itself.
"""

from __future__ import annotations

import math
from typing import Any

from aetcd import rpc
from aetcd.utils import prefix_range_end

from ..backends.etcd import EtcdChannel, KvLeaseStubs, RangeResponse, TxnResponse, keep_alive_once, txn
from ..backends.foreign import skip
from ..errors import StoreError
from .api import SKIP_KIND, SlotHolder, is_ticket

__all__ = ["EtcdSlots"]

_RACES = 5  # a slot taken by another between the read and the Txn: read again this many times


class EtcdSlots:
    """The semaphore ``name`` in the etcd of ``url``, under ``/{prefix}/relist/``."""

    backend = "etcd"

    def __init__(self, url: str, name: str, timeout: float, prefix: str = "dfpubsub"):
        self.name = name
        self.timeout = timeout
        self._root = f"/{prefix}/relist/{name}/".encode()
        self._channel = EtcdChannel(url, timeout, KvLeaseStubs.on)
        self._leases: dict[tuple[str, int], int] = {}  # (ticket, slot) -> etcd lease of this process's turns

    def _key(self, slot: int) -> bytes:
        return self._root + str(slot).encode()

    def _txn(self, request: rpc.TxnRequest) -> TxnResponse:
        response: TxnResponse = self._channel.call(lambda s: s.kv.Txn(request, timeout=self.timeout))
        return response

    def _read(self, slots: int) -> tuple[dict[int, Any], dict[int, int], list[bytes]]:
        """The live slots (slot -> kv), the garbage slots (slot -> mod revision) among ``slots``,
        and the keys under the semaphore that are no slot at all; garbage counted."""
        response: RangeResponse = self._channel.call(lambda s: s.kv.Range(
            rpc.RangeRequest(key=self._root, range_end=prefix_range_end(self._root)), timeout=self.timeout))
        held: dict[int, Any] = {}
        garbage: dict[int, int] = {}
        strays: list[bytes] = []
        for kv in response.kvs:
            name = kv.key[len(self._root):]
            slot = int(name) if name.isdigit() and len(name) < 8 else -1
            if slot < 0 or str(slot).encode() != name:
                skip(SKIP_KIND, kv.key, "malformed", "not a slot number")
                strays.append(kv.key)
            elif not kv.lease or not is_ticket(kv.value):
                skip(SKIP_KIND, kv.key, "malformed", f"not a slot's ticket with a lease: {kv.value!r:.60}")
                garbage[slot] = int(kv.mod_revision)
            elif slot < slots:
                held[slot] = kv
        return held, garbage, strays

    def acquire(self, ticket: str, slots: int, duration: float) -> int | None:
        for _ in range(_RACES):
            held, garbage, strays = self._read(slots)
            if strays:
                self._txn(txn([], [rpc.DeleteRangeRequest(key=k) for k in strays]))
            free = next((i for i in range(slots) if i not in held), None)
            if free is None:
                return None
            key = self._key(free)
            guard = rpc.Compare(key=key, target=rpc.Compare.MOD, result=rpc.Compare.EQUAL,
                                mod_revision=garbage[free]) if free in garbage else \
                rpc.Compare(key=key, target=rpc.Compare.CREATE, result=rpc.Compare.EQUAL, create_revision=0)
            grant = self._channel.call(lambda s: s.lease.LeaseGrant(
                rpc.LeaseGrantRequest(TTL=max(1, math.ceil(duration))), timeout=self.timeout))
            if grant.error:
                raise StoreError(f"etcd refused a lease: {grant.error}")
            try:
                taken = self._txn(txn([guard], [rpc.PutRequest(key=key, value=ticket.encode(),
                                                               lease=grant.ID)])).succeeded
            except StoreError:
                self._revoke_quietly(int(grant.ID))
                raise
            if taken:
                self._leases[(ticket, free)] = int(grant.ID)
                return free
            self._revoke_quietly(int(grant.ID))
        return None  # every round lost a race: as busy as a semaphore can be

    def _revoke_quietly(self, lease: int) -> None:
        try:
            self._channel.call(lambda s: s.lease.LeaseRevoke(rpc.LeaseRevokeRequest(ID=lease), timeout=self.timeout))
        except StoreError:
            pass  # gone or unreachable: the lease expires by itself

    def _ours(self, ticket: str, slot: int, lease: int) -> list[rpc.Compare]:
        key = self._key(slot)
        return [rpc.Compare(key=key, target=rpc.Compare.VALUE, result=rpc.Compare.EQUAL, value=ticket.encode()),
                rpc.Compare(key=key, target=rpc.Compare.LEASE, result=rpc.Compare.EQUAL, lease=lease)]

    def renew(self, ticket: str, slot: int, duration: float) -> bool:
        lease = self._leases.get((ticket, slot))
        if lease is None:
            return False
        if self._channel.call(lambda s: keep_alive_once(s.lease, lease, self.timeout)) <= 0 \
                or not self._txn(txn(self._ours(ticket, slot, lease), [])).succeeded:
            self._leases.pop((ticket, slot), None)
            self._revoke_quietly(lease)
            return False
        return True

    def release(self, ticket: str, slot: int) -> None:
        lease = self._leases.pop((ticket, slot), None)
        if lease is None:
            return
        self._txn(txn(self._ours(ticket, slot, lease), [rpc.DeleteRangeRequest(key=self._key(slot))]))
        self._revoke_quietly(lease)

    def holders(self, slots: int) -> list[SlotHolder]:
        held = self._read(slots)[0]
        return [SlotHolder(slot, kv.value.decode(), self._ttl(int(kv.lease))) for slot, kv in sorted(held.items())]

    def _ttl(self, lease: int) -> float:
        request = rpc.LeaseTimeToLiveRequest(ID=lease)
        return float(self._channel.call(lambda s: s.lease.LeaseTimeToLive(request, timeout=self.timeout)).TTL)

    def close(self) -> None:
        self._channel.close(final=True)
