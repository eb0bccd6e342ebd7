"""failover: what Sentinel and replication cost, and how long a Redis failover takes.

On a private Redis master with two replicas and three sentinels (loopback ports,
down-after-milliseconds ``--down-after``), in one run:

* ``nb_write``: NbApi updates per second (nb_write.py's loop, publishing on ZeroMQ) through
  ``redis+sentinel://`` against ``redis://`` straight to the same master; then with
  ``[redis] wait_replicas = 1`` (WAIT for one replica after each write) against without:
  ``wait_ratio``;
* ``drivers_e2e``: the Redis Streams driver's full stack flat out (e2e.py), Sentinel
  against direct;
* ``fanout``: one publisher and ``--subscribers`` subscriber processes on the Redis Streams
  driver (fanout.py's cells), Sentinel against direct;

each alternated ``--rounds`` times, the medians compared (the machine is shared; the CPU per
event, ``*_cpu_ratio``, direct over Sentinel, is the steadier figure);
* failovers: ``--failovers`` times, a writer updates through Sentinel without pause, the master
  is killed (SIGKILL), and the time from the kill to the first write that returns is taken;
  the killed server is restarted and rejoins as a replica before the next round;
* NATS: the full stack on the NATS driver on a three-node JetStream cluster, the stream R3
  against R1 (``nats_r3_ratio``).

Last line: ``{"bench": "failover", "nb_write_ratio": R, "drivers_e2e_ratio": R, "fanout_ratio": R,
"nb_write_cpu_ratio": R, "drivers_e2e_cpu_ratio": R, "fanout_cpu_ratio": R,
"wait_ratio": R, "failover_s": {"min", "p50", "p90", "max"}, "failover_budget_s": B,
"failovers_within_budget": N, "nats_r3_ratio": R, ..., "lost_undetected": 0}``.
Targets: the three Sentinel ratios >= 0.9; every failover within down-after + 2 s.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from e2e import DriverSpec, run_phase
from fanout import df_pub, df_sub, run_cell, summarize
from nb_write import VALUE, nbapi_rate

from dfpubsub.backends import access
from dfpubsub.errors import StoreUnavailable
from dfpubsub.store import Store, open_store
from dfpubsub.testing.servers import NatsCluster, RedisSentinelCluster

TABLES = ["port"]


def _median_rates(stores: dict[str, Store], writes: int, rounds: int) -> tuple[dict[str, float], dict[str, float]]:
    """NbApi updates per second and this process's CPU µs per update (the publisher's thread
    included, the servers' not), medians over ``rounds`` alternated rounds."""
    rates: dict[str, list[float]] = {name: [] for name in stores}
    cpus: dict[str, list[float]] = {name: [] for name in stores}
    for _ in range(rounds):
        for name, store in stores.items():
            cpu = time.process_time()
            rates[name].append(nbapi_rate(store, writes, 1000))
            cpus[name].append((time.process_time() - cpu) / writes * 1e6)
    return ({name: statistics.median(r) for name, r in rates.items()},
            {name: statistics.median(c) for name, c in cpus.items()})


def nb_write(cluster: RedisSentinelCluster, writes: int, rounds: int) -> dict[str, Any]:
    stores = {"direct": open_store(cluster.direct_url, TABLES, prefix="nbw"),
              "sentinel": open_store(cluster.url, TABLES, prefix="nbw")}
    stores["direct"].initialize()
    for k in range(1000):
        stores["direct"].create("port", f"port-{k:04d}", VALUE)
    rates, cpus = _median_rates(stores, writes, rounds)
    for store in stores.values():
        store.close()
    before = access.redis_access()
    access.configure(redis=access.RedisAccess(wait_replicas=1))
    waited = open_store(cluster.url, TABLES, prefix="nbw")
    access.configure(redis=before)
    plain = open_store(cluster.url, TABLES, prefix="nbw")
    wait, _ = _median_rates({"wait": waited, "plain": plain}, writes, rounds)
    waited.close()
    plain.close()
    print(f"[nb_write] direct {rates['direct']:,.0f}/s ({cpus['direct']:.0f} µs CPU each), sentinel "
          f"{rates['sentinel']:,.0f}/s ({cpus['sentinel']:.0f} µs); wait_replicas=1 {wait['wait']:,.0f}/s against "
          f"{wait['plain']:,.0f}/s", flush=True)
    return {"nb_write_direct_per_s": round(rates["direct"]), "nb_write_sentinel_per_s": round(rates["sentinel"]),
            "nb_write_ratio": round(rates["sentinel"] / rates["direct"], 2),
            "nb_write_cpu_ratio": round(cpus["direct"] / cpus["sentinel"], 2),
            "wait_per_s": round(wait["wait"]), "wait_ratio": round(wait["wait"] / wait["plain"], 2)}


