"""df-publisher-service: one per API host, the port subscribers connect to for forked workers.

Pre-fork API servers run many worker processes, but a "bind based" transport
(ZeroMQ tcp) gives a host one port. The service binds that port
(``pubsub.driver``) and an ipc socket (``pubsub.multiproc_socket``, mode
``[driver.zmq] ipc_mode``, 0660 by default; a stale file from a crash is
removed, a live one refused) that workers configured with
``pubsub.multiproc = true`` push their envelopes into. It relays them byte
for byte (:mod:`dfpubsub.relay`), greets new subscribers with hellos on the
workers' behalf, and registers itself in the discovery table under a lease.

SIGTERM: stop taking new work, relay what workers already sent (up to
``publisher_service.drain_timeout``), unregister, flush to subscribers and
exit 0.
"""

from __future__ import annotations

import logging
import socket
import sys

from dfpubsub.config import parse_settings
from dfpubsub.console import close_all, console_main
from dfpubsub.daemon import Daemon, check_settings
from dfpubsub.discovery import PublisherAnnouncer, discovery_from_settings
from dfpubsub.errors import ConfigError
from dfpubsub.factory import create_driver
from dfpubsub.logs import setup_logging
from dfpubsub.metrics import Stats
from dfpubsub.relay import Relay, RelayOptions

log = logging.getLogger("df-publisher-service")


@console_main("df-publisher-service")
def main(argv: list[str] | None = None) -> int:
    """Entry point of ``df-publisher-service``."""
    settings = check_settings(parse_settings(
        "df-publisher-service", __doc__.split("\n")[0], argv,
        ("pubsub", "publisher_service", "discovery", "etcd", "redis", "log", "metrics")))
    setup_logging(settings.log.level, settings.log.format)
    ps = settings.pubsub
    name = ps.publisher_name or f"{socket.gethostname()}/publisher-service"
    stats = Stats("publisher_service", name)
    daemon = Daemon("df-publisher-service", name, settings)
    ingress = egress = announcer = discovery = None
    try:
        driver = create_driver(settings)
        if not driver.publisher_service:
            raise ConfigError(f"driver {driver.name!r} needs no publisher service: workers publish directly")
        egress = driver.publisher(stats)
        ingress = driver.worker_ingress(stats, ps.multiproc_socket)
        service = settings.publisher_service
        relay = Relay(ingress, egress, name, RelayOptions(ps.max_idle_time, ps.dead_after_idles, ps.max_message_bytes,
                                                          service.max_workers, service.max_topics), stats)
        if settings.publisher_service.announce:
            discovery = found = discovery_from_settings(settings)
            announcer = daemon.open("discovery", lambda: PublisherAnnouncer(
                found, relay, advertise_host=settings.publisher_service.advertise_host or None))
            if announcer is None:
                return 0
        daemon.health.synced.set()  # both ends bound: workers and subscribers may come
        beat = daemon.health.heartbeat("main", 30.0)
        log.info("publisher service starting", extra={"service": name, "workers": ingress.uri,
                                                      "subscribers": egress.uri, "id": relay.id})
        relay.run(daemon.stop, settings.publisher_service.drain_timeout, beat)
        log.info("publisher service stopping", extra={"service": name, "relayed": stats.get("envelopes_relayed")})
    finally:
        close_all(announcer, discovery, ingress, egress, daemon)
    return 0


if __name__ == "__main__":
    sys.exit(main())
