"""CURVE client authentication for publishers: a ZAP handler with an allow-list of public keys.

A publisher with ``curve_secret_key`` encrypts its traffic; with
``curve_allowed_keys`` or ``curve_allowed_dir`` it also lets in only the
subscribers whose public key is listed. One ZAP handler (pyzmq's
ThreadAuthenticator) serves every socket of the process's ZeroMQ context;
each publisher gets its own ZAP domain and allow-list. The directory holds
public keys in ZeroMQ's certificate format (``df-keys generate`` writes them,
as ``zmq.auth.create_certificates`` does) and is read again when it changes,
so adding or removing a file lets a key in or out at its next handshake.
"""

from __future__ import annotations

import itertools
import logging
import os
import threading
from pathlib import Path

import zmq
import zmq.auth
from zmq.auth.thread import ThreadAuthenticator

from dfpubsub.errors import ConfigError
from dfpubsub.logs import RateLimitedLog
from dfpubsub.metrics import Stats

__all__ = ["AllowedKeys", "serve", "guard", "unguard", "read_public_keys", "load_secret_key"]

log = logging.getLogger("dfpubsub.drivers.zeromq.curve")
_refusals = RateLimitedLog(log, interval=10.0)

_lock = threading.Lock()
_auth: ThreadAuthenticator | None = None
_domains = itertools.count(1)


class AllowedKeys:
    """Public keys (Z85) let in: ``keys`` plus those in ``directory``, re-read when it changes."""

    def __init__(self, keys: list[str], directory: str, stats: Stats):
        self._fixed = {k.encode() for k in keys}
        self._dir = directory
        self._stamp: tuple[float, int] | None = None
        self._from_dir: set[bytes] = set()
        self.stats = stats
        self._reload()

    def callback(self, domain: str, client_key: bytes) -> bool:
        """pyzmq's credentials-provider hook: whether ``client_key`` (Z85) may connect."""
        self._reload()
        if client_key in self._fixed or client_key in self._from_dir:
            return True
        self.stats.inc("drops", reason="curve_refused")
        _refusals.warning(domain, "refused a subscriber's CURVE key", key=client_key.decode(errors="replace"))
        return False

    def _reload(self) -> None:
        if not self._dir:
            return
        try:
            st = os.stat(self._dir)
        except OSError:
            self._from_dir, self._stamp = set(), None  # gone: nobody from it
            return
        stamp = (st.st_mtime, st.st_nlink)
        if stamp != self._stamp:
            self._from_dir, self._stamp = read_public_keys(self._dir), stamp


class _AnyKey:
    def callback(self, domain: str, client_key: bytes) -> bool:
        return True


def read_public_keys(directory: str) -> set[bytes]:
    """The Z85 public keys of the certificate files in ``directory``; files that are not one
    (another tool's, a secret without its public part) are skipped."""
    keys = set()
    for path in sorted(Path(directory).iterdir()):
        if not path.is_file():
            continue
        try:
            public, _ = zmq.auth.load_certificate(path)
        except (ValueError, OSError, UnicodeError):
            continue
        if public and len(public) == 40:
            keys.add(public)
    return keys


def load_secret_key(path: str) -> str:
    """The Z85 secret key of a ``*.key_secret`` certificate file; ConfigError otherwise."""
    try:
        _, secret = zmq.auth.load_certificate(path)
    except (ValueError, OSError, UnicodeError) as exc:
        raise ConfigError(f"cannot read a CURVE secret key from {path}: {exc}") from exc
    if not secret:
        raise ConfigError(f"{path} holds no CURVE secret key (a public key file? use the .key_secret one)")
    return secret.decode()


def serve(sock: zmq.Socket[bytes], secret: str, allowed: AllowedKeys | None) -> tuple[str, str]:
    """Make ``sock`` a CURVE server with the Z85 ``secret`` key, letting in only ``allowed`` keys
    when given; (its public key, the ZAP domain to :func:`unguard`, or "")."""
    public = zmq.curve_public(secret.encode())
    sock.curve_server = True
    sock.curve_secretkey = secret.encode()
    sock.curve_publickey = public
    return public.decode(), guard(sock, allowed) if allowed is not None else ""


def guard(sock: zmq.Socket[bytes], allowed: AllowedKeys) -> str:
    """Make ``sock``'s CURVE handshakes ask ``allowed``; returns the ZAP domain to :func:`unguard`."""
    global _auth
    with _lock:
        if _auth is None:
            _auth = ThreadAuthenticator(zmq.Context.instance(), log=log)
            _auth.start()
            # With a handler present libzmq asks it about every CURVE handshake: a publisher of
            # this process without an allow-list (empty domain) still lets everyone in.
            _auth.configure_curve_callback("*", _AnyKey())
        domain = f"dfpubsub-{next(_domains)}"
        _auth.configure_curve_callback(domain, allowed)
    sock.zap_domain = domain.encode()
    return domain


def unguard(domain: str) -> None:
    """Forget a closed socket's allow-list."""
    with _lock:
        if _auth is not None:
            _auth.credentials_providers.pop(domain, None)
