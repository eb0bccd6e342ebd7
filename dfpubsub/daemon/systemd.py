"""systemd's notify protocol, spoken directly: one datagram to ``$NOTIFY_SOCKET``, no library.

A unit of ``Type=notify`` is started once the daemon sends ``READY=1``; with ``WatchdogSec=``
systemd passes ``WATCHDOG_USEC`` and restarts the daemon if no ``WATCHDOG=1`` arrives within
it. See sd_notify(3): the socket is a path, or an abstract name written with a leading ``@``.
Outside systemd (no ``$NOTIFY_SOCKET``) every call does nothing.
"""

from __future__ import annotations

import logging
import os
import socket

__all__ = ["sd_notify", "watchdog_interval"]

log = logging.getLogger("dfpubsub.daemon")


def sd_notify(*assignments: str) -> bool:
    """Send ``assignments`` (``READY=1``, ``STATUS=...``) to systemd; whether they were sent."""
    address = os.environ.get("NOTIFY_SOCKET", "")
    if not address or address[0] not in "/@":
        return False  # not under systemd, or a socket kind (vsock) this does not speak
    if address[0] == "@":
        address = "\0" + address[1:]
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC) as sock:
            sock.sendto("\n".join(assignments).encode(), address)
    except OSError as exc:  # systemd gone, or a socket we may not write: nothing to do about it
        log.debug("cannot notify systemd", extra={"socket": address, "error": str(exc)})
        return False
    return True


def watchdog_interval() -> float | None:
    """Seconds within which systemd wants ``WATCHDOG=1`` (``WATCHDOG_USEC``), or None when it
    wants none (or asks another process: ``WATCHDOG_PID``)."""
    usec, pid = os.environ.get("WATCHDOG_USEC", ""), os.environ.get("WATCHDOG_PID", "")
    if not usec.isdigit() or int(usec) == 0 or (pid.isdigit() and int(pid) != os.getpid()):
        return None
    return int(usec) / 1e6
