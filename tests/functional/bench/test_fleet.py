"""The fleet benchmark, small: 50 controllers in two worker processes against a private Redis, every
scenario once, so that the harness cannot rot. Not a timing test: it checks that every scenario ended
with every cache equal to the store (the benchmark compares them object by object) and that the
figures add up (what a cold start listed, what the relists of a feed whose history is gone read,
bookmarks leaving the steady writes' reads below the baseline's, a rolling restart resuming from
snapshots)."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[3] / "tools" / "bench" / "fleet.py"
CONTROLLERS, OBJECTS = 50, 1000

# Fifty controllers' threads: minutes on a busy 2-core machine, seconds on a quiet one.
pytestmark = [pytest.mark.zmq, pytest.mark.timeout(1200)]


def test_fifty_controllers_end_every_scenario_equal_to_the_store_and_the_figures_add_up():
    out = subprocess.run(
        [sys.executable, str(BENCH), "--store", "redis", "--controllers", str(CONTROLLERS), "--workers", "2",
         "--objects", str(OBJECTS), "--rate", "100", "--duration", "3", "--baseline-duration", "3",
         "--checkpoint", "1", "--idle-s", "1", "--idle", "1", "--partition-s", "2",
         # A relist's jitter is 0-2 s by default: the rolling restart, one controller after the other
         # in each process, would wait 25 of them (24 s of the test's 46).
         "--relist-jitter", "0.2",
         # Each controller keeps a state_dir: the rolling restart resumes from snapshots (issue 43).
         "--warm"],
        capture_output=True, text=True, timeout=1100)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    result = json.loads(out.stdout.strip().splitlines()[-1])
    assert result["bench"] == "fleet"
    assert result["unequal"] == [], out.stdout
    # Every controller listed the table once at its cold start (no snapshot yet)...
    assert result["cold_relists"] >= CONTROLLERS
    assert result["cold_listed"] >= CONTROLLERS * OBJECTS
    assert result["cold_bytes"] > CONTROLLERS * OBJECTS * 100, "a port's listing is ~200 bytes"
    # ...and none when restarted: each resumed from the snapshot it wrote as it stopped.
    assert result["restart_relists"] == 0 and result["restart_listed"] == 0
    assert result["restart_bytes"] < CONTROLLERS * OBJECTS * 10
    # Steady writes with bookmarks read less than the baseline, whose checkpoints replay every entry.
    assert result["steady_writes"] > 0 and result["baseline_writes"] > 0
    assert result["baseline_read_share"] > 0.3
    assert result["steady_read_share"] < result["baseline_read_share"]
    assert 0 <= result["ratio"] < 1
    assert result["steady_cpu_per_event_us"] > 0
    # One lost envelope: every controller replays, and none relists.
    assert result["lost_replays"] >= CONTROLLERS
    assert result["lost_relists"] == 0
    # An API worker killed -9 after its writes arrived: every controller repairs, and from the kill
    # on reads no object (before it, a checkpoint may rightly read a write still on its way).
    assert result["dead_replays"] >= CONTROLLERS
    assert result["dead_relists"] == 0 and result["dead_repair_objects"] == 0
    # The feed's history gone for all (a new df-feed met mid-stream: docs/reliability.md, "Anchors"):
    # every controller relists once and reads the table once.
    assert result["history_relists"] >= CONTROLLERS
    assert 1 <= result["history_listed_per_controller"] < 2
