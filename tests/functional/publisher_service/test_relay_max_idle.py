"""The publisher service's relay and a worker that advertises max_idle 0 (no idle hellos).

Real worker socket (ZeroMQ ipc) in, the in-process bus out. Such a worker's
silence proves nothing: the relay must neither forget it nor re-announce it
with a max_idle of its own, which would make subscribers take it as dead.
"""

from dfpubsub import load_driver
from dfpubsub.codec import decode, encode_hello
from dfpubsub.events import CONTROL_TOPIC, Hello
from dfpubsub.metrics import Stats
from dfpubsub.relay import Relay, RelayOptions
from tests.conftest import free_port, wait_for


def test_relay_keeps_a_worker_without_idle_hellos_and_welcomes_with_its_max_idle(tmp_path):
    stats = Stats("relay", "test")
    zmq_driver = load_driver(f"zmq+tcp://127.0.0.1:{free_port()}")
    bus = load_driver(f"memory://relay-max-idle-{free_port()}")
    sock = str(tmp_path / "workers.sock")
    relay = Relay(zmq_driver.worker_ingress(stats, sock), bus.publisher(stats), "svc",
                  RelayOptions(max_idle_time=0.1, dead_after_idles=2.0), stats)
    push = zmq_driver.worker_publisher(stats, sock)
    sub = bus.subscriber(stats)
    try:
        push.send(CONTROL_TOPIC, encode_hello(Hello("quiet", "q", 0.0, {"a": 5}, "start", 0.0, "h")))
        push.send(CONTROL_TOPIC, encode_hello(Hello("chatty", "c", 0.0, {"a": 7}, "start", 0.1, "h")))
        wait_for(lambda: relay.step(0.05) >= 0 and set(relay.workers()) == {"quiet", "chatty"},
                 what="both workers' hellos")
        # The control: a worker that promised idle hellos and went silent is forgotten...
        wait_for(lambda: relay.step(0.05) >= 0 and "chatty" not in relay.workers(), 10,
                 what="the silent worker to be forgotten")
        # ...by the same check that keeps the one that promised none.
        assert "quiet" in relay.workers()
        sub.subscribe(CONTROL_TOPIC)
        hellos: list = []

        def welcomed():
            relay.step(0.05)
            hellos.extend(decode(f) for f in sub.recv(0.05))
            return hellos

        wait_for(welcomed, what="a welcome for the quiet worker")
        got = [(h.publisher_id, h.seqs, h.reason, h.max_idle_time) for h in hellos]
        assert got == [("quiet", {"a": 5}, "welcome", 0.0)]
    finally:
        push.close()
        sub.close()
        relay.ingress.close()
        relay.transport.close()