def _alternated(rounds: int, cluster: RedisSentinelCluster,
                measure: Any) -> tuple[dict[str, float], dict[str, float], int]:
    """``measure(name, url, i)`` -> (rate, CPU µs per event, lost), direct and Sentinel in turn
    ``rounds`` times (the machine is shared: alternating spreads its moods over both); the
    medians of each and the undetected losses."""
    rates: dict[str, list[float]] = {"direct": [], "sentinel": []}
    cpus: dict[str, list[float]] = {"direct": [], "sentinel": []}
    lost = 0
    for i in range(rounds):
        for name, url in (("direct", cluster.direct_url), ("sentinel", cluster.url)):
            rate, cpu, n = measure(name, url, i)
            rates[name].append(rate)
            cpus[name].append(cpu)
            lost += n
    return ({k: statistics.median(v) for k, v in rates.items()}, {k: statistics.median(v) for k, v in cpus.items()},
            lost)


def drivers_e2e(ctx: Any, cluster: RedisSentinelCluster, seconds: float, rounds: int) -> tuple[dict[str, Any], int]:
    def measure(name: str, url: str, i: int) -> tuple[float, float, int]:
        res = run_phase(ctx, f"redis {name} {i + 1}", seconds, 0, DriverSpec(url, url, {"prefix": f"e2e{name}{i}"}))
        return res["rate"], res["cpu"] / res["rate"] * 1e6, res["lost_undetected"]

    rates, cpus, lost = _alternated(rounds, cluster, measure)
    return {"drivers_e2e_direct_per_s": round(rates["direct"]), "drivers_e2e_sentinel_per_s": round(rates["sentinel"]),
            "drivers_e2e_ratio": round(rates["sentinel"] / rates["direct"], 2),
            "drivers_e2e_cpu_ratio": round(cpus["direct"] / cpus["sentinel"], 2)}, lost


def fanout(ctx: Any, cluster: RedisSentinelCluster, seconds: float, n: int, rounds: int) -> tuple[dict[str, Any], int]:
    def measure(name: str, url: str, i: int) -> tuple[float, float, int]:
        spec = DriverSpec(url, url, {"prefix": f"fan{name}{i}"})
        out = summarize(f"[fanout {name} x{n} {i + 1}]", *run_cell(ctx, n, seconds, df_pub, df_sub, cluster.master(),
                                                                    spec))
        return out["rate"], out["sub_cpu_us"] + out["pub_cpu_us"], out["lost_undetected"]

    rates, cpus, lost = _alternated(rounds, cluster, measure)
    return {"fanout_direct_per_s": round(rates["direct"]), "fanout_sentinel_per_s": round(rates["sentinel"]),
            "fanout_ratio": round(rates["sentinel"] / rates["direct"], 2),
            "fanout_cpu_ratio": round(cpus["direct"] / cpus["sentinel"], 2)}, lost


def _write(store: Store, stop: threading.Event, acked: list[float]) -> None:
    """Update one object without pause until ``stop``, noting when each update returned."""
    n = 0
    while not stop.is_set():
        n += 1
        try:
            store.update("port", "k", n)
        except StoreUnavailable:
            continue
        acked.append(time.monotonic())


