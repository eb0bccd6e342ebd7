"""Test machinery that users' own tests may use too: lossy and killing transports, crash points,
private etcd and Redis servers.

Nothing here runs unless called: no environment variable arms a crash point and
no server starts at import. The core never imports this package (an import
contract holds it); the demo uses :class:`LossyTransport` to lose a message on purpose.
"""

from .transports import DropRule, KillOnSend, LossyTransport, drop_every, drop_nth

__all__ = ["DropRule", "KillOnSend", "LossyTransport", "drop_every", "drop_nth"]
