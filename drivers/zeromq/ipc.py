"""Binding ipc sockets safely: stale files from a crash, live conflicts, permissions."""

from __future__ import annotations

import os
import socket as pysocket
import stat

import zmq

from dfpubsub.errors import TransportError

__all__ = ["bind", "clear_stale_ipc", "unlink_ipc"]

_IPC = "ipc://"


def clear_stale_ipc(path: str) -> None:
    """Remove a socket file left by a crashed process; refuse one that is alive."""
    try:
        mode = os.stat(path).st_mode
    except FileNotFoundError:
        os.makedirs(os.path.dirname(path) or ".", mode=0o755, exist_ok=True)
        return
    if not stat.S_ISSOCK(mode):
        raise TransportError(f"{path} exists and is not a socket")
    probe = pysocket.socket(pysocket.AF_UNIX, pysocket.SOCK_STREAM)
    try:
        probe.connect(path)
    except ConnectionRefusedError:
        os.unlink(path)
        return
    except OSError as exc:
        raise TransportError(f"cannot probe ipc socket {path}: {exc}") from exc
    finally:
        probe.close()
    raise TransportError(f"ipc socket {path} is in use by a live process")


def bind(sock: zmq.Socket[bytes], url: str, ipc_mode: int) -> str:
    """Bind ``sock`` to ``url`` and return the bound endpoint.

    An ipc socket file gets ``ipc_mode`` (never world-writable by default:
    whoever can write to it can publish). The socket is closed on failure.
    """
    is_ipc = url.startswith(_IPC)
    try:
        if is_ipc:
            clear_stale_ipc(url[len(_IPC):])
        sock.bind(url)
        if is_ipc:
            os.chmod(url[len(_IPC):], ipc_mode)
        return sock.getsockopt_string(zmq.LAST_ENDPOINT)
    except TransportError:
        sock.close(0)
        raise
    except (zmq.ZMQError, OSError) as exc:
        sock.close(0)
        raise TransportError(f"cannot bind {url}: {exc}") from exc


def unlink_ipc(uri: str) -> None:
    """Remove the file of a bound ipc endpoint (nothing for other transports)."""
    if uri.startswith(_IPC):
        try:
            os.unlink(uri[len(_IPC):])
        except FileNotFoundError:
            pass
