"""df-db as kubectl users expect it: read-only commands never create a database."""

from __future__ import annotations

import json
import os

import pytest

from dfpubsub.testing.servers import free_port
from tests.functional.df_db_helpers import base_env, df_db, ok, refused


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


def test_global_options_work_after_the_command_too(tmp_path):
    env = base_env(DFPUBSUB_STORE__TABLES='["port"]')
    url = f"sqlite:///{tmp_path}/nb.sqlite"
    ok(env, "--store", url, "add", "port", '{"key": "p1", "value": 1}')
    # ok() puts "-o json" first; here every global option comes after the command instead.
    out = df_db(env, "tables", "-o", "json", "--store", url)
    assert out.returncode == 0 and json.loads(out.stdout) == [{"table": "port", "objects": 1}]
    out = df_db(env, "get", "port", "p1", f"--store={url}", "-ojson")
    assert out.returncode == 0 and json.loads(out.stdout)["value"] == 1


def test_add_then_watch_in_two_shells_meet_on_the_default_zmq_driver(tmp_path):
    """No driver flag in either shell: df-db add binds the default endpoint, the watch finds it."""
    import subprocess as sp

    from tests.functional.df_db_helpers import EXE

    port = free_port()
    env = {**base_env(DFPUBSUB_STORE__URL=f"sqlite:///{tmp_path}/nb.sqlite"),
           "DFPUBSUB_PUBSUB__DRIVER": f"zmq+tcp://127.0.0.1:{port}"}
    watch = sp.Popen([EXE, "-o", "json", "watch", "port", "--count", "1", "--timeout", "60"], env=env,
                     stdout=sp.PIPE, stderr=sp.PIPE, text=True)
    try:
        for i in range(30):  # until the watch has started (a slow machine): each add waits 1 s for it
            added = df_db(env, "add", "port", f'{{"key": "p{i}", "value": {{"v": 1}}}}')
            assert added.returncode == 0, added.stderr
            if "no subscriber was listening" not in added.stderr:
                break
        out, err = watch.communicate(timeout=60)
        assert watch.returncode == 0, err
        assert f'"p{i}"' in out
    finally:
        watch.kill()
    # With nobody listening, the writer says so (and the change is stored).
    alone = df_db(env, "add", "port", '{"key": "p2", "value": {}}')
    assert alone.returncode == 0 and "no subscriber was listening" in alone.stderr
