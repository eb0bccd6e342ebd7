"""df-db as kubectl users expect it: read-only commands never create a database."""

from __future__ import annotations

import os

import pytest

from tests.functional.df_db_helpers import base_env, ok, refused


@pytest.mark.parametrize("args", [("tables",), ("ls", "port"), ("get", "port", "p1"), ("publishers",),
                                  ("queues", "owners"), ("queues", "stats")])
def test_read_only_commands_on_a_missing_file_say_so_and_create_nothing(tmp_path, args):
    missing = tmp_path / "sub" / "nb.sqlite"
    env = base_env(DFPUBSUB_STORE__URL=f"sqlite:///{missing}", DFPUBSUB_STORE__TABLES='["port"]')
    err = refused(env, *args)
    assert f"no database at {missing}" in err
    assert not missing.exists() and not missing.parent.exists()


def test_a_relative_sqlite_url_is_relative_to_the_working_directory(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    env = base_env(DFPUBSUB_STORE__URL="sqlite:///nb.sqlite", DFPUBSUB_STORE__TABLES='["port"]')
    ok(env, "add", "port", '{"key": "p1", "value": {"mac": "m"}}')
    assert os.path.exists(tmp_path / "nb.sqlite")
    assert ok(env, "get", "port", "p1")["value"] == {"mac": "m"}
