"""df-pipeline: the Spark jobs over the event log (compact, audit) and the snapshot bootstrap.

Runs on a local Spark (``local[*]``) by default; unchanged under
``spark-submit --master ... $(python -c 'import dfpubsub.tools.pipeline as m; print(m.__file__)') compact ...``.
Each command prints one JSON line with its result on stdout; logs go to stderr.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from dfpubsub import __version__
from dfpubsub.config import add_config_arguments, settings_from_args
from dfpubsub.console import ArgumentParser, console_main
from dfpubsub.errors import ConfigError, PipelineError
from dfpubsub.logs import setup_logging

__all__ = ["main"]


def _conf(pairs: list[str]) -> dict[str, str]:
    out = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise argparse.ArgumentTypeError(f"--conf takes KEY=VALUE, not {pair!r}")
        out[key] = value
    return out


def _compaction_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--tombstone-retention", type=float, default=7 * 86400.0, metavar="SECONDS",
                   help="keep deletes this long for later runs [default: 7 days]")
    p.add_argument("--keep", type=int, default=2, help="committed generations to keep [default: 2]")


def _parser() -> argparse.ArgumentParser:
    parser = ArgumentParser(prog="df-pipeline", description=__doc__.split("\n")[0])
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    parser.add_argument("--master", help="Spark master (default: spark-submit's, else local[*])")
    parser.add_argument("--conf", action="append", default=[], metavar="KEY=VALUE", help="Spark setting (repeatable)")
    parser.add_argument("--log-level", default="warning", choices=["debug", "info", "warning", "error"])
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("compact", help="fold new segments into the next snapshot generation")
    p.add_argument("--log", required=True, help="root of the event log (archive.path)")
    p.add_argument("--snapshot", required=True, help="root of the snapshot")
    _compaction_options(p)

    p = sub.add_parser("audit", help="gaps, duplicates, order violations, latencies and rates of the log")
    p.add_argument("--log", required=True, help="root of the event log")
    p.add_argument("--out", required=True, help="directory of the report")
    p.add_argument("--topics", help="only these topics (comma-separated)")
    p.add_argument("--since", metavar="YYYY-MM-DD", help="first date (UTC) to read")
    p.add_argument("--until", metavar="YYYY-MM-DD", help="last date (UTC) to read")
    p.add_argument("--bucket", type=float, default=60.0, metavar="SECONDS", help="rate buckets [default: 60]")

    p = sub.add_parser("bootstrap", help="sync from the snapshot and catch up from the store; report what it took")
    p.add_argument("--snapshot", required=True, help="root of the snapshot")
    p.add_argument("--log", help="compact this event log into the snapshot first")
    p.add_argument("--topics", help="topics to sync (default: pubsub.topics, else store.tables)")
    p.add_argument("--verify", action="store_true", help="also list the store and compare (exit 1 on a difference)")
    _compaction_options(p)
    add_config_arguments(p, ("store", "pubsub"))
    return parser


def _preflight(args: argparse.Namespace) -> None:
    """Check the inputs, Java and the master before a JVM starts (dfpubsub/pipeline/preflight.py)."""
    from dfpubsub.pipeline import preflight
    from dfpubsub.pipeline.session import require_pyspark

    _conf(args.conf)
    if args.command == "audit":
        preflight.check_date(args.since, "--since")
        preflight.check_date(args.until, "--until")
        if args.since and args.until and args.since > args.until:
            raise ConfigError(f"--since {args.since} is after --until {args.until}")
        if args.bucket <= 0:
            raise ConfigError(f"--bucket takes a positive number of seconds, not {args.bucket:g}")
    preflight.check_master(args.master)
    if args.log is not None:
        preflight.check_directory(args.log, "event log")
    if args.command == "audit":
        preflight.check_directory(args.out, "report directory", must_exist=False)
    else:  # compact makes the snapshot; bootstrap reads it, unless it compacts first
        preflight.check_directory(args.snapshot, "snapshot", must_exist=args.command == "bootstrap" and not args.log)
    require_pyspark()
    preflight.check_java()


def _spark(args: argparse.Namespace) -> Any:
    from dfpubsub.pipeline import build_session

    return build_session(f"df-pipeline {args.command}", args.master, _conf(args.conf))


def _compact(args: argparse.Namespace) -> dict[str, Any]:
    from dfpubsub.pipeline import compact

    spark = _spark(args)
    try:
        r = compact(spark, args.log, args.snapshot, args.tombstone_retention, args.keep)
    finally:
        spark.stop()
    m = r.manifest
    return {"command": "compact", "created": r.created, "generation": m.generation, "new_segments": r.new_segments,
            "events": m.events if r.created else 0, "objects": m.objects, "tombstones": m.tombstones,
            "max_version": m.max_version, "seconds": round(r.seconds, 3)}


def _audit(args: argparse.Namespace) -> dict[str, Any]:
    from dfpubsub.pipeline.audit import audit

    topics = [t.strip() for t in args.topics.split(",") if t.strip()] if args.topics else None
    spark = _spark(args)
    try:
        r = audit(spark, args.log, args.out, topics, args.since, args.until, args.bucket)
    finally:
        spark.stop()
    s = r.summary
    return {"command": "audit", "out": r.out, "events": s["events"], "gaps": s["gaps"]["count"],
            "missing_events": s["gaps"]["missing_events"], "unexplained_gaps": s["gaps"]["unexplained"],
            "history_gone": len(s["writes"]["history_gone"]), "writes": s["writes"]["distinct"],
            "from_feed": s["writes"]["from_feed"], "duplicates": s["duplicates"]["extra_copies"],
            "order_violations": s["order_violations"]["count"], "seconds": round(r.seconds, 3)}


def _bootstrap(args: argparse.Namespace) -> dict[str, Any]:
    from dfpubsub.pipeline.bootstrap import catch_up, load_snapshot
    from dfpubsub.store import open_store_from_settings

    settings = settings_from_args(args)
    out: dict[str, Any] = {"command": "bootstrap"}
    if args.log:
        out["compact"] = _compact(args)
    topics = ([t.strip() for t in args.topics.split(",") if t.strip()] if args.topics
              else settings.pubsub.topics or settings.store.tables)
    loaded = load_snapshot(args.snapshot, topics)
    if loaded is None:
        raise PipelineError(f"no committed snapshot under {args.snapshot}: run df-pipeline compact first")
    manifest, objects = loaded
    with open_store_from_settings(settings) as store:
        truth, report = catch_up(store, topics, objects)
        out.update(generation=manifest.generation, snapshot_objects=len(objects), objects=len(truth),
                   from_snapshot=report.from_snapshot, fetched=report.fetched, deleted=report.deleted,
                   seconds=round(report.seconds, 3))
        if args.verify:
            listed = {(o.topic, o.table, o.key, o.version) for o in store.list_topics(topics)}
            out["verified"] = listed == {(o.topic, o.table, o.key, o.version) for o in truth}
    return out


@console_main("df-pipeline")
def main(argv: list[str] | None = None) -> int:
    """Entry point of ``df-pipeline``."""
    args = _parser().parse_args(argv)
    setup_logging(args.log_level)
    try:
        _preflight(args)
        result = {"compact": _compact, "audit": _audit, "bootstrap": _bootstrap}[args.command](args)
    except argparse.ArgumentTypeError as exc:
        print(f"df-pipeline: {exc}", file=sys.stderr)
        return 2
    print(json.dumps(result, sort_keys=True))
    return 0 if result.get("verified", True) else 1


if __name__ == "__main__":
    sys.exit(main())
