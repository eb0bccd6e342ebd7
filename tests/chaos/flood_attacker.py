"""A subscription flood against a publisher's tcp port, from a raw ZeroMQ XSUB (issue 31).

Usage: python flood_attacker.py URI STAY
Sends 100,000 distinct 96-byte subscriptions and 20,000 to the control topic as fast as it
can, prints "sent", then stays connected STAY seconds without reading anything, and leaves.
libzmq's XSUB sends its subscriptions again at every reconnection: a publisher that cuts it
off is flooded again.
"""

import sys
import time

import zmq

from dfpubsub.codec import topic_frame
from dfpubsub.events import CONTROL_TOPIC


def main() -> None:
    uri, stay = sys.argv[1], float(sys.argv[2])
    ctx = zmq.Context()
    sock = ctx.socket(zmq.XSUB)
    sock.setsockopt(zmq.SNDHWM, 0)  # queue the whole flood, whatever the publisher takes
    sock.setsockopt(zmq.RCVHWM, 1)  # and read (almost) nothing of what it sends
    sock.setsockopt(zmq.RCVBUF, 4096)
    sock.connect(uri)
    control = b"\x01" + topic_frame(CONTROL_TOPIC)
    for i in range(100_000):
        sock.send(b"\x01" + topic_frame(f"flood-{i:08d}".ljust(94, "x")))  # 96 bytes
        if i % 5 == 0:
            sock.send(control)
    print("sent", flush=True)
    time.sleep(stay)
    sock.close(0)
    ctx.term()


if __name__ == "__main__":
    main()
