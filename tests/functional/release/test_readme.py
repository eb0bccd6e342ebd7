"""Every Python snippet of the README runs as written, each in a fresh interpreter."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

README = Path(__file__).resolve().parents[3] / "README.md"
SNIPPETS = re.findall(r"^```python\n(.*?)^```", README.read_text(), flags=re.S | re.M)


def test_the_readme_has_snippets():
    assert SNIPPETS


@pytest.mark.parametrize("code", SNIPPETS, ids=[f"snippet{i + 1}" for i in range(len(SNIPPETS))])
def test_a_readme_snippet_runs_as_written(code, tmp_path):
    # A fresh working directory: a snippet must not depend on files or state another one left.
    out = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, f"stdout:\n{out.stdout}\nstderr:\n{out.stderr}"
    assert "Traceback" not in out.stderr


# Run after the README's first snippet, in its namespace: a forged event reaches the cache the way
# the snippet's subscriber hands events to it (on_event=cache.apply), then the subscriber resyncs
# through the snippet's own on_resync.
FORGERY = '''
from dfpubsub import Action, Event
FORGED = 2**64 - 1
assert cache.apply(Event("port", "port", "p1", Action.UPDATE, FORGED, {"mac": "forged"}))
assert cache.apply(Event("port", "port", "p-forged", Action.CREATE, FORGED, {"mac": "forged"}))
resync({"port"})
truth = store.get("port", "p1")
held = cache.get("port", "p1")
assert (held.version, held.value) == (truth.version, truth.value), (held, truth)
assert cache.get("port", "p-forged") is None, cache.get("port", "p-forged")
later = store.update("port", "p1", {"mac": "fa:16:3e:00:00:02"})   # a genuine write after it
cache.apply(Event("port", "port", "p1", Action.UPDATE, later.version, later.value))
assert cache.get("port", "p1").value == {"mac": "fa:16:3e:00:00:02"}
print("converged")
'''


def test_the_readme_first_resync_lets_the_truth_win_over_a_forged_version(tmp_path):
    # The first snippet is what a newcomer copies: its resync must replace a forged version of
    # 2^64-1 (and delete a forged object) with the store's, as docs/reliability.md promises.
    first = SNIPPETS[0]
    assert "on_resync=resync" in first
    out = subprocess.run([sys.executable, "-c", first + FORGERY], cwd=tmp_path, capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0, f"stdout:\n{out.stdout}\nstderr:\n{out.stderr}"
    assert out.stdout.rstrip().endswith("converged")
