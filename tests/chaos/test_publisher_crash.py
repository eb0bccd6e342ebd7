"""A publisher killed with SIGKILL, then restarted on the same address."""

import subprocess
import sys
import threading
from pathlib import Path

from dfpubsub import Subscriber, SubscriberOptions, load_driver
from dfpubsub.metrics import Stats
from tests.conftest import free_port, wait_for

CHILD = Path(__file__).with_name("pub_child.py")


def start_publisher(url, max_idle):
    proc = subprocess.Popen([sys.executable, str(CHILD), url, str(max_idle)], stdout=subprocess.PIPE, text=True)
    line = proc.stdout.readline()
    assert line.startswith("id "), line
    return proc, line.split()[1]


def test_killed_publisher_is_declared_lost_and_its_successor_streams_cleanly():
    url = f"tcp://127.0.0.1:{free_port()}"
    lock = threading.Lock()
    seqs: dict[str, list[int]] = {}
    gaps = []
    resyncs = []

    def on_event(e):
        with lock:
            seqs.setdefault(e.publisher_id, []).append(e.seq)

    def got(pid):
        with lock:
            return len(seqs.get(pid, []))

    stats = Stats("subscriber", "chaos")
    sub = Subscriber(load_driver("zmq").subscriber(stats), ["t"], on_event, resyncs.append,
                     SubscriberOptions(message_delay_window=0.2), "chaos", gaps.append, stats)
    sub.connect(url)
    sub.start()
    first, pid1 = start_publisher(f"zmq+{url}", 0.3)
    second = None
    try:
        wait_for(lambda: got(pid1) > 50, what="events from the first publisher")
        first.kill()
        first.wait()
        # No bye came: after dead_after_idles x max_idle of silence the publisher is lost,
        # and its topic is resynced in case its last messages died with it.
        wait_for(lambda: any(g.reason == "publisher_lost" and g.publisher_id == pid1 for g in gaps),
                 timeout=5, what="the dead publisher to be noticed")
        second, pid2 = start_publisher(f"zmq+{url}", 0.3)
        assert pid2 != pid1
        wait_for(lambda: got(pid2) > 50, what="events from the restarted publisher")
        with lock:
            s1, s2 = list(seqs[pid1]), list(seqs[pid2])
        assert s1 == list(range(s1[0], s1[0] + len(s1)))
        assert s2 == sorted(set(s2))
        # The successor was first heard mid-stream (ZeroMQ reconnects in the background):
        # that is covered by a first_seen resync, never by silence.
        reasons = {g.reason for g in gaps if g.publisher_id == pid2}
        assert reasons <= {"first_seen"}
        assert s2[0] == 1 or reasons == {"first_seen"}
        assert {"t"} in resyncs[1:]
    finally:
        first.kill()
        if second is not None:
            second.kill()
            second.wait()
        sub.close()
