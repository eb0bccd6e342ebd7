"""Leader election (docs/leader.md): one instance of a daemon acts, the others stand by.

A lease in a backend, with a fencing token that grows with every acquisition,
as client-go's ``leaderelection`` and etcd's ``concurrency.Election`` do:

- ``etcd://``: an etcd lease and a key created in a transaction guarded on its
  create revision, which is the token (:mod:`.etcd`);
- ``redis://``: ``SET NX PX``, renewals and releases checked by a script, the
  token from ``INCR`` (:mod:`.redis`);
- ``sqlite:///``: a row with holder, expiry and token, changed in a transaction
  (:mod:`.sqlite`).

:class:`LeaderElector` campaigns and renews in a thread and answers the act
path (:meth:`~LeaderElector.token`, :meth:`~LeaderElector.check`); the holder
stops acting ``renew_deadline`` after its last renewal, before its lease can
pass to another. :func:`lead` is what a daemon with ``[leader] enabled`` calls
before it acts. The backends load lazily: ``import dfpubsub.leader`` needs no extra.
"""

from __future__ import annotations

from .api import Holder, LeaseBackend
from .daemon import Leadership, lead
from .elector import LeaderElector, check_timing
from .factory import default_identity, elector_from_settings, open_lease

__all__ = ["Holder", "LeaderElector", "LeaseBackend", "Leadership", "check_timing", "default_identity",
           "elector_from_settings", "lead", "open_lease"]
