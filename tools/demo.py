"""df-demo: publishers, subscribers, a message lost on the wire, and its repair by replay.

Everything runs on the embedded default, with no server to install: the
northbound store is a SQLite file in a temporary directory, the transport is
ZeroMQ over loopback TCP.

1. An API worker (NbApi) writes to the store and publishes each change; two
   controllers subscribe (A: ``port`` and ``network``; B: ``portbinding``) and
   full-sync their caches from the store before applying events.
2. One envelope on ``port`` is lost on the wire (fault injection at the
   publisher's transport). Controller A sees the sequence jump, holds later
   messages for the delay window, then replays the store's change feed from
   the revision its cache is complete up to, and reads back exactly the lost
   change (not the table). B sees no false gap and never receives
   ``port`` events, although ZeroMQ's own filter is a byte prefix.
3. Controller B is stopped, writes go on, and B restarts with an empty cache:
   subscribe, full sync, events.
4. Every cache is checked object by object against the store.
5. Controller-to-controller (tools/demo_feed.py): two controllers register
   their chassis with plain store writes, and the change feed's publisher
   (df-feed) tells each about the other.
6. Persistent notifications (tools/demo_notify.py): port changes reach a local
   webhook as S3 event records, although it is down for a while.
"""

from __future__ import annotations

import logging
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from dfpubsub.tools.demo_feed import run_registration
from dfpubsub.tools.demo_notify import run_notifications

from dfpubsub import __version__
from dfpubsub.console import ArgumentParser, console_main
from dfpubsub.controller import Change, Controller
from dfpubsub.events import VersionedObject
from dfpubsub.metrics import Stats
from dfpubsub.nbapi import NbApi
from dfpubsub.plugins import load_driver
from dfpubsub.publisher import Publisher, PublisherOptions
from dfpubsub.store import Store, open_store
from dfpubsub.subscriber import SubscriberOptions
from dfpubsub.testing import LossyTransport, drop_nth
from dfpubsub.tracker import ResyncRequest

TABLES = ["port", "network", "portbinding", "chassis"]


