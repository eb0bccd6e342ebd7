"""The suite's own scheduling: pytest-xdist takes the xdist_group marks the suite relies on (the
alone tests back to back on one worker, the Spark tests on one JVM)."""

import pytest


@pytest.mark.xdist_group("groups-check")
def test_pytest_xdist_takes_the_groups(request: pytest.FixtureRequest) -> None:
    if not getattr(request.config.option, "loadgroup", False):
        pytest.skip("not run by pytest-xdist with --dist loadgroup")
    # pytest-xdist names a test's group in its node id; with pytest 9.2 it could not and every group
    # scattered without a word (pytest-dev/pytest-xdist#1386: setup.cfg keeps pytest below 9.2).
    assert request.node.nodeid.endswith("@groups-check"), (
        f"pytest-xdist ignored the test's xdist_group ({request.node.nodeid}): this pytest "
        f"{pytest.__version__} and pytest-xdist do not work together (pytest-dev/pytest-xdist#1386)")
