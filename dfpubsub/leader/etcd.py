"""Leases in etcd (``etcd://host:port[,host:port...]``), as etcd's own ``concurrency.Election``:
an etcd lease, a key attached to it created in a transaction guarded on the key's create
revision, and that create revision as the fencing token.

Taking the lease: ``LeaseGrant`` (etcd counts whole seconds, at least its
minimum of 2 s by default: the duration is rounded up), then a ``Txn`` that
creates ``/{prefix}/leader/{name}`` holding the identity, attached to the
lease, only if the key does not exist (``create_revision == 0``). etcd's
revisions only grow, so the key's create revision is larger than any earlier
holder's. Renewing: one ``LeaseKeepAlive`` exchange (TTL 0 in the answer: the
lease expired), then a ``Txn`` checking the key is still the one created with
the token, attached to the lease. Releasing: delete the key if it is still
ours, and revoke the lease. When renewals stop, etcd revokes the lease and
deletes the key by itself.
"""

from __future__ import annotations

import math

from aetcd import rpc

from ..backends.etcd import EtcdChannel, KvLeaseStubs, RangeResponse, TxnResponse, keep_alive_once
from ..errors import StoreError
from .api import Holder

__all__ = ["EtcdLease"]


class EtcdLease:
    """The lease ``name`` in the etcd of ``url``, under ``/{prefix}/leader/``."""

    backend = "etcd"

    def __init__(self, url: str, name: str, timeout: float, prefix: str = "dfpubsub"):
        self.name = name
        self.timeout = timeout
        self._key = f"/{prefix}/leader/{name}".encode()
        self._channel = EtcdChannel(url, timeout, KvLeaseStubs.on)
        self._leases: dict[int, int] = {}  # token -> etcd lease ID of the terms this process holds

    def _txn(self, request: rpc.TxnRequest) -> TxnResponse:
        response: TxnResponse = self._channel.call(lambda s: s.kv.Txn(request, timeout=self.timeout))
        return response

    def _revoke(self, lease: int) -> None:
        try:
            self._channel.call(lambda s: s.lease.LeaseRevoke(rpc.LeaseRevokeRequest(ID=lease), timeout=self.timeout))
        except StoreError as exc:
            if "lease not found" not in str(exc):  # already expired: nothing to revoke
                raise

    def acquire(self, identity: str, duration: float) -> int | None:
        grant = self._channel.call(lambda s: s.lease.LeaseGrant(
            rpc.LeaseGrantRequest(TTL=max(1, math.ceil(duration))), timeout=self.timeout))
        if grant.error:
            raise StoreError(f"etcd refused a lease: {grant.error}")
        free = rpc.Compare(key=self._key, target=rpc.Compare.CREATE, result=rpc.Compare.EQUAL, create_revision=0)
        put = rpc.RequestOp(request_put=rpc.PutRequest(key=self._key, value=identity.encode(), lease=grant.ID))
        try:
            response = self._txn(rpc.TxnRequest(compare=[free], success=[put]))
        except StoreError:
            self._revoke_quietly(int(grant.ID))
            raise
        if not response.succeeded:
            self._revoke_quietly(int(grant.ID))
            return None
        token = int(response.header.revision)  # the put's revision: the key's create revision
        self._leases[token] = int(grant.ID)
        return token

    def _revoke_quietly(self, lease: int) -> None:
        try:
            self._revoke(lease)
        except StoreError:
            pass  # unreachable: the lease expires by itself, with nothing attached

    def renew(self, identity: str, token: int, duration: float) -> bool:
        lease = self._leases.get(token)
        if lease is None:
            return False
        if self._channel.call(lambda s: keep_alive_once(s.lease, lease, self.timeout)) <= 0:
            self._leases.pop(token, None)
            return False
        ours = [rpc.Compare(key=self._key, target=rpc.Compare.CREATE, result=rpc.Compare.EQUAL, create_revision=token),
                rpc.Compare(key=self._key, target=rpc.Compare.LEASE, result=rpc.Compare.EQUAL, lease=lease)]
        if not self._txn(rpc.TxnRequest(compare=ours)).succeeded:  # deleted or replaced by someone else
            self._leases.pop(token, None)
            self._revoke_quietly(lease)
            return False
        return True

    def release(self, identity: str, token: int) -> None:
        lease = self._leases.pop(token, None)
        ours = rpc.Compare(key=self._key, target=rpc.Compare.CREATE, result=rpc.Compare.EQUAL, create_revision=token)
        self._txn(rpc.TxnRequest(compare=[ours], success=[rpc.RequestOp(
            request_delete_range=rpc.DeleteRangeRequest(key=self._key))]))
        if lease is not None:
            self._revoke(lease)

    def holder(self) -> Holder | None:
        response: RangeResponse = self._channel.call(
            lambda s: s.kv.Range(rpc.RangeRequest(key=self._key), timeout=self.timeout))
        if not response.kvs:
            return None
        kv = response.kvs[0]
        remaining = -1.0
        if kv.lease:
            ttl = self._channel.call(lambda s: s.lease.LeaseTimeToLive(rpc.LeaseTimeToLiveRequest(ID=kv.lease),
                                                                       timeout=self.timeout))
            remaining = float(ttl.TTL)
        return Holder(kv.value.decode(errors="replace"), int(kv.create_revision), remaining)

    def close(self) -> None:
        self._channel.close(final=True)
