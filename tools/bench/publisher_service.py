"""publisher_service: forked API workers through df-publisher-service, against one direct publisher.

* direct: one publisher process binding tcp, one subscriber process (the zmq_e2e stack).
* service: ``--workers`` (4) worker processes publishing with ``pubsub.multiproc = true``
  into one df-publisher-service process (ipc in, tcp out), one subscriber process.

The direct publisher publishes ~200-byte events round-robin on four topics flat out; the
workers then offer the same aggregate load (each paced at the direct rate / workers, in 1 ms
bursts), since four flat-out workers on a small machine would mostly measure how they starve
the subscriber of CPU (``--flat-out`` measures that instead). The figure is events delivered per
second at the subscriber. The phases alternate for ``--rounds`` rounds and
the best of each counts. After each phase every publisher reports its final sequences and
the subscriber accounts for every (publisher, topic, seq): delivered, or inside a range
a resync request reported. The rest is ``lost_undetected`` (must be 0). Each service phase
also prints the cores every process used while the workers published (the subscriber's until it
had accounted for everything): on a small machine they say who took the CPU. The last line of
stdout is one JSON object.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import subprocess
import sys
import tempfile
import time
from collections import Counter
from multiprocessing.connection import Connection
from multiprocessing.context import ForkServerContext
from multiprocessing.process import BaseProcess
from multiprocessing.synchronize import Event as MpEvent
from typing import Any

from e2e import (
    CONNECT_TIMEOUT,
    EVENT_BYTES,
    HWM,
    TOPICS,
    DriverSpec,
    Recorder,
    account,
    recv_from,
    run_phase,
    send_loop,
    stop_all,
    warm_up,
)

from dfpubsub.config import load_settings
from dfpubsub.factory import create_publisher
from dfpubsub.metrics import Stats
from dfpubsub.multiproc import WorkerPublisher
from dfpubsub.plugins import load_driver
from dfpubsub.subscriber import Subscriber, SubscriberOptions
from dfpubsub.testing.servers import free_port

DIRECT = DriverSpec("zmq+tcp://127.0.0.1:*", "zmq", {"sndhwm": HWM, "rcvhwm": HWM}, connect=True)


def write_config(path: str, port: int, socket_path: str) -> None:
    """The config the service and the workers share."""
    with open(path, "w") as f:
        f.write(f'[pubsub]\ndriver = "zmq+tcp://127.0.0.1:{port}"\nmultiproc_socket = "{socket_path}"\n'
                f'[publisher_service]\nannounce = false\n[log]\nlevel = "warning"\n'
                f'[driver.zmq]\nsndhwm = {HWM}\nrcvhwm = {HWM}\nworker_hwm = {HWM}\n')


def worker(conn: Connection, warm: MpEvent, seconds: float, rate: float, config: str, index: int) -> None:
    """An API worker: publish through the service at ``rate``/s (0: flat out), then report its id and sequences."""
    settings = load_settings(config, {"pubsub": {"multiproc": True}})
    pub = create_publisher(settings, name=f"bench-worker-{index}")
    assert isinstance(pub, WorkerPublisher)  # pubsub.multiproc is on
    report = send_loop(warm_up(pub.publish, warm), seconds, rate)
    pub.flush()
    report.update(id=pub.id, seqs=pub.sequences(), stats=pub.publisher.stats.snapshot())
    pub.close()
    conn.send(report)
    conn.recv()


def subscriber(conn: Connection, warm: MpEvent, endpoint: str, workers: int) -> None:
    """Deliver, then account for every event each worker reports having sent."""
    rec = Recorder(warm)
    stats = Stats("subscriber", "bench-sub")
    sub = Subscriber(load_driver("zmq", {"rcvhwm": HWM}).subscriber(stats), TOPICS, rec.on_event, rec.on_resync,
                     SubscriberOptions(), "bench-sub", rec.requests.append, stats)
    sub.connect(endpoint)
    sub.start()
    started = time.process_time(), time.perf_counter()
    reports: list[dict[str, Any]] = conn.recv()
    lost, dups, cpu = account(rec, reports, started)
    sub.close()
    conn.send({"delivered": rec.count, "rate": rec.rate(), "cpu": cpu,
               "lost_undetected": lost, "duplicates": dups, "stats": stats.snapshot(),
               "requests": dict(Counter(r.reason for r in rec.requests))})


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds a process has used so far (Linux /proc)."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def service_phase(ctx: ForkServerContext, seconds: float, rate: float, workers: int, tmp: str) -> dict[str, Any]:
    """Service + workers + subscriber; prints and returns the subscriber's report."""
    port, sock, config = free_port(), os.path.join(tmp, "publisher.sock"), os.path.join(tmp, "bench.toml")
    write_config(config, port, sock)
    service = subprocess.Popen([sys.executable, "-m", "dfpubsub.services.publisher_service", "--config", config])
    warm = ctx.Event()
    (sub_conn, sub_child) = ctx.Pipe()
    pipes = [ctx.Pipe() for _ in range(workers)]
    procs: list[BaseProcess] = [ctx.Process(target=subscriber, args=(sub_child, warm, f"tcp://127.0.0.1:{port}",
                                                                      workers), name="sub")]
    procs += [ctx.Process(target=worker, args=(child, warm, seconds, rate, config, i), name=f"worker-{i}")
              for i, (_, child) in enumerate(pipes)]
    try:
        for p in procs:
            p.start()
        warm.wait(CONNECT_TIMEOUT)
        service_cpu = cpu_seconds(service.pid), time.perf_counter()
        reports = [recv_from(conn, procs, seconds + 2 * CONNECT_TIMEOUT) for conn, _ in pipes]
        service_cores = (cpu_seconds(service.pid) - service_cpu[0]) / (time.perf_counter() - service_cpu[1])
        sub_conn.send(reports)
        res = recv_from(sub_conn, procs, 60.0)
        for conn, _ in pipes:
            conn.send("exit")
    finally:
        stop_all(procs)
        service.terminate()
        service.wait(10)
    sent = sum(r["sent"] for r in reports)
    elapsed = max(r["elapsed"] for r in reports)
    print(f"[service] {workers} workers published {sent} in {elapsed:.2f}s ({sent / elapsed:,.0f}/s); delivered "
          f"{res['delivered']} at {res['rate']:,.0f}/s; lost_undetected {res['lost_undetected']}, duplicates "
          f"{res['duplicates']}, resync requests {res['requests'] or 'none'}", flush=True)
    drops = sum(r["stats"].get("drops:send_failed", 0) for r in reports)
    cores = ", ".join(f"{r['cpu']:.2f}" for r in reports)
    print(f"[service] cores: workers {cores} (sum {sum(r['cpu'] for r in reports):.2f}), service "
          f"{service_cores:.2f}, subscriber {res['cpu']:.2f}", flush=True)
    print(f"[service] worker drops {drops}; subscriber {res['stats']}", flush=True)
    return res


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seconds", type=float, default=12.0, help="approximate total run time (default 12)")
    parser.add_argument("--rounds", type=int, default=2, help="interleaved direct/service rounds; best counts")
    parser.add_argument("--workers", type=int, default=4, help="forked API workers (default 4)")
    parser.add_argument("--flat-out", action="store_true", help="workers publish flat out, not at the direct rate")
    args = parser.parse_args(argv)
    rounds = max(1, args.rounds)
    phase = args.seconds / rounds / 2
    ctx = mp.get_context("forkserver")
    ctx.set_forkserver_preload(["zmq", "msgpack", "e2e", "dfpubsub.drivers.zeromq"])
    print(f"publisher_service: {EVENT_BYTES}-byte events on {len(TOPICS)} topics, {args.workers} workers, "
          f"about {args.seconds:g}s", flush=True)
    direct = via = 0.0
    lost = 0
    with tempfile.TemporaryDirectory(prefix="dfpubsub-bench-") as tmp:
        for _ in range(rounds):  # interleaved so that a noisy neighbour hits both sides alike
            d = run_phase(ctx, "direct", phase, 0, DIRECT)
            rate = 0.0 if args.flat_out else d["rate"] / args.workers
            s = service_phase(ctx, phase, rate, args.workers, tmp)
            direct, via = max(direct, d["rate"]), max(via, s["rate"])
            lost += d["lost_undetected"] + s["lost_undetected"]
    print(json.dumps({"bench": "publisher_service", "events_per_s": round(via), "direct_events_per_s": round(direct),
                      "ratio": round(via / direct, 2) if direct else 0.0, "lost_undetected": lost}), flush=True)
    return 0 if lost == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
