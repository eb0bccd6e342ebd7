"""pipeline: compact a synthetic event log on local[2] Spark against a single-process pyarrow compaction.

A log of ``--events`` events (``--keys`` objects, default events / 10, over
four topics; 5% deletes; 48-byte values) is written in the archiver's layout,
500k events per chunk so the generator never holds the log in memory. Then,
each in a process of its own while a thread samples the resident memory of
that process and its children (the JVM under Spark) from /proc:

- Spark: ``dfpubsub.pipeline.compact`` on ``local[2]`` with the settings
  every local job gets (``build_session``: a fixed 1 GiB heap, touched whole
  at start), timed from the job's start to the committed snapshot (the JVM's
  start-up is not counted, its JIT warm-up is: the first round pays it);
- baseline: pyarrow in one process: read every segment, sort by (table, key)
  and the tie-break order, keep the first row of each key, write the live
  rows to one Parquet file.

Each side runs ``--rounds`` times (into a fresh snapshot each time) and keeps
its best round, as the other benchmarks do; the peak memory is over all
rounds. Both must find the same numbers of live objects and tombstones. Last line:
``{"bench": "pipeline", "events": N, "spark_events_per_s": N, "baseline_events_per_s": N,
"spark_peak_rss_mb": N, "baseline_peak_rss_mb": N}``.
Targets: >= 500k events/s on local[2], and Spark's peak memory flat from 1M to 10M events.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from typing import Any

TOPICS = ("port", "network", "subnet", "router")
CHUNK = 500_000
VALUE_BYTES = 48
T0 = 1_767_225_600.0  # 2026-01-01T00:00:00Z


def generate(root: str, events: int, keys: int, seed: int = 8) -> None:
    """Write the synthetic log: per chunk and topic one segment, as the archiver would."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.compute as pc
    import pyarrow.parquet as pq

    from dfpubsub.archive import arrow_schema, partition_dir

    schema = arrow_schema()
    rng = np.random.default_rng(seed)
    for start in range(0, events, CHUNK):
        n = min(CHUNK, events - start)
        ids = rng.integers(0, keys, n)
        version = np.arange(start + 1, start + n + 1, dtype=np.int64)
        received = T0 + version / 1e5
        for t, topic in enumerate(TOPICS):
            pick = np.nonzero(ids % len(TOPICS) == t)[0]
            m = len(pick)
            v = version[pick]
            deleted = pa.array(rng.random(m) < 0.05)
            payload = np.zeros((m, VALUE_BYTES), dtype=np.uint8)
            payload[:, :8] = v.view(np.uint8).reshape(m, 8)
            offsets = np.arange(0, (m + 1) * VALUE_BYTES, VALUE_BYTES, dtype=np.int32)
            values = pa.Array.from_buffers(pa.binary(), m, [None, pa.py_buffer(offsets), pa.py_buffer(payload)])
            const = pa.array([topic]).take(pa.array(np.zeros(m, dtype=np.int32)))
            columns = {
                "topic": const, "table": const,
                "key": pc.binary_join_element_wise("k", pc.cast(pa.array(ids[pick]), pa.string()), ""),
                "action": pc.if_else(deleted, "delete", "update"),
                "version": pa.array(v), "value": pc.if_else(deleted, pa.scalar(None, pa.binary()), values),
                "timestamp": pa.array(received[pick] - 0.002),
                "publisher_id": pa.array(["bench-publisher"]).take(pa.array(np.zeros(m, dtype=np.int32))),
                "seq": pa.array(v), "sent_at": pa.array(received[pick] - 0.001),
                "received_at": pa.array(received[pick]),
            }
            table = pa.Table.from_arrays([columns[f.name] for f in schema], schema=schema)
            folder = os.path.join(root, partition_dir(topic, "2026-01-01"))
            os.makedirs(folder, exist_ok=True)
            pq.write_table(table, os.path.join(folder, f"seg-{start:012d}.parquet"), compression="zstd")


def run_spark(log: str, out: str, rounds: int) -> dict[str, Any]:
    """The Spark side (in its own process): the best of ``rounds`` compactions of ``log``."""
    from dfpubsub.pipeline import build_session, compact

    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    spark = build_session("bench-pipeline", "local[2]", {"spark.ui.enabled": "false"})
    try:
        runs = [compact(spark, log, f"{out}-{i}", tombstone_retention=1e12) for i in range(rounds)]
    finally:
        spark.stop()
    m = runs[-1].manifest
    return {"seconds": min(r.seconds for r in runs), "rounds": [round(r.seconds, 2) for r in runs],
            "events": m.events, "objects": m.objects, "tombstones": m.tombstones}


def run_baseline(log: str, out: str, rounds: int) -> dict[str, Any]:
    """The single-process pyarrow compaction (in its own process): the best of ``rounds``."""
    runs = [_baseline_once(log, f"{out}-{i}") for i in range(rounds)]
    return {**runs[-1], "seconds": min(r["seconds"] for r in runs), "rounds": [round(r["seconds"], 2) for r in runs]}


