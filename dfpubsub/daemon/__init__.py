"""What every dfpubsub daemon shares: checked settings, one start-up policy, health probes,
systemd's notify protocol and a bounded stop (see :mod:`.runner`)."""

from .health import Check, Health
from .preflight import check_settings
from .probes import ProbeServer
from .runner import Daemon
from .systemd import sd_notify, watchdog_interval

__all__ = ["Check", "Daemon", "Health", "ProbeServer", "check_settings", "sd_notify", "watchdog_interval"]