def failovers(cluster: RedisSentinelCluster, count: int) -> list[float]:
    """Seconds from each kill of the master to the first write through Sentinel that returned."""
    store = open_store(cluster.url, TABLES, prefix="fo", timeout=2.0)
    store.initialize()
    store.create("port", "k", 0)
    times: list[float] = []
    for round_ in range(count):
        acked: list[float] = []
        stop = threading.Event()
        thread = threading.Thread(target=_write, args=(store, stop, acked), daemon=True)
        thread.start()
        while len(acked) < 100:
            time.sleep(0.01)
        old = cluster.master()
        old.kill()  # returns once the process is gone: no write can return after this but through a new master
        killed = time.monotonic()
        cluster.wait_master_change(old)
        while not [t for t in acked if t > killed]:
            time.sleep(0.005)
        stop.set()
        thread.join(10)
        took = min(t for t in acked if t > killed) - killed
        times.append(took)
        print(f"[failover {round_ + 1}/{count}] first write {took:.2f} s after the kill", flush=True)
        old.start()  # the sentinels make it a replica of the new master
        cluster.wait_replica(old)
    store.close()
    return times


def nats_replicas(ctx: Any, workdir: Path, seconds: float) -> tuple[dict[str, Any], int]:
    cluster = NatsCluster(workdir / "nats").start()
    rates, lost = {}, 0
    try:
        for name, replicas in (("r1", 1), ("r3", 3), ("r1b", 1)):
            options = {"prefix": f"n{name}", "stream": f"N{name.upper()}", "num_replicas": replicas}
            res = run_phase(ctx, f"nats {name}", seconds, 0, DriverSpec(cluster.url, cluster.url, options))
            rates[name] = res["rate"]
            lost += res["lost_undetected"]
    finally:
        cluster.kill()
    r1 = (rates["r1"] + rates["r1b"]) / 2
    return {"nats_r1_per_s": round(r1), "nats_r3_per_s": round(rates["r3"]),
            "nats_r3_ratio": round(rates["r3"] / r1, 2)}, lost


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seconds", type=float, default=3.0, help="seconds per throughput phase (default 3)")
    parser.add_argument("--writes", type=int, default=5000, help="NbApi updates per nb_write round (default 5000)")
    parser.add_argument("--rounds", type=int, default=3, help="rounds of direct and Sentinel, alternated (default 3)")
    parser.add_argument("--subscribers", type=int, default=4, help="fanout subscriber processes (default 4)")
    parser.add_argument("--failovers", type=int, default=10, help="failovers timed (default 10)")
    parser.add_argument("--down-after", type=int, default=1000, help="sentinels' down-after-milliseconds")
    parser.add_argument("--parts", default="nb_write,drivers_e2e,fanout,failover,nats")
    args = parser.parse_args(argv)
    parts = set(args.parts.split(","))
    ctx = mp.get_context("forkserver")
    ctx.set_forkserver_preload(["zmq", "msgpack", "redis", "nats", "e2e", "dfpubsub.drivers.redis_streams",
                                "dfpubsub.drivers.nats_jetstream"])
    result: dict[str, Any] = {"bench": "failover"}
    lost = 0
    with tempfile.TemporaryDirectory(prefix="bench-failover-") as tmp:
        cluster = RedisSentinelCluster(Path(tmp) / "sentinel", down_after=args.down_after).start()
        try:
            if "nb_write" in parts:
                result.update(nb_write(cluster, args.writes, args.rounds))
            if "drivers_e2e" in parts:
                found, n = drivers_e2e(ctx, cluster, args.seconds, args.rounds)
                result.update(found)
                lost += n
            if "fanout" in parts:
                found, n = fanout(ctx, cluster, args.seconds, args.subscribers, args.rounds)
                result.update(found)
                lost += n
            if "failover" in parts:
                times = sorted(failovers(cluster, args.failovers))
                budget = args.down_after / 1000 + 2.0
                result.update({
                    "failover_s": {"min": round(times[0], 2), "p50": round(statistics.median(times), 2),
                                   "p90": round(times[int(0.9 * (len(times) - 1))], 2), "max": round(times[-1], 2)},
                    "failover_budget_s": budget, "failovers": len(times),
                    "failovers_within_budget": sum(t <= budget for t in times)})
        finally:
            cluster.kill()
        if "nats" in parts:
            found, n = nats_replicas(ctx, Path(tmp), args.seconds)
            result.update(found)
            lost += n
    result["lost_undetected"] = lost
    print(json.dumps(result), flush=True)
    return 0 if lost == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