def _baseline_once(log: str, out: str) -> dict[str, Any]:
    import numpy as np
    import pyarrow as pa
    import pyarrow.compute as pc
    import pyarrow.parquet as pq

    from dfpubsub.archive import segment_files
    from dfpubsub.pipeline.compact import ACTION_RANK, TIE_BREAK

    started = time.perf_counter()
    table = pa.concat_tables(pq.read_table(os.path.join(log, rel)) for rel in segment_files(log))
    rank = pc.if_else(pc.equal(table["action"], "delete"), ACTION_RANK["delete"],
                      pc.if_else(pc.equal(table["action"], "update"), ACTION_RANK["update"], ACTION_RANK["create"]))
    table = table.append_column("action_rank", rank)
    # Binary columns cannot be sort keys in pyarrow; the value only breaks ties of identical rows here.
    order = [("table", "ascending"), ("key", "ascending")] + [(c, "descending") for c in TIE_BREAK if c != "value"]
    table = table.take(pc.sort_indices(table, sort_keys=order))
    tables, keys = table["table"].to_numpy(zero_copy_only=False), table["key"].to_numpy(zero_copy_only=False)
    first = np.ones(len(table), dtype=bool)
    first[1:] = (tables[1:] != tables[:-1]) | (keys[1:] != keys[:-1])
    latest = table.filter(pa.array(first))
    deleted = pc.equal(latest["action"], "delete")
    live = latest.filter(pc.invert(deleted)).drop_columns(["action_rank"])
    pq.write_table(live, out, compression="snappy")  # as the Spark side writes its snapshot
    return {"seconds": time.perf_counter() - started, "events": len(table), "objects": len(live),
            "tombstones": int(pc.sum(deleted).as_py() or 0)}


def _tree_rss(pid: int) -> int:
    """Resident bytes of ``pid`` and its descendants, each address space counted once.

    A child still running its parent's executable has not exec'd yet: it shares its parent's
    pages (the JVM starts helpers such as Hadoop's ``chmod`` through ``posix_spawn``, whose
    child runs in the JVM's own memory until it execs) and its RSS is its parent's again.
    Counting it doubled the JVM in the odd sample that caught one.
    """
    children: dict[int, list[int]] = {}
    rss: dict[int, int] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as fh:
                fields = fh.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        children.setdefault(int(fields[1]), []).append(int(entry))
        rss[int(entry)] = int(fields[21]) * os.sysconf("SC_PAGE_SIZE")
    total, todo = rss.get(pid, 0), [pid]
    while todo:
        parent = todo.pop()
        for child in children.get(parent, ()):
            if _exe(child) != _exe(parent):
                total += rss.get(child, 0)
            todo.append(child)
    return total


def _exe(pid: int) -> str | None:
    try:
        return os.readlink(f"/proc/{pid}/exe")
    except OSError:
        return None


def measured(args: list[str]) -> tuple[dict[str, Any], float]:
    """Run this script with ``args`` in a child; its JSON result and the peak RSS of its tree (MiB)."""
    proc = subprocess.Popen([sys.executable, __file__, *args], stdout=subprocess.PIPE, text=True)
    peak = [0]

    def sample() -> None:
        while proc.poll() is None:
            peak[0] = max(peak[0], _tree_rss(proc.pid))
            time.sleep(0.05)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    out, _ = proc.communicate()
    sampler.join()
    if proc.returncode != 0:
        raise SystemExit(f"the {args[1]} side failed with exit code {proc.returncode}")
    return json.loads(out.strip().splitlines()[-1]), peak[0] / 2**20


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--events", type=int, default=1_000_000)
    parser.add_argument("--keys", type=int, help="distinct objects (default: events / 10)")
    parser.add_argument("--rounds", type=int, default=2, help="runs per side; the best counts [default: 2]")
    parser.add_argument("--dir", help="work directory (default: a temporary one, removed after)")
    parser.add_argument("--child", nargs=3, metavar=("SIDE", "LOG", "OUT"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        side, log, out = args.child
        run = run_spark if side == "spark" else run_baseline
        print(json.dumps(run(log, out, args.rounds)))
        return 0
    keys = args.keys or max(1, args.events // 10)
    with tempfile.TemporaryDirectory(prefix="bench-pipeline-", dir=args.dir) as tmp:
        log = os.path.join(tmp, "log")
        t0 = time.perf_counter()
        generate(log, args.events, keys)
        os.sync()  # the kernel's write-back of the fresh log must not land in the timed runs
        size = sum(os.path.getsize(os.path.join(d, f)) for d, _, fs in os.walk(log) for f in fs)
        print(f"generated {args.events:,} events over {keys:,} keys in {time.perf_counter() - t0:.1f}s "
              f"({size / 2**20:.0f} MiB of Parquet)", flush=True)
        rounds = ["--rounds", str(args.rounds)]
        spark, spark_rss = measured(["--child", "spark", log, os.path.join(tmp, "snap"), *rounds])
        print(f"spark local[2]: rounds {spark['rounds']} s; best {args.events / spark['seconds']:,.0f} events/s, "
              f"peak RSS {spark_rss:,.0f} MiB; {spark['objects']:,} objects, {spark['tombstones']:,} tombstones",
              flush=True)
        base, base_rss = measured(["--child", "baseline", log, os.path.join(tmp, "baseline.parquet"), *rounds])
        print(f"pyarrow baseline: rounds {base['rounds']} s; best {args.events / base['seconds']:,.0f} events/s, "
              f"peak RSS {base_rss:,.0f} MiB; {base['objects']:,} objects, {base['tombstones']:,} tombstones",
              flush=True)
    if (spark["objects"], spark["tombstones"]) != (base["objects"], base["tombstones"]):
        print("MISMATCH: Spark and the baseline disagree", file=sys.stderr)
        return 1
    print(json.dumps({"bench": "pipeline", "events": args.events,
                      "spark_events_per_s": round(args.events / spark["seconds"]),
                      "baseline_events_per_s": round(args.events / base["seconds"]),
                      "spark_peak_rss_mb": round(spark_rss), "baseline_peak_rss_mb": round(base_rss)}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
