"""The Promela model of the reliability protocol (spec/dfpubsub.pml, docs/model.md), checked by
Spin: every configuration verifies exhaustively, and every seeded bug (a real mistake of the
past, put back by a -D switch) is refuted with a counterexample. A failure names the trail's
file and prints its steps."""

from __future__ import annotations

import pytest
from dfpubsub.tools.model_check import BUGS, CONFIGS, bug_flags, verify


@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_the_model_verifies(name, tmp_path):
    got = verify(CONFIGS[name][0], tmp_path)
    assert got.errors == 0, f"{name}: a rule fails; trail {got.trail_path}:\n{got.trail}"
    assert got.complete, f"{name}: the search did not complete:\n{got.output}"
    assert got.states > 1000  # the search went somewhere


@pytest.mark.parametrize("bug", sorted(BUGS))
def test_a_seeded_bug_is_refuted(bug, tmp_path):
    config = BUGS[bug].config
    got = verify(bug_flags(bug), tmp_path)
    assert got.errors > 0, f"{bug} ({BUGS[bug].mistake}) went unnoticed in {config}: {got.states} states"
    assert got.trail_path.exists() and "assertion violated" in got.trail, got.trail
    # The rule the bug breaks, not another that fails first (a rule failing without the bug too
    # once passed for BUG_BOOKMARK_MIDSTREAM's refutation: docs/model.md, "Findings").
    assert got.refutes(bug), f"{bug}: another rule failed, not {BUGS[bug].rule!r}:\n{got.trail}"
