"""The audit's readable forms: a text summary and a PNG of rates and latencies over time."""

from __future__ import annotations

import io
import logging
import time
from typing import Any

__all__ = ["render_text", "plot_png"]

log = logging.getLogger(__name__)


def _ms(seconds: float | None) -> str:
    return "-" if seconds is None else f"{seconds * 1000:.1f}"


def render_text(s: dict[str, Any]) -> str:
    """The audit summary as a few paragraphs of text."""
    lines = [
        "dfpubsub event log audit",
        f"segments {s['segments']}, events {s['events']} ({s['distinct_events']} distinct), "
        f"publishers {s['publishers']}, streams (publisher, topic) {s['streams']}",
        "",
        f"gaps: {s['gaps']['count']} ({s['gaps']['missing_events']} events missing): "
        f"{s['gaps']['filled']} filled from the change feed, {s['gaps']['history_gone']} in history gone, "
        f"{s['gaps']['unexplained']} unexplained",
    ]
    causes = {"filled": " filled", "history_gone": " history gone"}
    lines += [f"  {g['publisher_id']} {g['topic']}: seq {g['first_missing']}..{g['last_missing']} ({g['missing']})"
              f"{causes.get(g['cause'], '')}" for g in s["gaps"]["largest"]]
    w = s["writes"]
    reach = "no reach marker" if w["reach"] is None else f"complete up to revision {w['reach']}"
    lines.append(f"writes: {w['distinct']} distinct in {w['rows']} rows ({w['from_feed']} read from the change "
                 f"feed), {w['repeated']} archived more than once; {reach}")
    lines += [f"  history gone in {h['topic']}: revisions {h['after'] + 1}..{h['horizon']}" for h in w["history_gone"]]
    dups = s["duplicates"]
    lines.append(f"duplicates: {dups['sequences']} sequences, {dups['extra_copies']} extra copies")
    lines += [f"  {d['publisher_id']} {d['topic']}: seq {d['seq']} x{d['copies']}" for d in dups["most_copied"]]
    lines.append(f"per-key version order violations: {s['order_violations']['count']}")
    lines += [f"  {v['table']}/{v['key']}: version {v['version']} after {v['max_version_before']} "
              f"({v['publisher_id']} seq {v['seq']})" for v in s["order_violations"]["first"]]
    lines += ["", "latency (ms)        events  delivery p50/p90/p99/max      end-to-end p50/p90/p99/max"]
    for topic, t in s["latency"].items():
        delivery = "/".join(_ms(t[f"delivery_{k}"]) for k in ("p50", "p90", "p99", "max"))
        e2e = "/".join(_ms(t[f"end_to_end_{k}"]) for k in ("p50", "p90", "p99", "max"))
        lines.append(f"  {topic:<16} {t['events']:>8}  {delivery:<28}  {e2e}")
    lines += ["", f"peak rate: {s['rates']['peak_events_per_s']:.1f} events/s "
                  f"(buckets of {s['rates']['bucket_seconds']:g} s)"]
    return "\n".join(lines) + "\n"


def plot_png(rates: list[dict[str, Any]], latency: dict[str, Any], bucket: float) -> bytes | None:
    """Events per second and p50/p99 delivery latency per topic over time; None without matplotlib."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        from matplotlib import pyplot as plt
    except ImportError:
        log.warning("matplotlib is not installed: no audit.png")
        return None
    fig, (top, bottom) = plt.subplots(2, 1, figsize=(10, 7), sharex=True)
    try:
        start = min((r["bucket_start"] for r in rates), default=time.time())
        for topic in latency:
            mine = [r for r in rates if r["topic"] == topic]
            x = [(r["bucket_start"] - start) / 60 for r in mine]
            top.plot(x, [r["events_per_s"] for r in mine], marker=".", label=topic)
            bottom.plot(x, [(r["delivery_p50"] or 0) * 1000 for r in mine], marker=".", label=f"{topic} p50")
            bottom.plot(x, [(r["delivery_p99"] or 0) * 1000 for r in mine], marker=".", linestyle="--",
                        label=f"{topic} p99")
        top.set_ylabel(f"events/s ({bucket:g} s buckets)")
        top.set_title(f"event rate and delivery latency from {time.strftime('%Y-%m-%d %H:%M', time.gmtime(start))} UTC")
        bottom.set_ylabel("delivery latency (ms)")
        bottom.set_xlabel("minutes")
        for ax in (top, bottom):
            ax.grid(True, alpha=0.3)
            if latency:
                ax.legend(fontsize="small", loc="upper right")
        buf = io.BytesIO()
        fig.savefig(buf, format="png", dpi=100)
        return buf.getvalue()
    finally:
        plt.close(fig)
