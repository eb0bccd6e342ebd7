"""A process that campaigns for a lease and, while it leads, acts: appends ``token identity time``
to a fencing log every few milliseconds.

Each act takes the log's lock, asks the elector for its token (the act path's
check) and appends the token and the time of the check under the same lock: a
stop between the check and the write holds the lock, so the log's order is the
order of the acts.

argv: lease URL, fencing log, identity, lease duration, renew deadline, retry period, clock skew.
Logs (JSON lines, dfpubsub.leader's) go to stderr.
"""

from __future__ import annotations

import fcntl
import signal
import sys
import threading
import time

from dfpubsub.leader import LeaderElector, open_lease
from dfpubsub.logs import setup_logging


def main() -> None:
    url, path, identity = sys.argv[1:4]
    lease, deadline, retry, skew = (float(a) for a in sys.argv[4:8])
    setup_logging("info")
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    elector = LeaderElector(open_lease(url, "fenced", timeout=min(retry, deadline / 3)), "fenced", identity,
                            lease_duration=lease, renew_deadline=deadline, retry_period=retry,
                            clock_skew=skew).start()
    with open(path, "a", encoding="utf-8") as log:
        while not stop.wait(0.005):
            fcntl.flock(log, fcntl.LOCK_EX)
            try:
                token, at = elector.token(), time.time()  # the act is decided here
                if token is not None:
                    log.write(f"{token} {identity} {at:.6f}\n")
                    log.flush()
            finally:
                fcntl.flock(log, fcntl.LOCK_UN)
    elector.close()


if __name__ == "__main__":
    main()