def say(who: str, msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {who:<13} {msg}", flush=True)


class Counter:
    """A table handler that counts what it is told."""

    def __init__(self) -> None:
        self.seen = 0

    def on_create(self, obj: VersionedObject) -> None:
        self.seen += 1

    def on_update(self, obj: VersionedObject, previous: VersionedObject) -> None:
        self.seen += 1

    def on_delete(self, previous: VersionedObject) -> None:
        self.seen += 1


def start_controller(name: str, topics: list[str], endpoint: str, store: Store) -> Controller:
    def on_gap(req: ResyncRequest) -> None:
        if req.reason == "gap_expired":
            lo, hi = req.missing or (0, 0)
            say(name, f"GAP on topic {req.topic!r}: seq {lo}..{hi} never arrived within the delay window")

    def on_reconciled(topics: set[str], changes: list[Change]) -> None:
        what = ", ".join(f"{c.action.value} {c.table}/{c.key} v{c.version}" for c in changes[:6])
        more = f" and {len(changes) - 6} more" if len(changes) > 6 else ""
        how = ctrl.last_repair
        if how is None or how.cause == "first_sync":
            return
        source = "replay of the store's change feed" if how.kind == "replay" else "relisting the store"
        say(name, f"repaired {sorted(topics)} by {source} ({how.cause}: {how.entries} feed entries and "
                  f"{how.objects} objects read): {what + more or 'nothing missing'}")

    ctrl = Controller(
        store, load_driver("zmq").subscriber(Stats("subscriber", name)), topics,
        {t: Counter() for t in TABLES}, SubscriberOptions(message_delay_window=0.3), name,
        on_gap=on_gap, on_reconciled=on_reconciled,
    )
    ctrl.connect(endpoint)
    ctrl.start()
    if not ctrl.synced.wait(10):
        raise SystemExit(f"{name} did not sync")
    say(name, f"subscribed to {sorted(topics)} and synced: {len(ctrl.cache)} objects")
    return ctrl


def converged(ctrl: Controller, store: Store) -> bool:
    truth = {(o.table, o.key): o for o in store.list_topics(ctrl.subscriber.topics)}
    return truth == {(o.table, o.key): o for o in ctrl.cache.items()}


def wait(cond: Callable[[], object], timeout: float = 10.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if cond():
            return True
        time.sleep(0.05)
    return False


def write(api: NbApi, i: int) -> None:
    table = TABLES[i % 3]
    key = f"{table}-{i % 7}"
    if api.get(table, key) is None:
        api.create(table, key, {"i": i, "name": f"{table} {i}"})
    else:
        api.update(table, key, {"i": i, "name": f"{table} {i}"})


def run(n_writes: int, workdir: Path) -> int:
    store = open_store(f"sqlite:///{workdir}/nb.sqlite", TABLES)
    say("store", f"embedded SQLite at {workdir}/nb.sqlite")
    stats = Stats("publisher", "api-worker")
    transport = LossyTransport(load_driver("zmq+tcp://127.0.0.1:*").publisher(stats), drop_nth("port", 5))
    pub = Publisher(transport, "api-worker", PublisherOptions(batch_linger=0, max_idle_time=1.0), stats)
    api = NbApi(store, pub)
    say("publisher", f"bound {transport.uri}, id {pub.id[:8]}")
    a = start_controller("controller-A", ["port", "network"], transport.uri, store)
    b = start_controller("controller-B", ["portbinding"], transport.uri, store)
    # ZeroMQ connects in the background: start writing once the publisher has heard both.
    wait(lambda: pub.stats.get("subscribers_joined") >= 2)

    say("api-worker", f"{n_writes} writes to ports, networks and port bindings; the 5th 'port' envelope is lost")
    for i in range(n_writes):
        write(api, i)
    say("publisher", f"envelopes dropped on the wire: {transport.dropped}")
    ok = wait(lambda: converged(a, store) and converged(b, store) and a.stats.get("replays") >= 1)

    say("controller-B", "stopping; 12 more writes while it is down")
    b.stop()
    for i in range(n_writes, n_writes + 12):
        write(api, i)
    b = start_controller("controller-B", ["portbinding"], transport.uri, store)
    ok &= wait(lambda: converged(a, store) and converged(b, store))

    for c in (a, b):
        s = c.stats
        equal = converged(c, store)
        say(c.name, f"{len(c.cache)} objects, gaps {s.get('gaps')}, repairs by replay {s.get('replays')}, "
                    f"by relist {s.get('relists')} (the initial sync), cache == store object by object: {equal}")
        ok &= equal
    false_gaps = b.stats.get("gaps")
    leaked = len([o for o in b.cache.items() if o.topic == "port"])
    say("controller-B", f"false gaps: {false_gaps}; 'port' objects leaked through the prefix filter: {leaked}")
    ok &= false_gaps == 0 and leaked == 0 and a.stats.get("gaps") >= 1
    a.stop()
    b.stop()
    ok &= run_registration(store, say, wait)
    ok &= run_notifications(api, workdir, say, wait)
    api.close()
    say("demo", "OK: the lost message was detected and repaired by replaying the change feed, controllers saw each other "
                "through the change feed, and the notifications survived the webhook's outage" if ok else "FAILED")
    return 0 if ok else 1


@console_main("df-demo")
def main(argv: list[str] | None = None) -> int:
    """Entry point of ``df-demo``."""
    parser = ArgumentParser(prog="df-demo", description=__doc__.split("\n")[0])
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    parser.add_argument("--writes", type=int, default=30, help="number of store writes to publish")
    parser.add_argument("--keep", metavar="DIR",
                        help="keep the store and queues in DIR (created if need be) for df-db to inspect afterwards")
    args = parser.parse_args(argv)
    # The demo tells its own story; the library's warnings (the gap it provokes) would repeat it.
    logging.getLogger("dfpubsub").setLevel(logging.ERROR)
    if args.keep:
        workdir = Path(args.keep).resolve()
        if (workdir / "nb.sqlite").exists():
            parser.error(f"{workdir} already holds a demo's store; give an empty or new directory")
        workdir.mkdir(parents=True, exist_ok=True)
        code = run(args.writes, workdir)
        say("demo", f"kept {workdir}; inspect it with: df-db --store sqlite:///{workdir}/nb.sqlite dump port")
        return code
    with tempfile.TemporaryDirectory(prefix="df-demo-") as tmp:
        return run(args.writes, Path(tmp))


if __name__ == "__main__":
    sys.exit(main())
