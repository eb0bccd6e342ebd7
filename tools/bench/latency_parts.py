"""Where an event's latency goes, for the end-to-end benchmarks: a breakdown of each sampled latency.

``time.time() - event.timestamp`` in the handler is split at the envelope's
``sent_at`` (stamped by the publisher when it sent the envelope) and at the
moment the subscriber's receive thread queued the envelope for the dispatch thread:

* ``batching``: publish() to send, the time an event lingered in its batch;
* ``transport``: send to queued, ZeroMQ's (or the server's) hop and the receive
  thread's wake-up, header decode and sequence tracking;
* ``dispatch``: queued to handler, the hop to the dispatch thread and decoding.

The subscriber's garbage collections are timed (``gc.callbacks``), and the
harness's own pacing is measured apart (``send_loop``): how far each sleep
between the publisher's 1 ms ticks overshot, and the burst sizes it caused
(a late tick sends a bigger burst, which can switch batching on).
"""

from __future__ import annotations

import gc
import time
from collections.abc import Iterable, Sequence
from typing import Any

from dfpubsub.events import EventBatch
from dfpubsub.subscriber import Subscriber

__all__ = ["GcPauses", "describe", "instrument", "p50_p99", "parts_ms"]

PARTS = ("batching", "transport", "dispatch")


class Stamps:
    """When the envelope being delivered was queued by the receive thread (instrumented subscriber)."""

    def __init__(self) -> None:
        self.queued: dict[int, float] = {}
        self.current = 0.0


def instrument(sub: Subscriber) -> Stamps:
    """Stamp each envelope ``sub`` queues, and make the stamp of the one it delivers ``current``."""
    stamps = Stamps()
    enqueue, deliver = sub._enqueue, sub._deliver

    def stamped_enqueue(batch: EventBatch) -> None:
        stamps.queued[id(batch)] = time.time()
        enqueue(batch)

    def stamped_deliver(batch: EventBatch) -> None:
        stamps.current = stamps.queued.pop(id(batch), 0.0)
        deliver(batch)

    setattr(sub, "_enqueue", stamped_enqueue)  # noqa: B010 (a method replaced on one instance)
    setattr(sub, "_deliver", stamped_deliver)  # noqa: B010
    return stamps


class GcPauses:
    """The garbage collector's pauses in this process while installed (``gc.callbacks``)."""

    def __init__(self) -> None:
        self.pauses: list[tuple[int, float]] = []  # (generation, seconds)
        self._start = 0.0
        gc.callbacks.append(self._callback)

    def _callback(self, phase: str, info: dict[str, Any]) -> None:
        if phase == "start":
            self._start = time.perf_counter()
        else:
            self.pauses.append((info["generation"], time.perf_counter() - self._start))

    def report(self) -> dict[str, Any]:
        gc.callbacks.remove(self._callback)
        longest = max((p for _, p in self.pauses), default=0.0)
        return {"collections": len(self.pauses), "gc_total_ms": sum(p for _, p in self.pauses) * 1e3,
                "gc_max_ms": longest * 1e3, "full": sum(1 for g, _ in self.pauses if g == 2)}


def p50_p99(values: Iterable[float], scale: float = 1.0) -> dict[str, float]:
    """``p50`` and ``p99`` of ``values`` times ``scale`` (nothing for no values)."""
    ordered = sorted(values)
    return {"p50": ordered[len(ordered) // 2] * scale, "p99": ordered[int(len(ordered) * 0.99)] * scale} \
        if ordered else {}


def parts_ms(parts: Sequence[float]) -> dict[str, dict[str, float]]:
    """p50 and p99 of each part of the sampled latencies, given flat (one triple per sample, in
    seconds; ms out)."""
    n = len(PARTS)
    return {name: p50_p99(parts[i::n], 1e3) for i, name in enumerate(PARTS) if parts}


def describe(label: str, parts: dict[str, dict[str, float]], gc_report: dict[str, Any], late: dict[str, float],
             bursts: dict[str, float]) -> str:
    """One line of the breakdown for a phase's report."""
    shown = ", ".join(f"{name} {v['p50']:.3f}/{v['p99']:.3f}" for name, v in parts.items())
    return (f"[{label}] latency parts p50/p99 ms: {shown}; subscriber GC: {gc_report['collections']} collections "
            f"({gc_report['full']} full), {gc_report['gc_total_ms']:.1f} ms in all, longest {gc_report['gc_max_ms']:.2f} "
            f"ms; harness: the publisher's sleeps overshot p50 {late.get('p50', 0):.3f} ms, p99 {late.get('p99', 0):.3f} "
            f"ms, bursts of p50 {bursts.get('p50', 0):.0f}, p99 {bursts.get('p99', 0):.0f} events")
