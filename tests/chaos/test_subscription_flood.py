"""A subscription flood from another process against a publisher's tcp port (issue 31): the
publisher's memory stays bounded while it lasts and comes back after the attacker leaves, and a
real subscriber is served throughout, losing nothing it does not know of (docs/security.md). The
flood comes twice in a default run (what one left behind would show in the second), five times
under ``--soak``."""

from __future__ import annotations

import subprocess
import sys
import threading
import time
from pathlib import Path

from tests.conftest import wait_for
from tests.functional.zmq_helpers import Sink

HERE = Path(__file__).resolve().parent
ROUNDS, SOAK_ROUNDS = 2, 5
#: Seconds the attacker stays connected, reading nothing, after its flood.
STAY = 5.0
#: RSS growth allowed while a flood lasts and once the attacker left (MB).
DURING, AFTER = 64.0, 16.0


class Victim:
    """The publisher process (flood_victim.py) and what it reports."""

    def __init__(self) -> None:
        self.proc = subprocess.Popen([sys.executable, str(HERE / "flood_victim.py")], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, text=True)
        assert self.proc.stdout is not None
        _, self.uri, _, self.id = self.proc.stdout.readline().split()
        self.rss = self.peak = 0.0
        self.published = self.cut = 0
        self.final: int | None = None
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            words = line.split()
            if words[0] == "rss":
                self.rss, self.published, self.cut = float(words[1]), int(words[3]), int(words[5])
                self.peak = max(self.peak, self.rss)
            elif words[0] == "published":
                self.final = int(words[1])

    def stop(self) -> int:
        assert self.proc.stdin is not None
        self.proc.stdin.write("stop\n")
        self.proc.stdin.flush()
        self.proc.wait(30)
        self._reader.join(10)
        assert self.final is not None
        return self.final


def test_a_subscription_flood_from_another_process_costs_the_publisher_bounded_memory_each_time(soak):
    victim = Victim()
    sink = Sink(["port"], [victim.uri])
    sink.sub.start()
    try:
        assert sink.sub.wait_synced(10)
        wait_for(lambda: len(sink.keys()) > 200, what="the real subscriber to be served")
        time.sleep(1.0)  # the publisher's own warm-up (its allocations settle) before the baseline
        base = victim.rss
        for round in range(SOAK_ROUNDS if soak else ROUNDS):
            cut, served = victim.cut, len(sink.keys())
            victim.peak = victim.rss
            attacker = subprocess.Popen([sys.executable, str(HERE / "flood_attacker.py"), victim.uri, str(STAY)],
                                        stdout=subprocess.PIPE, text=True)
            try:
                assert attacker.stdout is not None and attacker.stdout.readline().strip() == "sent"
                mid = len(sink.keys())
                attacker.wait(STAY + 30)
            finally:
                attacker.kill()
            assert victim.peak - base <= DURING, f"round {round}: +{victim.peak - base:.1f} MB during the flood"
            assert victim.cut > cut, f"round {round}: the attacker was never cut off"
            assert served < mid < len(sink.keys()), f"round {round}: the real subscriber was not served throughout"
            wait_for(lambda: victim.rss - base <= AFTER, timeout=10,
                     what=f"round {round}: the publisher's memory back within {AFTER} MB (+{victim.rss - base:.1f})")
        last = victim.stop()
        wait_for(lambda: len(sink.keys()) >= last or sink.gaps, timeout=10, what="the last events")
        assert sink.undetected_losses(victim.id, {"port": last}) == {"port": []}
        # Nothing lost at all, in fact, from the first event after the subscriber joined (those
        # before it came with its initial sync).
        first = int(sink.keys()[0][1:])
        assert sink.keys() == [f"k{n}" for n in range(first, last + 1)]
    finally:
        if victim.proc.poll() is None:
            victim.proc.kill()
        sink.sub.close()
